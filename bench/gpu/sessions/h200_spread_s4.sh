#!/usr/bin/env bash
# Session 4 (planned, not run yet): the `spread` sweep's static rows session 3 did not reach, into the same
# results (session 3's rows are copied in first, so the sweep skips them and the tables join both sessions).
#   k2 (best static at c = 256 high in the `fixed` sessions), vLLM's K table with only its start-up fix
#   (`--ktable-backports drafter_graphs`), k1, then k7's missing points (mixed c = 16, every profile at 64, 256).
# Next after it: `--only oracle` (needs every static row), `--premise`, a second start of specctl into a file of
# its own (the spread between starts), `ktable --ktable-backports off` into a file of its own (as shipped).
set -uo pipefail
END=$(( $(date +%s) + ${SWEEP_BUDGET_S:-1500} ))
OUTDIR="${SPECCTL_BG_OUT:?}"
RESULTS="$OUTDIR/h200_steady_spread.jsonl"
[[ -f "$RESULTS" ]] || cp bench/gpu/results/steady/h200_steady_spread_2026-12-01_s3.jsonl "$RESULTS"
R=(--results "$RESULTS" --state-dir /root/specctl-gpu/spread-state --mirror "$OUTDIR/mirror" --allow-partial
   --workload spread --grace-s 10)
left() { echo $(( END - $(date +%s) )); }
sweep() { local b; b=$(left); ((b > 60)) || { echo "== no time left for: $*"; return 0; }
          echo "== $(date +%T) budget ${b}s: $*"; PYTHONUNBUFFERED=1 python3 -m bench gpu.sweep "${R[@]}" --budget-s "$b" "$@"; }
sweep --only k2
sweep --only ktable --ktable-backports drafter_graphs
sweep --only k1
sweep --only k7
cp /root/specctl-gpu/spread-state/*.log "$OUTDIR/" 2>/dev/null || true
echo "== $(date +%T) done"
