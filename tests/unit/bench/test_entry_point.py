"""``python -m bench``: the registry, ``--list``, usage errors, and no ``sys.path`` edits under bench/."""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import run_all
from bench.__main__ import BENCHMARKS, description, main

REPO = Path(__file__).resolve().parents[3]
BENCH = REPO / "bench"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          check=False,
                          timeout=120)


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_every_registered_name_imports_and_has_main(name):
    module = importlib.import_module(BENCHMARKS[name])
    assert callable(getattr(module, "main", None)), f"{BENCHMARKS[name]} has no main"
    params = inspect.signature(module.main).parameters
    assert "argv" in params and params["argv"].default is None, "main(argv: list[str] | None = None) -> int"
    assert description(BENCHMARKS[name]), f"{BENCHMARKS[name]} has no docstring"


def test_every_benchmark_main_under_bench_is_registered():
    """Each module under bench/ with a command line (``if __name__ == "__main__"``) is reachable by name."""
    registered = set(BENCHMARKS.values())
    # installers of the GPU host's environment, run by install.sh / fetch_wheels.sh, not benchmarks; the engine
    # process a benchmark starts as its own child (bench.trace.run launches bench.trace.engine_proc)
    tools = {"bench.gpu.wheelset", "bench.gpu.check_deps", "bench.__main__", "bench.trace.engine_proc"}
    missing = []
    for path in sorted(BENCH.rglob("*.py")):
        if 'if __name__ == "__main__"' in path.read_text():
            module = ".".join(path.relative_to(REPO).with_suffix("").parts)
            if module not in registered | tools:
                missing.append(module)
    assert not missing, f"not in bench/__main__.py's BENCHMARKS: {missing}"


def test_run_all_goes_through_the_registry():
    assert {name for name, _, _ in run_all.BENCHMARKS} <= set(BENCHMARKS)


def test_list_prints_every_name():
    result = run_cli("--list")
    assert result.returncode == 0, result.stderr
    names = [line.split()[0] for line in result.stdout.splitlines() if line.strip()]
    assert names == list(BENCHMARKS)


def test_unknown_name_is_a_usage_error():
    result = run_cli("no-such-benchmark")
    assert result.returncode == 2
    assert "unknown benchmark" in result.stderr and "usage:" in result.stderr


def test_no_arguments_is_a_usage_error(capsys):
    assert main([]) == 2
    assert "usage:" in capsys.readouterr().err


def test_name_runs_its_main_with_the_rest_of_the_arguments():
    result = run_cli("sim", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m bench sim")


def _edits_sys_path(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        target = node.func.value if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else None
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(ast.unparse(t).startswith("sys.path") for t in targets):
                return True
        if target is not None and ast.unparse(target) == "sys.path":
            return True
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("site.addsitedir", "addsitedir"):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "sys" and any(a.name == "path" for a in node.names):
            return True  # a bare ``path`` is sys.path under another name
    return False


def test_no_file_under_bench_edits_sys_path():
    offenders = [path.relative_to(REPO).as_posix() for path in sorted(BENCH.rglob("*.py"))
                 if _edits_sys_path(ast.parse(path.read_text()))]
    assert not offenders, (f"sys.path edited in {offenders}: run as a module from the repository root, and give a "
                           "child process its PYTHONPATH instead (bench/gpu/premise.py re-executes itself)")


def test_the_sys_path_check_sees_an_edit():
    assert _edits_sys_path(ast.parse("import sys\nsys.path.insert(0, 'x')"))
    assert _edits_sys_path(ast.parse("import sys\nsys.path += ['x']"))
    assert _edits_sys_path(ast.parse("import sys\nsys.path[:0] = ['x']"))
    assert _edits_sys_path(ast.parse("import site\nsite.addsitedir('x')"))
    assert _edits_sys_path(ast.parse("from sys import path\npath.append('x')"))
    assert not _edits_sys_path(ast.parse("import sys\nprint(sys.path)"))


@pytest.mark.parametrize("argv", [["--max-num-seqs", "0"], ["--k-max", "0"], ["--max-capture", "-4"]])
def test_dispatch_check_refuses_sizes_it_cannot_build(argv, capsys) -> None:
    from bench.gpu import dispatch_check

    with pytest.raises(SystemExit) as refused:
        dispatch_check.main(argv)
    assert refused.value.code == 2 and "must be positive" in capsys.readouterr().err


def _imports_tests(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module") and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names = [node.args[0].value]
        if any(n == "tests" or n.startswith("tests.") for n in names):
            return True
    return False


def test_no_file_under_bench_imports_tests():
    """bench/ runs where tests/ is not shipped (the GPU host's checkout): the tests import bench, never the reverse."""
    offenders = [path.relative_to(REPO).as_posix() for path in sorted(BENCH.rglob("*.py"))
                 if _imports_tests(ast.parse(path.read_text()))]
    assert not offenders, f"bench/ imports tests/ in {offenders}: move what it needs into bench/support/"


def test_the_tests_import_check_sees_an_import():
    assert _imports_tests(ast.parse("import tests.support.stack"))
    assert _imports_tests(ast.parse("def f():\n    from tests.support import stack"))
    assert _imports_tests(ast.parse("import importlib\nimportlib.import_module('tests.support.stack')"))
    assert not _imports_tests(ast.parse("from bench.support import stack\nimport testsuite"))
