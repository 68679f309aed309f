"""The policy the engine applies, validated against the engine's own limits, swapped atomically.

A :class:`PolicyTable` is immutable: the reporter thread builds a new one from each
:class:`~specctl_vllm.kernel.protocol.Policy` it receives and replaces the reference in :class:`PolicyHolder` (one
attribute assignment, atomic under the GIL); the engine loop reads the reference once per step.

Engine-side validation (:func:`resolve`), whatever the controller sends:

* ``k`` and the adaptation bounds are clamped to the engine's ``num_speculative_tokens`` (drafts beyond it
  cannot be verified: vLLM sized its buffers for it);
* method ``engine`` or the engine's own drafter name → the engine's drafter; ``off`` → k = 0; a model-free
  method the patch computes (``ngram``/``suffix``, synchronous scheduling only) → that method; anything else
  → the engine's drafter;
* an :class:`~specctl_vllm.kernel.protocol.AdaptRule` left at its default (``k_max == 0``) while ``k > 0`` means "no
  per-request adaptation": the request keeps ``k``.

Expiry: a table is applied until ``received_at + ttl_s`` on the engine's monotonic clock; after that, and
before the first policy, the engine runs its static speculative config (:func:`static_table`), which makes
the patch a no-op: every request keeps the engine's own k and drafter.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from specctl_vllm.kernel import drafters, protocol
from specctl_vllm.kernel.adapt import RETRY_EVERY, RequestK


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """What the engine can do: its static speculative config and whether drafts can be replaced."""

    method: str  # vLLM's speculative method name, or "off"
    k_max: int  # num_speculative_tokens (0 without speculation)
    model_free_methods: tuple[str, ...] = ()  # drafters the patch may substitute (synchronous scheduling only)
    full_cuda_graphs: bool = False  # uniform decode batches replay a full CUDA graph (mixed k runs piecewise)
    #: Graph-shaped engines: the widths with captured full graphs (ascending, 0 first); () = per-request k.
    graph_widths: tuple[int, ...] = ()

    def to_protocol(self, token_budget: int | None = None) -> protocol.SpecConfig:
        """The spec the engine reports; ``token_budget`` only for graph-shaped engines, whose width rule uses it."""
        return protocol.SpecConfig(
            method=self.method, k_max=self.k_max, model_free_methods=list(self.model_free_methods),
            full_cuda_graphs=self.full_cuda_graphs, graph_widths=list(self.graph_widths),
            token_budget=(token_budget if self.graph_widths and token_budget
                          and token_budget <= protocol.MAX_TOKEN_BUDGET else None),
        )


@dataclass(frozen=True, slots=True)
class CategoryRule:
    """One category's effective, engine-validated policy."""

    k: int  # starting proposal length of a request
    method: str  # drafter of this category's drafts: the engine's name, a model-free one, or "off"
    model_free: bool  # True: the patch computes the drafts (the method differs from the engine's drafter)
    adapt: protocol.AdaptRule  # per-request bounds; k_min == k_max means a fixed k
    probe_rate: float = 0.0  # while k == 0: share of requests that run ``probe`` instead
    probe: CategoryRule | None = None
    source: str = "policy"

    @property
    def fixed(self) -> bool:
        """No per-request adaptation: every request of the category keeps ``k``."""
        return self.adapt.k_min == self.adapt.k_max


_generations = itertools.count(1)


@dataclass(frozen=True, slots=True)
class StepCellRows:
    """The controller's cell table resolved to this engine's width set (missing widths cost +inf)."""

    batch_edges: tuple[int, ...]
    step_s: tuple[tuple[float, ...], ...]
    steps: tuple[tuple[float, ...], ...]

    def bucket(self, n: int) -> int:
        edges = self.batch_edges
        i = 0
        while i < len(edges) - 1 and n > edges[i]:
            i += 1
        return i


