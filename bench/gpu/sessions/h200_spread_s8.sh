#!/usr/bin/env bash
# Session 8 of the `spread` sweep (ran 2026-12-02, SWEEP_BUDGET_S=1010: specctl, plain and ktable came back;
# bench/gpu/README.md, session 8): session 7's plan again. Session 7's last call was cut
# off at the session's last device seconds, and only specctl, plain and 3 k7 points came back. The aim: every
# reference the GPU execution-model targets name, measured in the same session as specctl (one session's host
# differs from another's at c >= 16 by more than the ratios claimed). In this order of priority:
#   specctl with the steady-step model at budget-bound points, every point, into a file of its own;
#   beside it in the same file: plain on low at every c (the low target) and on high at c = 256;
#   k7 on high and mixed at c <= 64 and k2 on high and mixed at c = 256 (the best static engines there in
#   sessions 4-6, the high and mixed targets);
#   the oracle (its pins from the static rows of sessions 4-7, seeded into the file below);
#   ktable's two points session 6 left (c = 256 on low and mixed); the widths at c = 256 if time is left.
set -uo pipefail
END=$(( $(date +%s) + ${SWEEP_BUDGET_S:-1480} ))
OUTDIR="${SPECCTL_BG_OUT:?}"
R=bench/gpu/results/steady
RESULTS="$OUTDIR/h200_steady_spread_s8.jsonl"
ORACLE="$OUTDIR/h200_steady_spread_oracle_s8.jsonl"
[[ -f "$ORACLE" ]] || python3 -m bench gpu.seed_static "$ORACLE" "$R/h200_steady_spread_2026-12-02_s7.jsonl" \
    "$R/h200_steady_spread_2026-12-02_s6.jsonl" "$R/h200_steady_spread_2026-12-01_s5.jsonl" \
    "$R/h200_steady_spread_k1_2026-12-01_s5.jsonl" "$R/h200_steady_spread_2026-12-01_s4.jsonl"
[[ -f "$OUTDIR/h200_steady_spread_ktable_s8.jsonl" ]] || \
    cp "$R/h200_steady_spread_ktable_2026-12-02_s6.jsonl" "$OUTDIR/h200_steady_spread_ktable_s8.jsonl"
# the engine logs hold the hook's overhead line: copy them every minute, so a cut-off call still brings them back
( while sleep 60; do cp /root/specctl-gpu/spread-state/*.log "$OUTDIR/" 2>/dev/null; done ) &
COPIER=$!
COMMON=(--state-dir /root/specctl-gpu/spread-state --allow-partial --workload spread --grace-s 10)
left() { echo $(( END - $(date +%s) )); }
sweep() { local b; b=$(left); ((b > 60)) || { echo "== no time left for: $*"; return 0; }
          echo "== $(date +%T) budget ${b}s: $*"; PYTHONUNBUFFERED=1 python3 -m bench gpu.sweep "${COMMON[@]}" --budget-s "$b" "$@"; }
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only specctl
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only plain --profiles low
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only plain --profiles high --concurrency 256
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only k7 --profiles high,mixed --concurrency 1,4,16,64
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only k2 --profiles high,mixed --concurrency 256
sweep --results "$ORACLE" --mirror "$OUTDIR/mirror_oracle" --only oracle
sweep --results "$OUTDIR/h200_steady_spread_ktable_s8.jsonl" --mirror "$OUTDIR/mirror_kt" --only ktable \
      --ktable-backports drafter_graphs
sweep --results "$OUTDIR/h200_steady_spread_widths_c256.jsonl" --mirror "$OUTDIR/mirror_widths" --premise \
      --premise-profile mixed,high --premise-concurrency 256 --premise-ks 0,1,2,4
kill "$COPIER" 2>/dev/null
cp /root/specctl-gpu/spread-state/*.log "$OUTDIR/" 2>/dev/null || true
echo "== $(date +%T) done"
