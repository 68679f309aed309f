"""What the benchmarks start and drive: the controller and vLLM server launchers, the controller's HTTP API as a
client, the simulated engine and the category workload. The tests use them too (tests import bench, never the
reverse: bench/ runs on a GPU host without tests/)."""
