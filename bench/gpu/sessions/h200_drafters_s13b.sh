#!/usr/bin/env bash
# Issue 16's smoke rows for the drafters beside EAGLE-3 (planned; a session of its own or what is left of one):
# native MTP (a MiMo-shaped 8B target with one MTP layer), DFlash and DSpark (5-layer Qwen3-style block drafters
# on the 8B Llama target), each as a static engine at K = 4 and under specctl (k_max 7), on the mixed profile
# (both categories in one engine: the acceptance per category) at c = 1 and 16. Configs and the reasons for them:
# bench/gpu/shapes.py; what vLLM 0.26 does with each (read from its sources): bench/gpu/README.md, *Other
# drafters*. An engine that does not start gets an engine_error row with vLLM's message: that row is its result.
# Gemma-4's MTP assistant is not run: its target config does not load with the carried transformers 5.17.
set -uo pipefail
# shellcheck source=prelude.sh
source "$(dirname "$0")/prelude.sh"
RESULTS="$OUTDIR/h200_steady_drafters_s13b.jsonl"
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only mtp_k4,mtp_specctl --profiles mixed --concurrency 1,16
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only dflash_k4,dflash_specctl --profiles mixed --concurrency 1,16
sweep --results "$RESULTS" --mirror "$OUTDIR/mirror" --only dspark_k4,dspark_specctl --profiles mixed --concurrency 1,16
session_done
