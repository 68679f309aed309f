#!/usr/bin/env bash
# Download vLLM 0.26.0 and what it needs beyond the GPU host's image (CPython 3.12, manylinux x86_64), trim what a
# Llama model on Hopper never loads, and pack it into parts a device call can carry (bench/gpu/parts/NN/).
#
#   bench/gpu/fetch_wheels.sh            # download the pinned set in requirements-vllm026.txt, trim, pack
#   bench/gpu/fetch_wheels.sh --resolve  # first re-resolve vllm==0.26.0 against PyPI and rewrite the pin file
#
# Needs network access to PyPI. Resolving needs a CPython 3.12 with pip >= 23 (--report): pip evaluates environment
# markers such as `python_version > "3.11"` (six, setuptools<81 for vLLM 0.26) with the interpreter it runs under.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PY="${PY:-python3}"
PY312="${PY312:-python3.12}"
WHEELS="$HERE/wheels"
PARTS="$HERE/parts"
PINS="$HERE/requirements-vllm026.txt"
PART_MIB="${PART_MIB:-36}"  # a part beside the checkout (about 23 MiB) stays under a call's 64 MiB

# manylinux_2_N tags are matched exactly by pip: list every N the host's glibc (2.39) accepts.
PLATFORM_ARGS=(--only-binary=:all: --python-version 3.12 --implementation cp)
for n in $(seq 39 -1 17); do PLATFORM_ARGS+=(--platform "manylinux_2_${n}_x86_64"); done
PLATFORM_ARGS+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)

if [[ "${1:-}" == "--resolve" || ! -s "$PINS" ]]; then
    report="$(mktemp -d)/report.json"
    "$PY312" -c 'import sys; assert sys.version_info[:2] == (3, 12), "resolve with CPython 3.12 (set PY312)"'
    "$PY312" -m pip install --quiet --dry-run --ignore-installed --report "$report" --target "$(mktemp -d)" \
        "${PLATFORM_ARGS[@]}" vllm==0.26.0
    {
        echo "# vllm==0.26.0 resolved for cp312 manylinux x86_64, minus what the GPU image has or a Llama"
        echo "# model on Hopper never loads (bench/gpu/wheelset.py). Regenerate: bench/gpu/fetch_wheels.sh --resolve"
        "$PY" "$HERE/wheelset.py" select "$report"
    } > "$PINS"
fi

mkdir -p "$WHEELS"
"$PY" -m pip download --quiet --no-deps "${PLATFORM_ARGS[@]}" -d "$WHEELS" -r "$PINS"
# Drop wheels left from an older pin set: two versions of one package stop the install on the host.
"$PY" - "$WHEELS" "$PINS" <<'PYEOF'
import re, sys
from pathlib import Path
wheel_dir, pins = Path(sys.argv[1]), Path(sys.argv[2])
canon = lambda s: re.sub(r"[-_.]+", "-", s).lower()
wanted = {canon(l.split("==")[0]) + "==" + l.split("==")[1].strip() for l in pins.read_text().splitlines() if "==" in l and not l.startswith("#")}
for whl in wheel_dir.glob("*.whl"):
    name, version = whl.name.split("-")[:2]
    if f"{canon(name)}=={version}" not in wanted:
        print(f"removing stale {whl.name}")
        whl.unlink()
PYEOF
"$PY" "$HERE/wheelset.py" trim "$WHEELS"/vllm-0.26.0-*.whl
"$PY" "$HERE/wheelset.py" pack --part-mib "$PART_MIB" "$WHEELS" "$PARTS"
du -sh "$WHEELS" "$PARTS"
