"""HTTP bodies owned by the service (the telemetry and policy bodies live in :mod:`specctl_vllm.kernel.protocol`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from specctl_vllm.controller.core.overrides import Override
from specctl_vllm.kernel.protocol import (
    CATEGORY_PATTERN,
    ENGINE_ID_PATTERN,
    MAX_K,
    METHOD_OFF,
    METHOD_PATTERN,
    category_name,
)

ACTOR_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@:\-]{0,127}$"
#: Longest TTL: 30 days. Longer pins should be deliberate (no TTL) rather than accidental.
MAX_TTL_S = 30 * 24 * 3600.0


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class OverrideIn(_In):
    """PUT /v1/overrides/{category}: pin k, pin the method, or force speculation off."""

    k: int | None = Field(default=None, ge=0, le=MAX_K, description="pinned proposal length; 0 = off")
    method: str | None = Field(default=None, pattern=METHOD_PATTERN, description="pinned draft method")
    off: bool = Field(default=False, description="force speculation off for the category")
    ttl_s: float | None = Field(default=None, gt=0, le=MAX_TTL_S, description="seconds until it expires; null = never")
    reason: str = Field(min_length=1, max_length=512, description="why (kept in the audit log)")
    actor: str = Field(pattern=ACTOR_PATTERN, description="who (kept in the audit log)")

    @model_validator(mode="after")
    def _consistent(self) -> OverrideIn:
        if self.off and (self.k not in (None, 0) or self.method not in (None, METHOD_OFF)):
            raise ValueError("off=true conflicts with a non-zero k or a method")
        if self.k == 0 and self.method not in (None, METHOD_OFF):
            raise ValueError("k=0 means speculation off: a method cannot be pinned with it")
        if not self.off and self.k is None and self.method is None:
            raise ValueError("nothing to override: give k, method or off=true")
        return self

    def to_override(self, category: str, now: float) -> Override:
        off = self.off or self.k == 0 or self.method == METHOD_OFF
        return Override(
            category=category,
            k=0 if off else self.k,
            method=None if off else self.method,
            off=off,
            expires_at=None if self.ttl_s is None else now + self.ttl_s,
            reason=self.reason,
            actor=self.actor,
            created_at=now,
        )


OverrideKind = Literal["k", "method", "off"]


class OverrideOut(BaseModel):
    category: str
    k: int | None
    method: str | None
    off: bool
    kinds: list[OverrideKind]
    expires_at: float | None = Field(description="unix seconds; null = no expiry")
    ttl_remaining_s: float | None
    reason: str
    actor: str
    created_at: float

    @classmethod
    def of(cls, override: Override, now: float) -> OverrideOut:
        remaining = None if override.expires_at is None else max(0.0, override.expires_at - now)
        return cls(
            category=override.category,
            k=override.k,
            method=override.method,
            off=override.off,
            kinds=list(override.kinds),
            expires_at=override.expires_at,
            ttl_remaining_s=remaining,
            reason=override.reason,
            actor=override.actor,
            created_at=override.created_at,
        )


class AuditEntry(BaseModel):
    id: int
    ts: float
    actor: str
    action: Literal["set", "clear", "expire"]
    category: str
    reason: str
    before: dict[str, Any] | None = Field(description="the override before the change (null: none)")
    after: dict[str, Any] | None = Field(description="the override after the change (null: none)")


class ErrorItem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ErrorBody(BaseModel):
    detail: str = Field(description="what was wrong, in words")
    errors: list[ErrorItem] = Field(default_factory=list, description="one entry per invalid field")


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    status: Literal["ready", "starting", "degraded"]
    store: str = Field(description="'ok' or why the SQLite file cannot be used")
    last_snapshot_age_s: float | None = Field(description="seconds since the last learned-state snapshot")
    overrides: int = Field(description="overrides in force")


class OverrideChange(BaseModel):
    """Answer to a write: the override now in force (null after a clear) and the audit row written."""

    override: OverrideOut | None
    audit: AuditEntry


class ForgetIn(_In):
    """POST /v1/forget: drop what was learned for one engine, one model, or one (model, category)."""

    engine: str | None = Field(default=None, pattern=ENGINE_ID_PATTERN, description="an engine id")
    model: str | None = Field(default=None, min_length=1, max_length=256, description="a model name")
    category: str | None = Field(default=None, pattern=CATEGORY_PATTERN + "|^_overflow$",
                                 description="with model: one of its categories")
    reason: str = Field(min_length=1, max_length=512, description="why (logged)")
    actor: str = Field(pattern=ACTOR_PATTERN, description="who (logged)")

    @field_validator("category", mode="before")
    @classmethod
    def _fold(cls, value: object) -> object:
        return category_name(value) or value  # the one category-name rule; what names none fails the pattern

    @model_validator(mode="after")
    def _one_thing(self) -> ForgetIn:
        if (self.engine is None) == (self.model is None):
            raise ValueError("give exactly one of engine or model (and optionally category with model)")
        if self.category is not None and self.model is None:
            raise ValueError("category needs model")
        return self


class Forgotten(BaseModel):
    kind: Literal["engine", "model", "category"]
    engine: str | None = None
    model: str | None = None
    category: str | None = None
    series: int = Field(description="series the learned state is charged after forgetting")
