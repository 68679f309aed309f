#!/usr/bin/env bash
# Session 6 of the `spread` sweep, in one background run, in this order of priority:
#   specctl with exploration on decode-only steps only and the token-budget cap (0290135, 256a733), into a
#   file seeded with the static rows of sessions 4 and 5;
#   k1 at the points sessions 4 and 5 left (c = 64 on low and mixed, c = 256 on every profile), before the
#   oracle, so that the oracle picks each category's best static k from every static engine measured so far;
#   the oracle (mixed profile, each category pinned to that k): measured in this session beside specctl;
#   ktable with its start-up fix (resumable: what does not fit goes to the next session);
#   the widths at c = 256, mixed and high (specctl pinned at K = 0, 1, 2, 4 there: every step carries a prompt,
#   the cell table cannot price the widths, and session 5's choice on mixed, K = 4, measured 0.97x plain; the
#   token-budget model of `python -m bench gpu.budget_model` predicts each), into a file of its own;
#   the premise check (specctl pinned at K = 0, 2, 4, 7 at c = 1 and 64), into a file of its own;
#   ktable as shipped (into a file of its own: the two share the engine name).
set -uo pipefail
END=$(( $(date +%s) + ${SWEEP_BUDGET_S:-1500} ))
OUTDIR="${SPECCTL_BG_OUT:?}"
R=bench/gpu/results/steady
RESULTS="$OUTDIR/h200_steady_spread_s6.jsonl"
[[ -f "$RESULTS" ]] || python3 - "$RESULTS" "$R/h200_steady_spread_2026-12-01_s5.jsonl" \
    "$R/h200_steady_spread_k1_2026-12-01_s5.jsonl" "$R/h200_steady_spread_2026-12-01_s4.jsonl" <<'PY'
import json, sys
out, *sources = sys.argv[1:]
static = {"plain", "k1", "k2", "k4", "k7"}
seen = set()
with open(out, "w") as f:
    for path in sources:  # session 5 first: where an engine and point repeat, the newer row wins
        for line in open(path):
            row = json.loads(line)
            key = (row.get("engine"), row.get("profile"), row.get("concurrency"))
            if row.get("kind") == "row" and row.get("engine") in static and key not in seen:
                seen.add(key)
                f.write(line if line.endswith("\n") else line + "\n")
PY
COMMON=(--state-dir /root/specctl-gpu/spread-state --allow-partial --workload spread --grace-s 10)
left() { echo $(( END - $(date +%s) )); }
sweep() { local b; b=$(left); ((b > 60)) || { echo "== no time left for: $*"; return 0; }
          echo "== $(date +%T) budget ${b}s: $*"; PYTHONUNBUFFERED=1 python3 -m bench gpu.sweep "${COMMON[@]}" --budget-s "$b" "$@"; }
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only specctl
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only k1
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only oracle
sweep --results "$OUTDIR/h200_steady_spread_ktable_fixed.jsonl" --mirror "$OUTDIR/mirror_kt" --only ktable \
      --ktable-backports drafter_graphs
sweep --results "$OUTDIR/h200_steady_spread_widths_c256.jsonl" --mirror "$OUTDIR/mirror_widths" --premise \
      --premise-profile mixed,high --premise-concurrency 256 --premise-ks 0,1,2,4
sweep --results "$OUTDIR/h200_steady_spread_premise.jsonl" --mirror "$OUTDIR/mirror_premise" --premise
sweep --results "$OUTDIR/h200_steady_spread_ktable_shipped.jsonl" --mirror "$OUTDIR/mirror_kt0" --only ktable \
      --ktable-backports off
cp /root/specctl-gpu/spread-state/*.log "$OUTDIR/" 2>/dev/null || true
echo "== $(date +%T) done"
