"""Answers as JSON bytes: any plain value (:func:`json_bytes`, :func:`json_safe`), telemetry acks with each
policy serialised once (:class:`AckEncoder`)."""

from __future__ import annotations

import json
import math
from typing import Any

from specctl_vllm.controller.core.brain import MAX_CACHED_POLICIES
from specctl_vllm.kernel.protocol import Policy


def json_bytes(value: Any) -> bytes:
    """What FastAPI's JSONResponse would send for ``value`` (plain JSON types), written by the C encoder."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def json_safe(value: Any) -> Any:
    """Non-finite floats as None (JSON has no Infinity/NaN; one would fail the whole answer)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


class AckEncoder:
    """Telemetry acks as JSON bytes, each policy serialised once rather than once per post.

    An engine's policy changes every few seconds at most while the engine posts ten or more times a second,
    and the policy is most of the ack: validating and serialising it for every post was work repeated for
    nothing. A :class:`Policy` is immutable and a new one gets a new version, so its JSON is cached by version
    (the identity check guards against a version number that comes back, e.g. from another Brain).
    """

    def __init__(self, capacity: int = MAX_CACHED_POLICIES) -> None:
        self._capacity = capacity
        self._policies: dict[int, tuple[Policy, bytes]] = {}

    def encode(self, outcome: str, seq: int, gaps: int, policy: Policy) -> bytes:
        """The same bytes as ``TelemetryAck(...).model_dump_json()``, built around the cached policy."""
        return b'{"outcome":"%s","seq":%d,"gaps":%d,"policy":%s}' % (
            outcome.encode(), seq, gaps, self.policy_json(policy))

    def policy_json(self, policy: Policy) -> bytes:
        held = self._policies.get(policy.version)
        if held is not None and held[0] is policy:
            return held[1]
        data = policy.model_dump_json().encode()
        self._policies.pop(policy.version, None)
        self._policies[policy.version] = (policy, data)
        while len(self._policies) > self._capacity:  # the oldest first: dicts keep insertion order
            self._policies.pop(next(iter(self._policies)))
        return data
