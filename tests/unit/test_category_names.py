"""Category names: one rule (``protocol.category_name``), applied by the engine's request tag and the middleware.
The controller's and the CLI's side: tests/unit/service/test_category_names_api.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from specctl_vllm.engine_patch.categories import CATEGORY_KEY, category_from_body, category_from_sampling_params
from specctl_vllm.engine_patch.middleware import CategoryMiddleware
from specctl_vllm.kernel.protocol import CATEGORY_PATTERN, category_name
from tests.unit.engine_patch.test_engine_middleware import Captured, run

#: (as written, the category it names or None)
NAMES = [
    ("sql", "sql"), ("SQL", "sql"), ("Sql.V2-x_y", "sql.v2-x_y"), ("A" * 64, "a" * 64), ("9lives", "9lives"),
    ("A" * 65, None), ("", None), ("_overflow", None), ("sql ", None), (" sql", None), ("sql\n", None),
    ("Straße", None), ("\u0130stanbul", None), ("KELVIN\u212a", None), ("a/b", None), (3, None), (None, None),
]


@pytest.mark.parametrize(("written", "named"), NAMES)
def test_the_rule(written, named):
    assert category_name(written) == named
    if named is not None:
        import re

        assert re.fullmatch(CATEGORY_PATTERN, named)  # what goes on the wire is a folded name


@pytest.mark.parametrize(("written", "named"), NAMES)
def test_the_engine_reads_a_tag_by_the_rule(written, named):
    params = SimpleNamespace(extra_args={CATEGORY_KEY: written}, structured_outputs=None)
    assert category_from_sampling_params(params) == (named or "default")
    assert category_from_body({"vllm_xargs": {CATEGORY_KEY: written}}) == (named or "default")


@pytest.mark.parametrize(("written", "sent"), [("SQL", "sql"), ("Code.Review", "code.review"), ("sql", "sql"),
                                               ("Straße", "Straße")])
def test_the_middleware_writes_the_category_a_tag_names(written, sent):
    """A name in another case reaches the engine as the category it names; one that names none is left as sent
    (the engine then counts the request under ``default``)."""
    app = Captured()
    body = {"messages": [], "vllm_xargs": {CATEGORY_KEY: written, "other": 1}}
    run(CategoryMiddleware(app), "/v1/chat/completions", [json.dumps(body).encode()])
    assert json.loads(app.body)["vllm_xargs"] == {CATEGORY_KEY: sent, "other": 1}


@pytest.mark.parametrize(("written", "named"), [(w, n) for w, n in NAMES if isinstance(w, str) and w])
def test_the_bench_names_request_and_config_categories_by_the_rule(written, named):
    """``specctl bench``: a request file's category and ``--config k=CAT:N`` fold as the engine's tag does; a
    name that names no category is refused (the CLI exits 2), never sent under another name."""
    from specctl_vllm.controller import bench

    line = json.dumps({"prompt": "x", "category": written})
    config = f"k={written}:2"
    if named is None:
        with pytest.raises(bench.BenchError, match="category"):
            bench.parse_requests([line], "f")
        if "," not in written and ":" not in written:
            with pytest.raises(bench.BenchError, match="bad category"):
                bench.parse_config(config)
        return
    (request,) = bench.parse_requests([line], "f")
    assert request.category == named and request.body["vllm_xargs"] == {CATEGORY_KEY: named}
    assert bench.parse_config(config).ks == {named: 2}


def test_the_bench_refuses_one_category_written_twice():
    from specctl_vllm.controller import bench

    with pytest.raises(bench.BenchError, match="given twice"):
        bench.parse_config("k=SQL:1,sql:2")
