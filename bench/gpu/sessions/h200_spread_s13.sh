#!/usr/bin/env bash
# Session 13 of the `spread` sweep (planned). Session 12 moved low to K = 0 at 64 and 256 requests with the
# measured check (0.97x and 0.94x plain), but its second pass on the same machine measured plain 19 % faster at
# c = 64 (7608 against 6391 tok/s): between-pass drift on one machine is larger than the differences claimed at
# that load. So this session measures the contested points twice, interleaved, each pass with a fresh engine
# (and, for specctl, a fresh controller): plain, specctl_skip, plain, specctl_skip, then the best static engines
# (K = 7 at 64, K = 2 at 256). Each pass writes its own results file, so the sweep's resume never skips the
# second pass. The code adds, since session 12's rows: the model's exploration paused where the check holds its
# width off, and probes of K = 0 that wait in proportion to the model's expected gain.
set -uo pipefail
# shellcheck source=prelude.sh
source "$(dirname "$0")/prelude.sh"
FIRST="$OUTDIR/h200_steady_spread_s13.jsonl"
SECOND="$OUTDIR/h200_steady_spread_s13_second.jsonl"
fresh_controller() { rm -f "$STATE"/controller/specctl.db* 2>/dev/null || true; }  # the sweep restores it otherwise
sweep --results "$FIRST" --mirror "$OUTDIR/mirror" --only plain --profiles low --concurrency 64,256
fresh_controller
sweep --results "$FIRST" --mirror "$OUTDIR/mirror" --only specctl_skip --profiles low,mixed,high --concurrency 64,256
sweep --results "$SECOND" --mirror "$OUTDIR/mirror_second" --only plain --profiles low --concurrency 64,256
fresh_controller
sweep --results "$SECOND" --mirror "$OUTDIR/mirror_second" --only specctl_skip --profiles low,mixed,high \
    --concurrency 64,256
sweep --results "$FIRST" --mirror "$OUTDIR/mirror" --only k7 --profiles high,mixed --concurrency 64
sweep --results "$FIRST" --mirror "$OUTDIR/mirror" --only k2 --profiles high,mixed --concurrency 256
session_done
