#!/usr/bin/env bash
# Session 16 (planned): every comparison in paired rounds (steady.py), 6 pairs of 3 s per point. Session 15
# found engines run one after another 16 % apart on the same configuration (ktable0: 1.09x plain on one machine,
# 0.84x on the next) and measured the K = 0 floor paired at 1.024x plain at 64 (pairs 0.896-1.038, 3 pairs).
# In the order the budget answers them:
#  1. specctl_skip from a fresh controller beside plain: low then mixed at 64, then at 256 (issue 15's low and
#     mixed targets against plain, drift cancelled);
#  2. premise-k0 (pinned K = 0, drafter skipped) beside plain on low at 64 and 256, each engine profiled alone
#     for 60 steps after its rounds: `gpu.trace_summary` compares decode-only steps (trace_summary_s16.json);
#  3. specctl_skip beside K = 7 on high at 1 and 16 (the high target against the best static there);
#  4. where time is left, specctl_skip beside K = 7 on mixed at 64 (K = 7 was the best static there in session 12,
#     1.10x plain; 0.99x in session 14): the mixed target against the best static, paired.
set -uo pipefail
# shellcheck source=prelude.sh
source "$(dirname "$0")/prelude.sh"
RESULTS="$OUTDIR/h200_steady_spread_s16_pair.jsonl"
PAIRED=(--rounds 6 --round-s 3)
PROFILES=/root/specctl-gpu/profiles
rm -rf "$PROFILES"
fresh_controller
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only specctl_skip --profiles low,mixed --concurrency 64,256 \
    --pair-with plain "${PAIRED[@]}"
export SPECCTL_BENCH_PROFILE_DIR="$PROFILES" SPECCTL_BENCH_PROFILE_STEPS=60
SPECCTL_DRAFT_AT_ZERO=skip sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --premise --premise-ks 0 \
    --premise-profile low --premise-concurrency 64,256 --pair-with plain "${PAIRED[@]}"
unset SPECCTL_BENCH_PROFILE_DIR
python3 -m bench gpu.trace_summary "$PROFILES" --out "$OUTDIR/trace_summary_s16.json"
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only specctl_skip --profiles high --concurrency 1,16 \
    --pair-with k7 "${PAIRED[@]}" --allow-partial
sweep --results "$OUTDIR/h200_steady_spread_s16_pair_mixed_k7.jsonl" --mirror "$OUTDIR/mirror" --only specctl_skip \
    --profiles mixed --concurrency 64 --pair-with k7 "${PAIRED[@]}" --allow-partial
session_done
