"""A request lands in the category named in vllm_xargs, or derived from response_format or tools."""

from __future__ import annotations

import pytest

from bench.support import controller_api
from bench.support.workload import Prompt, build_workload, run_workload
from specctl_vllm.kernel import protocol

pytestmark = pytest.mark.e2e

_STRUCTURED = next(p for p in build_workload(1) if p.category == "structured")
_TOOLS = next(p for p in build_workload(1) if p.category == "tool_call")
_PLAIN = Prompt("plain", "prose", [{"role": "user", "content": "Name three colours."}], max_tokens=16,
                explicit_category=False)


@pytest.mark.parametrize(
    ("prompt", "category", "expected"),
    [
        (_PLAIN, "e2e-xargs", "e2e-xargs"),  # explicit vllm_xargs
        (_PLAIN, "Not Valid!", protocol.DEFAULT_CATEGORY),  # invalid explicit name: default, not an error
        (_STRUCTURED, None, protocol.STRUCTURED_CATEGORY),  # derived from response_format
        (_TOOLS, None, protocol.TOOL_CATEGORY),  # derived from tools (the middleware)
        (_PLAIN, None, protocol.DEFAULT_CATEGORY),  # nothing to go by
    ],
    ids=["xargs", "invalid-name", "response_format", "tools", "plain"],
)
def test_request_lands_in_its_category(engine, controller, prompt: Prompt, category: str | None,
                                       expected: str) -> None:
    before = controller_api.wait_stable(controller.url)
    [result] = run_workload(engine.url, [Prompt(prompt.id, prompt.category, prompt.messages, 16, False,
                                                prompt.extra)], category=category)
    assert result.ok, result.error
    delta = controller_api.wait_stable(controller.url) - before
    moved = {name for name, c in delta.items() if c.request_steps > 0}
    assert moved == {expected}
    assert delta[expected].request_steps >= len(result.token_ids) - delta[expected].accepted_tokens
