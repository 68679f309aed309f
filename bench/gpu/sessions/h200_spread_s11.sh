#!/usr/bin/env bash
# Session 11 of the `spread` sweep (ran 2026-12-03: every engine up to K = 2; the machine went back before the
# oracle and the catch-up engine, bench/gpu/README.md *session 11*). Session 10 (one machine) left low at c = 256 at 0.82x plain (K = 2: the meter
# had timed K = 0 only on switch steps), mixed at c = 16 at 0.89x K = 7, and no oracle. Since then the meter skips
# the first step at a new width, explores in runs of two and fits a jump at the first drafted position
# (docs/policy.md, *Measured in session 10*). c = 1 and 4 met their targets in session 10 and the meter's change
# acts only where steps fill the token budget, so this session spends one machine on c = 16, 64 and 256, each
# point beside its same-machine references:
#   specctl_skip at c = 16, 64, 256 on every profile (its first point, high c = 16, on a fresh controller: the
#     cold start against K = 7's warm-up at the same point);
#   plain at c = 16, 64, 256 (low; plain does not depend on acceptance); K = 7 on high and mixed at c = 16 and 64,
#     K = 2 on high and mixed at 256 (the best static engines there in sessions 4-10);
#   the oracle (seeded from sessions 4-10's static rows) at c = 16, 64, 256;
#   with what is left: specctl (the drafter's catch-up at K = 0) at c = 256.
set -uo pipefail
# shellcheck source=prelude.sh
source "$(dirname "$0")/prelude.sh"
RESULTS="$OUTDIR/h200_steady_spread_s11.jsonl"
ORACLE="$OUTDIR/h200_steady_spread_oracle_s11.jsonl"
[[ -f "$ORACLE" ]] || python3 -m bench gpu.seed_static "$ORACLE" "$R/h200_steady_spread_2026-12-03_s10.jsonl" \
    "$R/h200_steady_spread_2026-12-03_s9.jsonl" "$R/h200_steady_spread_2026-12-02_s8.jsonl" \
    "$R/h200_steady_spread_2026-12-02_s7.jsonl" "$R/h200_steady_spread_2026-12-02_s6.jsonl" \
    "$R/h200_steady_spread_2026-12-01_s5.jsonl" "$R/h200_steady_spread_k1_2026-12-01_s5.jsonl" \
    "$R/h200_steady_spread_2026-12-01_s4.jsonl"
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only specctl_skip --concurrency 16,64,256
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only plain --profiles low --concurrency 16,64,256
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only k7 --profiles high,mixed --concurrency 16,64
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only k2 --profiles high,mixed --concurrency 256
sweep --results "$ORACLE" --mirror "$OUTDIR/mirror_oracle" --only oracle --concurrency 16,64,256
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only specctl --concurrency 256
session_done
