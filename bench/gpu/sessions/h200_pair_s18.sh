#!/usr/bin/env bash
# Session 18 (planned): the K = 0 floor on one machine, with both engines' traces, then the targets not yet paired.
# Session 17 measured premise-k0 (pinned K = 0, drafter skipped) at 0.925x plain paired at 64 and 0.904x at 256;
# its decode steps spent the same device time as plain's (6.06 / 6.04 ms at 64) and 1.8 ms more between steps,
# and the engine core's host cost at K = 0 is 1.07x plain's on the CPU bench (+69 us at 64, bench engine_core_ab):
# the rest is the model runner's side. Session 15c measured the same pair at 1.024x on another machine.
#  1. premise-k0 beside plain on low at 64 and 256, paired, each engine profiled for 40 steps after its rounds
#     with the traces kept under $OUTDIR/prof (they come back: `gpu.trace_summary` splits each step's host time
#     into execute_model, synchronize waits, other calls and untraced, for both engines of one machine);
#  2. specctl_skip beside K = 7 on mixed at 64 (the mixed target against the best static there), fresh controller;
#  3. specctl_skip beside plain on high at 256 (high's ">= 0.97x plain at 256"), fresh controller.
set -uo pipefail
# shellcheck source=prelude.sh
source "$(dirname "$0")/prelude.sh"
PAIRED=(--rounds 6 --round-s 3)
export SPECCTL_BENCH_PROFILE_DIR="$OUTDIR/prof" SPECCTL_BENCH_PROFILE_STEPS=40
SPECCTL_DRAFT_AT_ZERO=skip sweep --results "$OUTDIR/h200_steady_spread_s18_pair.jsonl" --premise --premise-ks 0 \
    --premise-profile low --premise-concurrency 64,256 --pair-with plain "${PAIRED[@]}"
unset SPECCTL_BENCH_PROFILE_DIR
python3 -m bench gpu.trace_summary "$OUTDIR/prof" --out "$OUTDIR/trace_summary_s18.json"
fresh_controller
sweep --results "$OUTDIR/h200_steady_spread_s18_pair_mixed_k7.jsonl" --only specctl_skip --profiles mixed \
    --concurrency 64 --pair-with k7 "${PAIRED[@]}" --allow-partial
fresh_controller
sweep --results "$OUTDIR/h200_steady_spread_s18_pair_high_plain.jsonl" --only specctl_skip --profiles high \
    --concurrency 256 --pair-with plain "${PAIRED[@]}" --allow-partial
session_done
