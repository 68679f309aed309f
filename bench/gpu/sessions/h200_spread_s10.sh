#!/usr/bin/env bash
# Session 10 of the `spread` sweep. Code: the counting call installed on the scheduler instance (86f8762) and the
# width rule reused across steps (widths.py), neither GPU-measured before. One machine, references beside it:
#   specctl_skip (K = 0 steps without the drafter's pass) at every point: the low profile at c >= 64 is the
#     point it exists for; its first point (high, c = 1) runs on a fresh controller: the cold start;
#     if it does not start, specctl (catch-up at K = 0) at c = 64 and 256 instead;
#   plain at every c (low; plain does not depend on acceptance);
#   K = 7 on high and mixed at c <= 64 (the best static engine there in sessions 4-8; its first point is the
#     cold-start reference), K = 2 on high and mixed at 256;
#   the oracle (seeded from sessions 4-9's static rows) at c = 64 and 256 with what is left.
set -uo pipefail
# shellcheck source=prelude.sh
source "$(dirname "$0")/prelude.sh"
RESULTS="$OUTDIR/h200_steady_spread_s10.jsonl"
ORACLE="$OUTDIR/h200_steady_spread_oracle_s10.jsonl"
[[ -f "$ORACLE" ]] || python3 -m bench gpu.seed_static "$ORACLE" "$R/h200_steady_spread_2026-12-03_s9.jsonl" \
    "$R/h200_steady_spread_2026-12-02_s8.jsonl" "$R/h200_steady_spread_2026-12-02_s7.jsonl" \
    "$R/h200_steady_spread_2026-12-02_s6.jsonl" "$R/h200_steady_spread_2026-12-01_s5.jsonl" \
    "$R/h200_steady_spread_k1_2026-12-01_s5.jsonl" "$R/h200_steady_spread_2026-12-01_s4.jsonl"
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only specctl_skip
grep -q '"engine": "specctl_skip", "profile"' "$RESULTS" 2>/dev/null || \
    sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only specctl --concurrency 64,256
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only plain --profiles low
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only k7 --profiles high,mixed --concurrency 1,4,16,64
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only k2 --profiles high,mixed --concurrency 256
sweep --results "$ORACLE" --mirror "$OUTDIR/mirror_oracle" --only oracle --concurrency 64,256
session_done
