#!/usr/bin/env bash
# Session 12 of the `spread` sweep. Since session 11 the engine holds the width rule's drafting width to what it
# measured: a width above 0 runs only while its goodput over every timed step of its runs beats K = 0's in the
# batch bucket by a confidence margin, with probe runs of the width that lacks evidence
# (controller/core/model/measured.py; docs/policy.md, *The measured check*). Session 11 left low at c = 64 and 256
# (0.80x, 0.86x plain) and mixed at c = 64 (0.79x the best static) on drafting widths where plain committed more.
# One machine, every point beside its same-machine references, most important first (the sweep resumes):
#   specctl_skip at c = 16, 64, 256, then 1 and 4, on every profile (its first point, high c = 16, on a fresh
#     controller: the cold start against K = 7's warm-up at the same point);
#   plain (low; plain does not depend on acceptance) at the same concurrencies;
#   K = 7 on high and mixed at c = 16, 64, 1, 4; K = 2 on high and mixed at 256 (the best static engines of
#     sessions 4-11 there).
set -uo pipefail
# shellcheck source=prelude.sh
source "$(dirname "$0")/prelude.sh"
RESULTS="$OUTDIR/h200_steady_spread_s12.jsonl"
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only specctl_skip --concurrency 16,64,256,1,4
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only plain --profiles low --concurrency 16,64,256,1,4
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only k7 --profiles high,mixed --concurrency 16,64,1,4
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only k2 --profiles high,mixed --concurrency 256
session_done
