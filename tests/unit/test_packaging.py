"""What the wheel installs, and one import namespace for the code (docs/packaging.md).

* The wheel's top level is ``specctl_vllm/`` and its dist-info only: no generic ``controller``, ``engine_patch``
  or ``kernel`` package in site-packages; pyproject.toml maps the three subpackages to the repository's
  top-level folders (``package-dir``, no symlinks) and lists every package.
* From a source tree on ``PYTHONPATH`` the same names resolve to the same folders.
* Nothing in the project imports or names the bare top-level packages. In the repository both
  ``controller.x`` and ``specctl_vllm.controller.x`` are importable; using both would load every module twice,
  with two copies of every class, so ``isinstance`` checks and module state would split.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "specctl_vllm"
#: the repository folders the namespace's subpackages are: never imported by these names
BARE = ("controller", "engine_patch", "kernel")
#: where Python code that must import through the namespace lives
PY_ROOTS = ("controller", "engine_patch", "bench", "tests", "scripts", "dashboards")
#: other files that name modules (command lines, deploy files, docs)
TEXT_ROOTS = ("controller", "engine_patch", "deploy", "docs", "bench", "scripts", ".ci", "tests", "dashboards")
TEXT_FILES = ("Makefile", "README.md", "pyproject.toml")
TEXT_SUFFIXES = {".md", ".yaml", ".yml", ".toml", ".sh", ".txt", ".py", ".cfg", ".ini", ".json", ""}
SKIP_DIRS = {"__pycache__", "results", "wheels", "parts", ".venv", ".cache"}
#: recorded on purpose with both the old and the new module paths (the migration note)
SKIP_FILES = {"docs/packaging.md"}


def _submodules(package: str) -> set[str]:
    folder = REPO / package
    return {p.stem for p in folder.glob("*.py")} | {p.name for p in folder.iterdir() if (p / "__init__.py").exists()}


def _bare_reference() -> re.Pattern[str]:
    """A dotted module path that starts at a bare package (``<bare>.<one of its modules>``), or ``-m <bare>``."""
    alternatives = []
    for package in BARE:
        subs = "|".join(sorted(map(re.escape, _submodules(package))))
        # not a logger name quoted in a JSON log line (logger names stay as they were)
        alternatives.append(rf"(?<![\w./-])(?<!\"logger\": \"){package}\.(?:{subs})\b")
        alternatives.append(rf"-m[\"',\s]+{package}(?![\w./-])")
    return re.compile("|".join(alternatives))


BARE_REFERENCE = _bare_reference()
#: logger names are log identifiers, not module paths: they stay as they were
LOGGER_CALLS = {"getLogger", "LogRecord"}


def _walk(roots: tuple[str, ...], keep) -> list[Path]:
    out = []
    for root in roots:
        for folder, dirs, files in os.walk(REPO / root):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
            out += [Path(folder) / f for f in sorted(files) if keep(Path(folder) / f)]
    return out


def _bare(name: str) -> bool:
    return name.split(".")[0] in BARE


def _logger_names(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in LOGGER_CALLS:
                ids.add(id(node.args[0]))
    return ids


def _setuptools() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_pyproject_maps_the_subpackages_to_the_repository_folders() -> None:
    assert _setuptools()["package-dir"] == {f"{NAMESPACE}.{package}": package for package in BARE}
    # no links: the package is the folder with its __init__.py, the subpackages live beside it
    assert not [p for p in (REPO / NAMESPACE).iterdir() if p.is_symlink() or p.name in BARE]


def test_pyproject_lists_every_package() -> None:
    """An explicit list (package-dir maps names to folders outside specctl_vllm/, which the finder cannot
    walk): a new subpackage must be added there, or the wheel ships without it."""
    folders = {NAMESPACE} | {
        ".".join((NAMESPACE, *init.parent.relative_to(REPO).parts))
        for package in BARE for init in (REPO / package).rglob("__init__.py") if "__pycache__" not in init.parts
    }
    assert sorted(_setuptools()["packages"]) == sorted(folders)


def test_a_source_tree_resolves_the_namespace_to_its_folders() -> None:
    """PYTHONPATH=<checkout> without an install (the GPU host, benchmark subprocesses): specctl_vllm extends
    its __path__ with the checkout, so each subpackage is the checkout's folder."""
    code = ("import specctl_vllm.controller as c, specctl_vllm.engine_patch as e, specctl_vllm.kernel as k; "
            "print(c.__file__, e.__file__, k.__file__)")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd="/", env=env)
    assert done.stdout.split() == [str(REPO / package / "__init__.py") for package in BARE]


