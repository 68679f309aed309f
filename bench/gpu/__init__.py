"""The GPU benchmark (vLLM on a GPU host); its modules also run as scripts."""
