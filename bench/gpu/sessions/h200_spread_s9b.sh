#!/usr/bin/env bash
# Session 9, second machine: the first one went back mid-sweep (a call came late) after specctl at c = 64 and 256
# on every profile and plain on low at c = 64 (rows in results/steady/h200_steady_spread_2026-12-03_s9.jsonl).
# The sweep resumes from those rows: plain at low 256 (plain stands for every profile), then the best static
# engines beside specctl.
set -uo pipefail
# shellcheck source=prelude.sh
source "$(dirname "$0")/prelude.sh"
RESULTS="$OUTDIR/h200_steady_spread_s9.jsonl"
[[ -f "$RESULTS" ]] || cp "$R/h200_steady_spread_2026-12-03_s9.jsonl" "$RESULTS"
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only plain --profiles low --concurrency 64,256
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only k2 --profiles high,mixed --concurrency 256
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only k7 --profiles high,mixed --concurrency 64
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only specctl_skip --profiles low,mixed --concurrency 64,256
session_done
