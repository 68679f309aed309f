"""``python -m controller`` is the same as the ``specctl`` command."""

from controller.cli import main

main()
