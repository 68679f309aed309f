"""The import namespace of the ``specctl-vllm`` distribution: ``specctl_vllm.controller`` (the controller
service, CLI and policy), ``specctl_vllm.engine_patch`` (the vLLM scheduler subclass, middleware and plugin) and
``specctl_vllm.kernel`` (what both share: the wire protocol, the adaptation rule, the step models).

In the repository the code lives in the top-level folders ``controller/``, ``engine_patch/`` and ``kernel/``.
pyproject.toml maps the three subpackages to them (``package-dir``), so the wheel, and an editable install,
hold one top-level package instead of generic names (docs/packaging.md). From a source tree on ``PYTHONPATH``
without an install (the GPU host, benchmark subprocesses) :func:`_source_tree` adds the repository root to this
package's ``__path__``, so the same names resolve to the same folders. Import only through this namespace:
importing ``controller.x`` beside ``specctl_vllm.controller.x`` would load every module, and every class, twice.

Not named ``specctl``: PyPI's unrelated ``specctl`` distribution installs a top-level ``specctl`` package.
"""

from __future__ import annotations

from pathlib import Path

#: The distribution this package is installed as (pyproject.toml ``[project] name``). Never ``specctl``: that
#: name on PyPI is an unrelated project, whose version must not be reported as this one's.
DISTRIBUTION = "specctl-vllm"

#: The subpackages, each a top-level folder of the repository.
SUBPACKAGES = ("controller", "engine_patch", "kernel")


def _source_tree(here: Path) -> Path | None:
    """The repository root when this package runs from a source tree: the subpackages are not inside it (an
    installed wheel has them as real subfolders) but beside it, as the repository's top-level folders."""
    if any((here / name).exists() for name in SUBPACKAGES):
        return None
    root = here.parent
    if all((root / name / "__init__.py").is_file() for name in SUBPACKAGES):
        return root
    return None


_root = _source_tree(Path(__file__).resolve().parent)
if _root is not None and str(_root) not in __path__:
    __path__.append(str(_root))
del _root


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
