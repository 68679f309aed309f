"""Drafter vocabulary shared by the controller and the engine patch.

A drafter is named as the engine reports it: its vLLM name for the drafter it was started with (``ngram``,
``eagle3``, ``mtp``, ``draft_model``, ...), ``ngram`` / ``suffix`` for the model-free drafters the patch
computes itself, ``off`` for k = 0. On the wire a policy may name the engine's own drafter by the alias
``engine`` (a policy is cached per model, and engines of one model can be started with different drafters).
These two functions are the only place that alias is translated: :func:`to_wire` when a policy is written,
:func:`resolve` wherever a wire name is read, so a name goes out and comes back unchanged.
"""

from __future__ import annotations

from specctl_vllm.kernel.protocol import METHOD_ENGINE, METHOD_NGRAM, METHOD_SUFFIX

#: Drafters computed by the engine patch itself (CPU time per token, no GPU pass).
FREE_METHODS = frozenset({METHOD_NGRAM, METHOD_SUFFIX})


def is_model_free(method: str) -> bool:
    return method in FREE_METHODS


def resolve(method: str, engine_method: str) -> str:
    """The drafter a wire name means on an engine started with ``engine_method``."""
    return engine_method if method == METHOD_ENGINE else method


def to_wire(method: str, engine_method: str) -> str:
    """The name a policy sends for ``method`` to an engine started with ``engine_method``."""
    return METHOD_ENGINE if method == engine_method else method
