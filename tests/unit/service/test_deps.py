"""The dependencies' request checks."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from specctl_vllm.controller.service.deps import reject_repeated_query
from specctl_vllm.controller.service.errors import BadInput


def _request(query: bytes) -> Request:
    return Request({"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": query})


@pytest.mark.parametrize(
    ("query", "repeated"),
    [
        (b"", None),
        (b"k_max=4", None),
        (b"k_max=4&model=m", None),
        (b"model_free=a&model_free=b", None),  # declared as a list
        (b"k_max=1&k_max=4", "k_max"),
        (b"b=1&a=1&b=2&a=2", "a, b"),
        (b"model_free=a&model_free=b&k_max=1&k_max=2", "k_max"),
    ],
)
def test_reject_repeated_query(query, repeated):
    if repeated is None:
        assert reject_repeated_query(_request(query)) is None
        return
    with pytest.raises(BadInput) as caught:
        reject_repeated_query(_request(query))
    assert caught.value.status == 422 and caught.value.detail.endswith(repeated)


def test_a_scope_without_query_string_passes():
    assert reject_repeated_query(Request({"type": "http", "method": "GET", "path": "/", "headers": []})) is None
