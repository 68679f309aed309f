#!/usr/bin/env bash
# On the GPU host, through bench/gpu/background.sh: the day trace, every configuration, resumable.
#   TRACE_DURATION_S  the day scaled to this many seconds (default 66)
#   TRACE_PROFILE     acceptance profile in bench/trace/profiles.json (default eagle3-published)
#   TRACE_REPEATS     repeats, interleaved (default 3)
#   SWEEP_BUDGET_S    seconds the whole script may run (default 1500)
set -uo pipefail
OUTDIR="${SPECCTL_BG_OUT:?}"
STATE=/root/specctl-gpu/trace-state
mkdir -p "$STATE"
PYTHONUNBUFFERED=1 python3 -m bench trace --results /root/specctl-gpu/trace/day.jsonl --state-dir "$STATE" \
    --mirror "$OUTDIR" --budget-s "${SWEEP_BUDGET_S:-1500}" --duration-s "${TRACE_DURATION_S:-66}" \
    --profile "${TRACE_PROFILE:-eagle3-published}" --repeats "${TRACE_REPEATS:-3}" ${TRACE_ARGS:-}
cp "$STATE"/controller.log "$OUTDIR/" 2>/dev/null || true
echo "== $(date +%T) done"
