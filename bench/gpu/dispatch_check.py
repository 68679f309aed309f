"""Which CUDA graph vLLM's own dispatch picks for every batch shape of a graph-shaped engine, with the patch's
width set lent and ``full_graphs_first`` applied, against an engine without a width set.

It runs the installed vLLM's ``CudaGraphManager._init_candidates`` and ``dispatch`` (no GPU, no capture: the
manager is built with only the fields those two read) for the target's decode manager, FULL_AND_PIECEWISE, and
counts, over every token count up to the largest capture size:

* ``mixed_holes``: batches with prompt chunks (no uniform token count) that find no graph and run eager, as
  vLLM stages the width set, and after the backport (the engine without a width set has none);
* ``mixed_other_size``: such batches that replay another graph size than that engine's;
* ``uniform_not_full``: uniform batches of a width in the set that miss a full graph (the capture sizes' limit).

Needs the vLLM release the backports were written for (0.26.0: the GPU host's install, or its wheel in any
CPython 3.11/3.12 environment; torch imports without CUDA). Exit status 1 when a hole or another size remains.

    python -m bench gpu.dispatch_check [--max-num-seqs 256] [--k-max 7] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def default_capture_sizes(max_size: int) -> list[int]:
    """vLLM's default capture sizes up to ``max_size``: 1, 2, 4, then steps of 8 to 248, then of 16 (the H200
    engines' 51 sizes at 512)."""
    sizes = [s for s in (1, 2, 4) if s <= max_size]
    sizes += [s for s in range(8, 256, 8) if s <= max_size]
    sizes += [s for s in range(256, max_size + 1, 16)]
    return sizes


def build_manager(cu: Any, mode: Any, sizes: list[int], max_num_seqs: int, k_max: int,
                  lent: list[tuple[int, int, int]] | None) -> Any:
    """A target decode manager with vLLM's candidates (``lent``: the batch-size table the patch lends)."""
    m = cu.CudaGraphManager.__new__(cu.CudaGraphManager)
    spec = SimpleNamespace(num_speculative_tokens_per_batch_size=lent,
                           uses_dynamic_speculative_decoding=lambda: lent is not None)
    m.vllm_config = SimpleNamespace(speculative_config=spec, num_speculative_tokens=k_max)
    m.compilation_config = SimpleNamespace(cudagraph_capture_sizes=sizes, max_cudagraph_capture_size=max(sizes))
    m.max_num_reqs = max_num_seqs
    m.decode_query_len = 1 + k_max
    m.cudagraph_mode = mode
    m.lora_capture_cases = [0]
    m._lora_dispatch_map, m._max_lora_case = {}, 0
    m._candidates, m._capture_descs = {}, {}
    m.use_breakable_cg = False
    m._graphs_captured = False
    m._init_candidates()
    m._graphs_captured = True
    return m


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--k-max", type=int, default=7)
    p.add_argument("--max-capture", type=int, default=512)
    p.add_argument("--json", type=Path, help="also write the result here")
    args = p.parse_args(argv)
    if args.max_num_seqs < 1 or args.max_capture < 1 or not 1 <= args.k_max <= 32:
        p.error("--max-num-seqs and --max-capture must be positive, --k-max between 1 and 32")
    try:
        import vllm
        import vllm.v1.worker.gpu.cudagraph_utils as cu
        from vllm.config.compilation import CUDAGraphMode
    except ImportError as exc:
        print(f"gpu.dispatch_check needs vLLM's model runner V2 sources importable: {exc}", file=sys.stderr)
        return 2
    from specctl_vllm.engine_patch import backports

    mode = CUDAGraphMode.FULL_AND_PIECEWISE
    sizes = default_capture_sizes(args.max_capture)
    widths = backports.graph_widths(args.k_max)
    plain = build_manager(cu, mode, sizes, args.max_num_seqs, args.k_max, None)
    patched = build_manager(cu, mode, sizes, args.max_num_seqs, args.k_max, [(1, 1, w) for w in widths])

    def mixed(m: Any, t: int) -> Any:
        return m.dispatch(num_reqs=min(t, args.max_num_seqs), num_tokens=t, uniform_token_count=None,
                          num_active_loras=0)

    counts = range(1, max(sizes) + 1)
    before = [t for t in counts if mixed(patched, t).cg_mode == CUDAGraphMode.NONE]
    backports.full_graphs_first(patched._candidates, patched._capture_descs)
    after = [t for t in counts if mixed(patched, t).cg_mode == CUDAGraphMode.NONE]
    other = [t for t in counts if mixed(patched, t).num_tokens != mixed(plain, t).num_tokens]
    uniform = []
    for w in widths:
        for n in range(1, args.max_num_seqs + 1):
            t = n * (w + 1)
            if t > max(sizes):
                break
            d = patched.dispatch(num_reqs=n, num_tokens=t, uniform_token_count=w + 1, num_active_loras=0)
            if d.cg_mode != CUDAGraphMode.FULL:
                uniform.append({"width": w, "requests": n, "mode": str(d.cg_mode)})
    result = {
        "vllm": vllm.__version__, "max_num_seqs": args.max_num_seqs, "k_max": args.k_max, "widths": list(widths),
        "capture_sizes": len(sizes), "max_capture": max(sizes),
        "plain_mixed_holes": sum(mixed(plain, t).cg_mode == CUDAGraphMode.NONE for t in counts),
        "mixed_holes_as_vllm_stages": len(before), "mixed_holes_after_backport": len(after),
        "mixed_other_size": len(other), "uniform_not_full": uniform,
        "holes_first": before[:24],
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if not after and not other else 1


if __name__ == "__main__":
    raise SystemExit(main())
