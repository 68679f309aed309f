"""scripts/rewrite_imports.py: old module paths become new ones in every form, whole names only, idempotently;
and the tree itself names no old path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def rw():
    spec = importlib.util.spec_from_file_location("rewrite_imports", REPO / "scripts" / "rewrite_imports.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.mark.parametrize(("before", "after"), [
    ("from specctl_vllm.controller.protocol import MAX_K\n", "from specctl_vllm.kernel.protocol import MAX_K\n"),
    ("import specctl_vllm.controller.core.model.cells as c\n", "import specctl_vllm.kernel.model.cells as c\n"),
    ("from specctl_vllm.controller import protocol\n", "from specctl_vllm.kernel import protocol\n"),
    # one statement whose names now live in two packages becomes two, indentation kept
    ("def f():\n    from specctl_vllm.controller.core import cost, brain\n",
     "def f():\n    from specctl_vllm.kernel import cost\n    from specctl_vllm.controller.core import brain\n"),
    ("from specctl_vllm.controller.core.model import measured as m, batch\n",
     "from specctl_vllm.kernel.model import measured as m\nfrom specctl_vllm.controller.core.model import batch\n"),
    ("from specctl_vllm.controller.core import (\n    replay,\n    budget,\n)\n",
     "from specctl_vllm.controller.core.offline import replay\nfrom specctl_vllm.controller.core.learn import budget\n"),
    # whole names: cost is not cost_fit, core.budget is not core.model.budget
    ('x = "specctl_vllm.controller.core.cost_fit.MIN_BASE_S"\n',
     'x = "specctl_vllm.controller.core.learn.cost_fit.MIN_BASE_S"\n'),
    ('x = "specctl_vllm.controller.core.budget"\n', 'x = "specctl_vllm.controller.core.learn.budget"\n'),
    ("# see controller/core/cost.py and tests/unit/core/test_cost.py::test_x\n",
     "# see kernel/cost.py and tests/unit/kernel/test_cost.py::test_x\n"),
    ("from tests.unit.core.test_replay import _batches\n", "from tests.unit.core.offline.test_replay import _batches\n"),
    ("from specctl_vllm.controller.core import brain\n", "from specctl_vllm.controller.core import brain\n"),
])
def test_rewrite(rw, before: str, after: str) -> None:
    assert rw.rewrite(before, python=True) == after
    assert rw.rewrite(after, python=True) == after  # idempotent


def test_no_file_names_an_old_path(rw) -> None:
    stale = []
    for path in rw._files([]):
        text = path.read_text(encoding="utf-8")
        if rw.rewrite(text, python=path.suffix == ".py") != text:
            stale.append(str(path.relative_to(REPO)))
    assert stale == [], "run: python scripts/rewrite_imports.py"
