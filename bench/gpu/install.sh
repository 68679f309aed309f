#!/usr/bin/env bash
# On the GPU host (no network): gather the carried parts, check them, install a vLLM wheel set into a scratch folder.
#
#   bench/gpu/install.sh stash [SET]     # every call that carries parts: move them out of the checkout
#   bench/gpu/install.sh install [SET]   # once all parts are stashed: join, sha256-check, pip install --target, check deps
#   source "$(bench/gpu/install.sh env [SET])"   # PYTHONPATH and the variables that vLLM release needs there
#
# SET (default vllm026) names a set fetch_wheels.sh packed: vllm026 (vLLM 0.26.0, parts under bench/gpu/parts/NN/)
# or vllm034 (vLLM 0.34.0, parts under bench/gpu/wheels/vllm034-parts/NN/). The checkout is re-sent with every
# call, so parts are kept in $SPECCTL_GPU_HOME (default /root/specctl-gpu), which lives as long as the machine
# stays warm; stash moves them there (the host's disk holds one copy, and a part already stashed is not carried
# again).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PY="${PY:-python3}"
HOME_DIR="${SPECCTL_GPU_HOME:-/root/specctl-gpu}"
SET="${2:-vllm026}"
case "$SET" in
    vllm026) PARTS_DIR="$HERE/parts"; STASH="$HOME_DIR/parts"; SITE="$HOME_DIR/site"; ENV_FILE="$HOME_DIR/env.sh" ;;
    vllm034) PARTS_DIR="$HERE/wheels/vllm034-parts"; STASH="$HOME_DIR/parts-$SET"; SITE="$HOME_DIR/site-$SET"
             ENV_FILE="$HOME_DIR/env-$SET.sh" ;;
    *) echo "unknown wheel set $SET (vllm026 or vllm034)" >&2; exit 2 ;;
esac

stash() {
    mkdir -p "$STASH"
    shopt -s nullglob
    local parts=("$PARTS_DIR"/*/"$SET"-wheels.tar.part*) manifests=("$PARTS_DIR"/*/MANIFEST.sha256)
    ((${#parts[@]})) || { echo "no $SET parts under $PARTS_DIR" >&2; exit 1; }
    cp "${manifests[0]}" "$STASH/"
    mv "${parts[@]}" "$STASH/"
    echo "stashed $(ls "$STASH"/"$SET"-wheels.tar.part* | wc -l) of $(grep -c "$SET-wheels.tar.part" "$STASH/MANIFEST.sha256") $SET parts; $(du -sh "$STASH" | cut -f1) in $STASH"
}

write_env() {
    mkdir -p "$HOME_DIR"
    {
        cat <<ENVEOF
# The checkout provides specctl_vllm/, which finds controller/, engine_patch/ and kernel/ beside it (vLLM finds
# the scheduler by --scheduler-cls; the plugin entry point only logs the version check, so the package itself
# need not be installed).
export PYTHONPATH="$REPO:$SITE\${PYTHONPATH:+:\$PYTHONPATH}"
export PATH="$SITE/bin:\$PATH"
# flashinfer's sampler JIT-compiles with nvcc, which is not carried.
export VLLM_USE_FLASHINFER_SAMPLER=0
# The host reaches nothing outside: no hub look-ups, no usage reports.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
ENVEOF
        if [[ "$SET" == vllm026 ]]; then
            # 0.26: the V1 model runner is the one whose batch-size K table and speculative path the benchmark compares
            echo "export VLLM_USE_V2_MODEL_RUNNER=0"
        else
            # 0.34: model runner V2 is the only runner (the variable is gone, and =0 is refused)
            echo "unset VLLM_USE_V2_MODEL_RUNNER"
        fi
    } > "$ENV_FILE"
}

install() {
    "$PY" "$HERE/wheelset.py" verify "$STASH"
    local work
    work="$(mktemp -d "$HOME_DIR/install.XXXXXX")"
    cat "$STASH"/"$SET"-wheels.tar.part* > "$work/$SET-wheels.tar"
    (cd "$work" && grep " $SET-wheels.tar$" "$STASH/MANIFEST.sha256" | sha256sum -c -)
    tar -xf "$work/$SET-wheels.tar" -C "$work"
    rm "$work/$SET-wheels.tar"
    rm -rf "$SITE"
    local t0=$SECONDS
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$work"/wheels/*.whl
    echo "installed $(ls "$work"/wheels | wc -l) wheels into $SITE in $((SECONDS - t0)) s"
    rm -rf "$work"
    write_env
    # shellcheck disable=SC1090
    source "$ENV_FILE"
    # vLLM's own requirements, then what the controller imports (pyproject's dependencies)
    "$PY" "$HERE/check_deps.py" vllm fastapi uvicorn pydantic-settings prometheus-client typer httpx numpy
    "$PY" -c 'import torch, vllm; print("torch", torch.__version__, "cuda", torch.version.cuda, "vllm", vllm.__version__)'
}

case "${1:-}" in
    stash) stash ;;
    install) install ;;
    env) write_env; echo "$ENV_FILE" ;;
    *) echo "usage: $0 stash|install|env [vllm026|vllm034]" >&2; exit 2 ;;
esac
