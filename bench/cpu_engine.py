"""Real-engine CPU benchmark: specctl against static, table, EMA-tier and hindsight-oracle speculation.

vLLM 0.32 (CPU build) serving SmolLM2-135M-Instruct (float32, greedy, eager, prefix caching off, Intel OpenMP
preloaded as vLLM's CPU guide asks), n-gram drafting, the mixed workload of :mod:`bench.cpu.workload` (prose,
JSON with and without response_format, code, code edits, tool calls, summaries, multi-turn) through the OpenAI
chat endpoint, closed loop at concurrency 8 and 1. Side by side in one run, each on its own fresh engine:

  specctl        patched engine + a fresh ``specctl serve`` (default settings): the product. Its controller
                 runs for the whole benchmark and every other configuration is measured *paired* with it
                 (below); ``--fresh-specctl-engine`` restarts its engine beside each configuration's, so
                 the two engines of a pairing are the same age (the controller keeps running)
  no_spec        plain vLLM, no speculation (the reference for greedy equality)
  k=N            plain vLLM, static n-gram N in {1,2,3,4,6,8} (vLLM's own config, one engine per N)
  batch_table    plain vLLM, ``num_speculative_tokens_per_batch_size`` = best static k at batch 1 for
                 batch 1 and best static k at concurrency 8 above (tuned in hindsight from the k=N runs)
  ema_tiers      patched engine, SGLang's acceptance-EMA tiers (controller/core/offline/ema_tiers.py) driving
                 per-category overrides of its own controller (bench/cpu/ema_driver.py)
  oracle-*       patched engine, per-category (drafter, k) pinned through the overrides API, chosen after
                 the fact (bench/cpu/oracle.py); the oracle is the best per-category static config measured
  specctl-min-evidence-N   specctl with its own fresh controller at SPECCTL_POLICY_MIN_EVIDENCE=N (not a
                 target row: shows what the policy's evidence guardrail costs on this machine)
  specctl-category-floor-F specctl with its own fresh controller at SPECCTL_POLICY_CATEGORY_FLOOR=F (not a
                 target row: what promising every category F x plain decoding costs or gains here)
  no_spec-again  (full mode) no speculation once more: how well two measurements of one config agree

Pairing. This machine is shared: its pace drifts by tens of percent within minutes, far more than the few
percent the comparison is about. So each configuration's measured prompts run in chunks (16 at concurrency
8, 8 at concurrency 1) alternating with the same chunks on the always-on specctl stack, in ABBA order; the
two engines never run at once. specctl / X is then measured in the same minutes, and X's goodput rescaled
by specctl's pace in those minutes (``normalised``) ranks the baselines (best static k, the oracle).

Every configuration gets a warm-up pass of distinct prompts (unmeasured) per concurrency (and specctl's fresh
engine, with ``--fresh-specctl-engine``, the same pass beside it); specctl's controller starts knowing nothing and learns from its warm-ups and
all its chunks, across its engine's restarts, as in a deployment. Each side's controller CPU time while it
served is recorded (``controller_cpu_s``): on 2 cores the controller competes with the engine.
Goodput = committed tokens / wall time (per category: tokens / summed latency, see bench/cpu/measure.py).
Every run's token ids are compared with the no-spec run's at the same concurrency.
Outputs: bench/results/cpu_engine.json, PNG plots beside it, bench/results/cpu_traces.json (simulator trace),
and in bench/results/tmp/cpu_engine/: recorded telemetry, request token traces (``specctl replay`` inputs) and
a checkpoint (``--post-only`` recomputes the results from it).

    python -m bench cpu_engine --quick          # 2 prompts per category (16 prompts)
    python -m bench cpu_engine                  # 16 per category at concurrency 8 (128 prompts), 4 at 1 (32)
    python -m bench cpu_engine --only no_spec,k=2 --quick    # a subset while developing (specctl always runs)
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from tqdm import tqdm

from bench.cpu import engines, measure, oracle, report, stats, traces
from bench.cpu.driver import Phase, run_phase, touch
from bench.cpu.workload import bench_workload, chunk_size, key
from bench.support import controller_api
from bench.support.specctl_serve import ADMIN_TOKEN
from bench.support.workload import CATEGORIES
from specctl_vllm.controller import replay_cli
from specctl_vllm.controller.core.offline import replay as replay_core
from specctl_vllm.controller.core.offline import token_traces

RESULTS = ROOT / "bench" / "results"
FIXED_KS = (1, 2, 3, 4, 6, 8)
PROBE_CATEGORIES = list(CATEGORIES)
#: Warm-up requests at concurrency 1 (JIT, caches, the controller's batch-size estimate: ~1 min on a shared machine).
WARMUP_C1 = 4


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tmp = Path(args.workdir)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.concurrencies = [int(c) for c in args.concurrency.split(",")]
        self.prompts = bench_workload(args.per_category)
        n_c1 = args.per_category_c1 * len(CATEGORIES)  # the interleaved order: a prefix has every category
        exclude = {key(p) for p in self.prompts}
        self.warm = bench_workload(args.warmup_per_category, seed=1, exclude=exclude)
        self.by_c = {c: (self.prompts[:n_c1] if c == 1 else self.prompts) for c in self.concurrencies}
        self.runs: dict[str, dict] = {}
        #: run name -> concurrency -> its measured requests (chunks merged); "specctl@X": specctl paired with X
        self.records: dict[str, dict[int, Phase]] = {}
        self.margins: dict[str, list[tuple[float, float]]] = {}
        self.extra: dict[str, dict] = {}
        self.model_dir = None
        self.ref: engines.Stack | None = None  # the specctl stack every configuration is paired with

    # -- one configuration, paired with specctl ------------------------------------------------------------
    def run(self, cfg: engines.RunConfig) -> None:
        started = time.monotonic()
        entry = {"config": {"patched": cfg.patched, "speculative": cfg.speculative, "role": cfg.role,
                            "pins": {str(c): p for c, p in cfg.pins.items()}}, "phases": {}, "paired_specctl": {}}
        self.runs[cfg.name] = entry
        self.records[cfg.name] = {}
        try:
            workdir = self.tmp / "runs" / _slug(cfg.name)
            with engines.start(cfg, self.model_dir, workdir, self.args.omp_bind, self.args.ld_preload,
                               self.args.server_cpus) as st:
                entry["startup_s"] = round(time.monotonic() - started, 1)
                if self.args.fresh_specctl_engine:
                    self.ref.restart_engine()  # both engines of the pairing start now: neither is older
                driver = None
                if cfg.role == "ema_tiers":
                    from bench.cpu.ema_driver import EmaOverrideDriver

                    driver = EmaOverrideDriver(st.controller.url, ADMIN_TOKEN, PROBE_CATEGORIES, engines.K_MAX).start()
                    st.proxy.observers.append(driver.observe)
                for c in cfg.concurrencies or self.concurrencies:
                    if c > 0:
                        self._paired(cfg, st, c, entry)
                if cfg.role == "reference":
                    self._logprob_pass(st)
                if driver is not None:
                    driver.stop()
                    entry["ema"] = {"changes": driver.changes, "steps_at_k": dict(driver.steps_at_k),
                                    "override_errors": driver.errors}
        except Exception as exc:  # noqa: BLE001 - one broken configuration must not lose the others' results
            entry["error"] = f"{type(exc).__name__}: {exc}"
            tqdm.write(f"{cfg.name}: FAILED {entry['error']}\n{traceback.format_exc()[-2000:]}")
        entry["wall_s"] = round(time.monotonic() - started, 1)
        self.checkpoint()

    def _paired(self, cfg: engines.RunConfig, st: engines.Stack, c: int, entry: dict) -> None:
        """Warm ``cfg`` up, then run the measured prompts in chunks alternating between it and specctl."""
        name = cfg.name
        if cfg.role == "oracle":
            engines.set_pins(st.controller.url, cfg.pins[c], f"hindsight oracle, concurrency {c}")
            self._wait_policy(st)
        self._record(st, f"{_slug(name)}_warm_c{c}")
        warm = self.warm if c > 1 else self.warm[:WARMUP_C1]
        run_phase(st.engine.url, warm, c, desc=f"{name} c={c} warm-up")
        self._record(st, None)
        if self.args.fresh_specctl_engine:  # the same warm-up for specctl's fresh engine
            self._record(self.ref, f"specctl_warm_c{c}")
            run_phase(self.ref.engine.url, warm, c, desc=f"specctl c={c} warm-up")
            self._record(self.ref, None)
        prompts = self.by_c[c]
        size = chunk_size(c)
        sides: dict[str, list[Phase]] = {name: [], "specctl": []}
        loads, cpu = [], {name: 0.0, "specctl": 0.0}
        ctl_cpu = {name: 0.0, "specctl": 0.0}
        for j, i in enumerate(range(0, len(prompts), size)):
            chunk = prompts[i : i + size]
            order = [(name, st), ("specctl", self.ref)]
            for side, stack in order if j % 2 == 0 else order[::-1]:  # ABBA: a steady drift cancels
                self._record(stack, f"{_slug(side)}_c{c}")
                loads.append(measure.load_avg())
                if self.args.touch:
                    touch(stack.engine.url)
                cpu0, ctl0 = stack.cpu_seconds(), stack.controller_cpu_seconds()
                sides[side].append(run_phase(stack.engine.url, chunk, c, desc=f"{side} c={c} [{j + 1}]"))
                cpu[side] += stack.cpu_seconds() - cpu0
                ctl_cpu[side] += stack.controller_cpu_seconds() - ctl0
                self._record(stack, None)
        for side, phases in sides.items():
            merged = merge(phases, c)
            summary = measure.summarise(merged, cpu[side], (min(loads), max(loads))).to_dict()
            summary["controller_cpu_s"] = round(ctl_cpu[side], 2)  # its own controller, while it served
            if side == name:
                entry["phases"][str(c)] = summary
                self.records[name][c] = merged
            else:
                entry["paired_specctl"][str(c)] = summary
                self.records[f"specctl@{name}"] = {**self.records.get(f"specctl@{name}", {}), c: merged}
        if cfg.role == "specctl_variant":
            entry.setdefault("decisions", {})[str(c)] = _decisions(st.controller.url)
        sp = self.runs.setdefault("specctl", {"config": {"role": "specctl", "patched": True}, "phases": {},
                                              "decisions": {}})
        sp["decisions"][f"{c}@{name}"] = _decisions(self.ref.controller.url)
        g, gs = entry["phases"][str(c)]["goodput"], entry["paired_specctl"][str(c)]["goodput"]
        tqdm.write(f"{name:>16} c={c}: {g:7.1f} tok/s | paired specctl {gs:7.1f} tok/s -> specctl/{name} "
                   f"{gs / g if g else float('nan'):.3f} (load {min(loads):.1f}..{max(loads):.1f})")

    def _record(self, st: engines.Stack, stem: str | None) -> None:
        if st.proxy is not None:
            st.proxy.record_to(self.tmp / "telemetry" / f"{stem}.jsonl" if stem else None)

    def checkpoint(self) -> None:
        """Everything measured so far, so that a failure after hours of runs loses nothing (``--post-only``)."""
        state = {"runs": self.runs, "records": self.records, "margins": self.margins, "extra": self.extra,
                 "table": getattr(self, "table", None), "oracle_info": getattr(self, "oracle_info", None)}
        tmp = self.tmp / "checkpoint.pkl.tmp"
        with open(tmp, "wb") as f:
            pickle.dump(state, f)
        tmp.replace(self.tmp / "checkpoint.pkl")

    def restore(self) -> None:
        with open(self.tmp / "checkpoint.pkl", "rb") as f:
            state = pickle.load(f)  # our own file, written by checkpoint()
        self.runs, self.records, self.margins, self.extra = (state["runs"], state["records"], state["margins"],
                                                             state["extra"])
        if state["table"] is not None:
            self.table = state["table"]
        if state["oracle_info"] is not None:
            self.oracle_info = state["oracle_info"]

    def _logprob_pass(self, st: engines.Stack) -> None:
        """Top-2 log-probs of the no-spec engine for every prompt some run disagreed on (near-tie check)."""
        ids = {m["prompt_id"] for per in self.equality()["by_run"].values() for mm in per.values() for m in mm}
        prompts = [p for p in self.prompts if p.id in ids]
        if prompts:
            ref = run_phase(st.engine.url, prompts, max(self.concurrencies), logprobs=2, desc="log-probs of mismatches")
            self.margins = {r.id: r.top2 for r in ref.records}
            self.extra["logprob_pass_records"] = ref.records

    def _wait_policy(self, st: engines.Stack) -> None:
        """Until the engine reports running the controller's newest policy (the pins are in force)."""
        eid = st.engine.engine_id
        deadline = time.monotonic() + 20.0
        time.sleep(0.3)
        while time.monotonic() < deadline:
            served, reported = engines.policy_version(st.controller.url, eid)
            if served is not None and served == reported:
                time.sleep(0.3)
                served2, reported2 = engines.policy_version(st.controller.url, eid)
                if served2 == reported2 == served:
                    return
            time.sleep(0.1)

    # -- the plan ----------------------------------------------------------------------------------------
    def wanted(self, name: str) -> bool:
        only = self.args.only
        return not only or name in only.split(",") or (name.startswith("oracle") and "oracle" in only.split(","))

    def main_plan(self) -> None:
        from bench.support.stack import model_dir

        self.model_dir = model_dir(self.args.model_dir)
        # telemetry is appended per phase: a fresh run must not mix in the steps of an earlier (killed) run
        for stale in (self.tmp / "telemetry").glob("*.jsonl"):
            stale.unlink()
        plan = [engines.no_spec()] + [engines.static(k) for k in self.args.ks]
        bar = tqdm(total=len(plan) + 5, desc="configurations", unit="cfg", position=0, dynamic_ncols=True)
        spec_cfg = engines.patched("specctl", "specctl")
        started = time.monotonic()
        with engines.start(spec_cfg, self.model_dir, self.tmp / "runs" / "specctl", self.args.omp_bind,
                           self.args.ld_preload, self.args.server_cpus) as ref:
            self.ref = ref
            self.runs["specctl"] = {"config": {"patched": True, "speculative": spec_cfg.speculative, "role": "specctl"},
                                    "phases": {}, "decisions": {}, "startup_s": round(time.monotonic() - started, 1)}
            for c in self.concurrencies:  # the controller starts knowing nothing, like every fresh deployment
                self._record(ref, f"specctl_warm_c{c}")
                run_phase(ref.engine.url, self.warm if c > 1 else self.warm[:WARMUP_C1], c, desc=f"specctl c={c} warm-up")
                self._record(ref, None)
            for cfg in plan:
                if self.wanted(cfg.name):
                    self.run(cfg)
                bar.update(1)
            if self.wanted("batch_table"):
                self.table = self._table()
                self.run(engines.batch_table(self.table))
            bar.update(1)
            if self.wanted("ema_tiers"):
                self.run(engines.patched("ema_tiers", "ema_tiers"))
            bar.update(1)
            variants = [(f"specctl-min-evidence-{v:g}", "SPECCTL_POLICY_MIN_EVIDENCE", v)
                        for v in self.args.variant_min_evidence]
            variants += [(f"specctl-category-floor-{v:g}", "SPECCTL_POLICY_CATEGORY_FLOOR", v)
                         for v in self.args.variant_category_floor]
            for name, env, value in variants:
                if self.wanted(name) or self.wanted("variants"):
                    self.run(engines.patched(name, "specctl_variant", controller_env={env: str(value)}))
            if self.wanted("oracle"):
                for name, pins in self._oracle_candidates().items():
                    self.run(engines.patched(name, "oracle", pins))
            bar.update(2)
            if "no_spec" in self.records and (self.args.repeat_reference or self.equality()["total_mismatches"]):
                # no speculation again (full mode): how far two measurements of one configuration differ after
                # pairing; and the log-probs of any prompt whose output differed
                again = (max(self.concurrencies),) if self.args.repeat_reference else (-1,)
                self.run(engines.RunConfig("no_spec-again", False, None, role="reference", concurrencies=again))
            bar.update(1)
        bar.close()
        self.runs["specctl"]["wall_s"] = round(time.monotonic() - started, 1)
        self.aggregate_specctl()
        self.checkpoint()

    def aggregate_specctl(self) -> None:
        """specctl's own figures: all its paired chunks together."""
        for c in self.concurrencies:
            phases = [ph[c] for n, ph in self.records.items() if n.startswith("specctl@") and c in ph]
            if phases:
                self.runs["specctl"]["phases"][str(c)] = measure.summarise(merge(phases, c)).to_dict()

    def add_chunks(self) -> None:
        """Per-chunk ``[tokens, wall_s]`` beside every phase (bench/cpu/stats.py: intervals, split selection)."""
        for name, per_c in self.records.items():
            side, run = (("paired_specctl", name.split("@", 1)[1]) if name.startswith("specctl@")
                         else ("phases", name))
            for c, phase in per_c.items():
                target = self.runs.get(run, {}).get(side, {}).get(str(c))
                if target is not None:
                    target["chunks"] = stats.chunk_figures(phase.records, chunk_size(c))

    def normalized(self, name: str, c: int) -> dict | None:
        return report.normalized(self.runs, name, str(c))

    def _best_static(self, c: int) -> int:
        """The static k (0 = off) with the best paired-normalised goodput at concurrency ``c``."""
        self.aggregate_specctl()
        best = (-1.0, 0)
        for name in self.runs:
            k = oracle.static_k(name)
            norm = self.normalized(name, c) if k is not None else None
            if norm and norm["goodput"] > best[0]:
                best = (norm["goodput"], k)
        return best[1]

    def _table(self) -> list[list[int]]:
        lo, hi = min(self.concurrencies), max(self.concurrencies)
        k_lo, k_hi = self._best_static(lo), self._best_static(hi)
        if lo == hi:
            return [[1, engines.MAX_NUM_SEQS, k_hi]]
        return [[1, lo, k_lo], [lo + 1, engines.MAX_NUM_SEQS, k_hi]]

    # -- oracle -------------------------------------------------------------------------------------------
    def _oracle_candidates(self) -> dict[str, dict[int, dict[str, tuple[int, str]]]]:
        self.aggregate_specctl()
        self.oracle_info: dict = {"candidates": {}, "fit": {}, "predicted": {}}
        ref = self.records.get("no_spec", {})
        if not ref:
            return {}
        proposers, used = replay_cli.default_proposers("ngram", ["suffix"], "auto")
        self.oracle_info["ngram_scorer"] = used
        measured: dict[int, dict[str, tuple[int, str]]] = {}
        modelled: dict[int, dict[str, tuple[int, str]]] = {}
        for c in self.concurrencies:
            trs = traces.request_traces(ref[c].records)
            work = oracle.workload(trs, c)
            profiles = token_traces.trace_profiles(trs, proposers, list(range(1, engines.K_MAX + 1)))
            norms = {n: self.normalized(n, c) for n in self.runs if oracle.static_k(n) is not None}
            # wall time each static run would have taken at specctl's average pace (paired rescaling)
            walls = {oracle.static_k(n): v["tokens"] / v["goodput"] for n, v in norms.items() if v and v["goodput"]}
            cost, fit = oracle.fit_cost(work, profiles, walls)
            self.oracle_info["fit"][str(c)] = fit
            modelled[c] = oracle.model_choice(work, profiles, cost)
            per = {n: v["per_category"] for n, v in norms.items() if v}
            measured[c] = oracle.measured_argmax(per)
            self.oracle_info["predicted"][str(c)] = {
                "model": oracle.predicted_goodput(work, profiles, cost, modelled[c]),
                "measured": oracle.predicted_goodput(work, profiles, cost, measured[c]),
                "profiles": {cat: {f"{m}:{k}": [round(p.e, 4), round(p.d, 4)] for (m, k), p in sorted(per_.items())}
                             for cat, per_ in profiles.items()}}
        out = {"oracle-model": modelled}
        if measured != modelled:
            out["oracle-measured"] = measured
        self.oracle_info["candidates"] = {n: {str(c): v for c, v in p.items()} for n, p in out.items()}
        return out

    def oracle_name(self, c: int) -> str | None:
        return report.oracle_name(self.runs, str(c))

    # -- after the runs ------------------------------------------------------------------------------------
    def equality(self) -> dict:
        out: dict = {"by_run": {}, "total_mismatches": 0, "requests_compared": 0}
        for c in self.concurrencies:
            ref = self.records.get("no_spec", {}).get(c)
            if ref is None:
                continue
            for name, phases in self.records.items():
                if name in ("no_spec", "no_spec-again", "specctl@no_spec-again") or c not in phases:
                    continue
                mm = measure.mismatches(ref.records, phases[c].records, self.margins)
                out["by_run"].setdefault(name, {})[str(c)] = [m.to_dict() for m in mm]
                out["total_mismatches"] += len(mm)
                out["requests_compared"] += len(phases[c].records)
        lp = self.extra.get("logprob_pass_records")
        ref8 = self.records.get("no_spec", {}).get(max(self.concurrencies))
        if lp is not None and ref8 is not None:
            out["control_logprob_pass_vs_no_spec"] = len(measure.mismatches(ref8.records, lp, self.margins))
        again = self.records.get("no_spec-again", {}).get(max(self.concurrencies))
        if again is not None and ref8 is not None:
            out["control_no_spec_again_vs_no_spec"] = len(measure.mismatches(ref8.records, again.records, self.margins))
        if len(self.concurrencies) > 1 and "no_spec" in self.records:
            a, b = (self.records["no_spec"].get(c) for c in self.concurrencies[:2])
            if a and b:
                out["control_no_spec_across_concurrency"] = len(measure.mismatches(a.records, b.records, self.margins))
        return out

    def write_traces(self) -> dict:
        """Request token traces (per concurrency) and the simulator trace."""
        ref = self.records.get("no_spec", {})
        info = {}
        for c, phase in ref.items():
            path = self.tmp / "requests" / f"requests_c{c}.jsonl"
            traces.write_request_traces(path, traces.request_traces(phase.records))
            info[str(c)] = str(path)
        static_recs = [r for n, ph in self.records.items() if oracle.static_k(n) or n == "batch_table"
                       for p in ph.values() for r in p.records]
        if ref and static_recs:
            from specctl_vllm.kernel.proposers import propose_suffix

            trs = traces.request_traces(ref[max(ref)].records)
            doc = traces.sim_trace(static_recs, trs, propose_suffix, engines.K_MAX,
                                   "bench/cpu_engine.py: vLLM 0.32 CPU, SmolLM2-135M-Instruct float32 greedy; engine = "
                                   "vLLM n-gram (2..4) per-step acceptance of the static-k and batch-table runs; "
                                   "suffix = the patch's drafter scored on the same requests' tokens at k=8")
            Path(self.args.traces_out).write_text(json.dumps(doc, indent=1))
            info["sim_trace"] = self.args.traces_out
        return info

    def replay_check(self) -> dict:
        """``specctl replay`` on the specctl run's telemetry vs what the benchmark measured."""
        out = {}
        ref = self.records.get("no_spec", {})
        for c in self.concurrencies:
            path = self.tmp / "telemetry" / f"specctl_c{c}.jsonl"
            if not path.exists() or c not in ref:
                continue
            batches = replay_core.parse_telemetry(path.read_text().splitlines(), str(path))
            if not batches:
                continue
            proposers, _ = replay_cli.default_proposers("ngram", ["suffix"], "auto")
            rep = replay_core.replay(batches, traces.request_traces(ref[c].records), proposers)
            measured = report.ratios(self.runs, str(c)).get("vs_no_spec", {})
            out[str(c)] = {"estimated_vs_off": {n: round(r["vs_off"], 4) for n, r in rep["policies"].items()},
                           "measured_vs_no_spec": {n: round(v, 4) for n, v in measured.items()},
                           "measured_engine_goodput": rep["measured_goodput"],
                           "choices": {n: r["choice"] for n, r in rep["policies"].items()
                                       if n in ("goodput", "oracle")}}
        return out


