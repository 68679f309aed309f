#!/usr/bin/env bash
# Session 15, third machine, the last ~7 device-minutes: the first run of paired rounds on the H200. premise-k0
# (specctl pinned at K = 0, drafter skipped) and plain start side by side on one GPU (0.44 of its memory each)
# and take turns, round by round, on low at 64 requests: the K = 0 floor with the host's drift cancelled.
set -uo pipefail
# shellcheck source=prelude.sh
source "$(dirname "$0")/prelude.sh"
RESULTS="$OUTDIR/h200_steady_spread_s15c_pair.jsonl"
SPECCTL_DRAFT_AT_ZERO=skip sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --premise --premise-ks 0 \
    --premise-profile low --premise-concurrency 64 --pair-with plain --allow-partial
session_done