def resolve_cells(cells: protocol.StepCells | None, widths: tuple[int, ...]) -> StepCellRows | None:
    if cells is None or not widths:
        return None
    index = {w: j for j, w in enumerate(cells.widths)}
    step_s = tuple(tuple(row[index[w]] if w in index else math.inf for w in widths) for row in cells.step_s)
    steps = tuple(tuple(row[index[w]] if w in index else 0.0 for w in widths) for row in cells.steps)
    return StepCellRows(tuple(cells.batch_edges), step_s, steps)


def resolve_curve(expected: list[float], k_max: int) -> tuple[float, ...]:
    """E(K) for K = 0..k_max, non-decreasing, extended flat; () when the controller sent none."""
    if not expected:
        return ()
    out = [1.0]
    for k in range(1, k_max + 1):
        value = expected[min(k, len(expected) - 1)]
        out.append(min(max(value, out[-1]), k + 1.0))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class PolicyTable:
    version: int | None  # None: the engine's static config
    expires_at: float  # engine monotonic clock; +inf for the static table
    default: CategoryRule
    categories: Mapping[str, CategoryRule] = field(default_factory=dict)
    #: Changes with every table that says something new (a new version, or new rules); the width rule
    #: recomputes on it (the cells and curves may have moved).
    generation: int = field(default_factory=lambda: next(_generations))
    #: Changes only with the rules: a new version that moves the cells or curves alone (the controller's
    #: learning bumps the version a few times a second at 256 requests) keeps it, so the requests' resolved
    #: states and the last batch pass stay valid (on the H200 a new generation cost a pass over the batch on
    #: 12 % of the steps at 256 requests, session 17).
    rules_generation: int = field(default_factory=lambda: next(_generations))
    #: Graph-shaped engines: E_c(K) per category (K = 0..k_max) and the default category's curve.
    curves: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    default_curve: tuple[float, ...] = ()
    #: Graph-shaped engines: per batch bucket, (step seconds, measured steps) aligned to the engine's widths.
    cells: StepCellRows | None = None

    @property
    def is_static(self) -> bool:
        return self.version is None

    def rule_for(self, category: str) -> CategoryRule:
        return self.categories.get(category, self.default)


def fixed_rule(k: int, method: str, model_free: bool = False, source: str = "default") -> CategoryRule:
    return CategoryRule(
        k=k, method=method, model_free=model_free, adapt=protocol.AdaptRule(k_min=k, k_max=k), source=source
    )


def static_table(engine: EngineSpec) -> PolicyTable:
    """The engine's own config: every category at the engine's k with the engine's drafter."""
    method = engine.method if engine.k_max > 0 else protocol.METHOD_OFF
    return PolicyTable(version=None, expires_at=math.inf, default=fixed_rule(engine.k_max, method))


def _resolve_method(requested: str, engine: EngineSpec) -> tuple[str, bool]:
    real = drafters.resolve(requested, engine.method)
    if real == protocol.METHOD_OFF:
        return protocol.METHOD_OFF, False
    if real == engine.method:
        return engine.method, False
    if real in engine.model_free_methods:
        return real, True
    return engine.method, False  # unknown or unavailable here: the engine's drafter


def resolve(policy: protocol.CategoryPolicy, engine: EngineSpec) -> CategoryRule:
    """Clamp one category's policy to what this engine can do (see the module docstring)."""
    cap = engine.k_max
    method, model_free = _resolve_method(policy.method, engine)
    probe = None
    if policy.probe_rate > 0 and min(policy.probe_k, cap) > 0:
        # Probes measure what the category would get with drafts: the engine's drafter when the policy is off.
        probe_method, probe_free = (engine.method, False) if method == protocol.METHOD_OFF else (method, model_free)
        probe = fixed_rule(min(policy.probe_k, cap), probe_method, probe_free, source="probe")
    probe_rate = policy.probe_rate if probe is not None else 0.0
    if cap == 0 or method == protocol.METHOD_OFF:
        off = fixed_rule(0, protocol.METHOD_OFF, source=policy.source)
        return CategoryRule(
            k=0, method=off.method, model_free=False, adapt=off.adapt,
            probe_rate=probe_rate, probe=probe, source=policy.source,
        )
    k = min(policy.k, cap)
    rule = policy.adapt
    if rule.k_max == 0:  # the default rule: no per-request adaptation
        adapt = protocol.AdaptRule(k_min=k, k_max=k)
    else:
        k_max = min(rule.k_max, cap)
        adapt = protocol.AdaptRule(
            k_min=min(rule.k_min, k_max), k_max=k_max, drop_after=rule.drop_after, climb_after=rule.climb_after
        )
        k = min(max(k, adapt.k_min), adapt.k_max)
    if adapt.k_max == 0:
        method, model_free = protocol.METHOD_OFF, False
    return CategoryRule(
        k=k, method=method, model_free=model_free, adapt=adapt,
        probe_rate=probe_rate if k == 0 else 0.0, probe=probe if k == 0 else None, source=policy.source,
    )


