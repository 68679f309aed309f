#!/usr/bin/env bash
# Session 4 of the `spread` sweep, in one background run:
#   k2 into session 3's results (session 3's rows are copied in first, so the tables join both sessions; K=2 was
#   the best static setting at c = 256 high in the `fixed` sessions);
#   specctl again, into a file of its own: the code after session 3's fixes (drafts of an 'off' category counted
#   under the engine's drafter, no per-request k adaptation in graph-shaped steps, the per-section overhead line);
#   k4 a second time, into a file of its own: the spread between two starts of one engine (session 3 measured
#   k4 at every point).
# Next after it: ktable (both variants), k1, k7's missing points, the oracle, the premise check.
set -uo pipefail
END=$(( $(date +%s) + ${SWEEP_BUDGET_S:-1500} ))
OUTDIR="${SPECCTL_BG_OUT:?}"
RESULTS="$OUTDIR/h200_steady_spread.jsonl"
[[ -f "$RESULTS" ]] || cp bench/gpu/results/steady/h200_steady_spread_2026-12-01_s3.jsonl "$RESULTS"
COMMON=(--state-dir /root/specctl-gpu/spread-state --allow-partial --workload spread --grace-s 10)
left() { echo $(( END - $(date +%s) )); }
sweep() { local b; b=$(left); ((b > 60)) || { echo "== no time left for: $*"; return 0; }
          echo "== $(date +%T) budget ${b}s: $*"; PYTHONUNBUFFERED=1 python3 -m bench gpu.sweep "${COMMON[@]}" --budget-s "$b" "$@"; }
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only k2
sweep --results "$OUTDIR/h200_steady_spread_specctl_after.jsonl" --mirror "$OUTDIR/mirror_after" --only specctl
sweep --results "$OUTDIR/h200_steady_spread_k4_second.jsonl" --mirror "$OUTDIR/mirror_k4" --only k4
cp /root/specctl-gpu/spread-state/*.log "$OUTDIR/" 2>/dev/null || true
echo "== $(date +%T) done"
