"""Which category a request belongs to.

Resolution order (first match wins):

1. **explicit**: ``vllm_xargs: {"specctl_category": "<name>"}`` in the OpenAI request body (vLLM copies
   ``vllm_xargs`` into ``SamplingParams.extra_args``), read with the one category-name rule,
   :func:`specctl_vllm.kernel.protocol.category_name`: ``SQL`` is the category ``sql``; a name that names no
   category resolves to ``default`` (a bad name is never an error and never creates a series).
2. **tools** (API process, :mod:`specctl_vllm.engine_patch.middleware`): a request that offers ``tools`` with a
   ``tool_choice`` other than ``"none"`` is ``tool_call``. Only the API process sees tools, so the middleware
   writes the derived name into ``vllm_xargs.specctl_category``; the engine then sees it as explicit.
3. **structured output**: ``response_format`` of type ``json_schema``/``json_object``/``structural_tag``,
   ``structured_outputs`` (or the older ``guided_*`` fields) is ``structured``. The middleware tags it; without
   the middleware the engine derives the same from ``SamplingParams.structured_outputs``.
4. otherwise ``default``.

Without the middleware, a tools request with ``tool_choice: "auto"`` lands in ``default`` (the engine cannot
see tools), and ``tool_choice: "required"``/named lands in ``structured`` (vLLM turns it into a JSON schema).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specctl_vllm.kernel import protocol

#: Key in ``vllm_xargs`` / ``SamplingParams.extra_args``.
CATEGORY_KEY = "specctl_category"

_STRUCTURED_FORMATS = frozenset({"json_schema", "json_object", "structural_tag"})
_STRUCTURED_FIELDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
_LEGACY_GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")


def valid_category(name: Any) -> str | None:
    """The category ``name`` means (case folded), or None when it names none."""
    return protocol.category_name(name)


def explicit_category(extra_args: Mapping[str, Any] | None) -> tuple[bool, str | None]:
    """(present, valid name) for the explicit key; present-but-invalid is (True, None)."""
    if not extra_args or CATEGORY_KEY not in extra_args:
        return False, None
    return True, valid_category(extra_args[CATEGORY_KEY])


def _has_structured_body(body: Mapping[str, Any]) -> bool:
    fmt = body.get("response_format")
    if isinstance(fmt, Mapping) and fmt.get("type") in _STRUCTURED_FORMATS:
        return True
    text = body.get("text")  # Responses API: {"text": {"format": {"type": "json_schema", ...}}}
    if isinstance(text, Mapping):
        inner = text.get("format")
        if isinstance(inner, Mapping) and inner.get("type") in _STRUCTURED_FORMATS:
            return True
    constraints = body.get("structured_outputs")
    if isinstance(constraints, Mapping) and any(constraints.get(f) not in (None, False) for f in _STRUCTURED_FIELDS):
        return True
    return any(body.get(name) is not None for name in _LEGACY_GUIDED)


def _has_tools(body: Mapping[str, Any]) -> bool:
    tools = body.get("tools")
    return isinstance(tools, list) and len(tools) > 0 and body.get("tool_choice") != "none"


def category_from_body(body: Mapping[str, Any]) -> str:
    """Category of an OpenAI request body (API process), following the module's resolution order."""
    xargs = body.get("vllm_xargs")
    present, name = explicit_category(xargs if isinstance(xargs, Mapping) else None)
    if present:
        return name or protocol.DEFAULT_CATEGORY
    if _has_tools(body):
        return protocol.TOOL_CATEGORY
    if _has_structured_body(body):
        return protocol.STRUCTURED_CATEGORY
    return protocol.DEFAULT_CATEGORY


def category_from_sampling_params(params: Any) -> str:
    """Category of an engine request from its ``SamplingParams`` (EngineCore process)."""
    if params is None:
        return protocol.DEFAULT_CATEGORY
    present, name = explicit_category(getattr(params, "extra_args", None))
    if present:
        return name or protocol.DEFAULT_CATEGORY
    if getattr(params, "structured_outputs", None) is not None or getattr(params, "guided_decoding", None) is not None:
        return protocol.STRUCTURED_CATEGORY
    return protocol.DEFAULT_CATEGORY
