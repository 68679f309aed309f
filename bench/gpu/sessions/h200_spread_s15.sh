#!/usr/bin/env bash
# Session 15 (planned). Session 14 measured the speculative engine pinned at K = 0 with the drafter skipped
# (premise-k0) at 1.11x plain's step time at 64 requests and 1.03x at 256 (0.90x and 0.97x plain's tok/s),
# the same dispatch mix as plain's: the floor under specctl on low-acceptance traffic. It also saw mixed at 64
# hold K = 0 for 15 s on a verdict taken on low traffic (0.83x plain); the measured check now reads a drafting
# width for today's traffic. In the order the budget answers them:
#  1. plain, vLLM's own engine held at K = 0 by its batch-size table with the drafter skipped and no specctl
#     hook (ktable0), and premise-k0, on low at 64 and 256: how much of the K = 0 gap is vLLM's speculative
#     engine and how much specctl's hook (the bench's acceptance mask no longer runs on K = 0 steps);
#  2. specctl_skip from a fresh controller, low then mixed at 64 (the traffic shift), then at 256;
#  3. a second pass of plain and ktable0 at 64, fresh engines.
# The engines of (1) also run each point's load for 40 steps under vLLM's torch profiler after its timed rounds
# (outside them): `gpu.trace_summary` turns the traces into device busy time and idle gaps per step, syncs and
# kernels (trace_summary_s15.json; the traces stay on the host).
set -uo pipefail
# shellcheck source=prelude.sh
source "$(dirname "$0")/prelude.sh"
FIRST="$OUTDIR/h200_steady_spread_s15.jsonl"
SECOND="$OUTDIR/h200_steady_spread_s15_second.jsonl"
PROFILES=/root/specctl-gpu/profiles
rm -rf "$PROFILES"
export SPECCTL_BENCH_PROFILE_DIR="$PROFILES" SPECCTL_BENCH_PROFILE_STEPS=40
sweep --results "$FIRST" --mirror "$OUTDIR/mirror" --only plain --profiles low --concurrency 64,256
sweep --results "$FIRST" --mirror "$OUTDIR/mirror" --only ktable0 --profiles low --concurrency 64,256
SPECCTL_DRAFT_AT_ZERO=skip sweep --results "$FIRST" --mirror "$OUTDIR/mirror" --premise --premise-ks 0 \
    --premise-profile low --premise-concurrency 64,256
unset SPECCTL_BENCH_PROFILE_DIR
python3 -m bench gpu.trace_summary "$PROFILES" --steps 40 --out "$OUTDIR/trace_summary_s15.json"
fresh_controller
sweep --results "$FIRST" --mirror "$OUTDIR/mirror" --only specctl_skip --profiles low,mixed --concurrency 64,256
sweep --results "$SECOND" --mirror "$OUTDIR/mirror_second" --only plain --profiles low --concurrency 64
sweep --results "$SECOND" --mirror "$OUTDIR/mirror_second" --only ktable0 --profiles low --concurrency 64
session_done
