"""Learned state read back from a snapshot (:meth:`specctl_vllm.controller.core.brain.Brain.dump`), checked part by part."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from specctl_vllm.controller.core.config import BrainConfig
from specctl_vllm.controller.core.learn.engines import EngineBook
from specctl_vllm.controller.core.learn.learner import ModelState
from specctl_vllm.kernel.cost import CostCoefficients
from specctl_vllm.kernel.protocol import CATEGORY_PATTERN, MAX_SEQ, OVERFLOW_CATEGORY

DUMP_FORMAT = "specctl-brain"
DUMP_VERSION = 1
_WIRE_NAME = re.compile(CATEGORY_PATTERN)


def check_model(ms: ModelState) -> None:
    """Raise ValueError when restored state holds a number outside what ingest can produce."""
    for c, st in ms.categories.items():
        if not _WIRE_NAME.match(c) and c != OVERFLOW_CATEGORY:
            raise ValueError(f"category name {c[:64]!r}")
        for est in st.methods.values():
            for v in (est.real_drafts, est.cf_drafts, est.attempts, est.hits, *(est.t_last or 0.0,)):
                if not math.isfinite(v):
                    raise ValueError("non-finite estimator state")
    coef = ms.cost.coefficients().vector()
    if not all(math.isfinite(float(v)) and v >= 0 for v in coef):
        raise ValueError("cost model does not fit")
    for v in (ms.mix.steps, ms.mix.requests, ms.mix.extra_tokens, ms.mix.committed,
              *ms.mix.per_category.values(), *ms.mix.committed_per_category.values()):
        if not math.isfinite(v):
            raise ValueError("non-finite batch mix")


def items(d) -> list:
    return list(d.items()) if isinstance(d, dict) else []


@dataclass
class Restored:
    policy_version: int = 0
    rejected_unknown: int = 0
    models: dict[str, ModelState] = field(default_factory=dict)
    engines: dict[str, EngineBook] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # what was left out, for the operator


def restore(data: dict, config: BrainConfig, preset: CostCoefficients) -> Restored:
    """A :meth:`Brain.dump` read back; parts that do not validate are left out and named in ``problems``."""
    out = Restored()
    if not isinstance(data, dict) or data.get("format") != DUMP_FORMAT or data.get("version") != DUMP_VERSION:
        out.problems.append("unknown snapshot format")
        return out  # unknown or old layout: start fresh rather than misread it
    try:
        out.policy_version = min(MAX_SEQ, max(0, int(data.get("policy_version", 0))))
        out.rejected_unknown = min(MAX_SEQ, max(0, int(data.get("rejected_unknown", 0))))
    except (TypeError, ValueError, OverflowError):
        out.problems.append("bad counters")
    for name, md in items(data.get("models")):
        if len(out.models) >= config.budget.max_models:
            out.problems.append("too many models")
            break
        try:
            ms = ModelState.from_dict(str(name), md, preset, config.learner)
            check_model(ms)
            out.models[str(name)] = ms
            out.problems.extend(f"model {str(name)[:64]!r}: category {c!r} does not validate" for c in ms.load_skipped)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError, ZeroDivisionError) as exc:
            out.problems.append(f"model {str(name)[:64]!r}: {type(exc).__name__}: {str(exc)[:120]}")
    for eid, ed in items(data.get("engines")):
        if len(out.engines) >= config.budget.max_engines:
            out.problems.append("too many engines")
            break
        try:
            out.engines[str(eid)] = EngineBook.from_dict(ed)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            out.problems.append(f"engine {str(eid)[:64]!r}: {type(exc).__name__}: {str(exc)[:120]}")
    return out
