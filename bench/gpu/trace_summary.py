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
  host time (the runner's work on the host for a step, launches included).

Divided by ``--steps`` (the steps profiled) where given. The summary is small JSON, one object per trace, so a
device session returns it while the traces stay on the host.

    python -m bench gpu.trace_summary /root/specctl-gpu/profiles --steps 40 --out summary.json
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

#: Trace categories of device activity (torch's Kineto export).
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
SYNC_WORDS = ("Synchronize", "synchronize")
#: vLLM's model runner annotates each step it executes ``execute_context_<n>(<tokens>)_generation_<n>(<tokens>)``.
STEP_ANNOTATION = "execute_"
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
    annotated = [float(e.get("dur", 0.0)) for e in events
                 if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(STEP_ANNOTATION)]
    per = (lambda us: round(us / 1e3 / steps, 4)) if steps else (lambda us: None)
    top = sorted(kernels.items(), key=lambda kv: (-kv[1][1], kv[0]))[:TOP]
    return {
        "steps": steps,
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
                       "mean_ms": round(sum(annotated) / len(annotated) / 1e3, 4) if annotated else None},
    }


def traces(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and (p.name.endswith(".pt.trace.json")
                                                                 or p.name.endswith(".pt.trace.json.gz")))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", type=Path, help="folder holding the traces (one subfolder per engine)")
    ap.add_argument("--steps", type=int, default=None, help="steps profiled per trace (per-step figures)")
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
            print(f"{path.parent.name:14s} {path.name[:60]:60s} busy {summary['busy_ms_per_step']} ms/step of "
                  f"{summary['window_ms_per_step']} ({summary['busy_share']}), gaps {summary['idle_gaps']['count']}"
                  f" = {summary['idle_gaps']['total_ms']} ms, syncs {summary['syncs']}", flush=True)
    text = json.dumps(out, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
