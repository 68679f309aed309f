"""What the steady-load benchmark runs, in which order and for how long (pure: no vLLM, no CUDA).

Every engine is EAGLE-3 on model runner V2 with the 8B target of ``shapes.py``. One engine start per
:class:`SteadyEngine`; inside it one :class:`Point` per (concurrency, profile), concurrency outermost, so one
start covers every profile. A point is a warm-up with the load already steady, then timed rounds. Results are
keyed by (engine label, profile, concurrency): a later call skips what is already there.

Profiles: ``high`` (every request in category high), ``low``, and ``mixed`` (half of the requests in flight in
each). The engines draft at the high profile's synthetic rates; ``accept_plugin.py`` lowers each category's
acceptance to its own beta.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.gpu.shapes import CONCURRENCY, OUTPUT_TOKENS, PROFILES, PROMPT_TOKENS, acceptance_rates

STEADY_PROFILES = ("high", "low", "mixed")
#: Categories a profile's requests are drawn from (mixed: alternate, so half of the in-flight requests are each).
PROFILE_CATEGORIES = {"high": ("high",), "low": ("low",), "mixed": ("high", "low")}
#: The profile whose synthetic rates the engines start with; the plugin can only lower acceptance from there.
ENGINE_PROFILE = "high"
STATIC_KS = (1, 2, 4, 7)
K_TABLE = ((1, 4, 4), (5, 64, 2), (65, 256, 0))
SPECCTL_K_MAX = 7
PREMISE_KS = (0, 2, 4, 7)
PREMISE_CONCURRENCY = (1, 64)
PREMISE_PROFILE = "high"
MAX_NUM_SEQS = 256


@dataclass(frozen=True, kw_only=True)
class Workload:
    """The requests' output lengths: drawn uniformly from [output_min, output_max] by a seeded stream of their
    own, so the n-th request of a point has the same prompt and the same length in every engine."""

    name: str
    output_min: int
    output_max: int

    @property
    def mean_output(self) -> float:
        return (self.output_min + self.output_max) / 2


#: ``fixed``: every request 128 tokens (the first session's rows). With one length, the requests of an engine
#: that commits one token per step (plain decoding) finish in lock-step and their prompts arrive in bursts that
#: fill a few steps; a speculative engine's requests drift apart (acceptance is random) until nearly every step
#: carries one prompt and runs off the full graphs. The point's state then depends on the time since its start,
#: not on the engine alone (H200, K=4 at c=64: rounds 9619, 9063, 8857 tok/s one after the other).
#: ``spread`` (the default): lengths 32-224, mean 128 - every engine's arrivals are spread from the first
#: seconds, as a server's are.
WORKLOADS = {
    "fixed": Workload(name="fixed", output_min=OUTPUT_TOKENS, output_max=OUTPUT_TOKENS),
    "spread": Workload(name="spread", output_min=32, output_max=224),
}
DEFAULT_WORKLOAD = "spread"
#: Rows written before the workload was recorded ran the fixed one.
UNRECORDED_WORKLOAD = "fixed"
MAX_MODEL_LEN = PROMPT_TOKENS + max(w.output_max for w in WORKLOADS.values()) + 64
#: Seconds assumed for an engine start before one was measured (8B dummy weights, torch.compile, CUDA graphs).
STARTUP_GUESS_S = 170.0
#: Added to the slowest start seen: the child's imports and the model files.
STARTUP_MARGIN_S = 15.0
#: A timed round ends at the worker's next dispatch snapshot after round_s (at most ~0.5 s later).
ROUND_SLACK_S = 1.0
SPECCTL_SCHEDULER = "specctl_vllm.engine_patch.scheduler.SpecctlScheduler"
PLAIN = "plain"
ORACLE = "oracle"
PREMISE = "premise"


@dataclass(frozen=True, kw_only=True)
class SteadyEngine:
    """One engine start. ``k`` is num_speculative_tokens (k_max for a K table and for specctl); 0 = plain."""

    name: str
    k: int = 0
    k_table: tuple[tuple[int, int, int], ...] | None = None
    specctl: bool = False
    #: load the specctl plugin for its model-runner backports, scheduler left stock (the K-table engine)
    backports: bool = False
    #: specctl engine whose categories are pinned by operator overrides (oracle, premise)
    pinned: bool = False
    #: variables the engine's processes start with beyond the sweep's own (a patch setting under test)
    env: tuple[tuple[str, str], ...] = ()
    #: the proposal method when not the sweep's ``--draft-method`` (the other drafters' smoke rows)
    drafter: str = ""
    #: vLLM's adaptive verification (>= 0.34: ``enable_adaptive_verification``; its per-request verify budget and
    #: online acceptance estimator), inside the engine's k (``num_speculative_tokens``)
    adaptive: bool = False

    @property
    def plugins(self) -> tuple[str, ...]:
        return ("specctl", "specctl_bench") if (self.specctl or self.backports) else ("specctl_bench",)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> SteadyEngine:
        data = json.loads(text)
        if data.get("k_table") is not None:
            data["k_table"] = tuple(tuple(r) for r in data["k_table"])
        data["env"] = tuple(tuple(kv) for kv in data.get("env", ()))
        return cls(**data)


def static_name(k: int) -> str:
    return PLAIN if k == 0 else f"k{k}"


def engines() -> list[SteadyEngine]:
    """The sweep's engine starts, in run order: plain, static k, vLLM's K table, specctl."""
    return [
        SteadyEngine(name=PLAIN),
        *(SteadyEngine(name=static_name(k), k=k) for k in STATIC_KS),
        SteadyEngine(name="ktable", k=max(r[2] for r in K_TABLE), k_table=K_TABLE, backports=True),
        SteadyEngine(name="specctl", k=SPECCTL_K_MAX, specctl=True),
    ]


#: The patch's setting that skips the drafter on K = 0 steps (engine_patch/backports.py, DRAFT_AT_ZERO_ENV).
DRAFT_AT_ZERO_ENV = "SPECCTL_DRAFT_AT_ZERO"


def optional_engines() -> list[SteadyEngine]:
    """Engines a sweep starts only when ``--only`` names them: specctl with a patch setting under test.
    ``specctl_skip``: K = 0 steps skip the drafter, and the drafter's KV cache misses the positions decoded at
    K = 0; the step still costs more than plain's (docs/engine.md). ``ktable0``: see :data:`KTABLE0_ENGINE`."""
    return [SteadyEngine(name="specctl_skip", k=SPECCTL_K_MAX, specctl=True, env=((DRAFT_AT_ZERO_ENV, "skip"),)),
            KTABLE0_ENGINE, *drafter_engines(), *adaptive_engines()]


