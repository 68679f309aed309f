"""Per-step width choice of a graph-shaped engine (no I/O; O(categories x widths) per step).

This rule is the one owner of the width: the controller's policy sends its inputs (the cell table, E_c(K) per
category, each category capped at k_max) and decides none (``controller/core/policy/README.md``, ``graph.py``);
only an operator's override pins or caps a category.

Each step the engine verifies one width K from its width set for every request, so every step replays a
captured full graph. The choice is :func:`specctl_vllm.kernel.model.widths.choose_width` (the one width rule of the
project) on:

* the step's requests per category (the batch the scheduler just formed: next step's batch, but for the
  requests that finish or join);
* E_c(K) per category: the controller's curve blended with this engine's last few dozen steps
  (:mod:`.fast_curves`);
* T(b, K) and the steps measured per cell from the controller's cell table;
* what this engine measured about its token budget (:class:`BudgetMeter`): the time of a step that filled it,
  the fixed part of a step's time per width (``a_0 + p K``) and the prompt tokens per committed token. Where the widest width could fill
  the budget and the engine has measured full steps, those price every width instead of the cells (the
  steady-step model, :func:`specctl_vllm.kernel.model.widths.steady_goodput`).

The rule is computed at least every ``RULE_REUSE_STEPS`` steps and at once when its inputs move (table, batch
bucket, pricing, a category's share of the batch by ``RULE_REUSE_SHARE``); between two computations a step keeps
the last width. A computation re-blends the fast curves once they are ``CURVE_REFRESH_STEPS`` old.

Operator overrides pin: when every category of the step is pinned to a fixed k by an override, the width is the
largest of those k, rounded down to the width set. Exploration: every ``explore_every``-th step of a bucket
runs the width whose cell has the fewest measured steps, if that is below ``explore_below``; the share of steps
this costs is bounded by ``1 / explore_every``, and shrinks as the model rates its width further above plain
(:meth:`WidthChooser._explore_period`: the loss stays under 0.2 % of goodput at any gain). Only steps that can be measured count and explore: a step that
carries prompt tokens does not enter the cell table (its time is mostly the prompt's), so exploring there
would cost a step at a worse width and measure nothing. Under a load where every step carries a prompt (the
H200 at 256 requests with replaced requests) the steady-step model prices the widths, and its meter times
every step: there every ``explore_every``-th step starts a run of :data:`STEADY_EXPLORE_RUN` steps at the width
the meter timed least while it has fewer than ``explore_below_steady`` decayed steps, so the fit sees more than
the width it runs (a share of at most ``STEADY_EXPLORE_RUN / explore_every`` of those steps). A run, not one
step: the meter learns only from a step that ran its predecessor's width (the first step at a new width holds
the tail of the previous one under async scheduling), so a lone step would cost and measure nothing.

The measured check (:mod:`specctl_vllm.kernel.model.measured`): whatever the model picks, a drafting
width runs only while what this engine measured of it in the bucket, over every timed step of its runs, beats
what it measured of K = 0 there by a confidence margin. Where one of the two lacks evidence a probe run of
:data:`PROBE_RUN` steps measures it (its first ``SETTLE_STEPS`` not counted), at most one run starting every
:data:`PROBE_GAP` steps of the bucket, only where the engine times its steps. Probes run before the cells'
exploration and the steady regime's, so a run is not cut.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from specctl_vllm.engine_patch.fast_curves import FastCurves
from specctl_vllm.engine_patch.policy_table import PolicyTable
from specctl_vllm.kernel.model.budget import FULL_SHARE, MIN_FULL_STEPS, BudgetMeter, verified_width
from specctl_vllm.kernel.model.cells import bucket_of
from specctl_vllm.kernel.model.measured import BLOCK_STEPS, SETTLE_STEPS, GoodputMeter, Verdict, probe_due, verdict
from specctl_vllm.kernel.model.widths import TokenBudget, choose_width, committed_per_step, could_fill, steady_regime

__all__ = ["FULL_SHARE", "MIN_FULL_STEPS", "BudgetMeter", "GoodputMeter", "WidthChooser", "verified_width"]

#: Steps between two re-blends of a category's curve (the fast sums move little in 8 steps); a re-blend rides
#: on a computation of the rule, so it never adds one.
CURVE_REFRESH_STEPS = 8
#: The width rule is recomputed at least every this many steps, and whenever the table, the batch bucket or the
#: pricing (cells or steady-step model) changes, or a category's share of the batch moves by RULE_REUSE_SHARE:
#: between two computations the step keeps the last width (on the H200 host the rule cost 0.1 ms a step at 256
#: requests, and the mix of a full batch moves by a request or two per step). 8 steps, as the curves' re-blend
#: and the budget meter's reading: a computation refreshes all three at once (every 4 steps, with the re-blend
#: due on its own, was 30 % of the steps at one request, at 0.05-0.17 ms each on this project's CPU; 8 steps
#: are 0.07-0.2 s of a GPU's engine, well inside the controller's own cadence).
RULE_REUSE_STEPS = 8
RULE_REUSE_SHARE = 0.05
#: Steps an exploration of the steady regime runs at the width it explores: the first is the switch (its time
#: holds the previous width's tail and the meter skips it), the second is timed.
STEADY_EXPLORE_RUN = 2
#: Steps of a probe run of the measured check: long enough that the steps past its settling ones average over
#: the prompt steps among them (on the H200 one step in two carries a prompt at 64 requests, and a block of 17
#: steps' goodput spreads 10-20 % there, 5 % at 256); its measured steps are one block of the meter's
#: between-block spread (32 steps).
PROBE_RUN = SETTLE_STEPS + BLOCK_STEPS
#: Steps of a bucket between the starts of two probe runs (and before the first): a probe's share of steps is at
#: most PROBE_RUN / (PROBE_RUN + PROBE_GAP), and only while the comparison is undecided; otherwise the
#: evidence's fading sets the pace (a probe every ~1000-2000 steps).
PROBE_GAP = 96
#: Modelled gain over K = 0 per extra PROBE_GAP of wait before a probe of K = 0 (:meth:`WidthChooser._gap`): a
#: width the model rates 10 % above plain is probed after 2 gaps, one it rates 100 % above after 11.
PROBE_GAIN_UNIT = 0.10
#: Steps the budget meter's reading is reused for: its fit is a 3 x 3 solve, and it moves little in 8 steps.
BUDGET_REFRESH_STEPS = 8


class WidthChooser:
    def __init__(self, widths: tuple[int, ...], k_max: int, explore_every: int = 50,
                 explore_below: float = 100.0, token_budget: int | None = None,
                 explore_below_steady: float = 5.0, probe_run: int = PROBE_RUN,
                 probe_gap: int = PROBE_GAP) -> None:
        self.widths = widths
        self.k_max = k_max
        self.budget = BudgetMeter(token_budget) if token_budget and token_budget > 0 else None
        self.explore_every = explore_every
        self.explore_below = explore_below
        self.explore_below_steady = explore_below_steady
        self._steady_steps = 0
        self._explore_left = 0  # steps left of the steady regime's current exploration run
        self.width = k_max  # the static config's width until the first policy
        self.fast = FastCurves(k_max)
        self._bucket_steps: dict[int, int] = {}
        self.explored = 0
        # curves are re-blended on a computation CURVE_REFRESH_STEPS or more steps after the last re-blend, or
        # when the table changes, not every step
        self._curves: dict[str, tuple[float, ...]] = {}
        self._curves_gen = -1
        self._curves_age = 0
        # the last computed width, reused for a few steps while its inputs hold (see _still_valid)
        self._decided: tuple[tuple, dict[str, float], int] | None = None
        self._decided_age = 0
        self._budget_reading = None
        self._budget_age = BUDGET_REFRESH_STEPS
        # the measured check: goodput per (bucket, width) over timed runs, and the probe runs that feed it
        self.measured = GoodputMeter()
        self.probe_run = probe_run
        self.probe_gap = probe_gap
        self._probe_left = 0
        self._probe_width = 0
        self._since_probe: dict[int, int] = {}  # bucket -> steps since its last probe started
        self.probes = 0
        self.verdict: Verdict | None = None  # the last check (what the hook's log and the tests read)
        # buckets where the check holds the model's drafting width off: the model's own exploration pauses there
        self._held_off: set[int] = set()
        self._model_gain = 0.0  # value(K*) / value(0) - 1 of the model's last computed width
        # of the last computed width's mix: E(K) per request by width (filled on demand), and the share of its
        # requests of categories this engine has not seen draft (the measured check's ``unseen``)
        self._expected: dict[int, float] = {}
        self._unseen = 0.0
        # the measured check of the last computed width: ((meter bucket, width), verdict, probe due), kept while
        # that width is reused (see _checked)
        self._check: tuple[tuple[int, int], Verdict, int | None] | None = None

    # -- fast timescale ------------------------------------------------------------------------------------
    def observe(self, agg: Mapping, by_category: Mapping[str, Sequence[int]] | None = None) -> None:
        """One step's acceptance into the fast curves (:meth:`FastCurves.observe`)."""
        self.fast.observe(agg, by_category)

    def curve(self, category: str, table: PolicyTable) -> tuple[float, ...]:
        """E_c(K) of ``category``: the controller's curve blended with this engine's fast evidence."""
        return self.fast.curve(category, table.curves.get(category) or table.default_curve)

    # -- the choice -----------------------------------------------------------------------------------------
    def choose(self, mix: Mapping[str, int], table: PolicyTable, batch: int, measurable: bool = True) -> int:
        """The width of the next step. ``measurable``: the step just scheduled carried no prompt tokens, so the
        next one probably will not either and its time enters the cell table (exploring is worth it)."""
        if table.is_static or table.cells is None or batch <= 0:
            self.width = self.k_max if table.is_static else self.width
            return self.width
        pinned = self._pinned(mix, table)
        if pinned is not None:
            self.width = pinned
            return pinned
        bucket = table.cells.bucket(batch)
        if self._probing(bucket):
            return self.width
        step_s, steps = table.cells.step_s[bucket], table.cells.steps[bucket]
        count = self._bucket_steps.get(bucket, 0) + (1 if measurable else 0)
        self._bucket_steps[bucket] = count
        held_off = bucket in self._held_off
        if measurable and self.explore_every and not held_off and count % self._explore_period() == 0:
            j = min(range(len(self.widths)), key=lambda i: steps[i])
            if steps[j] < self.explore_below and step_s[j] != float("inf"):
                self.explored += 1
                self.width = self.widths[j]
                return self.width
        budget = self._budget_now(batch)
        if budget is not None and not steady_regime(batch, self.widths[-1], budget):
            budget = None
        if budget is not None and not held_off and self._explore_steady():
            return self.width
        reuse = (table.generation, bucket, budget is None)
        if not self._still_valid(reuse, mix):
            choice = choose_width(mix, self._curves_for(mix, table), self.widths, step_s, steps, budget=budget)
            shares = self._shares(mix)
            self._decided = (reuse, shares, choice.width)
            self._decided_age = 0
            self._model_gain = choice.value / choice.plain_value - 1.0 if choice.plain_value > 0 else 0.0
            self._expected = {}
            self._unseen = sum(share for category, share in shares.items() if category not in self.fast)
            self._check = None
        self.width = self._checked(self._decided[2], batch, bucket, table)
        return self.width

    def measured_mix(self) -> Mapping[str, float] | None:
        """Each category's share of the batch the last width was computed for (None before one): the mix the
        measured check's cells are observed with."""
        return self._decided[1] if self._decided is not None else None

    def expected_at(self, width: int) -> float | None:
        """The committed tokens per request a step at ``width`` is expected to bring, for the mix of the last
        computed width (None before one)."""
        if width <= 0:
            return 1.0
        got = self._expected.get(width)
        if got is None:
            if self._decided is None:
                return None
            got = self._expected[width] = committed_per_step(self._decided[1], self._curves, width)
        return got

    def _transfer(self, width: int, table: PolicyTable):
        """``e(width, mix now) / e(width, mix then)`` for a measured cell's category weights, both from the
        curves of now (a cell's category that this mix lacks gets its curve in the same cache as the mix's own,
        kept until the curves are re-blended: at one request a cell's mix holds every category of the last
        few hundred steps, and resolving their curves at every verdict was most of the verdict's time)."""
        now = self.expected_at(width)
        if not now:
            return None

        def transfer(then: Mapping[str, float]) -> float:
            total = sum(then.values())
            if total <= 0:
                return 1.0
            e = 0.0
            for category, weight in then.items():
                curve = self._curves.get(category)
                if curve is None:
                    curve = self._curves[category] = self._capped(category, table)
                e += weight * curve[min(width, len(curve) - 1)]
            return now * total / e if e > 0 else 1.0

        return transfer

    def _explore_period(self) -> int:
        """Measurable steps between two explorations of the cells: ``explore_every``, longer the more the model
        rates its width above plain (``x (1 + x / PROBE_GAIN_UNIT)``, as a probe of K = 0 waits). An explored
        step gives up at most the fraction ``x / (1 + x)`` of a step at the model's width, so exploration's
        share of the loss stays under ``PROBE_GAIN_UNIT / explore_every`` (0.2 %) at any gain; a width the
        model rates 2.6x plain (high at one request on the H200) is explored once in 850 steps, not in 50."""
        return max(self.explore_every, int(self.explore_every * (1.0 + max(self._model_gain, 0.0) / PROBE_GAIN_UNIT)))

    def _budget_now(self, batch: int) -> TokenBudget | None:
        """The budget meter's reading, refreshed every :data:`BUDGET_REFRESH_STEPS` steps; None, and no fit, at a
        batch where no width could fill the budget (the reading would go unused: after a busy period the meter
        keeps its full steps, and at a few requests it was fitted every 8 steps for nothing), and a fresh fit at
        the next batch that could."""
        if self.budget is None:
            return None
        rho = self.budget.prompt_ratio
        if rho is None or not could_fill(batch, self.widths[-1], self.budget.tokens, rho):
            self._budget_age = BUDGET_REFRESH_STEPS
            return None
        self._budget_age += 1
        if self._budget_age >= BUDGET_REFRESH_STEPS:
            self._budget_reading = self.budget.current()
            self._budget_age = 0
        return self._budget_reading

    def _probing(self, bucket: int) -> bool:
        """Whether this step belongs to a probe run (then ``self.width`` is the probed width)."""
        self._since_probe[bucket] = self._since_probe.get(bucket, 0) + 1
        if self._probe_left <= 0:
            return False
        self._probe_left -= 1
        self.width = self._probe_width
        return True

    def _checked(self, model_width: int, batch: int, bucket: int, table: PolicyTable) -> int:
        """The measured check on the model's width, and the start of a probe run where one is due.

        The verdict is taken when the model's width is computed and kept while that width is reused (at most
        :data:`RULE_REUSE_STEPS` - 1 steps, in one bucket of the meter): one step more in a cell of hundreds
        moves neither goodput nor its margin, and the two readings, the transfer to today's mix and the
        margins were the larger part of the rule's time at 256 requests. Whether a probe starts is asked
        every step, so probes keep their gaps to the step."""
        meter = self.measured
        if model_width <= 0 or not meter.timing:
            self._held_off.discard(bucket)
            return model_width
        where = (bucket_of(batch, meter.edges), model_width)
        check = self._check
        if check is None or check[0] != where:
            check = self._check = (where, *self._take_verdict(model_width, batch, bucket, table))
        _, v, due = check
        if due is not None and self.probe_run > 0 and self._since_probe.get(bucket, 0) >= self._gap(v, due):
            self._since_probe[bucket] = 0
            self.probes += 1
            self._probe_width = due
            self._probe_left = self.probe_run - 1
            return due
        return v.width

    def _take_verdict(self, model_width: int, batch: int, bucket: int, table: PolicyTable
                      ) -> tuple[Verdict, int | None]:
        """(the measured check's verdict on ``model_width``, the width a probe should measure or None)."""
        meter = self.measured
        # the drafting width's goodput for today's mix (its cell's steps may have been taken on other traffic)
        plain = meter.reading(batch, 0)
        drafting = meter.reading(batch, model_width, self._transfer(model_width, table))
        v = self.verdict = verdict(model_width, plain, drafting)
        if v.width == 0:
            # The model's exploration calibrates the widths it would run; while measurement holds them off, its
            # steps at drafting widths only cost (on the H200 at 256 requests, low, 9-13 % of steps, session 12):
            # the check's own probes look at the model's width again.
            self._held_off.add(bucket)
        else:
            self._held_off.discard(bucket)
        return v, probe_due(v, plain, drafting, model_width, unseen=self._unseen)

    def _gap(self, v: Verdict, due: int) -> int:
        """Steps between probes. A probe of K = 0 under the model's drafting width costs in proportion to the
        gain the model sees (on the H200 K = 7 at 16 requests on high: 2x plain, so a 32-step probe cost a
        first pass 7 % in the graph simulator); its chance of overturning the model falls as that gain grows.
        So while nothing refutes the model, the gap grows with its gain (x 1 + gain / PROBE_GAIN_UNIT); once
        measurement holds the width off or is undecided, probes come every ``probe_gap`` steps."""
        if due == 0 and v.state in ("unmeasured", "confirmed"):
            return int(self.probe_gap * (1.0 + max(self._model_gain, 0.0) / PROBE_GAIN_UNIT))
        return self.probe_gap

    @staticmethod
    def _shares(mix: Mapping[str, int]) -> dict[str, float]:
        total = sum(mix.values()) or 1
        return {category: n / total for category, n in mix.items()}

    def _still_valid(self, reuse: tuple, mix: Mapping[str, int]) -> bool:
        """Whether the last computed width still stands: same table, batch bucket and pricing, computed fewer
        than :data:`RULE_REUSE_STEPS` steps ago, and no category's share of the batch moved by
        :data:`RULE_REUSE_SHARE` or more."""
        decided = self._decided
        if decided is None or decided[0] != reuse or self._decided_age + 1 >= RULE_REUSE_STEPS:
            return False
        shares = decided[1]
        if shares.keys() != mix.keys():
            return False
        total = sum(mix.values()) or 1
        for category, n in mix.items():
            if abs(n / total - shares[category]) >= RULE_REUSE_SHARE:
                return False
        self._decided_age += 1
        self._curves_age += 1  # the curves' age counts steps, computed or not
        self.width = decided[2]
        return True

    def _explore_steady(self) -> bool:
        """Every ``explore_every``-th step priced by the steady-step model runs the width the meter timed least,
        while it has fewer than ``explore_below_steady`` decayed steps: every step there carries prompts, so the
        cells' exploration never runs, and a meter that only saw one width fits the others' fixed cost from its
        prior (on the H200 at 256 requests it kept K = 1 on low, 0.87x plain, where its undecayed fit of the
        same session picks K = 0)."""
        self._steady_steps += 1
        if self._explore_left > 0:
            self._explore_left -= 1
            return True  # the run's next step, at the width it explores (self.width unchanged)
        if not self.explore_every or self._steady_steps % self.explore_every:
            return False
        meter = self.budget
        least = min(self.widths, key=meter.width_steps)
        if meter.width_steps(least) >= self.explore_below_steady:
            return False
        self.explored += 1
        self._explore_left = STEADY_EXPLORE_RUN - 1
        self.width = least
        return True

    def _curves_for(self, mix: Mapping[str, int], table: PolicyTable) -> dict[str, tuple[float, ...]]:
        self._curves_age += 1
        if table.generation != self._curves_gen or self._curves_age >= CURVE_REFRESH_STEPS:
            self._curves.clear()
            self._curves_gen = table.generation
            self._curves_age = 0
        curves = self._curves
        for category in mix:
            if category not in curves:
                curves[category] = self._capped(category, table)
        return curves

    def _capped(self, category: str, table: PolicyTable) -> tuple[float, ...]:
        curve = self.curve(category, table)
        rule = table.rule_for(category)
        if rule.source == "override" and rule.fixed and rule.k < len(curve) - 1:
            # an operator's k caps what the category is credited with beyond it
            return curve[: rule.k + 1]
        return curve

    def _pinned(self, mix: Mapping[str, int], table: PolicyTable) -> int | None:
        ks = []
        for category in mix:
            rule = table.rule_for(category)
            if rule.source != "override" or not rule.fixed:
                return None
            ks.append(rule.k)
        if not ks:
            return None
        k = max(ks)
        return max(w for w in self.widths if w <= k)
