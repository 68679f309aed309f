#!/usr/bin/env bash
# Session 9 of the `spread` sweep (planned, not run yet). Session 8 measured specctl with the per-width fixed
# step cost at every point, beside plain, but its budget ran out before K = 7, K = 2 and the oracle; at
# c >= 64 low missed plain (K = 0 at 64, K = 1 at 256: the meter had timed one width). Since then the chooser
# explores on budget-bound steps. Aim, budget-bound points first, each beside its same-session references:
#   specctl at c = 64 and 256 (every profile), plain there (low at 64 and 256, high at 256);
#   K = 2 on high and mixed at 256, K = 7 on high and mixed at 64 (the best static engines there, sessions 4-7);
#   specctl_skip (K = 0 steps without the drafter's pass) on low and mixed at 64 and 256: plain's cost at K = 0,
#   and what the drafter's missed positions cost the categories that draft;
#   the oracle (seeded from sessions 4-8); then specctl and K = 7 at c <= 16; widths at c = 256 if time is left.
set -uo pipefail
# shellcheck source=prelude.sh
source "$(dirname "$0")/prelude.sh"
RESULTS="$OUTDIR/h200_steady_spread_s9.jsonl"
ORACLE="$OUTDIR/h200_steady_spread_oracle_s9.jsonl"
[[ -f "$ORACLE" ]] || python3 -m bench gpu.seed_static "$ORACLE" "$R/h200_steady_spread_2026-12-02_s8.jsonl" \
    "$R/h200_steady_spread_2026-12-02_s7.jsonl" \
    "$R/h200_steady_spread_2026-12-02_s6.jsonl" "$R/h200_steady_spread_2026-12-01_s5.jsonl" \
    "$R/h200_steady_spread_k1_2026-12-01_s5.jsonl" "$R/h200_steady_spread_2026-12-01_s4.jsonl"
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only specctl --concurrency 64,256
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only plain --profiles low --concurrency 64,256
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only plain --profiles high --concurrency 256
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only k2 --profiles high,mixed --concurrency 256
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only k7 --profiles high,mixed --concurrency 64
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only specctl_skip --profiles low,mixed --concurrency 64,256
sweep --results "$ORACLE" --mirror "$OUTDIR/mirror_oracle" --only oracle
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only specctl
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only k7 --profiles high,mixed --concurrency 1,4,16
sweep --results "$OUTDIR/h200_steady_spread_widths_c256.jsonl" --mirror "$OUTDIR/mirror_widths" --premise \
      --premise-profile mixed,high --premise-concurrency 256 --premise-ks 0,1,2,4
session_done