def adaptive_engines() -> list[SteadyEngine]:
    """vLLM >= 0.34, beside its own adaptive verification (the peer rows of vLLM 0.34). ``av``: vLLM's
    documented configuration, ``enable_adaptive_verification`` at K = 7 with the stock scheduler (its budget
    and estimator decide every request's drafts). ``specctl_av``: the two composed - specctl owns, per
    category, the drafter, the off switch and the most drafts a request may get; vLLM's budget decides each
    request's verify count inside that."""
    return [SteadyEngine(name="av", k=SPECCTL_K_MAX, adaptive=True),
            SteadyEngine(name="specctl_av", k=SPECCTL_K_MAX, specctl=True, adaptive=True)]


#: vLLM's own speculative engine held at K = 0 at every batch size by its batch-size K table, with the drafter
#: skipped there (the backports' ``skip``) and vLLM's stock scheduler: no specctl hook. Beside plain and the
#: premise engine pinned at K = 0 it splits a K = 0 step's cost over plain between vLLM's speculative engine and
#: specctl's scheduler hook (session 14: premise at K = 0 ran 1.11x plain's step at 64 requests, 1.03x at 256).
KTABLE0_ENGINE = SteadyEngine(name="ktable0", k=SPECCTL_K_MAX, k_table=((1, MAX_NUM_SEQS, 0),), backports=True,
                              env=((DRAFT_AT_ZERO_ENV, "skip"),))


#: The drafters of issue 16's smoke rows beside EAGLE-3, and the static width each is compared at.
SMOKE_DRAFTERS = ("mtp", "dflash", "dspark")
SMOKE_K = 4


def drafter_engines() -> list[SteadyEngine]:
    """Per drafter: a static engine at K = 4 and specctl (k_max 7) with the same drafter. The patch's
    graph-shaped steps cover the autoregressive drafters (MTP as EAGLE-3); DFlash and DSpark draft a block in
    one pass, and the patch runs them with per-request k (their smoke rows say whether vLLM honoured it)."""
    out = []
    for d in SMOKE_DRAFTERS:
        out.append(SteadyEngine(name=f"{d}_k{SMOKE_K}", k=SMOKE_K, drafter=d))
        env = ((DRAFT_AT_ZERO_ENV, "skip"),) if d == "mtp" else ()
        out.append(SteadyEngine(name=f"{d}_specctl", k=SPECCTL_K_MAX, specctl=True, drafter=d, env=env))
    return out


ORACLE_ENGINE = SteadyEngine(name=ORACLE, k=SPECCTL_K_MAX, specctl=True, pinned=True)
PREMISE_ENGINE = SteadyEngine(name=PREMISE, k=SPECCTL_K_MAX, specctl=True, pinned=True)


