"""The drafter vocabulary: one translation of the wire alias, names round-trip, and the controller never
imports the engine patch (the shared modules sit below both)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from specctl_vllm.controller.drafters import is_model_free, resolve, to_wire
from specctl_vllm.controller.protocol import METHOD_ENGINE, METHOD_NGRAM, METHOD_OFF, METHOD_SUFFIX

ROOT = Path(__file__).resolve().parents[2]


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


def test_the_controller_never_imports_the_engine_patch() -> None:
    offenders = []
    for path in sorted((ROOT / "controller").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names
                          if n.removeprefix("specctl_vllm.").split(".")[0] == "engine_patch"]
    assert offenders == []
