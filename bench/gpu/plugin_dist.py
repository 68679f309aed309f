"""A dist-info folder that makes vLLM's plugin loader find the benchmark's plugins without installing the project.

On the GPU host the repository is only on ``PYTHONPATH`` (nothing is pip-installed), but vLLM finds general
plugins through ``importlib.metadata.entry_points(group="vllm.general_plugins")``. importlib.metadata's path
finder looks for ``*.dist-info`` folders directly inside every ``sys.path`` entry and reads their
``METADATA`` (the distribution's name) and ``entry_points.txt``; so a folder holding
``specctl_bench-0.0.0.dist-info/`` put on the engine's ``PYTHONPATH`` declares both entry points. Which of them a
process loads is then chosen with ``VLLM_PLUGINS`` (a comma list of entry-point names).
"""

from __future__ import annotations

from pathlib import Path

DIST_NAME = "specctl_bench"
DIST_VERSION = "0.0.0"
GROUP = "vllm.general_plugins"
#: entry-point name -> object reference
ENTRY_POINTS = {
    "specctl": "specctl_vllm.engine_patch.plugin:register",
    "specctl_bench": "bench.gpu.accept_plugin:register",
}


def dist_info_name() -> str:
    return f"{DIST_NAME}-{DIST_VERSION}.dist-info"


def entry_points_text(entry_points: dict[str, str] = ENTRY_POINTS, group: str = GROUP) -> str:
    lines = [f"[{group}]"] + [f"{name} = {ref}" for name, ref in entry_points.items()]
    return "\n".join(lines) + "\n"


def metadata_text() -> str:
    return f"Metadata-Version: 2.1\nName: {DIST_NAME}\nVersion: {DIST_VERSION}\n"


def write_plugin_dist(folder: Path) -> Path:
    """Write (or refresh) the dist-info under ``folder``; returns ``folder``, the entry to put on PYTHONPATH."""
    dist = folder / dist_info_name()
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(metadata_text())
    (dist / "entry_points.txt").write_text(entry_points_text())
    (dist / "top_level.txt").write_text("bench\nengine_patch\n")
    return folder


def plugins_env(names: tuple[str, ...]) -> str:
    """``VLLM_PLUGINS`` value loading exactly ``names`` (vLLM splits it on commas)."""
    unknown = set(names) - set(ENTRY_POINTS)
    if unknown:
        raise ValueError(f"unknown plugin names: {sorted(unknown)}")
    return ",".join(names)
