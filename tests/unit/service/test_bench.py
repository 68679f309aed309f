"""specctl bench: the request file, configurations, the schedule, the statistics, and a run against a fake
OpenAI-compatible endpoint (a real HTTP server on loopback)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, StreamingResponse

from specctl_vllm.controller import bench, bench_cli
from specctl_vllm.controller.bench import BenchError, Config, Result


def line(**kw) -> str:
    return json.dumps(kw)


def test_request_file_forms_and_default_categories() -> None:
    reqs = bench.parse_requests([
        line(messages=[{"role": "user", "content": "hi"}], category="chat", max_tokens=8),
        line(prompt="def f(", max_tokens=4),
        line(messages=[{"role": "user", "content": "j"}], response_format={"type": "json_object"}),
        line(messages=[{"role": "user", "content": "t"}], tools=[{"type": "function", "function": {"name": "f"}}]),
        "",
    ])
    assert [(r.category, r.kind, r.max_tokens) for r in reqs] == [
        ("chat", "chat", 8), ("default", "completion", 4), ("structured", "chat", 256), ("tool_call", "chat", 256)]
    assert reqs[0].body["vllm_xargs"] == {"specctl_category": "chat"} and reqs[0].body["temperature"] == 0


@pytest.mark.parametrize(("text", "message"), [
    ("not json", "not JSON"),
    ("[1]", "not a JSON object"),
    (line(prompt="x", messages=[{"role": "user"}]), "exactly one of"),
    (line(prompt=""), "non-empty string"),
    (line(messages=[]), "non-empty list"),
    (line(prompt="x", max_tokens=0), "max_tokens"),
    (line(prompt="x", category="Bad Name"), "category"),
    (line(prompt="x", temprature=0.5), "unknown keys"),
])
def test_bad_request_lines_name_the_line(text: str, message: str) -> None:
    with pytest.raises(BenchError, match=f"f:1: .*{message}"):
        bench.parse_requests([text], "f")
    with pytest.raises(BenchError, match="no requests"):
        bench.parse_requests(["", " "], "f")


def test_configs() -> None:
    assert bench.parse_config("plain=http://h:8000/") == Config("plain", "endpoint", url="http://h:8000")
    assert bench.parse_config("off") == Config("off", "override", k_all=0)
    assert bench.parse_config("specctl") == Config("specctl", "override")
    assert bench.parse_config("k=3").k_all == 3
    assert bench.parse_config("k=chat:4,code:1").ks == {"chat": 4, "code": 1}
    for bad in ("x", "k=99", "k=chat:x", "n=ftp://h", "a b=http://h"):
        with pytest.raises(BenchError):
            bench.parse_config(bad)
    cats = ["chat", "code", "json"]
    assert bench.overrides_for(bench.parse_config("off"), cats) == {"chat": 0, "code": 0, "json": 0}
    assert bench.overrides_for(bench.parse_config("specctl"), cats) == {"chat": None, "code": None, "json": None}
    assert bench.overrides_for(bench.parse_config("k=chat:4"), cats) == {"chat": 4, "code": None, "json": None}


def test_schedule_interleaves_and_rotates() -> None:
    a, b, c = (Config(n, "endpoint", url="http://x") for n in "abc")
    order = [(r, cfg.name) for r, cfg in bench.schedule([a, b, c], 3)]
    assert order == [(0, "a"), (0, "b"), (0, "c"), (1, "b"), (1, "c"), (1, "a"), (2, "c"), (2, "a"), (2, "b")]


def test_percentile_and_summary() -> None:
    assert bench.percentile([], 50) is None
    assert bench.percentile([1, 2, 3, 4], 50) == 2.5 and bench.percentile([5], 99) == 5
    results = [Result("a", True, ttft_s=0.1, e2e_s=1.1, output_tokens=11, itl_s=[0.1] * 10),
               Result("b", True, ttft_s=0.3, e2e_s=0.5, output_tokens=3, itl_s=[0.1, 0.1]),
               Result("b", False, error="HTTP 500")]
    s = bench.summarize(results, 2.0, {"a": {"drafts": 10, "draft_tokens": 40, "accepted": 20}})
    over = s["categories"]["overall"]
    assert over["output_tokens"] == 14 and over["goodput_tok_s"] == 7.0 and over["errors"] == 1
    assert s["categories"]["a"]["tpot_mean_ms"] == pytest.approx(100.0)
    assert s["categories"]["a"]["mean_acceptance_length"] == 3.0  # 1 + accepted per draft
    assert s["categories"]["a"]["acceptance_rate"] == 0.5
    assert s["error_samples"] == ["HTTP 500"]
    agg = bench.aggregate([{"config": "x", "summary": s}, {"config": "x", "summary": bench.summarize(results, 1.0)}])
    g = agg["x"]["overall"]["goodput_tok_s"]
    assert (g["min"], g["max"], g["mean"]) == (7.0, 14.0, 10.5)
    assert "overall" in bench.format_table(agg, "x")


def test_prometheus_counters() -> None:
    text = ('specctl_drafts_total{model_name="m",category="a",method="ngram"} 5\n'
            'specctl_drafts_total{model_name="m",category="a",method="suffix"} 1\n'
            'specctl_accepted_tokens_total{model_name="m",category="b",method="ngram"} 7\n'
            "# HELP x\nother 3\n")
    got = bench.parse_prometheus_counters(text, bench.SPECCTL_COUNTERS, "category")
    assert got == {"a": {"drafts": 6.0}, "b": {"accepted": 7.0}}
    assert bench.counter_delta({"a": {"drafts": 9.0}}, {"a": {"drafts": 6.0}}) == {"a": {"drafts": 3.0}}


# --- against a fake endpoint -------------------------------------------------------------------------------------


def fake_app() -> FastAPI:
    app = FastAPI()
    state = {"drafts": 0, "accepted": 0}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"data": [{"id": "fake"}]}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(f'vllm:spec_decode_num_drafts_total{{engine="0"}} {state["drafts"]}\n'
                                 f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {state["drafts"] * 4}\n'
                                 f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {state["accepted"]}\n')

    @app.post("/v1/chat/completions")
    @app.post("/v1/completions")
    async def complete(request: Request):
        body = await request.json()
        if body.get("max_tokens") == 13:
            return PlainTextResponse("boom", status_code=500)
        n = body["max_tokens"]

        async def events():
            for _ in range(n):
                state["drafts"] += 1
                state["accepted"] += 1
                key = {"delta": {"content": "x"}} if "messages" in body else {"text": "x"}
                yield "data: " + json.dumps({"choices": [key]}) + "\n\n"
                await asyncio.sleep(0.001)
            yield "data: " + json.dumps({"choices": [], "usage": {"completion_tokens": n}}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def endpoint():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = uvicorn.Server(uvicorn.Config(fake_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(5)


def write_requests(path: Path, extra: list[str] = ()) -> Path:
    path.write_text("\n".join([
        line(messages=[{"role": "user", "content": "hi"}], category="chat", max_tokens=6),
        line(prompt="def f(", max_tokens=9, category="code"),
        line(messages=[{"role": "user", "content": "j"}], response_format={"type": "json_object"}, max_tokens=5),
        *extra]) + "\n")
    return path


def test_bench_two_endpoints_end_to_end(endpoint, tmp_path: Path, capsys) -> None:
    reqs = write_requests(tmp_path / "reqs.jsonl", [line(prompt="fails", max_tokens=13)])
    out = tmp_path / "bench.json"
    code = bench_cli.main([str(reqs), "--config", f"a={endpoint}", "--config", f"b={endpoint}", "--repeats", "2",
                           "--concurrency", "2", "--json", str(out), "--plots", str(tmp_path / "plots")])
    assert code == 0
    text = capsys.readouterr()
    assert "goodput tok/s" in text.out and "round 2/2" in text.err  # table, progress bars
    data = json.loads(out.read_text())
    assert [r["config"] for r in data["runs"]] == ["a", "b", "b", "a"]  # interleaved, rotated
    agg = data["aggregate"]["a"]
    assert set(agg) == {"overall", "chat", "code", "structured", "default"}
    assert agg["chat"]["output_tokens"]["mean"] == 6 and agg["default"]["errors"]["mean"] == 1
    assert agg["overall"]["mean_acceptance_length"]["mean"] == pytest.approx(2.0)  # vLLM counters: 1 + 1/1
    assert agg["overall"]["ttft_p50_ms"]["mean"] > 0 and agg["overall"]["itl_p99_ms"]["mean"] > 0
    assert any(p.suffix in (".png", ".svg") for p in (tmp_path / "plots").iterdir())


@pytest.mark.parametrize(("argv", "code", "message"), [
    (["--config", "off"], 2, "need --controller"),
    ([], 2, "at least one --config"),
    (["--config", "a=http://127.0.0.1:9"], 3, "/v1/models"),
    (["--config", "a=http://h", "--config", "a=http://h"], 2, "repeat"),
])
def test_bad_usage_is_a_message(argv, code, message, tmp_path: Path, capsys) -> None:
    reqs = write_requests(tmp_path / "r.jsonl")
    assert bench_cli.main([str(reqs), *argv, "--no-progress"]) == code
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_binary_request_file_is_refused(tmp_path: Path, capsys) -> None:
    path = tmp_path / "r.bin"
    path.write_bytes(bytes(range(256)))
    assert bench_cli.main([str(path), "--config", "a=http://h"]) == 2
    assert "cannot read it as UTF-8" in capsys.readouterr().err


def _wire_client(client, monkeypatch) -> None:
    import httpx

    from tests.unit.service.conftest import ADMIN_TOKEN

    monkeypatch.setenv("SPECCTL_ADMIN_TOKEN", ADMIN_TOKEN)
    for verb in ("get", "put", "delete"):
        monkeypatch.setattr(httpx, verb, lambda url, _v=verb, **kw: getattr(client, _v)(url.replace("http://ctl", ""),
                                                                                       **kw))


def test_overrides_pinned_and_restored(client, monkeypatch) -> None:
    """off / k / specctl through the controller's admin API (a TestClient controller)."""
    _wire_client(client, monkeypatch)
    ledger = bench.OverrideLedger(found={})
    bench_cli.apply_overrides("http://ctl", ledger.actions(bench.parse_config("k=chat:3"), ["chat", "code"]))
    assert {o["category"]: o["k"] for o in client.get("/v1/overrides").json()} == {"chat": 3}
    bench_cli.apply_overrides("http://ctl", ledger.actions(bench.parse_config("off"), ["chat", "code"]))
    assert {o["category"]: o["k"] for o in client.get("/v1/overrides").json()} == {"chat": 0, "code": 0}
    bench_cli.apply_overrides("http://ctl", ledger.actions(bench.parse_config("specctl"), ["chat", "code"]))
    assert client.get("/v1/overrides").json() == []
    monkeypatch.delenv("SPECCTL_ADMIN_TOKEN")
    with pytest.raises(bench_cli.Unreachable, match="SPECCTL_ADMIN_TOKEN"):
        bench_cli.apply_overrides("http://ctl", ledger.actions(bench.parse_config("off"), ["chat"]))


