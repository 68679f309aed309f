#!/usr/bin/env bash
# Session 19 (planned; it replaces h200_pair_s18.sh, which never ran): the targets issue 15 still misses, in paired
# rounds, on the code of session 19 (the width rule's cadence, the reporter's GIL pauses) and session 18 (rules
# generation, the verdict reused with its width). Engine starts dominate a session (two per sweep call, 70-150 s
# each), so each call pairs one reference with as many points as it can decide:
#  1. specctl_skip beside plain on low at 64 and 256, 12 pairs of 4 s, fresh controller: the low target at both
#     (session 17: per-pair sd 0.04 at 64 asks 16 pairs for +-2 %, 0.10 at 256 asks ~100: 256 stays a median),
#     and the hook's overhead line at batch >= 128 while it drafts (the <= 1 % target, 1.30-1.44 % in session 17);
#  2. specctl_skip beside K = 7 on high and mixed at 1 and 64, 8 pairs of 3 s, fresh controller: high 1 (missed
#     by about 1 % in session 17, sd 0.013: 8 pairs decide it), mixed 64 against the best static, and high 64 and
#     mixed 1 beside them;
#  3. premise-k0 beside plain on low at 64, 12 pairs of 3 s, each engine profiled for 40 steps after its rounds,
#     traces kept (`gpu.trace_summary`): where the K = 0 floor's host time goes, both engines on one machine.
set -uo pipefail
# shellcheck source=prelude.sh
source "$(dirname "$0")/prelude.sh"
# one results file: the budget check guesses an engine start from the starts it holds, and the paired table keeps
# each pairing's reference rows apart
RESULTS="$OUTDIR/h200_steady_spread_s19_pair.jsonl"
fresh_controller
sweep --results "$RESULTS" --only specctl_skip --profiles low --concurrency 64,256 \
    --pair-with plain --rounds 12 --round-s 4 --allow-partial
fresh_controller
sweep --results "$RESULTS" --only specctl_skip --profiles high,mixed --concurrency 1,64 \
    --pair-with k7 --rounds 8 --round-s 3 --allow-partial
export SPECCTL_BENCH_PROFILE_DIR="$OUTDIR/prof" SPECCTL_BENCH_PROFILE_STEPS=40
SPECCTL_DRAFT_AT_ZERO=skip sweep --results "$RESULTS" --premise --premise-ks 0 \
    --premise-profile low --premise-concurrency 64 --pair-with plain --rounds 12 --round-s 3 --allow-partial
unset SPECCTL_BENCH_PROFILE_DIR
[[ -d "$OUTDIR/prof" ]] && python3 -m bench gpu.trace_summary "$OUTDIR/prof" --out "$OUTDIR/trace_summary_s19.json"
session_done