def build_table(
    policy: protocol.Policy, engine: EngineSpec, received_at: float, previous: PolicyTable | None = None
) -> PolicyTable:
    """An immutable table from a controller policy. Rules equal to the previous table's are reused (same
    object), so the engine keeps a request's adaptation state when the policy did not change for its category."""
    old: dict[CategoryRule, CategoryRule] = {}
    if previous is not None:
        old = {rule: rule for rule in (previous.default, *previous.categories.values())}

    def intern(rule: CategoryRule) -> CategoryRule:
        return old.setdefault(rule, rule)

    categories = {name: intern(resolve(cp, engine)) for name, cp in policy.categories.items()}
    default = intern(resolve(policy.default, engine))
    same_rules = (
        previous is not None
        and previous.default is default
        and previous.categories.keys() == categories.keys()
        and all(previous.categories[name] is rule for name, rule in categories.items())
    )
    extra: dict = {}
    if same_rules and previous is not None:
        extra["rules_generation"] = previous.rules_generation
        if previous.version == policy.version:
            extra["generation"] = previous.generation
    if engine.graph_widths:
        extra["curves"] = MappingProxyType({name: resolve_curve(cp.expected, engine.k_max)
                                            for name, cp in policy.categories.items() if cp.expected})
        extra["default_curve"] = resolve_curve(policy.default.expected, engine.k_max)
        extra["cells"] = resolve_cells(policy.step_cells, engine.graph_widths)
    return PolicyTable(
        version=policy.version,
        expires_at=received_at + policy.ttl_s,
        default=default,
        categories=MappingProxyType(categories),
        **extra,
    )


class PolicyHolder:
    """The one mutable reference shared by the reporter thread (writer) and the engine loop (reader)."""

    def __init__(self, engine: EngineSpec) -> None:
        self.engine = engine
        self.static = static_table(engine)
        self._table = self.static

    def install(self, policy: protocol.Policy, now: float) -> PolicyTable:
        table = build_table(policy, self.engine, now, previous=self._table)
        self._table = table
        return table

    def current(self, now: float) -> PolicyTable:
        """The table to apply at ``now``: the latest policy until it expires, then the static config."""
        table = self._table
        return table if table.expires_at > now else self.static

    def applied_version(self, now: float) -> int | None:
        return self.current(now).version


def next_k_bound(state: RequestK, rule: CategoryRule) -> int:
    """Largest k the request can have after its next adaptation step (:func:`specctl_vllm.kernel.adapt.next_k`).

    The drafter drafts next step's tokens during this step, so the batch's drafting depth must already cover
    where each request may climb to: +1 after a full acceptance streak, ``max(k_min, 1)`` on a retry from 0.
    """
    k = state.k
    adapt = rule.adapt
    if adapt.k_min == adapt.k_max:
        return k
    if k == 0:
        return max(adapt.k_min, 1) if (adapt.k_max > 0 and state.idle_steps + 1 >= RETRY_EVERY) else 0
    if state.full_streak + 1 >= adapt.climb_after:
        return min(k + 1, adapt.k_max)
    return k
