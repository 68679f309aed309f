#!/usr/bin/env bash
# vLLM 0.34 peer rows (issue "The newest vLLM"): specctl beside vLLM's own adaptive verification, on one GPU, in
# the order that answers "what does specctl add to adaptive verification" first, so a session cut short still
# brings back the rows that decide it. Run through background.sh with SPECCTL_GPU_SET=vllm034 after
# `install.sh install vllm034` (bench/gpu/README.md, "vLLM 0.34 on the device").
#  1. the day trace on one adaptive-verification engine: av (every category pinned at K = 7, vLLM's verify budget
#     inside it) and specctl_av (specctl's policy around that budget), repeats interleaved: one engine start
#     answers the question on the benchmark where load and mix change;
#  2. av: vLLM's documented configuration (enable_adaptive_verification, K = 7, stock scheduler), mixed profile at
#     c = 1, 16, 64, 256;
#  3. specctl_av: specctl composed with it, same points;
#  4. specctl alone, mixed at the same points;
#  5. the day trace on a plain specctl engine: specctl, k4, k2, k0, k7;
#  6. plain and static K, the K table, then the high and low profiles for every engine.
# Resumable: every row lands in $OUTDIR at once (background.sh brings it back), and rows already in
# bench/gpu/results/v034/ (committed from an earlier session) are not measured again.
set -uo pipefail
# shellcheck source=prelude.sh
source "$(dirname "$0")/prelude.sh"
SEED=bench/gpu/results/v034
STEADY="$OUTDIR/v034_steady.jsonl"
TRACE="$OUTDIR/v034_day.jsonl"
for f in v034_steady.jsonl v034_day.jsonl; do
    [[ -f "$SEED/$f" && ! -f "$OUTDIR/$f" ]] && cp "$SEED/$f" "$OUTDIR/$f"
done
COMMON+=(--model-runner default)  # 0.34: model runner V2 is the only runner (VLLM_USE_V2_MODEL_RUNNER=0 refused)
python3 -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)'
trace() { local b; b=$(left); ((b > 120)) || { echo "== no time left for trace: $*"; return 0; }
          echo "== $(date +%T) budget ${b}s: trace $*"
          PYTHONUNBUFFERED=1 python3 -m bench trace --results "$TRACE" --state-dir "$STATE/trace" --mirror "$OUTDIR" \
              --budget-s "$b" --duration-s "${TRACE_DURATION_S:-40}" --profile eagle3-published --repeats "${TRACE_REPEATS:-2}" \
              --model-runner default "$@"
          cp "$STATE"/trace/controller.log "$OUTDIR/trace_controller.log" 2>/dev/null || true; }
MIXED=(--profiles mixed --concurrency 1,16,64,256)
trace --adaptive-verification --configs av,specctl_av
sweep --results "$STEADY" --only av "${MIXED[@]}"
fresh_controller
sweep --results "$STEADY" --only specctl_av "${MIXED[@]}"
fresh_controller
sweep --results "$STEADY" --only specctl "${MIXED[@]}"
trace --configs specctl,k4,k2,k0,k7
sweep --results "$STEADY" --only plain,k4,k2,ktable,k1,k7 "${MIXED[@]}"
fresh_controller
sweep --results "$STEADY" --only av,specctl_av,specctl,plain,k4,k2,ktable,k1,k7 --profiles high,low \
    --concurrency 1,16,64,256
python3 -m bench gpu.steady_table "$STEADY" > "$OUTDIR/v034_steady_table.md" 2>&1 || true
session_done
