"""Measured goodput per (batch bucket, width): the check that keeps a drafting width only while it beats plain.

The width rule (:mod:`.widths`) ranks widths with a model: the decode-only cells, or the steady-step model where
the token budget binds. Both leave out part of what a width costs under a steady load with prompts: the cells
learn only from decode steps followed by decode steps (on the H200 at 64 requests, session 11, a K = 1 step
there cost 7.8 ms against K = 0's 6.0, but 16.3 ms against 9.7 over all steps: a drafting width pays far more of
the prompt steps around it), and the steady-step model fitted K = 0's fixed cost from two steps at 256 requests.
Both kept a drafting width where plain decoding committed 14-20 % more.

So the engine also measures, per bucket and width, what a run of steps at that width committed per second of
engine time, over every timed step (prompt or not) past the first few of a run (:data:`SETTLE_STEPS`: the
first step holds the previous width's tail under async scheduling, and the prompts a step schedules were
brought by the completions of the step before), and :func:`verdict` holds a drafting width to it. The caller
leaves out a step most of whose requests run prompt chunks (a burst of arrivals, an engine's first steps): it
measures prefill whatever the width, and without drafts it would read as K = 0.

    K > 0 runs only while  g(K) >= g(0) * (1 + BASE_MARGIN + Z * sqrt(rse(0)^2 + rse(K)^2))

``g`` = decayed committed tokens / decayed seconds, ``rse`` its relative standard error from the decayed
per-step spread of ``seconds - g^-1 * committed`` (the ratio estimator's). Steps of a steady load are not
independent (a step's prompt chunks are the completions of the steps before it, requests finish in waves, the
host drifts): over the H200 recordings of sessions 1-15 (``python -m bench gpu.check_noise``) the spread of
29-step blocks put the standard error at a median 1.44x, at 256 requests 1.79x, at most 5x the per-step one. So
the meter also keeps the spread of blocks of :data:`BLOCK_STEPS` measured steps of a run, and each verdict
carries the margin it gives (:func:`block_margin`) beside the one it decides with. It does not decide: replayed
over those recordings (``gpu.check_noise --verdicts``) it would have turned 438 of 11195 verdict readings (3.9 %;
under 1.5 % in 15 of the 20 engines) from confirmed to undecided, at a median gain of +25 % (87 % of them above
+10 %), mostly where K = 0's evidence had faded; undecided runs K = 0, so it would have held off large gains to
guard against small ones. A rule that weighs a gain's size against its noise must be measured on a GPU first.

Where either width has too little evidence the model's width runs and a probe run of the unmeasured width is
due (:func:`probe_due`); where the drafting width does not clear the margin, K = 0 runs and the drafting width
is probed until the comparison is decided.

A measurement holds for the traffic it was taken on. Each step is observed with the mix of categories the
width rule priced it for, and a cell keeps the decayed mix of its steps. A drafting width's goodput is read for
today's mix as ``g e(K, mix now) / e(K, mix then)``, both ``e`` (the committed tokens per request the categories'
curves give at K) from the curves of now: the cell keeps measuring the width's cost and the acceptance it met,
and only the change of mix moves the reading (a change of belief about one category's acceptance does not:
the measurement already met the real one). On the H200 (session 14) a K = 2 refuted on prose held plain
decoding for 15 s after half the traffic turned to JSON, 0.83x plain at 64 requests, until the refuted evidence
faded; K = 0's ``e`` is 1 at any mix. Where part of the batch is of categories whose acceptance nothing has
measured yet (a new category, under K = 0 that drafts nothing), a refuted or undecided width is probed again at
once (:func:`probe_due`, ``unseen``).

No I/O; O(1) per step (the sums age lazily, by the steps counted since a cell was last touched).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specctl_vllm.kernel.decay import decay_factor
from specctl_vllm.kernel.model.cells import BATCH_EDGES, bucket_of
from specctl_vllm.kernel.protocol import MAX_K

#: Per-step decay of the measured sums (every timed step of the engine ages every cell): a half-life of about
#: 700 steps, 10-40 s on the H200 between 16 and 256 requests, so a probe's evidence lasts several probes' gaps.
MEASURED_DECAY = 0.999
#: Steps of a run not measured: the first holds the previous width's tail, the next carry prompts that the
#: previous width's completions brought (on the H200 a K = 0 run inside K = 1 steps at 64 requests measured
#: 13.4 ms a step over runs of a few steps, 9.3 ms over long ones).
SETTLE_STEPS = 3
#: Smallest relative gain over K = 0 a drafting width must show on top of its measurement's noise.
BASE_MARGIN = 0.01
#: Standard errors of the difference the gain must clear: one (a width within one standard error of plain is
#: not used; the probes then measure until the difference is outside it or is gone).
Z = 1.0
#: Decayed measured steps each width needs before the comparison is made; below it the model's width runs. Few:
#: the margin grows as the evidence fades (the spread stays that of the steps measured, the count decays), so
#: a large gain stays confirmed on old evidence and a small one is looked at again soon.
MIN_STEPS = 4.0
#: A refuted drafting width is probed again once its evidence has faded below about one probe's steps: a change
#: of mix or acceptance in the bucket gets a new look every few hundred steps at a bounded share.
RECHECK_STEPS = 30.0
#: While the comparison is undecided (the gain inside the margin), the width with fewer steps is probed until
#: it has this many decayed steps: the margin then rests on hundreds of steps, not on one probe.
DECIDE_STEPS = 200.0
#: Measured steps of one block of the between-block spread: a probe run's measured steps (the engine's probe
#: run is SETTLE_STEPS + BLOCK_STEPS), so one probe is one block, and blocks long enough to hold the waves of
#: prompt steps a steady load runs in (on the H200 the spread kept growing from blocks of 8 steps to 29).
BLOCK_STEPS = 29
#: Decayed blocks a cell needs before its own between-block spread is read (the spread of two blocks is one
#: degree of freedom); below it :func:`block_margin` scales its per-step figure by the other width's ratio.
MIN_BLOCKS = 3.0
#: Categories a cell keeps the mix of (the rest of a step's mix is left out of the cell's; an engine's categories
#: are capped well below this by the controller's policy).
MAX_MIX_CATEGORIES = 64
#: Share of a step's requests of categories with no measured acceptance (neither the controller's curve nor
#: the engine's fast sums have seen them draft) from which a refuted or undecided width is probed again: the
#: verdict was taken on traffic without them.
UNSEEN_SHARE = 0.2


@dataclass(frozen=True, kw_only=True)
class Measured:
    """What the engine measured at one (bucket, width): committed tokens per second (read for the mix the
    reading was asked for, where the cell and the caller both know one), its relative standard error, the
    decayed steps behind it (0 steps: nothing measured; goodput 0, rse inf) and the decayed weight of each
    category over those steps (empty: no step came with a mix)."""

    goodput: float
    rse: float
    steps: float
    mix: Mapping[str, float] = field(default_factory=dict)
    #: decayed closed blocks behind the between-block spread
    blocks: float = 0.0
    #: the relative standard error from the spread between blocks, where the cell has MIN_BLOCKS of them
    block_rse: float | None = None

    @property
    def inflation(self) -> float | None:
        """block rse / per-step rse, at least 1 (None without enough blocks, or without a per-step figure)."""
        if self.block_rse is None or not 0 < self.rse < math.inf:
            return None
        return max(self.block_rse / self.rse, 1.0)


NOTHING = Measured(goodput=0.0, rse=math.inf, steps=0.0)


#: Where a cell's sums sit in its list: the step sums (weight, seconds, committed and their second moments),
#: the mix, then the same sums over closed blocks (weight in blocks).
_STEPS, _MIX, _BLOCKS = slice(1, 7), 7, slice(8, 14)


class GoodputMeter:
    """Decayed per-(bucket, width) sums over timed steps past the first :data:`SETTLE_STEPS` of a run:
    weight, seconds, committed tokens and their second moments (seconds^2, committed^2, seconds x committed),
    the decayed weight of each category of the steps' mixes, and the same sums over blocks of
    ``block_steps`` consecutive measured steps of one run (a run's last block counts once it holds half that)."""

    def __init__(self, edges: Sequence[int] = BATCH_EDGES, decay: float = MEASURED_DECAY,
                 settle: int = SETTLE_STEPS, block_steps: int = BLOCK_STEPS, min_blocks: float = MIN_BLOCKS) -> None:
        self.edges = tuple(edges)
        self.decay = decay
        self.settle = settle
        self.block_steps = max(int(block_steps), 2)
        self.min_blocks = min_blocks
        # the project's one decay formula, in steps: a per-step factor ``decay`` is a half-life of ln 2 / -ln decay
        self._half_life = math.log(0.5) / math.log(decay) if 0 < decay < 1 else math.inf
        self.clock = 0  # timed steps observed (every width, every bucket): the sums age by it
        # (bucket, width) -> [t, n, x, y, xx, yy, xy, {category: decayed share}, bn, bx, by, bxx, byy, bxy]
        self._cells: dict[tuple[int, int], list[Any]] = {}
        self._last: int | None = None  # width of the step observed last
        self._run = 0  # steps of the current run (same width back to back)
        self._block: list[Any] | None = None  # the open block: [cell key, seconds, committed, measured steps]

    def observe(self, batch: int, width: int, committed: int, interval_s: float | None,
                mix: Mapping[str, float] | None = None) -> None:
        """One step of ``batch`` requests at ``width`` that committed ``committed`` tokens in ``interval_s``
        seconds of engine time (None: the engine was idle before it, not timed); ``mix``: each category's share
        of the step's requests, as the width rule priced it (None: unknown)."""
        width = min(max(width, 0), MAX_K)  # one key past any engine's width set: the table stays bounded
        self._run = self._run + 1 if width == self._last else 1
        self._last = width
        if self._run == 1:
            self._close_block()  # a block never spans two runs: the next run starts in another state
        if interval_s is None or not (0 < interval_s < 60) or batch <= 0 or committed < 0:
            return
        self.clock += 1
        if self._run <= self.settle:
            return
        key = self._key(batch, width)
        cell = self._cells.get(key)
        if cell is None:
            cell = self._cells[key] = [float(self.clock), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, {}, 0.0, 0.0, 0.0, 0.0,
                                       0.0, 0.0]
        else:
            self._age(cell)
        x, y = interval_s, float(committed)
        _add_moments(cell, 1, 1.0, x, y)
        if mix and width > 0:  # K = 0 commits one token a request at any mix: its reading is never rescaled
            kept = cell[_MIX]
            for category, share in mix.items():
                if share > 0 and (category in kept or len(kept) < MAX_MIX_CATEGORIES):
                    kept[category] = kept.get(category, 0.0) + share
        block = self._block
        if block is not None and block[0] != key:
            self._close_block()  # the run moved to another bucket
            block = None
        if block is None:
            block = self._block = [key, 0.0, 0.0, 0]
        block[1] += x
        block[2] += y
        block[3] += 1
        if block[3] >= self.block_steps:
            self._close_block()

    def _close_block(self) -> None:
        """Fold the open block into its cell's block sums (half a block or more: a shorter one is mostly the
        noise of its few steps), and start none."""
        block, self._block = self._block, None
        if block is None or 2 * block[3] < self.block_steps:
            return
        cell = self._cells.get(block[0])
        if cell is None:
            return
        self._age(cell)
        _add_moments(cell, _BLOCKS.start, 1.0, block[1], block[2])

    def _key(self, batch: int, width: int) -> tuple[int, int]:
        return bucket_of(batch, self.edges), min(max(width, 0), MAX_K)

    def _factor(self, cell: list[float]) -> float:
        """What the cell's sums keep of their weight from their last update to now."""
        return decay_factor(self.clock - cell[0], self._half_life)

    def _age(self, cell: list[float]) -> None:
        f = self._factor(cell)
        if f < 1.0:
            for i in (*range(_STEPS.start, _STEPS.stop), *range(_BLOCKS.start, _BLOCKS.stop)):
                cell[i] *= f
            kept = cell[_MIX]
            for category in kept:
                kept[category] *= f
        cell[0] = float(self.clock)

    def reading(self, batch: int, width: int,
                transfer: Callable[[Mapping[str, float]], float] | None = None) -> Measured:
        """The measured goodput of ``width`` in ``batch``'s bucket, aged to now (the state is left alone).
        ``transfer``, given the cell's decayed category weights, returns ``e(K, mix now) / e(K, mix then)``: the
        goodput is read for today's mix (a factor that is not a positive finite number is ignored)."""
        cell = self._cells.get(self._key(batch, width))
        if cell is None:
            return NOTHING
        f = self._factor(cell)
        n, x, y = cell[1] * f, cell[2] * f, cell[3] * f
        if n <= 0 or x <= 0 or y <= 0:
            return NOTHING
        rse = ratio_rse(cell[_STEPS], f)
        blocks = cell[_BLOCKS.start] * f
        # a few blocks: their spread over n - 1
        block_rse = ratio_rse(cell[_BLOCKS], f, ddof=1.0) if blocks >= self.min_blocks else None
        kept = cell[_MIX]
        scale = 1.0
        if transfer is not None and kept:
            got = transfer(kept)
            scale = got if isinstance(got, float | int) and 0 < got < math.inf else 1.0
        return Measured(goodput=scale * y / x, rse=rse, steps=n, mix=dict(kept), blocks=blocks,
                        block_rse=block_rse)

    @property
    def timing(self) -> bool:
        """Whether any step was timed: probing only pays where the engine times its steps."""
        return self.clock > 0


def _add_moments(cell: list[Any], at: int, n: float, x: float, y: float) -> None:
    """Add one sample (weight ``n``, seconds ``x``, committed ``y``) to the six sums starting at ``at``."""
    cell[at] += n
    cell[at + 1] += x
    cell[at + 2] += y
    cell[at + 3] += x * x
    cell[at + 4] += y * y
    cell[at + 5] += x * y


def ratio_rse(sums: Sequence[float], f: float = 1.0, ddof: float = 0.0) -> float:
    """Relative standard error of committed / seconds from six decayed sums (weight, seconds, committed,
    seconds^2, committed^2, seconds x committed) aged by ``f``: the ratio estimator's variance
    var(x - r y) / (n xbar^2), r = seconds per committed token, the spread taken over ``n - ddof`` (inf below
    two samples' weight)."""
    n, x, y = sums[0] * f, sums[1] * f, sums[2] * f
    if n <= 1 or x <= 0 or y <= 0:
        return math.inf
    r = x / y
    spread = (sums[3] - 2 * r * sums[5] + r * r * sums[4]) * f / (n - ddof)
    return math.sqrt(max(spread, 0.0) / n) / (x / n)


def margin(plain: Measured, drafting: Measured, base: float = BASE_MARGIN, z: float = Z) -> float:
    """The relative gain a drafting width must show over K = 0 given both measurements' noise."""
    return base + z * math.sqrt(plain.rse ** 2 + drafting.rse ** 2)


def block_margin(plain: Measured, drafting: Measured, base: float = BASE_MARGIN, z: float = Z) -> float | None:
    """:func:`margin` with each width's noise the larger of its per-step and per-block figures; a width
    without its own blocks (measured by one or two probes) has its per-step figure scaled by the other's ratio
    of block to step spread (the traffic and the host that spread its steps are the same). None where neither
    has enough blocks."""
    known = [m.inflation for m in (plain, drafting) if m.inflation is not None]
    if not known:
        return None
    pooled = max(known)

    def noise(m: Measured) -> float:
        inflation = m.inflation
        return m.rse * (inflation if inflation is not None else pooled)

    return base + z * math.sqrt(noise(plain) ** 2 + noise(drafting) ** 2)


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """What the measurements say about running the model's drafting width instead of K = 0.

    ``state``: ``unmeasured`` (too few steps of one of them: the model decides), ``confirmed`` (the drafting
    width beats K = 0 by the margin), ``undecided`` (its gain is inside the margin) or ``refuted`` (K = 0
    commits at least as much). Only ``confirmed`` and ``unmeasured`` run the drafting width."""

    state: str
    width: int  # the width to run
    gain: float  # g(K) / g(0) - 1 where both are measured, else 0
    margin: float
    #: the margin with the spread between blocks of steps (:func:`block_margin`); reported, not deciding
    block_margin: float | None = None


def verdict(model_width: int, plain: Measured, drafting: Measured, min_steps: float = MIN_STEPS) -> Verdict:
    """The measured check on the model's width (pure; O(1))."""
    if model_width <= 0:
        return Verdict(state="confirmed", width=0, gain=0.0, margin=0.0)
    if plain.steps < min_steps or drafting.steps < min_steps or plain.goodput <= 0:
        return Verdict(state="unmeasured", width=model_width, gain=0.0, margin=math.inf)
    m = margin(plain, drafting)
    blocked = block_margin(plain, drafting)
    gain = drafting.goodput / plain.goodput - 1.0
    if gain >= m:
        return Verdict(state="confirmed", width=model_width, gain=gain, margin=m, block_margin=blocked)
    return Verdict(state="undecided" if gain > 0 else "refuted", width=0, gain=gain, margin=m,
                   block_margin=blocked)


def probe_due(v: Verdict, plain: Measured, drafting: Measured, model_width: int,
              min_steps: float = MIN_STEPS, decide_steps: float = DECIDE_STEPS,
              recheck_steps: float = RECHECK_STEPS, unseen: float = 0.0) -> int | None:
    """The width a probe run should measure now, or None: K = 0 while it has fewer than ``min_steps`` (the
    model's drafting width runs meanwhile and measures itself; a confirmed verdict whose K = 0 evidence has
    faded is ``unmeasured`` again); while undecided, the width with fewer steps until it has
    ``decide_steps``; once refuted, the drafting width when its evidence has faded below ``recheck_steps``.
    Refuted or undecided, the drafting width at once where ``unseen`` (the share of the step's requests of
    categories no draft has measured) reaches :data:`UNSEEN_SHARE`. (How often a probe may start is the
    caller's: one run every so many steps.)"""
    if model_width <= 0:
        return None
    if v.state == "unmeasured":
        return 0 if plain.steps < min_steps else None
    if v.state in ("undecided", "refuted") and unseen >= UNSEEN_SHARE:
        return model_width
    if v.state == "undecided":
        fewer, steps = (0, plain.steps) if plain.steps <= drafting.steps else (model_width, drafting.steps)
        return fewer if steps < decide_steps else None
    if v.state == "refuted":
        return model_width if drafting.steps < recheck_steps else None
    return None