def merge(phases: list[Phase], c: int) -> Phase:
    """Chunks as one phase: the records in order, the wall time summed (idle time between chunks excluded)."""
    records = [r for ph in phases for r in ph.records]
    return Phase(c, records, 0.0, sum(ph.wall_s for ph in phases))


def _decisions(url: str) -> list[dict]:
    out = []
    for v in controller_api.categories(url):
        d = v.get("decision") or {}
        out.append({"category": v.get("category"), "k": d.get("k"), "method": d.get("method"),
                    "source": d.get("source"), "adapt": [d.get("adapt_k_min"), d.get("adapt_k_max")],
                    "speedup": d.get("estimated_speedup"), "reason": d.get("reason"),
                    "mean_acceptance_length": v.get("mean_acceptance_length")})
    return out


def _slug(name: str) -> str:
    return name.replace("=", "").replace(" ", "_")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 prompts per category, 1 warm-up prompt per category")
    ap.add_argument("--per-category", type=int, default=None,
                    help="measured prompts per category at the highest concurrency (default 16; --quick 2)")
    ap.add_argument("--per-category-c1", type=int, default=None,
                    help="measured prompts per category at concurrency 1 (default 4; --quick 2): one request at a "
                         "time is slow on a shared 2-core machine")
    ap.add_argument("--warmup-per-category", type=int, default=None,
                    help=f"warm-up prompts per category before the concurrency-8 pass (2; --quick 1); {WARMUP_C1} "
                         "prompts before the concurrency-1 pass")
    ap.add_argument("--concurrency", default="8,1", help="measured concurrencies, in run order")
    ap.add_argument("--ks", default=",".join(map(str, FIXED_KS)))
    ap.add_argument("--only", default="", help="comma-separated configurations to run (development)")
    ap.add_argument("--variant-min-evidence", default="200",
                    help="also run specctl with its own controller at these SPECCTL_POLICY_MIN_EVIDENCE values "
                         "(comma-separated drafts; '' = none): how much the cold-start guardrail costs here")
    ap.add_argument("--variant-category-floor", default="1",
                    help="also run specctl with its own controller at these SPECCTL_POLICY_CATEGORY_FLOOR values "
                         "(comma-separated ratios; '' = none): every category at least that share of plain decoding")
    ap.add_argument("--no-touch", dest="touch", action="store_false",
                    help="no short unmeasured request to an engine right before each of its measured chunks")
    ap.add_argument("--fresh-specctl-engine", action="store_true",
                    help="restart specctl's engine beside each configuration's (same age on both sides of a "
                         "pairing); the controller and its learned state keep running")
    ap.add_argument("--no-repeat-reference", dest="repeat_reference", action="store_false",
                    help="skip the final no-speculation drift check")
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--server-cpus", default="none",
                    help="CPUs for every engine's API server and EngineCore, the controllers and this client "
                         "('auto': all but --omp-bind's; default 'none': left to the kernel). On 2 cores, pinning "
                         "starved the EngineCore (bench/results/cpu_engine_run5_partial.json): off by default")
    ap.add_argument("--omp-bind", default=engines.default_omp_bind(),
                    help="VLLM_CPU_OMP_THREADS_BIND of every engine (default: the last CPU, %(default)s; 'auto' = vLLM's)")
    ap.add_argument("--ld-preload", default=engines.default_ld_preload(),
                    help="LD_PRELOAD of every engine (default: this environment's Intel OpenMP, %(default)r; '' = none)")
    ap.add_argument("--out", default=str(RESULTS / "cpu_engine.json"))
    ap.add_argument("--traces-out", default=str(RESULTS / "cpu_traces.json"))
    ap.add_argument("--workdir", default=str(RESULTS / "tmp" / "cpu_engine"))
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--post-only", action="store_true",
                    help="no runs: redo the results from the checkpoint of an earlier run in --workdir")
    a = ap.parse_args(argv)
    full, quick = (16, 4, 2), (2, 2, 1)
    defaults = quick if a.quick else full
    a.per_category = a.per_category or defaults[0]
    a.per_category_c1 = min(a.per_category_c1 or defaults[1], a.per_category)
    a.warmup_per_category = a.warmup_per_category or defaults[2]
    if a.quick:
        a.repeat_reference = False
    a.server_cpus = {"none": None, "auto": engines.default_server_cpus(a.omp_bind)}.get(a.server_cpus, a.server_cpus)
    a.ks = [int(k) for k in a.ks.split(",") if k.strip()]
    a.variant_min_evidence = [float(v) for v in a.variant_min_evidence.split(",") if v.strip()]
    a.variant_category_floor = [float(v) for v in a.variant_category_floor.split(",") if v.strip()]
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    if args.server_cpus:  # the client and the telemetry proxy too: the worker's core runs the model only
        os.sched_setaffinity(0, {int(c) for c in args.server_cpus.split(",")})
    bench = Bench(args)
    if args.post_only:
        bench.restore()
        bench.aggregate_specctl()  # a checkpoint of a run stopped midway has specctl's chunks but not their sum
    else:
        bench.main_plan()
    bench.add_chunks()
    cs = [str(c) for c in bench.concurrencies]
    rat = {c: report.ratios(bench.runs, c) for c in cs}
    out = {
        "benchmark": "specctl CPU engine (vLLM 0.32 CPU, SmolLM2-135M-Instruct, n-gram)",
        "settings": {"per_category": args.per_category, "per_category_c1": args.per_category_c1,
                     "warmup_per_category": args.warmup_per_category,
                     "prompts": len(bench.prompts), "categories": list(CATEGORIES), "concurrency": bench.concurrencies,
                     "fixed_ks": args.ks, "quick": args.quick, "k_max_patched": engines.K_MAX, "omp_bind": args.omp_bind,
                     "server_cpus": args.server_cpus, "touch": args.touch,
                     "ld_preload": args.ld_preload,
                     "engine": "float32, enforce-eager, prefix caching off, KV cache 1 GiB, seed 0, n-gram lookup 2..4",
                     "python": platform.python_version(), "machine": platform.machine(), "cpus": _cpus()},
        "batch_table": getattr(bench, "table", None),
        "runs": bench.runs,
        "oracle": getattr(bench, "oracle_info", None),
        "ratios": rat,
        "targets": {c: report.check_targets(r) for c, r in rat.items()},
        "equality": bench.equality(),
    }
    out["traces"] = bench.write_traces()
    try:
        out["replay_check"] = bench.replay_check()
    except Exception as exc:  # noqa: BLE001 - a replay failure is reported, the measured results are kept
        out["replay_check"] = {"error": f"{type(exc).__name__}: {exc}"}
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not args.no_plots:
        out["plots"] = report.plot(bench.runs, rat, cs, path.parent, path.stem)
    out["wall_seconds"] = round(time.monotonic() - started, 1)
    path.write_text(json.dumps(out, indent=1, default=str))
    report.print_tables(bench.runs, rat, cs)
    eq = out["equality"]
    print(f"\ngreedy equality: {eq['total_mismatches']} mismatching outputs of {eq['requests_compared']} compared"
          f" (controls: log-prob pass {eq.get('control_logprob_pass_vs_no_spec')}, no_spec across concurrency "
          f"{eq.get('control_no_spec_across_concurrency')})")
    print(f"wrote {path} in {out['wall_seconds']:.0f} s")
    failed = [n for n, r in bench.runs.items() if "error" in r]
    return 1 if failed else 0


def _cpus() -> int:
    import os

    return os.cpu_count() or 0


if __name__ == "__main__":
    sys.exit(main())
