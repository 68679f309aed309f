#!/usr/bin/env bash
# On the GPU host (no network): gather the carried parts, check them, install vLLM 0.26 into a scratch folder.
#
#   bench/gpu/install.sh stash     # every call that carries a part: keep bench/gpu/parts/NN/* outside the checkout
#   bench/gpu/install.sh install   # once all parts are stashed: join, sha256-check, pip install --target, check deps
#   source "$(bench/gpu/install.sh env)"   # PYTHONPATH and the variables vLLM 0.26 needs there
#
# The checkout is re-sent with every call, so parts are kept in $SPECCTL_GPU_HOME (default /root/specctl-gpu),
# which lives as long as the machine stays warm.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PY="${PY:-python3}"
HOME_DIR="${SPECCTL_GPU_HOME:-/root/specctl-gpu}"
STASH="$HOME_DIR/parts"
SITE="$HOME_DIR/site"
ENV_FILE="$HOME_DIR/env.sh"

stash() {
    mkdir -p "$STASH"
    shopt -s nullglob
    local parts=("$HERE"/parts/*/vllm026-wheels.tar.part*) manifests=("$HERE"/parts/*/MANIFEST.sha256)
    ((${#parts[@]})) || { echo "no parts under $HERE/parts" >&2; exit 1; }
    cp "${parts[@]}" "$STASH/"
    cp "${manifests[0]}" "$STASH/"
    ls -l "$STASH"
}

write_env() {
    mkdir -p "$HOME_DIR"
    cat > "$ENV_FILE" <<ENVEOF
# The checkout provides specctl_vllm/, whose links reach controller/ and engine_patch/ (vLLM finds the scheduler
# by --scheduler-cls; the plugin entry point only logs the version check, so the package itself need not be
# installed).
export PYTHONPATH="$REPO:$SITE\${PYTHONPATH:+:\$PYTHONPATH}"
export PATH="$SITE/bin:\$PATH"
# flashinfer's sampler JIT-compiles with nvcc, which is not carried; the V1 model runner is the one whose
# batch-size K table and speculative path the benchmark compares.
export VLLM_USE_FLASHINFER_SAMPLER=0
export VLLM_USE_V2_MODEL_RUNNER=0
# The host reaches nothing outside: no hub look-ups, no usage reports.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
ENVEOF
}

install() {
    "$PY" "$HERE/wheelset.py" verify "$STASH"
    local work
    work="$(mktemp -d)"
    cat "$STASH"/vllm026-wheels.tar.part* > "$work/vllm026-wheels.tar"
    (cd "$work" && grep ' vllm026-wheels.tar$' "$STASH/MANIFEST.sha256" | sha256sum -c -)
    tar -xf "$work/vllm026-wheels.tar" -C "$work"
    rm "$work/vllm026-wheels.tar"
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
}

case "${1:-}" in
    stash) stash ;;
    install) install ;;
    env) write_env; echo "$ENV_FILE" ;;
    *) echo "usage: $0 stash|install|env" >&2; exit 2 ;;
esac
