"""Category resolution, API side (request body) and engine side (SamplingParams)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from specctl_vllm.engine_patch.categories import category_from_body, category_from_sampling_params, valid_category
from specctl_vllm.kernel import protocol

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"messages": []}, protocol.DEFAULT_CATEGORY),
        ({"vllm_xargs": {"specctl_category": "code"}}, "code"),
        ({"vllm_xargs": {"specctl_category": "code"}, "tools": TOOLS}, "code"),  # explicit beats derived
        ({"vllm_xargs": {"specctl_category": "Bad Name"}, "tools": TOOLS}, protocol.DEFAULT_CATEGORY),
        ({"vllm_xargs": {"specctl_category": 7}}, protocol.DEFAULT_CATEGORY),
        ({"vllm_xargs": {"other": 1}, "tools": TOOLS}, protocol.TOOL_CATEGORY),
        ({"tools": TOOLS}, protocol.TOOL_CATEGORY),
        ({"tools": TOOLS, "tool_choice": "none"}, protocol.DEFAULT_CATEGORY),
        ({"tools": TOOLS, "response_format": SCHEMA}, protocol.TOOL_CATEGORY),  # tools before structured
        ({"tools": []}, protocol.DEFAULT_CATEGORY),
        ({"response_format": SCHEMA}, protocol.STRUCTURED_CATEGORY),
        ({"response_format": {"type": "json_object"}}, protocol.STRUCTURED_CATEGORY),
        ({"response_format": {"type": "text"}}, protocol.DEFAULT_CATEGORY),
        ({"structured_outputs": {"regex": "[0-9]+"}}, protocol.STRUCTURED_CATEGORY),
        ({"structured_outputs": {"json": None}}, protocol.DEFAULT_CATEGORY),
        ({"guided_json": {"type": "object"}}, protocol.STRUCTURED_CATEGORY),
        ({"text": {"format": {"type": "json_schema"}}}, protocol.STRUCTURED_CATEGORY),
        ({"vllm_xargs": "not a dict", "response_format": SCHEMA}, protocol.STRUCTURED_CATEGORY),
    ],
)
def test_category_from_body(body: dict, expected: str) -> None:
    assert category_from_body(body) == expected


def params(extra: dict | None = None, structured: object | None = None) -> SimpleNamespace:
    return SimpleNamespace(extra_args=extra, structured_outputs=structured)


@pytest.mark.parametrize(
    ("sampling_params", "expected"),
    [
        (None, protocol.DEFAULT_CATEGORY),
        (params(), protocol.DEFAULT_CATEGORY),
        (params({"specctl_category": "summarise"}), "summarise"),
        (params({"specctl_category": "summarise"}, structured=object()), "summarise"),
        (params({"specctl_category": "x" * 65}), protocol.DEFAULT_CATEGORY),
        (params({"specctl_category": "ok\n"}), protocol.DEFAULT_CATEGORY),
        (params(structured=object()), protocol.STRUCTURED_CATEGORY),
        (params({"kv_transfer_params": {}}), protocol.DEFAULT_CATEGORY),
    ],
)
def test_category_from_sampling_params(sampling_params: object, expected: str) -> None:
    assert category_from_sampling_params(sampling_params) == expected


@pytest.mark.parametrize(
    ("name", "valid"),
    [("code", True), ("a.b-c_d", True), ("9lives", True), ("_overflow", False), ("Code", True),
     ("", False), ("x" * 64, True), ("x" * 65, False), (None, False), ("sp ace", False)],
)
def test_valid_category(name: object, valid: bool) -> None:
    assert (valid_category(name) is not None) is valid
