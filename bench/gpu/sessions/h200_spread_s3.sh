#!/usr/bin/env bash
# Session 3 on one H200 (2026-12-01): the `spread` workload, one sweep run in the background for the whole
# device budget (bench/gpu/background.sh). Engines in order of what the table needs most; each gets the time
# left until one shared deadline, so whatever does not fit is the tail of this list.
#   plain (high only: its throughput does not depend on acceptance), specctl, k4 (every point),
#   k7 (c <= 16, where it was the best static setting), k2 (c = 256 and 64, where it was).
set -uo pipefail
END=$(( $(date +%s) + ${SWEEP_BUDGET_S:-1500} ))
OUTDIR="${SPECCTL_BG_OUT:?}"
R=(--results "$OUTDIR/h200_steady_spread.jsonl" --state-dir /root/specctl-gpu/spread-state
   --mirror "$OUTDIR/mirror" --allow-partial --workload spread --grace-s 10)
left() { echo $(( END - $(date +%s) )); }
sweep() { local b; b=$(left); ((b > 60)) || { echo "== no time left for: $*"; return 0; }
          echo "== $(date +%T) budget ${b}s: $*"; PYTHONUNBUFFERED=1 python3 -m bench gpu.sweep "${R[@]}" --budget-s "$b" "$@"; }
sweep --only plain --profiles high
sweep --only specctl
sweep --only k4
sweep --only k7 --concurrency 1,4,16
sweep --only k2 --concurrency 256,64
cp /root/specctl-gpu/spread-state/*.log "$OUTDIR/" 2>/dev/null || true
echo "== $(date +%T) done"