@dataclass(frozen=True, kw_only=True)
class Timing:
    round_s: float = 5.0
    rounds: int = 3
    #: static engines: warm-up of each point (as long as specctl's relearning: every engine is measured the same
    #: time after its point started)
    warmup_s: float = 8.0
    #: specctl: the learning period of the engine's first point (the controller starts with no evidence) ...
    learn_s: float = 10.0
    #: ... and of every later point
    relearn_s: float = 8.0
    #: pinned specctl engines: time for the overrides to reach the engine and the load to settle
    pin_warmup_s: float = 4.0


@dataclass(frozen=True, kw_only=True)
class Point:
    """One measured load. ``label`` is the row's engine name (premise rows: ``premise-k4``)."""

    label: str
    profile: str
    concurrency: int
    warmup_s: float
    #: (category, k) overrides pinned during the point
    pins: tuple[tuple[str, int], ...] = ()

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.label, self.profile, self.concurrency)

    @property
    def categories(self) -> tuple[str, ...]:
        return PROFILE_CATEGORIES[self.profile]

    @classmethod
    def from_dict(cls, data: dict) -> Point:
        return cls(**{**data, "pins": tuple(tuple(p) for p in data.get("pins", ()))})


def warmup_for(engine: SteadyEngine, index: int, timing: Timing) -> float:
    """Warm-up of the engine's index-th point."""
    if engine.pinned:
        return timing.pin_warmup_s
    if engine.specctl:
        return timing.learn_s if index == 0 else timing.relearn_s
    return timing.warmup_s


def engine_points(engine: SteadyEngine, profiles: tuple[str, ...] = STEADY_PROFILES,
                  concurrency: tuple[int, ...] = CONCURRENCY, timing: Timing = Timing()) -> list[Point]:
    """Every (concurrency, profile) of an unpinned engine, concurrency outermost."""
    pairs = [(c, p) for c in concurrency for p in profiles]
    return [Point(label=engine.name, profile=p, concurrency=c, warmup_s=warmup_for(engine, i, timing))
            for i, (c, p) in enumerate(pairs)]


def premise_points(timing: Timing = Timing(), ks: tuple[int, ...] = PREMISE_KS,
                   concurrency: tuple[int, ...] = PREMISE_CONCURRENCY, profile: str = PREMISE_PROFILE) -> list[Point]:
    """The specctl engine pinned at width K for every category, at the premise's concurrencies. Another
    profile or c than the premise's own measures which pinned width is best at a point in the same engine
    (e.g. mixed at c = 256, where every step carries a prompt and the cell table cannot price the widths)."""
    cats = PROFILE_CATEGORIES[profile]
    return [Point(label=f"{PREMISE}-k{k}", profile=profile, concurrency=c, warmup_s=timing.pin_warmup_s,
                  pins=tuple((cat, k) for cat in cats))
            for c in concurrency for k in ks]


#: Engine name -> k of the settings a static deployment can choose from (plain is k=0).
STATIC_CHOICES = {static_name(k): k for k in (0, *STATIC_KS)}


def share_plain_rows(rows: dict) -> dict:
    """Plain decoding drafts nothing, so its throughput does not depend on the acceptance profile: a plain point
    measured on one profile stands for the others where they were not measured (marked ``shared_from``)."""
    out = dict(rows)
    for (name, profile, c), row in rows.items():
        if name != PLAIN:
            continue
        for other in STEADY_PROFILES:
            if (PLAIN, other, c) not in out:
                out[(PLAIN, other, c)] = {**row, "shared_from": profile}
    return out


def best_static_k(rows: dict, profile: str, concurrency: int) -> int | None:
    """The static k (0 = plain) with the highest median goodput on ``profile`` at ``concurrency``; None when no
    static row of that point exists. Plain's row of another profile stands for this one (it drafts nothing):
    the sweep measures plain on one profile only, and an oracle without it would pin a drafting k where plain
    decoding is the best static setting."""
    rows = share_plain_rows(rows)
    best: tuple[float, int] | None = None
    for name, k in STATIC_CHOICES.items():
        row = rows.get((name, profile, concurrency))
        if row is None or row.get("tok_per_s_median") is None:
            continue
        candidate = (row["tok_per_s_median"], -k)  # a tie goes to the shorter proposal
        if best is None or candidate > best:
            best = candidate
    return None if best is None else -best[1]


def oracle_points(rows: dict, concurrency: tuple[int, ...] = CONCURRENCY, timing: Timing = Timing()) -> list[Point]:
    """The mixed profile on the specctl engine with each category pinned to its best static k at that
    concurrency (high from the high-profile rows, low from the low-profile rows); points whose static rows
    are missing are left out."""
    points = []
    for c in concurrency:
        pins = tuple((cat, best_static_k(rows, cat, c)) for cat in PROFILE_CATEGORIES["mixed"])
        if any(k is None for _, k in pins):
            continue
        points.append(Point(label=ORACLE, profile="mixed", concurrency=c, warmup_s=timing.pin_warmup_s, pins=pins))
    return points


