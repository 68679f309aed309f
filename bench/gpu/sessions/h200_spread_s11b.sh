#!/usr/bin/env bash
# Session 11, second machine: the oracle at c = 16, 64, 256 (seeded from sessions 4-10's static rows), the one
# engine of h200_spread_s11.sh that did not run before the first machine went back. Its rows sit beside the first
# machine's in the same session: ratios to them are across machines (as session 9's c = 256 column).
set -uo pipefail
# shellcheck source=prelude.sh
source "$(dirname "$0")/prelude.sh"
ORACLE="$OUTDIR/h200_steady_spread_oracle_s11.jsonl"
[[ -f "$ORACLE" ]] || python3 -m bench gpu.seed_static "$ORACLE" "$R/h200_steady_spread_2026-12-03_s10.jsonl" \
    "$R/h200_steady_spread_2026-12-03_s9.jsonl" "$R/h200_steady_spread_2026-12-02_s8.jsonl" \
    "$R/h200_steady_spread_2026-12-02_s7.jsonl" "$R/h200_steady_spread_2026-12-02_s6.jsonl" \
    "$R/h200_steady_spread_2026-12-01_s5.jsonl" "$R/h200_steady_spread_k1_2026-12-01_s5.jsonl" \
    "$R/h200_steady_spread_2026-12-01_s4.jsonl"
sweep --results "$ORACLE" --mirror "$OUTDIR/mirror_oracle" --only oracle --concurrency 16,64,256
session_done
