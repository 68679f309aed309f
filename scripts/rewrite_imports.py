"""Rewrite module paths after modules moved (issue 39: the shared kernel, controller/core grouped by role).

Usage::

    python scripts/rewrite_imports.py              # every .py under the code folders, plus controller/openapi.json
    python scripts/rewrite_imports.py docs README.md  # also these files (a folder: its text files)
    python scripts/rewrite_imports.py --check      # exit 1, listing the files, if anything still names an old path

Idempotent: a rewritten file names no old path, so a second run changes nothing. Re-run it after merging a
branch whose new code still uses the old paths.

Three rewrites, in this order:

1. ``from <package> import <module>, ...`` (Python files, parsed): a name that is a moved module is imported
   from its new package; one statement whose names now live in different packages becomes one per package.
2. Dotted module paths anywhere in the text (imports, monkeypatch targets, docstrings, JSON):
   ``specctl_vllm.controller.protocol.MAX_K`` -> ``specctl_vllm.kernel.protocol.MAX_K``.
3. Repository file paths of moved modules and of their tests (:data:`PATH_MOVES`):
   ``controller/core/cost.py`` -> ``kernel/cost.py``.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NS = "specctl_vllm"

#: old dotted module -> new dotted module. Append here when a module moves; never remove a line (a branch
#: merged later may still use the old path).
MOVES: dict[str, str] = {
    # the shared kernel: what the controller and the engine patch both import
    f"{NS}.controller.protocol": f"{NS}.kernel.protocol",
    f"{NS}.controller.drafters": f"{NS}.kernel.drafters",
    f"{NS}.controller.adapt": f"{NS}.kernel.adapt",
    f"{NS}.controller.proposers": f"{NS}.kernel.proposers",
    f"{NS}.controller.core.cost": f"{NS}.kernel.cost",
    f"{NS}.controller.core.decay": f"{NS}.kernel.decay",
    f"{NS}.controller.core.model.budget": f"{NS}.kernel.model.budget",
    f"{NS}.controller.core.model.cells": f"{NS}.kernel.model.cells",
    f"{NS}.controller.core.model.measured": f"{NS}.kernel.model.measured",
    f"{NS}.controller.core.model.widths": f"{NS}.kernel.model.widths",
    # controller/core grouped by role: what the controller learns, and offline evaluation
    **{f"{NS}.controller.core.{m}": f"{NS}.controller.core.learn.{m}"
       for m in ("learner", "estimator", "cost_fit", "mix", "engines", "entropy", "budget")},
    **{f"{NS}.controller.core.{m}": f"{NS}.controller.core.offline.{m}"
       for m in ("replay", "replay_path", "whatif", "token_traces", "ema_tiers")},
}

#: other files that moved (tests with their code): old repository path -> new, rewritten where text names them
PATH_MOVES: dict[str, str] = {
    "tests/unit/core/test_cost.py": "tests/unit/kernel/test_cost.py",
    "tests/unit/core/test_decay.py": "tests/unit/kernel/test_decay.py",
    "tests/unit/test_drafters.py": "tests/unit/kernel/test_drafters.py",
    "tests/unit/core/model/test_cells.py": "tests/unit/kernel/model/test_cells.py",
    "tests/unit/core/model/test_measured.py": "tests/unit/kernel/model/test_measured.py",
    "tests/unit/core/model/test_widths.py": "tests/unit/kernel/model/test_widths.py",
    **{f"tests/unit/core/test_{m}.py": f"tests/unit/core/learn/test_{m}.py"
       for m in ("budget", "engines", "entropy", "estimator", "mix")},
    **{f"tests/unit/core/test_{m}.py": f"tests/unit/core/offline/test_{m}.py"
       for m in ("replay", "replay_path", "replay_recordings", "whatif", "engine_clock")},
}
#: test modules that moved, by dotted name (a test importing another's helpers)
TEST_MOVES: dict[str, str] = {
    old.removesuffix(".py").replace("/", "."): new.removesuffix(".py").replace("/", ".")
    for old, new in PATH_MOVES.items()
}

#: where Python files are rewritten by default
CODE_ROOTS = ("controller", "engine_patch", "kernel", "bench", "scripts", "tests", "deploy", "dashboards", NS)
#: other files rewritten by default (generated from docstrings that name modules)
DEFAULT_FILES = ("controller/openapi.json",)
TEXT_SUFFIXES = {".py", ".md", ".json", ".yaml", ".yml", ".toml", ".sh", ".txt", ".cfg", ".ini", ".Dockerfile", ""}
SKIP_DIRS = {"__pycache__", ".git", ".venv", ".cache", "results", "wheels", "parts", "node_modules"}
#: these name the old paths on purpose
SKIP_FILES = {"scripts/rewrite_imports.py", "tests/unit/scripts/test_rewrite_imports.py"}


def _dotted_pattern(moves: dict[str, str]) -> re.Pattern[str]:
    # longest first, and whole dotted names only: core.cost must not match core.cost_fit
    keys = sorted(moves, key=len, reverse=True)
    return re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, keys)) + r")(?!\w)")


def _path_of(module: str) -> str:
    return module.removeprefix(f"{NS}.").replace(".", "/") + ".py"


def _path_pattern(moves: dict[str, str]) -> tuple[re.Pattern[str], dict[str, str]]:
    paths = {_path_of(old): _path_of(new) for old, new in moves.items()} | PATH_MOVES
    keys = sorted(paths, key=len, reverse=True)
    return re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, keys)) + r")(?![\w])"), paths


def _split_from_imports(text: str, moves: dict[str, str]) -> str:
    """Rewrite ``from pkg import mod`` where ``pkg.mod`` moved; regroup by target package."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    lines = text.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
            continue
        if not any(f"{node.module}.{a.name}" in moves for a in node.names):
            continue
        first = lines[node.lineno - 1]
        indent = first[: node.col_offset]
        last = lines[node.end_lineno - 1]
        if indent.strip() or last[node.end_col_offset:].strip():
            print(f"rewrite_imports: skipped a compound line: {first.strip()}", file=sys.stderr)
            continue
        groups: dict[str, list[str]] = {}
        for alias in node.names:
            target = moves.get(f"{node.module}.{alias.name}")
            if target:
                package, name = target.rsplit(".", 1)
                asname = alias.asname or (alias.name if name != alias.name else None)
            else:
                package, name, asname = node.module, alias.name, alias.asname
            groups.setdefault(package, []).append(name + (f" as {asname}" if asname else ""))
        new = "".join(_from_import(indent, package, names) for package, names in groups.items())
        edits.append((node.lineno - 1, node.end_lineno, new))
    for start, end, new in sorted(edits, reverse=True):
        lines[start:end] = [new]
    return "".join(lines)


