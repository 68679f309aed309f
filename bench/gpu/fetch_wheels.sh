#!/usr/bin/env bash
# Download a vLLM release and what it needs beyond the GPU host's image (CPython 3.12, manylinux x86_64), trim what
# a Llama model on Hopper never loads, and pack it into parts a device call can carry.
#
#   bench/gpu/fetch_wheels.sh                       # vLLM 0.26.0: the pins in requirements-vllm026.txt -> parts/NN/
#   bench/gpu/fetch_wheels.sh --resolve             # first re-resolve vllm==0.26.0 against PyPI, rewrite the pins
#   bench/gpu/fetch_wheels.sh --vllm 0.34.0         # vLLM 0.34.0: requirements-vllm034.txt -> wheels/vllm034-parts/NN/
#   bench/gpu/fetch_wheels.sh --vllm 0.34.0 --resolve
#
# 0.26.0 (its torch is the image's) leaves out the packages wheelset.py's IMAGE_PROVIDED names. A later release is
# selected against the image's package list itself (results/h200_image_pip_list.txt): carried is what the image
# lacks or has at a version the release's requirements exclude (wheelset.py select --image). OVERRIDES replaces a
# pin PyPI cannot satisfy (vLLM 0.34.0 pins flashinfer-python==0.7.3, which PyPI does not have: 0.7.4 is carried).
#
# Needs network access to PyPI. Resolving needs a CPython 3.12 with pip >= 23 (--report, set PY312): pip evaluates
# environment markers such as `python_version > "3.11"` with the interpreter it runs under.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PY="${PY:-python3}"
PY312="${PY312:-python3.12}"
PART_MIB="${PART_MIB:-36}"  # a part beside the checkout (about 23 MiB) stays under a call's 64 MiB
VLLM=0.26.0
RESOLVE=0
while (($#)); do
    case "$1" in
        --vllm) VLLM="$2"; shift 2 ;;
        --resolve) RESOLVE=1; shift ;;
        *) echo "usage: $0 [--vllm VERSION] [--resolve]" >&2; exit 2 ;;
    esac
done
TAG="vllm$(echo "$VLLM" | awk -F. '{printf "%d%02d", $1, $2}')"  # 0.26.0 -> vllm026, 0.34.0 -> vllm034
PINS="$HERE/requirements-$TAG.txt"
if [[ "$VLLM" == 0.26.0 ]]; then
    WHEELS="$HERE/wheels"
    PARTS="$HERE/parts"
else
    WHEELS="$HERE/wheels/$TAG"
    PARTS="$HERE/wheels/$TAG-parts"
fi
case "$VLLM" in
    0.34.0) OVERRIDES=(--override flashinfer-python==0.7.4) ;;
    *) OVERRIDES=() ;;
esac

# manylinux_2_N tags are matched exactly by pip: list every N the host's glibc (2.39) accepts.
PLATFORM_ARGS=(--only-binary=:all: --python-version 3.12 --implementation cp)
for n in $(seq 39 -1 17); do PLATFORM_ARGS+=(--platform "manylinux_2_${n}_x86_64"); done
PLATFORM_ARGS+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)

if [[ "$RESOLVE" == 1 || ! -s "$PINS" ]]; then
    work="$(mktemp -d)"
    "$PY312" -c 'import sys; assert sys.version_info[:2] == (3, 12), "resolve with CPython 3.12 (set PY312)"'
    if [[ "$VLLM" == 0.26.0 ]]; then
        "$PY312" -m pip install --quiet --dry-run --ignore-installed --report "$work/report.json" --target "$work/t" \
            "${PLATFORM_ARGS[@]}" vllm==0.26.0
        {
            echo "# vllm==0.26.0 resolved for cp312 manylinux x86_64, minus what the GPU image has or a Llama"
            echo "# model on Hopper never loads (bench/gpu/wheelset.py). Regenerate: bench/gpu/fetch_wheels.sh --resolve"
            "$PY" "$HERE/wheelset.py" select "$work/report.json"
        } > "$PINS"
    else
        # vLLM's own requirements (with OVERRIDES) are resolved without it; the vllm wheel is pinned on its own.
        "$PY" -m pip download --quiet --no-deps "${PLATFORM_ARGS[@]}" -d "$work" "vllm==$VLLM"
        "$PY" "$HERE/wheelset.py" requires "$work"/vllm-"$VLLM"-*.whl "${OVERRIDES[@]}" > "$work/requires.txt"
        "$PY312" -m pip install --quiet --dry-run --ignore-installed --report "$work/report.json" --target "$work/t" \
            "${PLATFORM_ARGS[@]}" -r "$work/requires.txt"
        {
            echo "# vllm==$VLLM resolved for cp312 manylinux x86_64 (${OVERRIDES[*]:-no override}), minus what the"
            echo "# GPU image (results/h200_image_pip_list.txt) has at a version that meets every requirement, and"
            echo "# what a Llama model on Hopper never loads (bench/gpu/wheelset.py select --image)."
            echo "# Regenerate: bench/gpu/fetch_wheels.sh --vllm $VLLM --resolve"
            echo "vllm==$VLLM"
            "$PY" "$HERE/wheelset.py" select "$work/report.json" --root "$work/requires.txt" \
                --image "$HERE/results/h200_image_pip_list.txt"
        } > "$PINS"
    fi
    rm -rf "$work"
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
"$PY" "$HERE/wheelset.py" trim "$WHEELS"/vllm-"$VLLM"-*.whl
"$PY" "$HERE/wheelset.py" sizes --part-mib "$PART_MIB" "$WHEELS" | tail -1
"$PY" "$HERE/wheelset.py" pack --part-mib "$PART_MIB" --name "$TAG" "$WHEELS" "$PARTS"
du -sh "$WHEELS" "$PARTS"
