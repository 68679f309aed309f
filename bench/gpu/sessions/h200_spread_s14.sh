#!/usr/bin/env bash
# Session 14 (planned). Session 13 left low and mixed at 256 requests 4-7 % below plain, all of it in the
# speculative engine's K = 0 steps (2-6 % below plain's with the drafter skipped; the hook 0.6-0.7 points), and
# its target dispatch ran 4 points more steps eager than plain's at 256 (61-62 % against 57 %). Reading 0.26's
# _init_candidates since then found mixed batches at 111 token counts up to 512 running eager in an engine with
# a width set, where plain runs piecewise; the full_graph_dispatch backport now stages the next piecewise graph
# there. In the order the budget answers them:
#  1. plain and specctl_skip (fresh controller) on low and mixed at 64 and 256: does the dispatch mix now match
#     plain's, and what is left of the K = 0 gap (`steady_widths --goodput`);
#     Beside them the same engine pinned at K = 0 for every category (`premise-k0`, the drafter skipped): its
#     K = 0 step against plain's with no width choice, probe or exploration in the way;
#  2. the last drafter smoke row, dspark_specctl, beside dspark_k4 (mixed, c = 16);
#  3. high at c = 1 and 16 (session 12: 0.96x and 0.89x K = 7, the latter a cold first point) beside K = 7, and
#     K = 7 on mixed at 64 (the best static engine there in sessions 4-12);
#  4. a second pass of plain and specctl_skip on low at 64 and 256, fresh engines and controller.
set -uo pipefail
# shellcheck source=prelude.sh
source "$(dirname "$0")/prelude.sh"
FIRST="$OUTDIR/h200_steady_spread_s14.jsonl"
SECOND="$OUTDIR/h200_steady_spread_s14_second.jsonl"
DRAFTERS="$OUTDIR/h200_steady_drafters_s14.jsonl"
sweep --results "$FIRST" --mirror "$OUTDIR/mirror" --only plain --profiles low --concurrency 64,256
fresh_controller
sweep --results "$FIRST" --mirror "$OUTDIR/mirror" --only specctl_skip --profiles low,mixed --concurrency 64,256
SPECCTL_DRAFT_AT_ZERO=skip sweep --results "$FIRST" --mirror "$OUTDIR/mirror" --premise --premise-ks 0 \
    --premise-profile low --premise-concurrency 64,256
sweep --results "$DRAFTERS" --mirror "$OUTDIR/mirror_drafters" --only dspark_k4,dspark_specctl --profiles mixed \
    --concurrency 16
sweep --results "$FIRST" --mirror "$OUTDIR/mirror" --only specctl_skip --profiles high --concurrency 1,16
sweep --results "$FIRST" --mirror "$OUTDIR/mirror" --only k7 --profiles high --concurrency 1,16
sweep --results "$FIRST" --mirror "$OUTDIR/mirror" --only k7 --profiles mixed --concurrency 64
sweep --results "$SECOND" --mirror "$OUTDIR/mirror_second" --only plain --profiles low --concurrency 64,256
fresh_controller
sweep --results "$SECOND" --mirror "$OUTDIR/mirror_second" --only specctl_skip --profiles low --concurrency 64,256
session_done
