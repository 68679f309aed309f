"""Engine-side configuration, read once from ``SPECCTL_*`` environment variables in the EngineCore process.

Every field states its unit, default and the reason for the default. Invalid values never stop the engine:
:func:`load_settings` logs every problem at once and falls back to the defaults (the patch must not be the
reason vLLM fails to start).
"""

from __future__ import annotations

import logging
import os
import re
import socket
from typing import Literal

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from specctl_vllm.kernel import protocol

# Under "vllm.": in a vLLM process the lines use vLLM's handler, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.specctl.settings")

#: ``SPECCTL_CONTROLLER_URL`` values that turn reporting (and so policies) off: the patch then only applies
#: the engine's static speculative config, exactly like an unpatched engine.
REPORTING_OFF = {"", "off", "none", "disabled"}
#: Older variable names still read (``SPECCTL_<old>`` -> field): 0 turned scoring off then as it does now.
LEGACY_NAMES = {"COUNTERFACTUAL_SHARE": "overhead_budget"}


class EngineSettings(BaseSettings):
    """What the patch inside vLLM's EngineCore needs: where the controller is and how hard to try."""

    model_config = SettingsConfigDict(env_prefix="SPECCTL_", extra="ignore", frozen=True)

    controller_url: str = Field(
        default="http://127.0.0.1:8081",
        description="controller base URL (telemetry goes to URL/v1/telemetry); '' or 'off' disables reporting "
        "and policies, leaving the engine on its static config",
    )
    ingest_token: SecretStr | None = Field(
        default=None, description="bearer token for POST /v1/telemetry; unset only against an --insecure-dev controller"
    )
    engine_id: str | None = Field(
        default=None,
        pattern=protocol.ENGINE_ID_PATTERN,
        description="stable name of this engine in the controller's data; default: host name plus data-parallel "
        "rank, stable across restarts of the same engine so its series continue",
    )
    report_interval_s: float = Field(
        default=0.1,
        ge=0.01,
        le=60,
        description="seconds between telemetry posts; 100 ms keeps a policy change under ~0.2 s away while one "
        "post costs well under 1 ms of the reporter thread",
    )
    connect_timeout_s: float = Field(
        default=0.25, gt=0, le=10, description="TCP connect timeout in seconds; short, a local controller answers in ms"
    )
    request_timeout_s: float = Field(
        default=1.0,
        gt=0,
        le=30,
        description="read/write timeout in seconds; a slower answer counts as a failure and the batch is retried",
    )
    backoff_max_s: float = Field(
        default=5.0,
        gt=0,
        le=300,
        description="cap of the exponential retry delay in seconds; bounds how late the engine re-attaches "
        "after the controller comes back",
    )
    queue_steps: int = Field(
        default=8192,
        ge=16,
        le=1_000_000,
        description="step records buffered between the engine loop and the reporter; the oldest are dropped "
        "(and counted) beyond it. 8192 steps is tens of seconds of a busy engine, a few MiB",
    )
    batch_max_steps: int = Field(
        default=1000,
        ge=1,
        le=protocol.MAX_STEPS_PER_BATCH,
        description="steps per telemetry post; keeps one body well under the controller's 4 MiB cap",
    )
    max_categories: int = Field(
        default=24,
        ge=1,
        le=protocol.MAX_CATEGORIES_PER_STEP // 2,
        description="distinct categories this engine tracks; later new names map to the default category, so "
        "a client inventing names cannot grow the engine's or controller's state",
    )
    overhead_budget: float = Field(
        default=0.005,
        ge=0,
        le=0.05,
        description="share of engine step time the patch's per-step work may take on average (model-free "
        "drafting, a method's own cost, aside); counterfactual scoring of model-free drafters only uses what the "
        "per-request work leaves of it. 0.5 % keeps the patch under the 1 % overhead target; 0 turns scoring off",
    )
    min_draft_depth: int = Field(
        default=0,
        ge=0,
        le=protocol.MAX_K,
        description="lowest drafting depth the patch asks of the engine's drafter when no request in the batch "
        "wants drafts; 0 skips drafting entirely (vLLM 0.32 drafters accept 0), raise it for a drafter that does not",
    )
    search_window_tokens: int = Field(
        default=4096,
        ge=64,
        le=1 << 20,
        description="most recent tokens of a request the patch's model-free drafters search; bounds their cost "
        "per step on long contexts",
    )
    error_limit: int = Field(
        default=100,
        ge=1,
        description="hook failures after which the patch switches itself off for the engine's lifetime (each "
        "failure already falls back to vLLM's own behaviour for that step)",
    )

    @property
    def reporting_enabled(self) -> bool:
        return self.controller_url.strip().lower() not in REPORTING_OFF

    @property
    def telemetry_url(self) -> str:
        return self.controller_url.rstrip("/") + "/v1/telemetry"


