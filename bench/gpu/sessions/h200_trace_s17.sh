#!/usr/bin/env bash
# Session 17, the device time left after h200_pair_s16.sh (about 7 minutes, a fresh machine): the K = 0 step's
# host side. Session 17's profiles showed a pinned K = 0 step of the EAGLE-3 engine spends the same device time
# as plain's decode step (6.06 / 6.04 ms at 64 requests) but 1.8 ms more between steps: the host, not the GPU.
# The traces themselves come back this time (40 steps each) so their CPU events can be read per annotation
# (`gpu.trace_summary --host`): premise-k0 (drafter skipped) at low 64, then plain there if the budget allows.
set -uo pipefail
# shellcheck source=prelude.sh
source "$(dirname "$0")/prelude.sh"
export SPECCTL_BENCH_PROFILE_DIR="$OUTDIR/prof" SPECCTL_BENCH_PROFILE_STEPS=40
SPECCTL_DRAFT_AT_ZERO=skip sweep --results "$OUTDIR/h200_trace_s17.jsonl" --premise --premise-ks 0 \
    --premise-profile low --premise-concurrency 64 --rounds 2 --round-s 3
sweep --results "$OUTDIR/h200_trace_s17.jsonl" --only plain --profiles low --concurrency 64 --rounds 2 --round-s 3
session_done
