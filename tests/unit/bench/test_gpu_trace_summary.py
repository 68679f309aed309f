"""Profiled steps summarised: device busy time and idle gaps per step, syncs, top kernels."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bench.gpu import steady
from bench.gpu.trace_summary import main, merged, summarise


def kernel(ts: float, dur: float, name: str = "gemm") -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}


def call(ts: float, dur: float, name: str) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur}


@pytest.mark.parametrize(("spans", "want"), [
    ([], []),
    ([(0, 10), (5, 20), (30, 40)], [(0, 20), (30, 40)]),
    ([(30, 40), (0, 10), (10, 12)], [(0, 12), (30, 40)]),  # touching spans join, any order
])
def test_overlapping_device_activity_is_counted_once(spans, want) -> None:
    assert merged(spans) == want


def test_busy_time_gaps_syncs_and_kernels_per_step() -> None:
    """Two steps of 1000 us: 600 us of kernels each (two overlapping streams in the first), a 400 us gap
    after each but the last, one stream sync on the host."""
    events = [kernel(0, 500), kernel(100, 500, "attn"), kernel(1000, 300), kernel(1300, 300, "attn"),
              call(590, 5, "cudaGraphLaunch"), call(600, 390, "cudaStreamSynchronize"),
              {"ph": "i", "cat": "kernel", "name": "marker", "ts": 5000},  # not a span: ignored
              {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 0, "dur": 9000},
              {"ph": "X", "cat": "user_annotation", "name": "execute_context_0(0)_generation_64(64)", "ts": 0,
               "dur": 300},
              {"ph": "X", "cat": "user_annotation", "name": "execute_context_1(40)_generation_63(63)", "ts": 1000,
               "dur": 500}]
    s = summarise(events, steps=2, gap_us=50)
    assert (s["window_ms"], s["busy_ms"]) == (1.6, 1.2)
    assert s["busy_share"] == pytest.approx(0.75)
    assert s["busy_ms_per_step"] == pytest.approx(0.6)
    assert s["idle_gaps"] == {"min_us": 50, "count": 1, "total_ms": 0.4, "largest_us": 400.0,
                              "total_ms_per_step": 0.2}
    assert s["syncs"] == {"cudaStreamSynchronize": 1}
    assert s["runtime_calls"]["cudaGraphLaunch"] == {"count": 1, "total_ms": 0.005}
    assert [k["name"] for k in s["top_kernels"]] == ["attn", "gemm"]  # 800 us against 800: attn's first by name
    assert s["top_kernels"][0]["ms_per_step"] == pytest.approx(0.4)
    assert s["host_steps"] == {"count": 2, "mean_ms": 0.4}


def test_no_device_activity_and_no_step_count() -> None:
    s = summarise([call(0, 5, "cudaMalloc")])
    assert (s["window_ms"], s["busy_ms"], s["busy_share"], s["busy_ms_per_step"]) == (0.0, 0.0, None, None)


def test_the_cli_summarises_every_trace_by_engine_and_refuses_an_empty_folder(tmp_path: Path, capsys) -> None:
    assert main([str(tmp_path / "none")]) == 2
    assert main([str(tmp_path)]) == 2
    for engine, dur in (("plain", 500.0), ("premise", 600.0)):
        folder = tmp_path / engine
        folder.mkdir()
        with gzip.open(folder / f"{engine}_low_c64_rank0.123.pt.trace.json.gz", "wt") as fh:
            json.dump({"traceEvents": [kernel(0, dur), kernel(1000, dur)]}, fh)
    (tmp_path / "plain" / "broken.pt.trace.json").write_text("{not json")
    out = tmp_path / "summary.json"
    assert main([str(tmp_path), "--steps", "2", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["engine"], r.get("busy_ms_per_step")) for r in rows] == [
        ("plain", None), ("plain", 0.5), ("premise", 0.6)]
    assert rows[0]["error"].startswith("JSONDecodeError")


@pytest.mark.parametrize(("env", "folder", "steps"), [
    ({}, None, steady.DEFAULT_PROFILE_STEPS),
    ({"SPECCTL_BENCH_PROFILE_DIR": "/p", "SPECCTL_BENCH_PROFILE_STEPS": "25"}, Path("/p/plain"), 25),
    ({"SPECCTL_BENCH_PROFILE_DIR": "/p", "SPECCTL_BENCH_PROFILE_STEPS": "-3"}, Path("/p/plain"),
     steady.DEFAULT_PROFILE_STEPS),
    ({"SPECCTL_BENCH_PROFILE_DIR": "", "SPECCTL_BENCH_PROFILE_STEPS": "x"}, None, steady.DEFAULT_PROFILE_STEPS),
])
def test_the_driver_profiles_only_when_told_where(env, folder, steps) -> None:
    assert steady.profile_dir("plain", env) == folder
    assert steady.profile_steps(env) == steps


def test_a_profiled_point_steps_its_load_between_start_and_stop() -> None:
    calls = []

    class Engine:
        def start_profile(self, profile_prefix=None):
            calls.append(("start", profile_prefix))

        def stop_profile(self):
            calls.append(("stop",))

    class Load:
        def step(self):
            calls.append(("step",))

    point = steady.plan.Point(label="plain", profile="low", concurrency=64, warmup_s=1.0)
    steady.profile_point(Engine(), Load(), point, 3)
    assert calls == [("start", "plain_low_c64"), ("step",), ("step",), ("step",), ("stop",)]
