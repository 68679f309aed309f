"""The drafter vocabulary: one translation of the wire alias, names round-trip (which package may import which:
tests/unit/test_layering.py)."""

from __future__ import annotations

import pytest

from specctl_vllm.kernel.drafters import is_model_free, resolve, to_wire
from specctl_vllm.kernel.protocol import METHOD_ENGINE, METHOD_NGRAM, METHOD_OFF, METHOD_SUFFIX


@pytest.mark.parametrize("engine", ["draft_model", "eagle3", METHOD_NGRAM, METHOD_OFF])
@pytest.mark.parametrize("method", ["draft_model", "eagle3", "mtp", METHOD_NGRAM, METHOD_SUFFIX, METHOD_OFF])
def test_a_drafter_name_comes_back_unchanged(engine, method) -> None:
    assert resolve(to_wire(method, engine), engine) == method


@pytest.mark.parametrize(("method", "engine", "wire"), [
    ("eagle3", "eagle3", METHOD_ENGINE),  # the engine's own drafter goes out as the alias
    (METHOD_NGRAM, "eagle3", METHOD_NGRAM),
    (METHOD_NGRAM, METHOD_NGRAM, METHOD_ENGINE),
    (METHOD_OFF, "eagle3", METHOD_OFF),
])
def test_to_wire(method, engine, wire) -> None:
    assert to_wire(method, engine) == wire
    assert resolve(wire, engine) == method


@pytest.mark.parametrize(("method", "free"), [(METHOD_NGRAM, True), (METHOD_SUFFIX, True), ("eagle3", False),
                                              (METHOD_OFF, False), (METHOD_ENGINE, False)])
def test_model_free(method, free) -> None:
    assert is_model_free(method) is free

