#!/usr/bin/env bash
# Session 5 of the `spread` sweep (ran 2026-12-01: bench/gpu/README.md, session 5), in one background run, into a file of its own so that
# one session holds specctl beside plain and K=7 at every point (session 4 had K=2 and K=4 only; session 3's K=7
# stopped at c = 16): plain (its rows stand for every profile), k7, specctl.
# Next after it: ktable with its start-up fix (`--ktable-backports drafter_graphs`) and as shipped (`off`, each
# into a file of its own: the two variants share the engine name), k1, then `--only oracle` and `--premise`.
set -uo pipefail
END=$(( $(date +%s) + ${SWEEP_BUDGET_S:-1500} ))
OUTDIR="${SPECCTL_BG_OUT:?}"
RESULTS="$OUTDIR/h200_steady_spread_s5.jsonl"
R=(--results "$RESULTS" --state-dir /root/specctl-gpu/spread-state --mirror "$OUTDIR/mirror" --allow-partial
   --workload spread --grace-s 10)
left() { echo $(( END - $(date +%s) )); }
sweep() { local b; b=$(left); ((b > 60)) || { echo "== no time left for: $*"; return 0; }
          echo "== $(date +%T) budget ${b}s: $*"; PYTHONUNBUFFERED=1 python3 -m bench gpu.sweep "${R[@]}" --budget-s "$b" "$@"; }
sweep --only plain --profiles high
sweep --only specctl
sweep --only k7
cp /root/specctl-gpu/spread-state/*.log "$OUTDIR/" 2>/dev/null || true
echo "== $(date +%T) done"