OPERATOR = {"k": 2, "reason": "tuned by hand", "actor": "alice"}
ADMIN = {"Authorization": "Bearer admin-token-0123456789"}


def _requests_file(tmp_path: Path) -> Path:
    path = tmp_path / "r.jsonl"
    path.write_text('{"category": "chat", "prompt": "hi"}\n{"category": "code", "prompt": "x"}\n')
    return path


def test_bench_refuses_to_pin_over_an_operators_override(client, monkeypatch, tmp_path, capsys) -> None:
    _wire_client(client, monkeypatch)
    assert client.put("/v1/overrides/chat", json=OPERATOR, headers=ADMIN).status_code == 200
    code = bench_cli.main([str(_requests_file(tmp_path)), "--endpoint", "http://engine.invalid", "--controller",
                          "http://ctl", "--config", "off", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "chat" in err and "--replace-overrides" in err
    assert [(o["category"], o["k"], o["actor"]) for o in client.get("/v1/overrides").json()] == [("chat", 2, "alice")]
    assert [r["action"] for r in client.get("/v1/audit", headers=ADMIN).json()] == ["set"]  # nothing touched


def test_a_failing_bench_restores_exactly_what_it_set(client, monkeypatch, tmp_path) -> None:
    _wire_client(client, monkeypatch)
    assert client.put("/v1/overrides/chat", json=OPERATOR, headers=ADMIN).status_code == 200
    assert client.put("/v1/overrides/other", json=OPERATOR, headers=ADMIN).status_code == 200  # not in the file
    # the engine is unreachable: the run fails at once, after the bench pinned chat and code
    code = bench_cli.main([str(_requests_file(tmp_path)), "--endpoint", "http://engine.invalid", "--controller",
                          "http://ctl", "--config", "off", "--no-progress", "--replace-overrides", "--model", "m",
                          "--settle", "0"])
    assert code == 3
    now = {o["category"]: (o["k"], o["actor"], o["reason"]) for o in client.get("/v1/overrides").json()}
    assert now == {"chat": (2, "alice", "tuned by hand"), "other": (2, "alice", "tuned by hand")}