def test_no_module_imports_a_bare_top_level_package() -> None:
    offenders = []
    for path in _walk(PY_ROOTS, lambda p: p.suffix == ".py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            offenders += [f"{path.relative_to(REPO)}:{node.lineno}: {n}" for n in names if _bare(n)]
    assert offenders == [], f"import through {NAMESPACE}.*: {offenders}"


def test_no_python_string_names_a_bare_module_path() -> None:
    """monkeypatch targets, ``importlib.import_module`` arguments, ``--scheduler-cls`` values, docstrings."""
    offenders = []
    for path in _walk(PY_ROOTS, lambda p: p.suffix == ".py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        loggers = _logger_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in loggers:
                offenders += [f"{path.relative_to(REPO)}:{node.lineno}: {m.group(0)}"
                              for m in BARE_REFERENCE.finditer(node.value)]
    assert offenders == []


def test_no_deploy_file_or_doc_names_a_bare_module_path() -> None:
    def keep(path: Path) -> bool:
        return path.suffix in TEXT_SUFFIXES and path.relative_to(REPO).as_posix() not in SKIP_FILES

    paths = _walk(TEXT_ROOTS, keep) + [REPO / name for name in TEXT_FILES]
    offenders = []
    for path in paths:
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            if path.suffix == ".py" and any(f"{call}(" in line for call in LOGGER_CALLS):
                continue
            offenders += [f"{path.relative_to(REPO)}:{lineno}: {m.group(0)}" for m in BARE_REFERENCE.finditer(line)]
    assert offenders == []


def test_the_guard_sees_the_old_forms() -> None:
    for text in ("x.engine_patch.scheduler", "docs/controller.md", "controller.url", "specctl_vllm.controller.cli",
                 '{"logger": "controller.service"}'):
        assert not BARE_REFERENCE.search(text), text
    for package in BARE:
        module = min(_submodules(package) - {"__init__", "__main__"})
        for text in (f"{package}.{module}", f'"-m", "{package}"', f"python -m {package} serve"):
            assert BARE_REFERENCE.search(text), text


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    """``pip wheel`` on a copy of what the Dockerfiles copy, offline."""
    context = tmp_path_factory.mktemp("context")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, context / name)
    for name in (*BARE, NAMESPACE):
        shutil.copytree(REPO / name, context / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(out),
         str(context)],
        check=False, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = out.glob("specctl_vllm-*.whl")
    return zipfile.ZipFile(path)


def test_the_wheel_installs_one_top_level_package(wheel) -> None:
    names = wheel.namelist()
    top = {name.split("/")[0] for name in names}
    (info,) = [t for t in top if t.endswith(".dist-info")]
    assert top == {NAMESPACE, info}
    assert info.startswith("specctl_vllm-")
    assert wheel.read(f"{info}/top_level.txt").decode().split() == [NAMESPACE]
    # every module of the three folders is a real file in the wheel, under the namespace
    for package in BARE:
        for path in (REPO / package).rglob("*.py"):
            if "__pycache__" not in path.parts:
                assert f"{NAMESPACE}/{path.relative_to(REPO).as_posix()}" in names, path
    assert f"{NAMESPACE}/controller/openapi.json" in names


def test_the_wheel_entry_points_name_the_namespace(wheel) -> None:
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    text = wheel.read(entry_points).decode()
    assert "specctl = specctl_vllm.controller.cli:main" in text
    assert "specctl-vllm = specctl_vllm.controller.cli:main" in text
    plugins = text.split("[vllm.general_plugins]", 1)[1].split("[", 1)[0]
    assert plugins.split() == ["specctl", "=", "specctl_vllm.engine_patch.plugin:register"]


# --- the install a new user makes (README, docs/packaging.md, `make dist`, CI's wheel step) ------------------------

def _shell_blocks(text: str) -> list[str]:
    return [line.split("#")[0].strip() for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL)
            for line in block.splitlines()]


@pytest.mark.parametrize("doc", ["README.md", "docs/packaging.md"])
def test_install_commands_work_before_the_distribution_is_published(doc: str) -> None:
    """No command installs `specctl-vllm` from PyPI (not yet published) or installs `specctl` (another project);
    the docs say so, and name the distribution the project will publish under."""
    text = (REPO / doc).read_text()
    assert "not yet published" in text and "`specctl-vllm`" in text
    installs = [line for line in _shell_blocks(text) if "pip install" in line]
    assert installs, doc
    for line in installs:
        target = line.split("pip install", 1)[1]
        assert "dist/specctl_vllm-" in target or "-e ." in target or "-e '." in target, line
        assert not re.search(r"(?<![\w/-])specctl(-vllm)?(\[|\s|'|$)", target.replace("dist/specctl_vllm-", "")), line


def test_make_dist_builds_sdist_and_wheel_and_ci_installs_the_wheel() -> None:
    makefile = (REPO / "Makefile").read_text()
    dist = makefile.split("\ndist:", 1)[1].split("\n\n", 1)[0]
    assert "pip wheel" in dist and "build_sdist" in dist
    check = makefile.split("\nwheel-check:", 1)[1].split("\n\n", 1)[0]
    assert "-m venv" in check and "pip install -q dist/specctl_vllm-*.whl" in check
    assert "specctl --version" in check and "specctl-vllm" in check and "specctl serve --help" in check
    ci = [line.strip() for line in (REPO / ".ci/run").read_text().splitlines() if not line.startswith("#")]
    assert ci.index("make wheel-check") > ci.index("make test")
