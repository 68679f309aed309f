# Sourced by the device run scripts (bench/gpu/sessions/v034_peers.sh): the sweep's budget clock, the
# engine-log copier and `sweep`, one call of `bench gpu.sweep` with what is left of the budget.
#   SWEEP_BUDGET_S   seconds the whole session script may run (default 1480)
#   SPECCTL_BG_OUT   the folder background.sh packs and brings back
# `fresh_controller` deletes the controller's store before a pass that must start from a cold controller.
# The engine logs hold the hook's overhead line: they are copied every minute, so a cut-off call still brings
# them back; `session_done` stops the copier and copies them once more.
END=$(( $(date +%s) + ${SWEEP_BUDGET_S:-1480} ))
OUTDIR="${SPECCTL_BG_OUT:?}"
R=bench/gpu/results/steady
STATE=/root/specctl-gpu/spread-state
( while sleep 60; do cp "$STATE"/*.log "$OUTDIR/" 2>/dev/null; done ) >/dev/null 2>&1 &  # holds no output open
COPIER=$!
COMMON=(--state-dir "$STATE" --allow-partial --workload spread --grace-s 10)
left() { echo $(( END - $(date +%s) )); }
sweep() { local b; b=$(left); ((b > 60)) || { echo "== no time left for: $*"; return 0; }
          echo "== $(date +%T) budget ${b}s: $*"; PYTHONUNBUFFERED=1 python3 -m bench gpu.sweep "${COMMON[@]}" --budget-s "$b" "$@"; }
# The sweep restores the controller's learned state from its SQLite store: a pass meant to start cold deletes it.
fresh_controller() { rm -f "$STATE"/controller/specctl.db* 2>/dev/null || true; }
session_done() { kill "$COPIER" 2>/dev/null; cp "$STATE"/*.log "$OUTDIR/" 2>/dev/null || true; echo "== $(date +%T) done"; }
