#!/usr/bin/env bash
# Session 15, second machine. The first machine of the session (h200_spread_s15.sh) measured plain and ktable0
# on low at 64 and 256, then was handed back between two calls and its state lost. On the second machine, in
# the order the remaining budget answers them:
#  1. plain and premise-k0 (K = 0 pinned, drafter skipped) on low at 64 and 256, each point's load profiled for
#     40 steps after its timed rounds; `gpu.trace_summary` writes trace_summary_s15b.json;
#  2. specctl_skip from a fresh controller, low then mixed at 64, then at 256;
#  3. ktable0 at 64 on this machine.
set -uo pipefail
# shellcheck source=prelude.sh
source "$(dirname "$0")/prelude.sh"
FIRST="$OUTDIR/h200_steady_spread_s15b.jsonl"
PROFILES=/root/specctl-gpu/profiles
rm -rf "$PROFILES"
export SPECCTL_BENCH_PROFILE_DIR="$PROFILES" SPECCTL_BENCH_PROFILE_STEPS=40
sweep --results "$FIRST" --mirror "$OUTDIR/mirror" --only plain --profiles low --concurrency 64,256
SPECCTL_DRAFT_AT_ZERO=skip sweep --results "$FIRST" --mirror "$OUTDIR/mirror" --premise --premise-ks 0 \
    --premise-profile low --premise-concurrency 64,256
unset SPECCTL_BENCH_PROFILE_DIR
python3 -m bench gpu.trace_summary "$PROFILES" --steps 40 --out "$OUTDIR/trace_summary_s15b.json"
fresh_controller
sweep --results "$FIRST" --mirror "$OUTDIR/mirror" --only specctl_skip --profiles low,mixed --concurrency 64,256
sweep --results "$FIRST" --mirror "$OUTDIR/mirror" --only ktable0 --profiles low --concurrency 64
session_done
