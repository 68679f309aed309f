#!/usr/bin/env bash
# Session 5, the device time left after h200_spread_s5.sh: k1, resumable (its rows go into session 5's file).
set -uo pipefail
OUTDIR="${SPECCTL_BG_OUT:?}"
PYTHONUNBUFFERED=1 python3 -m bench gpu.sweep --results "$OUTDIR/h200_steady_spread_s5.jsonl" \
  --state-dir /root/specctl-gpu/spread-state --mirror "$OUTDIR/mirror" --allow-partial --workload spread \
  --grace-s 10 --budget-s "${SWEEP_BUDGET_S:-300}" --only k1
cp /root/specctl-gpu/spread-state/k1.log "$OUTDIR/" 2>/dev/null || true
echo "== $(date +%T) done"
