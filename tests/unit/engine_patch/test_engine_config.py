"""Settings from the environment, the supported vLLM range, and the plugin entry point."""

from __future__ import annotations

import logging

import pytest

from specctl_vllm.engine_patch import plugin, startup, versions
from specctl_vllm.engine_patch.settings import default_engine_id, load_settings


def test_defaults() -> None:
    s = load_settings({})
    assert (s.controller_url, s.report_interval_s, s.reporting_enabled) == ("http://127.0.0.1:8081", 0.1, True)
    assert s.telemetry_url == "http://127.0.0.1:8081/v1/telemetry"
    assert s.ingest_token is None


def test_environment_is_read() -> None:
    s = load_settings({"SPECCTL_CONTROLLER_URL": "http://c:9/", "SPECCTL_INGEST_TOKEN": "secret-token-123456",
                       "SPECCTL_REPORT_INTERVAL_S": "0.5", "SPECCTL_ENGINE_ID": "gpu-3"})
    assert s.telemetry_url == "http://c:9/v1/telemetry"
    assert s.ingest_token.get_secret_value() == "secret-token-123456"
    assert "secret-token-123456" not in repr(s)
    assert (s.report_interval_s, s.engine_id) == (0.5, "gpu-3")


def test_older_variable_name_is_still_read() -> None:
    assert load_settings({"SPECCTL_COUNTERFACTUAL_SHARE": "0"}).overhead_budget == 0
    assert load_settings({"SPECCTL_COUNTERFACTUAL_SHARE": "0", "SPECCTL_OVERHEAD_BUDGET": "0.01"}).overhead_budget == 0.01


@pytest.mark.parametrize("value", ["", "off", "OFF", "none", "disabled"])
def test_reporting_can_be_turned_off(value: str) -> None:
    assert not load_settings({"SPECCTL_CONTROLLER_URL": value}).reporting_enabled


@pytest.mark.parametrize(
    "env",
    [{"SPECCTL_REPORT_INTERVAL_S": "fast"}, {"SPECCTL_QUEUE_STEPS": "-1"}, {"SPECCTL_ENGINE_ID": "bad id!"}],
)
def test_invalid_values_fall_back_to_defaults_and_say_why(env: dict, caplog) -> None:
    with caplog.at_level(logging.ERROR):
        s = load_settings(env)
    assert s == load_settings({})
    assert next(iter(env)) in caplog.text


def test_default_engine_id_is_a_valid_protocol_id() -> None:
    import re

    from specctl_vllm.kernel import protocol

    assert re.fullmatch(protocol.ENGINE_ID_PATTERN, default_engine_id(3))
    assert default_engine_id(3).endswith("-dp3")


@pytest.mark.parametrize(
    ("version", "supported"),
    [("0.26.0", True), ("0.32.0", True), ("0.32.1+cpu", True), ("0.29.0rc1", True), ("0.25.9", False),
     ("0.33.0", True), ("0.33.1rc1", True), ("0.34.0", True), ("0.34.1", True), ("0.35.0", False),
     ("1.0.0", False), ("garbage", False), (None, False)],
)
def test_supported_range(version: str | None, supported: bool) -> None:
    assert versions.is_supported(version) is supported
    assert (versions.support_problem(version) is None) is supported


def test_installed_vllm_is_supported() -> None:
    assert versions.is_supported(versions.installed_version())


def test_plugin_is_idempotent_and_never_raises(monkeypatch, caplog) -> None:
    startup.mode.cache_clear()
    applied = []
    monkeypatch.setattr(plugin.backports, "apply", lambda: applied.append(1))
    monkeypatch.setattr(versions, "installed_version", lambda: "0.40.0")
    try:
        with caplog.at_level(logging.WARNING, logger="vllm.specctl"):
            plugin.register()
            plugin.register()
        assert caplog.text.count("outside the supported range") == 1  # one line per process
        assert "stock scheduler" in caplog.text
        assert applied == []  # a vLLM the patch does not know gets no backport either
        startup.mode.cache_clear()
        monkeypatch.setattr(versions, "installed_version", lambda: 1 / 0)
        plugin.register()  # must not raise
    finally:
        startup.mode.cache_clear()


@pytest.mark.parametrize(
    ("version", "environ", "patched", "says"),
    [
        ("0.34.0", {}, True, None),
        ("0.32.0+cpu", {}, True, None),
        ("0.35.0", {}, False, "stock scheduler"),
        ("0.25.0", {}, False, "stock scheduler"),
        (None, {}, False, "not installed"),
        ("0.35.0", {versions.ALLOW_ENV: "1"}, True, "anyway"),
        ("0.35.0", {versions.ALLOW_ENV: "no"}, False, "stock scheduler"),
    ],
)
def test_startup_mode(version, environ, patched, says) -> None:
    mode = startup.decide(version, environ)
    assert mode.patched is patched
    assert (mode.line is None) if says is None else (says in mode.line)


def test_an_unknown_vllm_gets_the_stock_scheduler(monkeypatch, caplog) -> None:
    """``--scheduler-cls specctl_vllm.engine_patch.scheduler.SpecctlScheduler`` on a vLLM outside the range: vLLM's
    own classes, no mixin, one log line; back on a supported vLLM the same module is the patch again."""
    import importlib

    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from specctl_vllm.engine_patch import runtime, scheduler

    startup.mode.cache_clear()
    monkeypatch.setattr(versions, "installed_version", lambda: "0.99.0")
    try:
        with caplog.at_level(logging.WARNING, logger="vllm.specctl"):
            stock = importlib.reload(scheduler)
        assert not stock.PATCHED
        assert not issubclass(stock.SpecctlScheduler, runtime.SpecctlMixin)
        assert issubclass(stock.SpecctlAsyncScheduler, AsyncScheduler)
        assert caplog.text.count("stock scheduler") == 1
    finally:
        monkeypatch.undo()
        startup.mode.cache_clear()
        patched = importlib.reload(scheduler)
    assert patched.PATCHED and issubclass(patched.SpecctlScheduler, runtime.SpecctlMixin)


def test_plugin_is_the_declared_entry_point() -> None:
    from importlib import metadata

    eps = metadata.entry_points(group="vllm.general_plugins")
    assert any(ep.name == "specctl" and ep.value == "specctl_vllm.engine_patch.plugin:register" for ep in eps)
