"""The import namespace of the ``specctl-vllm`` distribution: ``specctl_vllm.controller`` (the controller
service, CLI and policy) and ``specctl_vllm.engine_patch`` (the vLLM scheduler subclass, middleware and plugin).

In the repository the code lives in the top-level folders ``controller/`` and ``engine_patch/``; the two entries
here are relative symlinks to them, so the repository keeps its shape while the wheel installs one top-level
package instead of two generic names (docs/packaging.md). Import only through this namespace: importing
``controller.x`` beside ``specctl_vllm.controller.x`` would load every module, and every class, twice.

Not named ``specctl``: PyPI's unrelated ``specctl`` distribution installs a top-level ``specctl`` package.
"""

from __future__ import annotations

from pathlib import Path

#: The distribution this package is installed as (pyproject.toml ``[project] name``). Never ``specctl``: that
#: name on PyPI is an unrelated project, whose version must not be reported as this one's.
DISTRIBUTION = "specctl-vllm"


def version() -> str:
    """This distribution's version: its installed metadata, else (run from a clone without installing) the
    ``version`` in the clone's pyproject.toml, else ``"unknown"``."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed(DISTRIBUTION)
    except PackageNotFoundError:
        return _clone_version(Path(__file__).resolve().parent.parent / "pyproject.toml") or "unknown"


def _clone_version(pyproject: Path) -> str | None:
    """``[project] version`` of ``pyproject`` when it declares this distribution."""
    import tomllib

    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except (OSError, ValueError):
        return None
    if project.get("name") != DISTRIBUTION or not isinstance(project.get("version"), str):
        return None
    return project["version"]
