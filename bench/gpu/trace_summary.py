"""What a profiled window of steps spent on the device and waiting for the host: one summary per torch trace.

The steady-load driver profiles each point's load for a few dozen steps after its timed rounds when
``SPECCTL_BENCH_PROFILE_DIR`` is set (``steady.py``; vLLM's own torch profiler, CPU and CUDA activity). Per
trace (``*.pt.trace.json[.gz]``, found under the folder given, the engine's name being the trace's folder):

* ``window_ms``: first device activity to last; ``busy_ms``: the union of kernels, copies and memsets in it;
  ``busy_share`` = busy / window. Two engines with the same busy time per step and different step times differ
  on the host side (the device waited); more busy time is more device work (``top_kernels`` says which);
* ``idle_gaps``: gaps of at least ``--gap-us`` between device activity, their count, total and the largest;
* ``runtime_calls``: host-side CUDA runtime calls by name (count, total ms), syncs among them;
* ``top_kernels``: the kernels with the most device time (name cut to 120 characters);
* ``host_steps``: vLLM's per-step annotations (``execute_context_..._generation_...``): how many, and their mean
  host time (the runner's work on the host for a step, launches included);
* ``steps_by_kind``: each annotated step but the last is the host time from its annotation to the next one; the
  device time of a step is that of the kernels, copies and memsets launched in it (matched by the runtime
  call's correlation id, so a graph replay counts all its kernels). Medians per kind: ``decode`` (no prompt
  tokens: the like-for-like step of two engines at one batch) and ``with_prompts``. The window's mix of prompt
  steps is whatever the load had in those few dozen steps, so totals of two engines are not like for like;
  the decode medians are.
* per kind, where the host spent a step's interval on the runner's own thread (the thread of the step
  annotations): ``median_runner_ms`` in ``execute_model`` (the annotation), ``median_sync_wait_ms`` blocked in
  a CUDA synchronize call (waiting for the device), ``median_other_host_ms`` in the other traced calls (the
  sampler, output copies) and ``median_untraced_ms`` in nothing the profiler records: waiting for the next
  step's input from the scheduler, or Python that calls no op. A step whose device time is the same on two
  engines and whose interval is longer on one, with the difference in ``untraced``, waited on the host side
  of the engine, not on the GPU.

Per-step figures divide by the annotated steps the trace holds (an engine that did not execute a model step on
every driver step holds fewer than it was asked for), else by ``--steps``. The summary is small JSON, one object
per trace, so a device session returns it while the traces stay on the host.

    python -m bench gpu.trace_summary /root/specctl-gpu/profiles --steps 40 --out summary.json
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import re
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

#: Trace categories of device activity (torch's Kineto export).
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
#: Host-side spans of the runner's thread: torch ops, CUDA calls and annotations.
HOST_CATEGORIES = frozenset({"cpu_op", "user_annotation"}) | RUNTIME_CATEGORIES
SYNC_WORDS = ("Synchronize", "synchronize")
#: vLLM's model runner annotates each step it executes ``execute_context_<n>(<tokens>)_generation_<n>(<tokens>)``.
STEP_ANNOTATION = "execute_"
PROMPT_REQUESTS = re.compile(r"_context_(\d+)")
TOP = 15


def load_events(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        doc = json.load(fh)
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]


def merged(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, overlapping intervals joined."""
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def correlation(event: dict) -> int | None:
    args = event.get("args")
    value = args.get("correlation") if isinstance(args, dict) else None
    return value if isinstance(value, int) else None


def prompt_requests(annotation: str) -> int | None:
    """Requests with prompt tokens in a step, read from vLLM's annotation (None where it does not say)."""
    found = PROMPT_REQUESTS.search(annotation)
    return int(found.group(1)) if found else None


