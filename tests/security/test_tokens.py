"""Bearer tokens: separate scopes, 401 vs 403, a constant-time comparison of digests, never leaked.

The HTTP tests run against a real ``specctl serve`` process on loopback; the comparison-path test
drives :class:`specctl_vllm.controller.service.auth.TokenCheck` directly, where the timing property lives.
"""

from __future__ import annotations

import hashlib
import signal

import httpx
import pytest
from pydantic import SecretStr

from bench.support.specctl_serve import ADMIN_TOKEN, INGEST_TOKEN, SpecctlServe, telemetry_batch
from specctl_vllm.controller.service import auth

OVERRIDE = {"k": 1, "reason": "security test", "actor": "tester"}


def _batch(seq: int) -> dict:
    return telemetry_batch("sec-engine", seq, {"default": [1, 1, 1, 1, 1]})


# -- who may do what ---------------------------------------------------------------------------

WRITES = [
    ("POST", "/v1/telemetry", "ingest"),
    ("PUT", "/v1/overrides/sec-cat", "admin"),
    ("DELETE", "/v1/overrides/sec-cat?actor=tester", "admin"),
]

BAD_AUTHORIZATION = [
    ("missing", None, 401),
    ("empty bearer", "Bearer", 401),
    ("basic scheme", "Basic dXNlcjpwYXNz", 401),
    ("no scheme", "{token}", 401),
    ("other scope's token", "Bearer {other}", 403),
    ("token plus one char", "Bearer {token}x", 403),
    ("token prefix", "Bearer {prefix}", 403),
    ("same length, wrong", "Bearer {same_len}", 403),
    ("huge token", "Bearer " + "z" * 6000, 403),
]


def _authorization(template: str | None, scope: str) -> dict[str, str]:
    if template is None:
        return {}
    token = ADMIN_TOKEN if scope == "admin" else INGEST_TOKEN
    other = INGEST_TOKEN if scope == "admin" else ADMIN_TOKEN
    value = template.format(token=token, other=other, prefix=token[:-3], same_len="x" * len(token))
    return {"Authorization": value}


def _call(controller: SpecctlServe, method: str, path: str, headers: dict, seq: int = 0) -> httpx.Response:
    body = _batch(seq) if path == "/v1/telemetry" else OVERRIDE if method == "PUT" else None
    return httpx.request(method, controller.url + path, json=body, headers=headers, timeout=10)


@pytest.mark.parametrize(("method", "path", "scope"), WRITES, ids=[f"{m} {p.split('?')[0]}" for m, p, _ in WRITES])
@pytest.mark.parametrize(("case", "template", "status"), BAD_AUTHORIZATION, ids=[c[0] for c in BAD_AUTHORIZATION])
def test_writes_refuse_bad_tokens(controller, method, path, scope, case, template, status):
    response = _call(controller, method, path, _authorization(template, scope))
    assert response.status_code == status, response.text
    assert response.json()["detail"]  # a reason, in words
    if status == 401:
        assert response.headers.get("www-authenticate") == "Bearer"


def test_writes_accept_their_own_token_only(controller):
    assert _call(controller, "POST", "/v1/telemetry", controller.headers("ingest"), seq=1).status_code == 200
    assert _call(controller, "PUT", "/v1/overrides/sec-cat", controller.headers("admin")).status_code == 200
    lower = {"Authorization": f"bearer {ADMIN_TOKEN}"}  # the scheme is case-insensitive (RFC 7235)
    assert _call(controller, "DELETE", "/v1/overrides/sec-cat?actor=tester", lower).status_code == 200


READS = ["/v1/policy?model=m&k_max=4&method=ngram", "/v1/categories", "/v1/overrides", "/v1/audit",
         "/v1/engines", "/healthz", "/readyz", "/metrics"]


@pytest.mark.parametrize("path", READS)
def test_reads_are_open(controller, path):
    assert httpx.get(controller.url + path, timeout=10).status_code == 200


# -- the comparison path -----------------------------------------------------------------------

PRESENTED = [ADMIN_TOKEN, ADMIN_TOKEN[:-1], ADMIN_TOKEN + "x", ADMIN_TOKEN[:4], "x" * len(ADMIN_TOKEN),
             INGEST_TOKEN, "z" * 10_000, "é" * 40]


@pytest.mark.parametrize("presented", PRESENTED, ids=range(len(PRESENTED)))
def test_every_presented_token_is_compared_as_a_fixed_size_digest(monkeypatch, presented):
    """Whatever the length or prefix of the guess, exactly one compare_digest of two SHA-256 digests decides.

    Equal-size inputs to a constant-time compare leave nothing for response time to depend on; the
    only branches before the compare look at the scheme and emptiness, not at the secret.
    """
    calls = []
    real = auth.hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    check = auth.TokenCheck.from_secret(auth.Scope.ADMIN, SecretStr(ADMIN_TOKEN))
    expected = hashlib.sha256(ADMIN_TOKEN.encode()).digest()
    if presented == ADMIN_TOKEN:
        check.verify(f"Bearer {presented}")
    else:
        with pytest.raises(auth.AuthError) as err:
            check.verify(f"Bearer {presented}")
        assert err.value.status == 403
    assert calls == [(hashlib.sha256(presented.encode()).digest(), expected)]
    assert all(len(a) == len(b) == 32 for a, b in calls)


