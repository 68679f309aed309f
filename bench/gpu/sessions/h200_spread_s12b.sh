#!/usr/bin/env bash
# Session 12, what was left of the same machine after h200_spread_s12.sh: a second pass of specctl_skip (a fresh
# engine; the controller restores the first pass's learned state from its SQLite store) on low and mixed at c = 64 and 256, and plain beside it: the points the measured check
# moved, measured twice.
set -uo pipefail
# shellcheck source=prelude.sh
source "$(dirname "$0")/prelude.sh"
RESULTS="$OUTDIR/h200_steady_spread_s12b.jsonl"
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror_b" --only specctl_skip --profiles low,mixed --concurrency 64,256
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror_b" --only plain --profiles low --concurrency 64,256
session_done
