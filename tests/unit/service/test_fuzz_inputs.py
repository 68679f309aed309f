"""Hostile inputs never reach the last-resort handler: every answer is < 500.

The TestClient re-raises server exceptions, so a bug fails the example with its traceback; the
runtime's internal-error counter is checked too. Examples are capped to keep the unit tier fast; the
schema-driven fuzzing of every endpoint lives in tests/fuzz.
"""

import copy
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.service.batches import batch, hist, step
from tests.unit.service.conftest import ADMIN, INGEST

FUZZ = settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**31, 2**53 + 1, 2**63, 2**64, 10**30, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=40))
json_values = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=12), inner, max_size=5)),
    max_leaves=20,
)


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, sub in value.items():
            yield from _paths(sub, prefix + (key,))
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            yield from _paths(sub, prefix + (i,))


def _replace(value, path, new):
    if not path:
        return new
    out = copy.deepcopy(value)
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = new
    return out


def _valid_batch():
    steps = [step({"code": [hist(2, [1, 0, 2]), hist(4, [0, 1, 0, 0, 3])], "prose": [hist(1, [3, 1])]}, t=1.0)]
    return batch(0, steps, policy_version=3, dropped_steps=2)


BATCH_PATHS = list(_paths(_valid_batch()))


def _post(client, path, body, headers):
    raw = json.dumps(body).encode() if not isinstance(body, bytes) else body
    return client.request("PUT" if "overrides" in path else "POST", path, content=raw,
                          headers={**headers, "Content-Type": "application/json"})


def _check(client, response):
    assert response.status_code < 500, response.text
    assert response.json()["detail"] if response.status_code >= 400 else True
    assert client.app.state.runtime.internal_errors == 0


@FUZZ
@given(body=json_values)
def test_arbitrary_json_telemetry(client, body):
    _check(client, _post(client, "/v1/telemetry", body, INGEST))


@FUZZ
@given(index=st.integers(0, len(BATCH_PATHS) - 1), value=json_values, seq=st.integers(0, 50))
def test_mutated_batches(client, index, value, seq):
    body = _replace(_valid_batch(), BATCH_PATHS[index], value)
    if isinstance(body, dict):
        body["seq"] = seq if "seq" not in BATCH_PATHS[index] else body.get("seq")
    _check(client, _post(client, "/v1/telemetry", body, INGEST))


def _extreme_batch(counts, wall_s, t, seq):
    requests = sum(counts)
    return batch(seq, [{"t": t, "wall_s": wall_s, "batch_size": requests, "scheduled_tokens": requests * 5,
                        "draft_tokens": requests * 4, "prefill_tokens": counts[0], "draft_depth": 4,
                        "categories": [{"category": "code", "method": "ngram", "requests": requests,
                                        "hists": [{"k": 4, "accepted": counts}]}]}])


def _reads_still_work(client):
    for path in ("/v1/categories", "/v1/engines", "/metrics", "/v1/policy?model=test-model&k_max=4&method=ngram"):
        assert client.get(path).status_code == 200, path
    assert client.app.state.runtime.internal_errors == 0


@FUZZ
@given(
    counts=st.lists(st.sampled_from([0, 1, 7, 1000, 2**20, 10**7]), min_size=5, max_size=5),
    wall_s=st.floats(min_value=0, max_value=3600), t=st.floats(min_value=0, max_value=1e308),
    seq=st.sampled_from([0, 1, 2**63, 10**30]),
)
def test_valid_shape_extreme_numbers(client, counts, wall_s, t, seq):
    """Counts up to the protocol bound (10**7 per step, far above any engine) are ingested and read back fine."""
    _check(client, _post(client, "/v1/telemetry", _extreme_batch(counts, wall_s, t, seq), INGEST))
    _reads_still_work(client)


@pytest.mark.parametrize("count", [10**7 + 1, 10**12, 2**63, 10**30])
def test_implausible_counts_are_refused_and_do_not_poison_reads(client, count):
    response = _post(client, "/v1/telemetry", _extreme_batch([count, 0, 0, 0, 1], 0.02, 1.0, 0), INGEST)
    assert response.status_code == 422, response.text
    _reads_still_work(client)


@FUZZ
@given(body=st.one_of(json_values, st.fixed_dictionaries(
    {"k": json_values, "reason": st.text(max_size=600), "actor": st.text(max_size=20)},
    optional={"method": json_values, "off": json_values, "ttl_s": json_values})))
def test_arbitrary_override_bodies(client, body):
    _check(client, _post(client, "/v1/overrides/code", body, ADMIN))


@FUZZ
@given(raw=st.binary(max_size=300))
def test_arbitrary_bytes(client, raw):
    _check(client, _post(client, "/v1/telemetry", raw, INGEST))
    _check(client, _post(client, "/v1/overrides/code", raw, ADMIN))


@pytest.mark.parametrize("seed", range(3))
def test_many_category_names_are_capped(client, seed):
    """Unbounded category names: the Brain pools the overflow, nothing fails, state stays bounded."""
    rng = random.Random(seed)
    for seq in range(10):
        names = {f"c{rng.randrange(10**9)}": [hist(1, [1, 1])] for _ in range(60)}
        response = client.post("/v1/telemetry", json=batch(seq, [step(names)]), headers=INGEST)
        assert response.status_code == 200, response.text
    views = client.get("/v1/categories").json()
    assert len(views) <= 64 + 1
    assert any(v["category"] == "_overflow" for v in views)


@pytest.mark.parametrize(
    ("method", "path", "headers", "repeated"),
    [
        ("GET", "/v1/policy?model=m&k_max=1&k_max=4&method=ngram", {}, "k_max"),
        ("GET", "/v1/policy?model=m&model=n&k_max=4&method=ngram", {}, "model"),
        ("GET", "/v1/audit?limit=1&limit=5", {}, "limit"),
        ("GET", "/v1/categories?model=a&model=b", {}, "model"),
        ("DELETE", "/v1/overrides/code?actor=a&actor=b", ADMIN, "actor"),
    ],
)
def test_a_repeated_scalar_query_parameter_is_refused(client, method, path, headers, repeated):
    response = client.request(method, path, headers=headers)
    assert response.status_code == 422, response.text
    assert repeated in response.json()["detail"]


def test_a_repeated_list_query_parameter_is_accepted(client):
    response = client.get("/v1/policy?model=m&k_max=4&method=ngram&model_free=ngram&model_free=suffix")
    assert response.status_code == 200, response.text


def test_token_is_checked_before_the_query(client):
    assert client.delete("/v1/overrides/code?actor=a&actor=b").status_code == 401


@pytest.mark.parametrize("value", ["true", "0", "eagle3"])
def test_model_free_names_only_the_patchs_drafters(client, value):
    response = client.get(f"/v1/policy?model=m&k_max=4&method=ngram&model_free={value}")
    assert response.status_code == 422, response.text
