"""Inputs the fuzzer found, kept as fixed regression cases (the fuzzer itself draws new inputs each run).

Each was a schema-violating request the controller accepted: JSON booleans silently coerced to numbers.
``{"k": false}`` in an override meant "speculation off" to the controller, though the document says ``k``
is an integer; an operator script with a bug must get a 422, not a changed policy.
"""

from __future__ import annotations

import httpx
import pytest

from bench.support.specctl_serve import SpecctlServe, telemetry_batch


@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    with SpecctlServe(tmp_path_factory.mktemp("fuzz-findings"), env={"SPECCTL_LOG_LEVEL": "warning"}) as proc:
        yield proc


OVERRIDES = [
    {"k": False, "reason": "r", "actor": "a"},  # found: accepted as k=0, i.e. speculation off
    {"k": True, "reason": "r", "actor": "a"},
    {"k": 2, "ttl_s": True, "reason": "r", "actor": "a"},
]


@pytest.mark.parametrize("body", OVERRIDES, ids=["k=false", "k=true", "ttl_s=true"])
def test_override_refuses_booleans_for_numbers(controller, body):
    response = httpx.put(controller.url + "/v1/overrides/fuzzed", json=body, headers=controller.headers("admin"))
    assert response.status_code == 422, response.text
    assert httpx.get(controller.url + "/v1/overrides/fuzzed").status_code == 404  # nothing applied


def _batch_with(path: tuple, value) -> dict:
    batch = telemetry_batch("fuzz-engine", 0, {"default": [1, 1, 0, 0, 0]})
    node = batch
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return batch


BATCHES = [
    (("steps", 0, "wall_s"), True),  # found: accepted as 1.0 s
    (("seq",), True),
    (("steps", 0, "categories", 0, "hists", 0, "accepted", 0), True),
]


@pytest.mark.parametrize(("path", "value"), BATCHES, ids=["wall_s=true", "seq=true", "bucket=true"])
def test_telemetry_refuses_booleans_for_numbers(controller, path, value):
    response = httpx.post(controller.url + "/v1/telemetry", json=_batch_with(path, value),
                          headers=controller.headers("ingest"))
    assert response.status_code == 422, response.text