def steps_by_kind(events: Sequence[dict], annotated: Sequence[dict]) -> dict:
    """Median host interval and device time of the annotated steps, decode-only apart from those with prompts."""
    launched_at = {c: float(e["ts"]) for e in events
                   if e.get("cat") in RUNTIME_CATEGORIES and (c := correlation(e)) is not None}
    device_at: list[tuple[float, float]] = sorted(
        (launched_at[c], float(e.get("dur", 0.0))) for e in events
        if e.get("cat") in DEVICE_CATEGORIES and (c := correlation(e)) in launched_at)
    starts = [float(a["ts"]) for a in annotated]
    thread = (annotated[0].get("pid"), annotated[0].get("tid")) if annotated else None
    host = sorted(((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), is_sync(e)) for e in events
                   if e.get("cat") in HOST_CATEGORIES and (e.get("pid"), e.get("tid")) == thread),
                  key=lambda h: h[0])
    kinds: dict[str, dict[str, list[float]]] = {}
    cursor = 0
    for i in range(len(annotated) - 1):  # the last step has no end in the window
        begin, end = starts[i], starts[i + 1]
        while cursor < len(device_at) and device_at[cursor][0] < begin:
            cursor += 1
        device = 0.0
        j = cursor
        while j < len(device_at) and device_at[j][0] < end:
            device += device_at[j][1]
            j += 1
        prompts = prompt_requests(str(annotated[i].get("name", "")))
        kind = "unknown" if prompts is None else "decode" if prompts == 0 else "with_prompts"
        bucket = kinds.setdefault(kind, {"interval": [], "device": [], "runner": [], "sync_wait": [],
                                         "other_host": [], "untraced": []})
        bucket["interval"].append(end - begin)
        bucket["device"].append(device)
        for name, value in host_split(host, begin, end, float(annotated[i].get("dur", 0.0))).items():
            bucket[name].append(value)
    return {kind: {"count": len(b["interval"]),
                   **{f"median_{name}_ms": round(statistics.median(values) / 1e3, 4)
                      for name, values in b.items()}}
            for kind, b in sorted(kinds.items())}


def is_sync(event: dict) -> bool:
    return event.get("cat") in RUNTIME_CATEGORIES and any(w in str(event.get("name", "")) for w in SYNC_WORDS)


def host_split(host: Sequence[tuple[float, float, bool]], begin: float, end: float, runner: float) -> dict:
    """One step's interval on the runner's thread, in microseconds: the annotation (``execute_model``), time
    blocked in synchronize calls after it, other traced calls after it, and what no traced event covers."""
    runner = min(runner, end - begin)
    after = begin + runner
    spans = [(max(a, after), min(b, end), sync) for a, b, sync in host if b > after and a < end]
    covered = sum(b - a for a, b in merged((a, b) for a, b, _ in spans))
    sync_wait = sum(b - a for a, b in merged((a, b) for a, b, sync in spans if sync))
    return {"runner": runner, "sync_wait": sync_wait, "other_host": covered - sync_wait,
            "untraced": (end - begin) - runner - covered}


