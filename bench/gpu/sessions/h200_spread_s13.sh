#!/usr/bin/env bash
# Session 13. Two questions, in the order the budget answers them:
#  1. Repeatability where the targets are contested. Session 12 moved low to K = 0 at 64 and 256 requests with
#     the measured check (0.97x and 0.94x plain), but its second pass measured plain 19 % faster at c = 64 (7608
#     against 6391 tok/s): between-pass drift on one machine was larger than the differences claimed. So plain
#     and specctl_skip run interleaved twice at 64 and 256, each pass with a fresh engine (and, for specctl, a
#     fresh controller), each pass into its own results file so the sweep's resume never skips the second.
#     The code adds since session 12: the model's exploration paused where the check holds its width off, probes
#     of K = 0 that wait in proportion to the model's expected gain, prompt bursts out of the check, and one
#     pass over the batch's requests per 8 steps (the hook's largest section at 256 requests; the overhead line
#     says how often the pass ran).
#  2. Issue 16's smoke rows for the drafters beside EAGLE-3, at c = 16 on the mixed profile (both categories
#     in one engine): native MTP (a MiMo-shaped 8B target), DFlash and DSpark, each static at K = 4 and under
#     specctl (bench/gpu/shapes.py; bench/gpu/README.md, *Other drafters*). An engine that does not start gets
#     an engine_error row with vLLM's message: that row is its result.
# Then, if time is left, the best static engines on mixed (K = 7 at 64, K = 2 at 256) for the mixed ratios.
set -uo pipefail
# shellcheck source=prelude.sh
source "$(dirname "$0")/prelude.sh"
FIRST="$OUTDIR/h200_steady_spread_s13.jsonl"
SECOND="$OUTDIR/h200_steady_spread_s13_second.jsonl"
DRAFTERS="$OUTDIR/h200_steady_drafters_s13.jsonl"
sweep --results "$FIRST" --mirror "$OUTDIR/mirror" --only plain --profiles low --concurrency 64,256
fresh_controller
sweep --results "$FIRST" --mirror "$OUTDIR/mirror" --only specctl_skip --profiles low,mixed --concurrency 64,256
sweep --results "$SECOND" --mirror "$OUTDIR/mirror_second" --only plain --profiles low --concurrency 64,256
fresh_controller
sweep --results "$SECOND" --mirror "$OUTDIR/mirror_second" --only specctl_skip --profiles low,mixed \
    --concurrency 64,256
sweep --results "$DRAFTERS" --mirror "$OUTDIR/mirror_drafters" --only mtp_k4,mtp_specctl --profiles mixed --concurrency 16
sweep --results "$DRAFTERS" --mirror "$OUTDIR/mirror_drafters" --only dflash_k4,dflash_specctl --profiles mixed \
    --concurrency 16
sweep --results "$DRAFTERS" --mirror "$OUTDIR/mirror_drafters" --only dspark_k4,dspark_specctl --profiles mixed \
    --concurrency 16
sweep --results "$FIRST" --mirror "$OUTDIR/mirror" --only k7 --profiles mixed --concurrency 64
sweep --results "$FIRST" --mirror "$OUTDIR/mirror" --only k2 --profiles mixed --concurrency 256
session_done