def pending(points: list[Point], done: set[tuple[str, str, int]]) -> list[Point]:
    return [p for p in points if p.key not in done]


def point_seconds(point: Point, timing: Timing, slack_s: float = ROUND_SLACK_S) -> float:
    """Warm-up and timed rounds; ``slack_s`` per round for its wait at the boundaries (budget checks)."""
    return point.warmup_s + timing.rounds * (timing.round_s + slack_s)


def startup_guess(rows: dict) -> float:
    starts = [r["meta"]["startup_s"] for r in rows.values() if r.get("meta", {}).get("startup_s")]
    return max(starts) + STARTUP_MARGIN_S if starts else STARTUP_GUESS_S


def engine_seconds(points: list[Point], timing: Timing, startup_s: float, slack_s: float = ROUND_SLACK_S) -> float:
    return startup_s + sum(point_seconds(p, timing, slack_s) for p in points)


def planned_seconds(plan: list[tuple[SteadyEngine, list[Point]]], timing: Timing,
                    startup_s: float = STARTUP_GUESS_S, slack_s: float = 0.0) -> float:
    """The sweep: a start per engine that has points, plus every point's warm-up and rounds (no boundary slack
    unless asked: the plan as designed)."""
    return sum(engine_seconds(points, timing, startup_s, slack_s) for _, points in plan if points)


def spec_config(engine: SteadyEngine, draft_dir: Path, *, method: str, synthetic: bool) -> dict | None:
    """``draft_dir``: the drafter's folder (for native MTP the target's own, which holds the MTP layer)."""
    if engine.k == 0:
        return None
    spec: dict = {"method": engine.drafter or method, "model": str(draft_dir), "num_speculative_tokens": engine.k}
    if synthetic:
        spec["rejection_sample_method"] = "synthetic"
        spec["synthetic_acceptance_rates"] = acceptance_rates(PROFILES[ENGINE_PROFILE], engine.k)
    if engine.k_table is not None:
        spec["num_speculative_tokens_per_batch_size"] = [list(r) for r in engine.k_table]
    if engine.adaptive:
        spec["enable_adaptive_verification"] = True
    return spec


def engine_kwargs(engine: SteadyEngine, target_dir: Path, draft_dir: Path, *, method: str = "eagle3",
                  synthetic: bool = True, eager: bool = False) -> dict:
    """EngineArgs of one engine start; async scheduling, capture sizes and graph mode stay vLLM's defaults."""
    kwargs: dict = {
        "model": str(target_dir),
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "dtype": "bfloat16",
        "max_model_len": MAX_MODEL_LEN,
        "max_num_seqs": MAX_NUM_SEQS,
        "seed": 0,
        "disable_log_stats": False,  # spec-decode counters come from the stats loggers
        "speculative_config": spec_config(engine, draft_dir, method=method, synthetic=synthetic),
    }
    if engine.specctl:
        kwargs["scheduler_cls"] = SPECCTL_SCHEDULER
    if eager:
        kwargs["enforce_eager"] = True
    return kwargs


# -- results ------------------------------------------------------------------------------------------------------
def workload_of(row: dict) -> str:
    return str(row.get("workload") or UNRECORDED_WORKLOAD)


def workloads_in(path: Path) -> set[str]:
    """The workloads of the point rows already in a results file (one file holds one workload)."""
    if not path.exists():
        return set()
    found = set()
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("kind") == "row":
            found.add(workload_of(row))
    return found


def load_results(path: Path) -> tuple[dict[tuple[str, str, int], dict], dict[str, dict]]:
    """(point rows keyed by (engine, profile, concurrency), engine-failure rows by engine); later rows replace
    earlier ones (a re-measurement)."""
    rows: dict[tuple[str, str, int], dict] = {}
    failures: dict[str, dict] = {}
    if not path.exists():
        return rows, failures
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:  # a line cut short by a killed call
            continue
        if row.get("kind") == "row":
            rows[(row["engine"], row["profile"], int(row["concurrency"]))] = row
        elif row.get("kind") == "engine_error":
            failures[row["engine"]] = row
    return rows, failures


def code_digest(repo: Path, patterns: tuple[str, ...] = ("controller/**/*.py", "engine_patch/**/*.py")) -> str:
    """Content hash of the sources a run used (the tree may be uncommitted)."""
    digest = hashlib.sha256()
    for path in sorted({p for pattern in patterns for p in repo.glob(pattern)}):
        digest.update(str(path.relative_to(repo)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]