def _from_import(indent: str, package: str, names: list[str]) -> str:
    line = f"{indent}from {package} import {', '.join(names)}\n"
    if len(line) <= 121:
        return line
    body = "".join(f"{indent}    {name},\n" for name in names)
    return f"{indent}from {package} import (\n{body}{indent})\n"


def rewrite(text: str, *, python: bool, moves: dict[str, str] | None = None) -> str:
    moves = {**MOVES, **TEST_MOVES} if moves is None else moves
    if python:
        text = _split_from_imports(text, moves)
    text = _dotted_pattern(moves).sub(lambda m: moves[m.group(1)], text)
    pattern, paths = _path_pattern(moves)
    return pattern.sub(lambda m: paths[m.group(1)], text)


def _files(args: list[str]) -> list[Path]:
    out: list[Path] = []
    for root in CODE_ROOTS:
        out += _walk(REPO / root, lambda p: p.suffix == ".py")
    out += [REPO / f for f in DEFAULT_FILES if (REPO / f).is_file()]
    for arg in args:
        path = Path(arg)
        out += _walk(path, lambda p: p.suffix in TEXT_SUFFIXES) if path.is_dir() else [path]
    return sorted(p for p in {p.resolve() for p in out} if not _skipped(p))


def _skipped(path: Path) -> bool:
    return path.is_relative_to(REPO) and path.relative_to(REPO).as_posix() in SKIP_FILES


def _walk(folder: Path, keep) -> list[Path]:
    if not folder.is_dir() or folder.is_symlink():
        return []
    found = []
    for path in folder.iterdir():
        if path.is_symlink() or path.name in SKIP_DIRS:
            continue
        if path.is_dir():
            found += _walk(path, keep)
        elif keep(path):
            found.append(path)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="further files or folders (their text files) to rewrite")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file names an old path")
    args = parser.parse_args(argv)
    changed = []
    for path in _files(args.paths):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        new = rewrite(text, python=path.suffix == ".py")
        if new != text:
            changed.append(path)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    for path in changed:
        print(path.relative_to(REPO) if path.is_relative_to(REPO) else path)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
