"""``specctl --version`` and the plugin's start-up line name this distribution's version, never another's."""

from __future__ import annotations

import importlib.metadata
import logging
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

import specctl_vllm
from specctl_vllm.controller import cli
from specctl_vllm.engine_patch import plugin, versions

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _metadata(installed: dict[str, str]):
    """importlib.metadata.version over a fake set of installed distributions."""

    def version(name: str) -> str:
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    return version


@pytest.mark.parametrize(
    ("installed", "expected"),
    [
        ({"specctl-vllm": "9.8.7", "specctl": "0.1.6"}, "9.8.7"),  # the metadata of this distribution
        ({"specctl": "0.1.6"}, PYPROJECT["version"]),  # a clone, PyPI's unrelated `specctl` installed beside
        ({}, PYPROJECT["version"]),  # a clone, nothing installed
    ],
    ids=["installed", "clone-beside-other-specctl", "clone"],
)
def test_version_is_this_distributions(monkeypatch, installed, expected):
    monkeypatch.setattr(importlib.metadata, "version", _metadata(installed))
    result = CliRunner().invoke(cli.app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"specctl (specctl-vllm) {expected}"


def test_the_distribution_name_is_the_pyprojects():
    assert specctl_vllm.DISTRIBUTION == PYPROJECT["name"]


def test_a_foreign_pyproject_is_not_read(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "specctl"\nversion = "0.1.6"\n')
    assert specctl_vllm._clone_version(tmp_path / "pyproject.toml") is None
    assert specctl_vllm._clone_version(tmp_path / "missing.toml") is None


def test_plugin_start_up_line_names_the_version(monkeypatch, caplog):
    monkeypatch.setattr(importlib.metadata, "version", _metadata({"specctl-vllm": "9.8.7"}))
    monkeypatch.setattr(versions, "installed_version", lambda: "0.32.0")
    plugin._announce_once.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger="vllm.specctl.plugin"):
            plugin.register()
    finally:
        plugin._announce_once.cache_clear()
    assert "specctl-vllm 9.8.7" in caplog.text