def test_the_check_keeps_only_a_digest():
    check = auth.TokenCheck.from_secret(auth.Scope.INGEST, SecretStr(INGEST_TOKEN))
    assert INGEST_TOKEN not in repr(check)
    assert all(value != INGEST_TOKEN for value in vars(check).values())


# -- tokens never leak -------------------------------------------------------------------------

def _forbidden_strings() -> list[str]:
    return [ADMIN_TOKEN, INGEST_TOKEN]


def test_tokens_never_in_logs_or_error_bodies(controller):
    """Drive every rejection path with the real tokens in play, then read the server's whole log output."""
    admin, ingest = controller.headers("admin"), controller.headers("ingest")
    url = controller.url
    responses = [
        httpx.post(url + "/v1/telemetry", json=_batch(10), headers=admin),  # other scope
        httpx.put(url + "/v1/overrides/leak", json=OVERRIDE, headers=ingest),
        httpx.put(url + "/v1/overrides/leak", json=OVERRIDE, headers={"Authorization": f"Bearer {ADMIN_TOKEN}x"}),
        httpx.put(url + "/v1/overrides/leak", json=OVERRIDE, headers={"Authorization": ADMIN_TOKEN}),
        httpx.put(url + "/v1/overrides/leak", headers=admin, json={**OVERRIDE, "k": ADMIN_TOKEN}),  # 422
        httpx.put(url + "/v1/overrides/leak", headers=admin, json={**OVERRIDE, "actor": INGEST_TOKEN + " !"}),
        httpx.put(url + "/v1/overrides/leak", headers=admin,
                  content=f'{{"reason": "{ADMIN_TOKEN}", "k": '.encode(),
                  ),  # malformed JSON quoting the token
        httpx.post(url + "/v1/telemetry", headers=ingest, json={**_batch(11), "engine_id": INGEST_TOKEN + "/"}),
        # token in the path, in a name that is no category even case-folded: 422
        httpx.put(url + f"/v1/overrides/{ADMIN_TOKEN}!", json=OVERRIDE, headers=admin),
        httpx.get(url + f"/v1/categories?model={ADMIN_TOKEN}&token={INGEST_TOKEN}"),  # token in a query: logged URL
        httpx.get(url + f"/nowhere/{INGEST_TOKEN}"),  # 404
    ]
    statuses = [r.status_code for r in responses]
    assert statuses[:-2] == [403, 403, 403, 401, 422, 422, 400, 422, 422], statuses
    assert statuses[-2:] == [200, 404], statuses
    for response in responses:
        text = response.text + "".join(f"{k}: {v}" for k, v in response.headers.items())
        for secret in _forbidden_strings():
            assert secret not in text, response.request.url
    log = controller.log_text()
    assert "/v1/overrides/leak" in log and "/v1/telemetry" in log  # the requests above were logged ...
    assert "[redacted]" in log  # ... the URLs that carried a token were scrubbed ...
    for secret in _forbidden_strings():
        assert secret not in log  # ... and no token with them
        assert hashlib.sha256(secret.encode()).hexdigest() not in log


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"SPECCTL_ADMIN_TOKEN": "Short-Secret-15"}, "shorter than"),
        ({"SPECCTL_ADMIN_TOKEN": INGEST_TOKEN}, "must differ"),
        ({"SPECCTL_ADMIN_PORT": "not-a-port-" + INGEST_TOKEN}, "SPECCTL_ADMIN_PORT"),
    ],
    ids=["short token", "same token twice", "invalid setting quoting a token"],
)
def test_refused_start_does_not_print_tokens(tmp_path, env, expected):
    proc = SpecctlServe(tmp_path, env=env)
    proc.spawn()
    try:
        code = proc.proc.wait(60)
    finally:
        proc.kill(signal.SIGKILL)
    out = proc.log_text()
    assert code == 2, out
    assert expected in out
    secrets = _forbidden_strings() + [env.get("SPECCTL_ADMIN_TOKEN", ""), env.get("SPECCTL_ADMIN_PORT", "")]
    for secret in filter(None, secrets):
        assert secret not in out


def test_start_without_tokens_is_refused_and_says_why(tmp_path):
    proc = SpecctlServe(tmp_path, admin_token=None, ingest_token=None)
    proc.spawn()
    code = proc.proc.wait(60)
    out = proc.log_text()
    assert code == 2
    assert "SPECCTL_ADMIN_TOKEN" in out and "SPECCTL_INGEST_TOKEN" in out and "--insecure-dev" in out
