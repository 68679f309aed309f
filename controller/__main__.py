"""``python -m specctl_vllm.controller`` is the same as the ``specctl`` command."""

from specctl_vllm.controller.cli import main

main()
