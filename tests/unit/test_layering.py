"""Which package may import which: the kernel sits below both sides, the two sides never import each other.

* ``specctl_vllm.kernel`` imports neither the controller nor the engine patch: the engine loads the kernel
  without any controller code, and the controller's formulas are the engine's;
* ``specctl_vllm.engine_patch`` imports nothing of the controller (it runs inside vLLM's EngineCore);
* ``specctl_vllm.controller`` imports nothing of the engine patch (it is a sidecar without vLLM).

Every import counts, module-level or inside a function, ``import x`` or ``from x import y``, absolute or
relative.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NS = "specctl_vllm"

#: (folder, the packages its code must not import)
RULES = [
    ("kernel", (f"{NS}.controller", f"{NS}.engine_patch")),
    ("engine_patch", (f"{NS}.controller",)),
    ("controller", (f"{NS}.engine_patch",)),
]


def imported_modules(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in ``source``, relative ones resolved against ``module``. For
    ``from p import n`` both ``p`` and ``p.n`` are listed (``n`` may be a submodule)."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def _forbidden(name: str, banned: tuple[str, ...]) -> bool:
    return any(name == b or name.startswith(b + ".") for b in banned)


def _module_name(folder: str, path: Path) -> tuple[str, bool]:
    parts = path.relative_to(REPO / folder).with_suffix("").parts
    is_package = parts[-1] == "__init__"
    return ".".join((NS, folder, *parts[: -1 if is_package else None])), is_package


def violations(folder: str, banned: tuple[str, ...]) -> list[str]:
    out = []
    for path in sorted((REPO / folder).rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        module, is_package = _module_name(folder, path)
        for line, name in imported_modules(path.read_text(encoding="utf-8"), module, is_package):
            # a bare top-level name (``controller.x``) is the same package: tests/unit/test_packaging.py bans it
            qualified = name if name.startswith(NS + ".") else f"{NS}.{name}"
            if _forbidden(qualified, banned):
                out.append(f"{path.relative_to(REPO)}:{line}: {name}")
    return out


@pytest.mark.parametrize(("folder", "banned"), RULES, ids=[folder for folder, _ in RULES])
def test_layering(folder: str, banned: tuple[str, ...]) -> None:
    assert (REPO / folder / "__init__.py").is_file()
    assert violations(folder, banned) == []


@pytest.mark.parametrize(("source", "module", "caught"), [
    (f"from {NS}.controller import protocol\n", f"{NS}.kernel.x", True),
    (f"import {NS}.engine_patch.hook\n", f"{NS}.kernel.x", True),
    (f"def f():\n    from {NS}.controller.core import brain\n", f"{NS}.kernel.x", True),  # function-local
    (f"from {NS} import controller\n", f"{NS}.kernel.x", True),
    ("from ..controller import cli\n", f"{NS}.kernel.x", True),  # relative, out of the kernel
    (f"from {NS}.kernel import protocol\n", f"{NS}.kernel.x", False),
    (f"from {NS}.controllers import x\n", f"{NS}.kernel.x", False),  # a prefix of a name is not the package
])
def test_the_rule_sees_every_form_of_import(source: str, module: str, caught: bool) -> None:
    banned = (f"{NS}.controller", f"{NS}.engine_patch")
    names = [name if name.startswith(NS + ".") else f"{NS}.{name}"
             for _, name in imported_modules(source, module, is_package=False)]
    assert any(_forbidden(n, banned) for n in names) is caught, names