def default_engine_id(data_parallel_rank: int = 0) -> str:
    """Host name plus data-parallel rank, reduced to the protocol's engine id alphabet."""
    host = re.sub(r"[^A-Za-z0-9_.:\-]", "-", socket.gethostname() or "engine").strip("-.:_") or "engine"
    return f"{host[:100]}-dp{data_parallel_rank}"


def load_settings(environ: dict[str, str] | None = None) -> EngineSettings:
    """Read the settings; on invalid values log every error and return the defaults."""
    env = dict(os.environ if environ is None else environ)
    try:
        return _from_env(env)
    except ValidationError as exc:
        problems = "; ".join(f"SPECCTL_{'.'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors())
        logger.error("specctl: invalid engine settings, using defaults: %s", problems)
        return _from_env({k: v for k, v in env.items() if not k.startswith("SPECCTL_")})


def _from_env(env: dict[str, str]) -> EngineSettings:
    # pydantic-settings reads os.environ; passing the values explicitly keeps tests hermetic.
    prefix = "SPECCTL_"
    values = {
        name: env[prefix + name.upper()]
        for name in EngineSettings.model_fields
        if prefix + name.upper() in env
    }
    for old, new in LEGACY_NAMES.items():
        if prefix + old in env and new not in values:
            values[new] = env[prefix + old]
    return EngineSettings.model_validate(values)


class GraphSettings(BaseSettings):
    """Graph-shaped speculation on model runner V2 (:mod:`specctl_vllm.engine_patch.backports`): read in every vLLM process."""

    model_config = SettingsConfigDict(env_prefix="SPECCTL_", extra="ignore", frozen=True)

    backports: str = Field(
        default="auto",
        description="'auto' (every model-runner backport that applies), 'off', or a comma list of backport names; "
        "auto is safe because each backport is applied only to the vLLM release and sources it was checked against",
    )
    graph_widths: str = Field(
        default="",
        description="comma list of proposal widths the engine captures full graphs for and picks one of per step; "
        "empty: 0,1,2,4 and num_speculative_tokens, the short widths that still pay at large batches plus k_max",
    )
    draft_at_zero: Literal["catch_up", "skip"] = Field(
        default="catch_up",
        description="at width 0: 'catch_up' runs the drafter's first pass so its KV cache stays complete (about "
        "10 % of a plain step on the H200); 'skip' leaves the drafter idle, at the cost of later acceptance",
    )


def load_graph_settings(environ: dict[str, str] | None = None) -> GraphSettings:
    """Like :func:`load_settings`: invalid values are logged and the defaults used."""
    env = dict(os.environ if environ is None else environ)
    values = {name: env[f"SPECCTL_{name.upper()}"] for name in GraphSettings.model_fields
              if f"SPECCTL_{name.upper()}" in env}
    try:
        return GraphSettings.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(f"SPECCTL_{'.'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors())
        logger.error("specctl: invalid graph settings, using defaults: %s", problems)
        return GraphSettings()
