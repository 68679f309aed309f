"""The dist-info folder that lets vLLM's plugin loader find the benchmark's plugins on PYTHONPATH alone."""

from __future__ import annotations

import importlib.metadata as md

import pytest

from bench.gpu.plugin_dist import ENTRY_POINTS, GROUP, dist_info_name, plugins_env, write_plugin_dist


def test_importlib_metadata_finds_both_entry_points(tmp_path, monkeypatch):
    folder = write_plugin_dist(tmp_path / "dist")
    assert (folder / dist_info_name() / "entry_points.txt").exists()
    monkeypatch.syspath_prepend(str(folder))
    found = {ep.name: ep.value for ep in md.entry_points(group=GROUP) if ep.dist and ep.dist.name == "specctl_bench"}
    assert found == ENTRY_POINTS


def test_the_distribution_reads_back_with_name_and_version(tmp_path):
    folder = write_plugin_dist(tmp_path)
    (dist,) = list(md.distributions(path=[str(folder)]))
    assert (dist.metadata["Name"], dist.version) == ("specctl_bench", "0.0.0")
    assert {(ep.group, ep.name) for ep in dist.entry_points} == {(GROUP, "specctl"), (GROUP, "specctl_bench")}


def test_rewriting_is_idempotent(tmp_path):
    write_plugin_dist(tmp_path)
    write_plugin_dist(tmp_path)
    assert len(list(md.distributions(path=[str(tmp_path)]))) == 1


def test_plugins_env_is_a_comma_list_of_known_names():
    assert plugins_env(("specctl_bench",)) == "specctl_bench"
    assert plugins_env(("specctl", "specctl_bench")).split(",") == ["specctl", "specctl_bench"]
    with pytest.raises(ValueError):
        plugins_env(("nope",))


def test_entry_point_targets_are_importable_without_vllm():
    for ref in ENTRY_POINTS.values():
        module, attr = ref.split(":")
        assert callable(getattr(__import__(module, fromlist=[attr]), attr))
