"""Report the requirements of installed distributions that the environment does not satisfy.

Runs on the GPU host after ``install.sh install``: the carried wheels were installed with ``--no-deps`` next to the
image's own packages, so this is where a version the image provides but a carried package rejects shows up.
Prints one line per unmet requirement and exits 0 (the run decides whether it matters); distributions left out on
purpose (``wheelset.TRIMMED``: never loaded for a Llama model on Hopper) are not reported.
"""

from __future__ import annotations

import sys
from importlib import metadata

from packaging.markers import default_environment
from packaging.requirements import Requirement
from wheelset import TRIMMED, canonical


def unmet(dist_name: str, seen: set[str]) -> list[str]:
    """Walk ``dist_name``'s requirements (no extras) recursively; return those missing or at a rejected version."""
    problems: list[str] = []
    key = dist_name.lower()
    if key in seen:
        return problems
    seen.add(key)
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        return [f"{dist_name}: not installed"]
    env = default_environment() | {"extra": ""}
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            if canonical(req.name) not in TRIMMED:
                problems.append(f"{dist.metadata['Name']} needs {req}: not installed")
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            problems.append(f"{dist.metadata['Name']} needs {req}: have {have}")
        problems.extend(unmet(req.name, seen))
    return problems


def main(argv: list[str]) -> int:
    seen: set[str] = set()
    problems = [p for name in argv or ["vllm"] for p in unmet(name, seen)]
    for line in problems:
        print(f"unmet: {line}")
    print(f"checked {len(seen)} distributions, {len(problems)} unmet requirements")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