def summarise(events: Sequence[dict], steps: int | None = None, gap_us: float = 50.0) -> dict:
    """The device's busy time and idle gaps, the host's runtime calls and the top kernels (times in ms)."""
    events = [e for e in events if e.get("ph") == "X" and "ts" in e]  # complete spans only
    device = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))) for e in events
              if e.get("cat") in DEVICE_CATEGORIES]
    busy_spans = merged(device)
    window = (busy_spans[-1][1] - busy_spans[0][0]) if busy_spans else 0.0
    busy = sum(b - a for a, b in busy_spans)
    gaps = [b[0] - a[1] for a, b in itertools.pairwise(busy_spans) if b[0] - a[1] >= gap_us]
    kernels: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("cat") in DEVICE_CATEGORIES:
            k = kernels[str(e.get("name", "?"))[:120]]
            k[0] += 1
            k[1] += float(e.get("dur", 0.0))
    calls: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("cat") in RUNTIME_CATEGORIES:
            c = calls[str(e.get("name", "?"))]
            c[0] += 1
            c[1] += float(e.get("dur", 0.0))
    annotated = sorted((e for e in events if e.get("cat") == "user_annotation"
                        and str(e.get("name", "")).startswith(STEP_ANNOTATION)), key=lambda e: float(e["ts"]))
    host_times = [float(e.get("dur", 0.0)) for e in annotated]
    divisor = len(annotated) or steps
    per = (lambda us: round(us / 1e3 / divisor, 4)) if divisor else (lambda us: None)
    top = sorted(kernels.items(), key=lambda kv: (-kv[1][1], kv[0]))[:TOP]
    return {
        "steps": steps,
        "per_step_divisor": divisor,
        "window_ms": round(window / 1e3, 3),
        "busy_ms": round(busy / 1e3, 3),
        "busy_share": round(busy / window, 4) if window > 0 else None,
        "window_ms_per_step": per(window),
        "busy_ms_per_step": per(busy),
        "idle_gaps": {"min_us": gap_us, "count": len(gaps), "total_ms": round(sum(gaps) / 1e3, 3),
                      "largest_us": round(max(gaps), 1) if gaps else 0.0,
                      "total_ms_per_step": per(sum(gaps))},
        "device_events": len(device),
        "runtime_calls": {name: {"count": int(n), "total_ms": round(t / 1e3, 3)}
                          for name, (n, t) in sorted(calls.items(), key=lambda kv: -kv[1][1])},
        "syncs": {name: int(n) for name, (n, _) in calls.items() if any(w in name for w in SYNC_WORDS)},
        "top_kernels": [{"name": name, "count": int(n), "total_ms": round(t / 1e3, 3), "ms_per_step": per(t)}
                        for name, (n, t) in top],
        "host_steps": {"count": len(annotated),
                       "mean_ms": round(sum(host_times) / len(host_times) / 1e3, 4) if host_times else None},
        "steps_by_kind": steps_by_kind(events, annotated),
    }


def traces(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and (p.name.endswith(".pt.trace.json")
                                                                 or p.name.endswith(".pt.trace.json.gz")))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", type=Path, help="folder holding the traces (one subfolder per engine)")
    ap.add_argument("--steps", type=int, default=None, help="steps profiled per trace (per-step figures where a trace holds no step annotations)")
    ap.add_argument("--gap-us", type=float, default=50.0, help="smallest idle gap counted, microseconds")
    ap.add_argument("--out", type=Path, default=None, help="write the summaries here as JSON (else stdout)")
    args = ap.parse_args(argv)
    if not args.root.is_dir():
        print(f"no such folder: {args.root}", file=sys.stderr)
        return 2
    found = traces(args.root)
    if not found:
        print(f"no torch traces under {args.root}", file=sys.stderr)
        return 2
    out = []
    for path in found:
        try:
            summary = summarise(load_events(path), args.steps, args.gap_us)
        except (OSError, ValueError, KeyError, TypeError) as exc:  # one unreadable trace: say so, go on
            summary = {"error": f"{type(exc).__name__}: {exc}"}
        out.append({"engine": path.parent.name, "trace": path.name, **summary})
        if "error" not in summary:
            decode = summary["steps_by_kind"].get("decode", {})
            print(f"{path.parent.name:14s} {path.name[:60]:60s} busy {summary['busy_ms_per_step']} ms/step of "
                  f"{summary['window_ms_per_step']} ({summary['busy_share']}) over {summary['per_step_divisor']} "
                  f"steps, gaps {summary['idle_gaps']['count']} = {summary['idle_gaps']['total_ms']} ms, syncs "
                  f"{summary['syncs']}; decode steps {decode.get('count', 0)}: median device "
                  f"{decode.get('median_device_ms')} ms of {decode.get('median_interval_ms')} (host: runner "
                  f"{decode.get('median_runner_ms')}, sync wait {decode.get('median_sync_wait_ms')}, other "
                  f"{decode.get('median_other_host_ms')}, untraced {decode.get('median_untraced_ms')})", flush=True)
    text = json.dumps(out, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
