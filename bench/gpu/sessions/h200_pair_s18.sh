#!/usr/bin/env bash
# Session 18 (planned): as many pairs as a point needs to decide at ±2 %, on fewer points. Session 17's per-pair
# ratios had a standard deviation of 0.04 (specctl beside plain, low 64), 0.08 (premise-k0 beside plain, low 64)
# and 0.10-0.18 at 256 requests with 3 s rounds: a 95 % interval of ±2 % on their mean needs 16, 62 and 100-316
# pairs (`gpu.steady_table`'s paired section). So:
#  1. premise-k0 beside plain on low at 64, 16 pairs of 3 s, each engine profiled for 40 steps after its rounds
#     with the traces kept under $OUTDIR/prof (`gpu.trace_summary` splits each step's host time, both engines of one
#     machine: where the K = 0 floor's host time goes);
#  2. specctl_skip beside plain on low at 64, 16 pairs of 3 s, fresh controller (issue 15's low target there);
#  3. specctl_skip beside K = 7 on mixed at 64, 12 pairs of 3 s, fresh controller (mixed against the best static);
#  4. specctl_skip beside plain on low at 256, 8 pairs of 8 s, fresh controller: do longer rounds take the noise of
#     a 256-request round (30-100 steps in 3 s) out of the pair ratio, or does drift come back in?
set -uo pipefail
# shellcheck source=prelude.sh
source "$(dirname "$0")/prelude.sh"
# one results file: the budget check guesses an engine start from the starts it holds (170 s on an empty file,
# where these engines started in 70-150 s), and the paired table keeps each pairing's reference rows apart
RESULTS="$OUTDIR/h200_steady_spread_s18_pair.jsonl"
export SPECCTL_BENCH_PROFILE_DIR="$OUTDIR/prof" SPECCTL_BENCH_PROFILE_STEPS=40
SPECCTL_DRAFT_AT_ZERO=skip sweep --results "$RESULTS" --premise --premise-ks 0 \
    --premise-profile low --premise-concurrency 64 --pair-with plain --rounds 16 --round-s 3
unset SPECCTL_BENCH_PROFILE_DIR
python3 -m bench gpu.trace_summary "$OUTDIR/prof" --out "$OUTDIR/trace_summary_s18.json"
fresh_controller
sweep --results "$RESULTS" --only specctl_skip --profiles low --concurrency 64 \
    --pair-with plain --rounds 16 --round-s 3 --allow-partial
fresh_controller
sweep --results "$RESULTS" --only specctl_skip --profiles mixed \
    --concurrency 64 --pair-with k7 --rounds 12 --round-s 3 --allow-partial
fresh_controller
sweep --results "$RESULTS" --only specctl_skip --profiles low --concurrency 256 \
    --pair-with plain --rounds 8 --round-s 8 --allow-partial
session_done
