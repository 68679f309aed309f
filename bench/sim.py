"""Trace-driven simulator benchmark (see bench/sim/run.py); ``python bench/sim.py --help``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from bench.sim.run import main

if __name__ == "__main__":
    sys.exit(main())
