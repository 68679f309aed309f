"""The model-runner backports of :mod:`specctl_vllm.engine_patch.backports`, read against vLLM 0.34.0's sources.

0.34 rebuilt model runner V2's CUDA-graph manager: uniform decode graphs are captured per query length, from
``VllmConfig.get_decode_cudagraph_query_lens`` (``config/vllm.py`` L677-706), and dispatched from a table of their
own (``v1/worker/gpu/cudagraph_utils.py`` L577-584); the drafter's decode passes follow the scheduled width. What
that leaves of each 0.26 backport (line numbers of the 0.34.0 wheel):

``drafter_graphs``: upstream. The autoregressive drafter's one-token decode manager is built with
    ``decode_query_lens={1: max_num_reqs}`` whatever the K table says (``spec_decode/autoregressive/speculator.py``
    L44-51).
``full_graph_dispatch``: upstream. A uniform batch looks its graph up among the graphs of its own query length, so
    one width never shadows another, and decode graphs are no longer staged among the token-keyed candidates, so
    no token count is left with decode graphs only (``cudagraph_utils.py`` L289-427, L577-584).
``graph_widths``: rewritten. 0.34 captures one decode query length per K of a batch-size table, else only
    ``1 + k_max``. The wrapper adds ``1 + K`` for every width K of the engine's width set to what
    ``get_decode_cudagraph_query_lens`` returns, each up to the request count of the widest; the target and the
    drafter's prefill manager both ask it (``model_runner.py`` L805, ``target_dependent_ar/speculator.py`` L47).
``honour_width``: rewritten. The runner passes the scheduled width to the drafter
    (``model_runner.py`` L2380, ``num_speculative_tokens=num_spec_tokens``) and the drafter runs ``K - 1`` decode
    passes (``target_dependent_ar/speculator.py`` L249-267); at K = 0 its first pass still writes the drafter's KV
    cache, sampling nothing (L245). But where the attention backend updates decode metadata in place, the whole
    decode loop is one captured graph of ``k_max - 1`` passes, specialised per K only for the K of a batch-size
    table (``autoregressive/speculator.py`` L144-165, ``autoregressive/cudagraph_utils.py`` L61-76); replayed at a
    smaller width it drafts ``k_max`` tokens, the runner then masks the rest (``model_runner.py`` L2388-2389). The
    wrapper specialises those graphs for every width of the width set, as vLLM does for a table's.
``SPECCTL_DRAFT_AT_ZERO=skip``: not ported; on 0.34 a K = 0 step runs vLLM's own first pass.

None of this applies with ``enable_adaptive_verification``: vLLM then captures variable-length decode graphs and
trims each request's drafts on the device (``spec_decode/adaptive_verification.py``), and the patch caps drafts
per request instead of per step. Nothing here imports vLLM: :mod:`~specctl_vllm.engine_patch.backports` resolves
the targets and passes them in.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

RELEASE = "0.34.0"

#: Backports 0.34 has upstream, with where.
UPSTREAM = {
    "drafter_graphs": "the drafter's decode graphs take decode_query_lens={1: max_num_reqs} "
                      "(v1/worker/gpu/spec_decode/autoregressive/speculator.py L44-51)",
    "full_graph_dispatch": "uniform batches dispatch per query length (v1/worker/gpu/cudagraph_utils.py L577-584)",
}

_CG = "vllm.v1.worker.gpu.cudagraph_utils"
_AR = "vllm.v1.worker.gpu.spec_decode.autoregressive"

#: (module, qualified name, lines its source must contain) per backport, as read in the 0.34.0 wheel.
TARGETS: dict[str, tuple[tuple[str, str, tuple[str, ...]], ...]] = {
    "graph_widths": (
        ("vllm.config.vllm", "VllmConfig.get_decode_cudagraph_query_lens",
         ("not speculative_config.uses_dynamic_speculative_decoding()", "return {decode_query_len: max_num_seqs}")),
        (_CG, "CudaGraphManager._init_candidates",
         ("decode_cudagraph_capture_shapes(", "self.decode_max_reqs,", "capture_decode and self.varlen_decode")),
        (_CG, "CudaGraphManager.dispatch", ("self._decode_descs.get(", "uniform_token_count")),
    ),
    "honour_width": (
        (f"{_AR}.cudagraph_utils", "SpeculatorCudaGraphManager.capture",
         ("SpeculatorBatchDescriptor(**vars(desc), num_speculative_tokens=k)", "if self.decode_query_len == 1:")),
        (f"{_AR}.cudagraph_utils", "SpeculatorCudaGraphManager.specialize_spec_tokens",
         ("if desc.cg_mode != CUDAGraphMode.FULL or desc in self.graphs:",)),
        (f"{_AR}.speculator", "AutoRegressiveSpeculator._run_multi_step_decode",
         ("self.decode_cudagraph_manager.specialize_spec_tokens(", "self._run_fused_multi_step_decode")),
        (f"{_AR}.speculator", "AutoRegressiveSpeculator.capture",
         ("self._fused_multi_step_decode", "specialize_spec_tokens=self.supports_decode_metadata_update")),
        ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.sample_tokens",
         ("num_speculative_tokens=num_spec_tokens",)),
    ),
}

#: What each wrapper replaces: (module, qualified name).
WRAPPED = {
    "graph_widths": ("vllm.config.vllm", "VllmConfig.get_decode_cudagraph_query_lens"),
    "honour_width": (f"{_AR}.cudagraph_utils", "SpeculatorCudaGraphManager.capture"),
}
#: The drafters whose decode loop the two rewrites were read for (``SpeculatorConfig.speculator_class``): EAGLE,
#: EAGLE-3 and single-module MTP. Multi-module MTP (also ``method="mtp"``) has a graph manager of its own.
AUTOREGRESSIVE_SPECULATORS = (
    "vllm.v1.worker.gpu.spec_decode.eagle.speculator.EagleSpeculator",
    "vllm.v1.worker.gpu.spec_decode.mtp.speculator.MTPSpeculator",
)
#: The descriptor class vLLM specialises drafter decode graphs with.
DESCRIPTOR = (f"{_AR}.cudagraph_utils", "SpeculatorBatchDescriptor")
FUSED_DECODE = "_fused_multi_step_decode"

#: Maps an engine's VllmConfig to its width set, or None where the backports stay out of the way.
WidthsOf = Callable[[Any], "tuple[int, ...] | None"]


def width_query_lens(lens: Mapping[int, int], widths: Iterable[int], sampled: int) -> dict[int, int]:
    """vLLM's ``{query length: most requests}`` plus ``K + sampled`` for every width K, each up to the most
    requests vLLM gives any (a width set runs every width at every batch size)."""
    most = max(lens.values())
    out = {int(w) + sampled: most for w in widths}
    out.update(lens)
    return dict(sorted(out.items()))


def wrap_query_lens(original: Callable, widths_of: WidthsOf) -> Callable:
    @functools.wraps(original)
    def get_decode_cudagraph_query_lens(self: Any, decode_query_len: int) -> dict[int, int]:
        lens = original(self, decode_query_len)
        widths = widths_of(self)
        sampled = decode_query_len - int(getattr(self, "num_speculative_tokens", 0) or 0)
        if not widths or sampled <= 0 or set(lens) != {decode_query_len}:
            return lens  # no width set, a one-token runner, or vLLM's own table: as vLLM built it
        return width_query_lens(lens, widths, sampled)

    return get_decode_cudagraph_query_lens


def width_specialized(capture_descs: Mapping[Any, list], widths: Iterable[int], descriptor: type) -> dict:
    """The drafter's decode graphs to capture, one per graph and width K >= 2 (K <= 1 runs no decode pass), as
    vLLM specialises them for a batch-size table's K (``autoregressive/cudagraph_utils.py`` L69-76)."""
    ks = sorted({int(w) for w in widths} - {0, 1}, reverse=True)
    return {mode: [descriptor(**vars(desc), num_speculative_tokens=k) for desc in descs for k in ks]
            for mode, descs in capture_descs.items()}


def wrap_speculator_capture(original: Callable, widths_of: WidthsOf, descriptor: type) -> Callable:
    @functools.wraps(original)
    def capture(self: Any, forward_fn: Callable, *args: Any, specialize_spec_tokens: bool = False,
                **kwargs: Any) -> Any:
        fused = getattr(forward_fn, "__name__", "") == FUSED_DECODE
        if fused and not specialize_spec_tokens and self.decode_query_len == 1:
            widths = widths_of(self.vllm_config)
            if widths:
                self._capture_descs = width_specialized(self._capture_descs, widths, descriptor)
        return original(self, forward_fn, *args, specialize_spec_tokens=specialize_spec_tokens, **kwargs)

    return capture
