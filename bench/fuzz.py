"""The long run of the pipeline's stateful fuzz (tests/fuzz/test_pipeline_stateful.py; CI runs a bounded one).

    python -m bench.fuzz                          # 400 examples x 60 steps (tens of minutes on 2 cores)
    python -m bench.fuzz --examples 50 --steps 40
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

TEST = Path(__file__).resolve().parents[1] / "tests" / "fuzz" / "test_pipeline_stateful.py"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=400, help="state machines run (default 400)")
    parser.add_argument("--steps", type=int, default=60, help="steps per state machine (default 60)")
    args = parser.parse_args(argv)
    env = dict(os.environ, SPECCTL_FUZZ_EXAMPLES=str(args.examples), SPECCTL_FUZZ_STEPS=str(args.steps))
    return subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "--hypothesis-show-statistics", str(TEST)], env=env)


if __name__ == "__main__":
    raise SystemExit(main())
