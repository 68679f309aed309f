"""Schemathesis over the committed ``controller/openapi.json``, every operation, with and without tokens.

Runs against a real ``specctl serve`` on loopback. For every generated request (valid and invalid
data): no 5xx, and the answer conforms to the document (status code listed, content type, headers,
body schema). Invalid data must be refused with a 4xx; operations that declare a bearer scheme must
refuse requests without a valid token.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from bench.support.specctl_serve import SpecctlServe

OPENAPI = Path(__file__).resolve().parents[2] / "controller" / "openapi.json"
EXAMPLES_PER_OPERATION = 40

schema = schemathesis.openapi.from_path(OPENAPI)
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])

#: Every endpoint the service must expose; the fuzzer must cover all of them.
FIXED_ENDPOINTS = {
    ("POST", "/v1/telemetry"), ("GET", "/v1/policy"), ("GET", "/v1/categories"), ("GET", "/v1/categories/{name}"),
    ("GET", "/v1/overrides/{category}"), ("PUT", "/v1/overrides/{category}"), ("DELETE", "/v1/overrides/{category}"),
    ("GET", "/v1/overrides"), ("GET", "/v1/audit"), ("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/metrics"),
}

CONFORMANCE = [not_a_server_error, status_code_conformance, content_type_conformance,
               response_headers_conformance, response_schema_conformance, negative_data_rejection]


@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    with SpecctlServe(tmp_path_factory.mktemp("fuzz"), env={"SPECCTL_LOG_LEVEL": "warning"}) as proc:
        yield proc


def _headers(controller: SpecctlServe, who: str, operation_scopes: set[str]) -> dict[str, str]:
    if who == "none":
        return {}
    if who == "wrong":
        return {"Authorization": "Bearer not-the-token-0000000000"}
    # "valid": the token this operation asks for (reads declare none and ignore it)
    scope = "ingest" if "IngestToken" in operation_scopes else "admin"
    return controller.headers(scope)


def _scopes(case) -> set[str]:
    return {name for requirement in case.operation.definition.raw.get("security", []) for name in requirement}


def test_the_document_covers_every_endpoint():
    operations = {(m.upper(), p) for p, item in schema.raw_schema["paths"].items() for m in item
                  if m in {"get", "put", "post", "delete", "patch"}}
    assert FIXED_ENDPOINTS <= operations, FIXED_ENDPOINTS - operations


@pytest.mark.parametrize("who", ["valid", "none", "wrong"])
@schema.parametrize()
@settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much, HealthCheck.data_too_large])
def test_fuzz(case, controller, who):
    scopes = _scopes(case)
    checks = list(CONFORMANCE)
    if scopes and who != "valid":
        checks.append(ignored_auth)
    case.call_and_validate(base_url=controller.url, headers=_headers(controller, who, scopes), checks=checks,
                           timeout=30)
