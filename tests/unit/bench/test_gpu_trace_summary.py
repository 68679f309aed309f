"""Profiled steps summarised: device busy time and idle gaps per step, syncs, top kernels."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bench.gpu import steady
from bench.gpu.trace_summary import main, merged, prompt_requests, summarise


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


def step(ts: float, prompts: int, dur: float = 100.0) -> dict:
    return {"ph": "X", "cat": "user_annotation", "ts": ts, "dur": dur,
            "name": f"execute_context_{prompts}({prompts * 40})_generation_{64 - prompts}({64 - prompts})"}


def launched(ts: float, corr: int, name: str = "cudaGraphLaunch") -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": 5, "args": {"correlation": corr}}


def ran(ts: float, dur: float, corr: int) -> dict:
    return {"ph": "X", "cat": "kernel", "name": "k", "ts": ts, "dur": dur, "args": {"correlation": corr}}


def test_each_step_gets_the_device_time_of_what_it_launched_decode_steps_apart() -> None:
    """Steps at 0, 1000, 2500, 3500 and 4500 us: decode, prompt, decode, decode, and the last (no end, not
    counted). A graph replay's kernels share its launch's correlation; a kernel whose launch is outside the
    profiled window counts for no step."""
    events = [step(0, 0), step(1000, 2), step(2500, 0), step(3500, 0), step(4500, 0),
              launched(10, 1), ran(50, 300, 1), ran(360, 200, 1),      # step 1: 500 us in one graph
              launched(1010, 2, "cudaLaunchKernel"), ran(1020, 900, 2),  # step 2 (prompt): 900 us
              launched(2510, 3), ran(2600, 700, 3),                      # step 3: 700 us
              launched(3510, 4), ran(3600, 400, 4),                      # step 4: 400 us
              launched(4510, 5), ran(4600, 999, 5),                      # the last step: not counted
              ran(20, 50, 99)]                                           # launched before the window
    kinds = summarise(events)["steps_by_kind"]
    host = {"median_runner_ms": 0.1, "median_sync_wait_ms": 0.0, "median_other_host_ms": 0.0}
    assert kinds == {"decode": {"count": 3, "median_interval_ms": 1.0, "median_device_ms": 0.5, **host,
                                "median_untraced_ms": 0.9},
                     "with_prompts": {"count": 1, "median_interval_ms": 1.5, "median_device_ms": 0.9, **host,
                                      "median_untraced_ms": 1.4}}


def on(event: dict, tid: int) -> dict:
    return {**event, "pid": 1, "tid": tid}


def test_a_steps_host_time_splits_into_runner_sync_wait_other_calls_and_untraced() -> None:
    """Two decode steps of 1000 us on the runner's thread (tid 7). Step 1: execute_model 300 us, then the
    sampler's ops 300-400 (one nested in another), a synchronize 450-650, nothing after: 350 us untraced.
    Step 2: execute_model 200 us, a synchronize running past the step's end counts up to it. Events of
    another thread (the scheduler's, tid 9) are not the runner's."""
    events = [on(step(0, 0, dur=300), 7), on(step(1000, 0, dur=200), 7), on(step(2000, 0), 7),
              on({"ph": "X", "cat": "cpu_op", "name": "aten::argmax", "ts": 300, "dur": 100}, 7),
              on({"ph": "X", "cat": "cpu_op", "name": "aten::view", "ts": 320, "dur": 10}, 7),
              on(call(450, 200, "cudaEventSynchronize"), 7),
              on(call(1900, 300, "cudaStreamSynchronize"), 7),
              on({"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "ts": 1300, "dur": 500}, 9)]
    decode = summarise(events)["steps_by_kind"]["decode"]
    assert decode["count"] == 2
    assert decode["median_runner_ms"] == pytest.approx(0.25)
    assert decode["median_sync_wait_ms"] == pytest.approx((0.2 + 0.1) / 2)
    assert decode["median_other_host_ms"] == pytest.approx((0.1 + 0.0) / 2)
    assert decode["median_untraced_ms"] == pytest.approx((0.4 + 0.7) / 2)


@pytest.mark.parametrize(("name", "want"), [
    ("execute_context_0(0)_generation_64(64)", 0),
    ("execute_context_3(120)_generation_61(61)", 3),
    ("execute_300_context_1(sq40sk40sqsq1600sqsk1600)_generation_63(sq63sk9000sqsq63sqsk9000)", 1),
    ("execute_model", None),
])
def test_prompt_requests_are_read_from_both_annotation_forms(name, want) -> None:
    assert prompt_requests(name) == want


def test_per_step_figures_divide_by_the_steps_the_trace_holds() -> None:
    """Asked for 40 steps, the engine executed 2 in the window: per step is per executed step."""
    s = summarise([kernel(0, 600), kernel(1000, 600), step(0, 0), step(1000, 0)], steps=40)
    assert (s["per_step_divisor"], s["busy_ms_per_step"]) == (2, 0.6)


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
