"""specctl bench --trace: every configuration plays the trace against a stand-in endpoint and controller (a
real HTTP server on loopback); rows trace_stats reads, the oracle's figures, overrides put back, bad input."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from specctl_vllm.controller import bench_cli, trace_bench
from specctl_vllm.controller.trace_stats import analyse, load_rows

OPERATOR = {"category": "chat", "k": 5, "off": False, "method": None, "reason": "tuned by hand", "actor": "alice",
            "ttl_remaining_s": None}


def stand_in(state: dict) -> FastAPI:
    """An OpenAI endpoint and a controller's override API in one app. The endpoint answers ``max_tokens x (k + 1)``
    tokens for a category pinned at k and ``x 2`` without an override (the controller's policy), so each
    configuration's figure shows the override that was in force while it ran."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict:
        return {"data": [{"id": "stand-in"}]}

    @app.get("/v1/overrides")
    async def overrides() -> list:
        return list(state["overrides"].values())

    @app.put("/v1/overrides/{category}")
    async def put(category: str, request: Request) -> dict:
        body = await request.json()
        state["writes"].append(("put", category, body.get("actor")))
        state["overrides"][category] = {"category": category, "k": body.get("k"), "off": bool(body.get("off")),
                                        "method": body.get("method"), "reason": body["reason"],
                                        "actor": body["actor"], "ttl_remaining_s": body.get("ttl_s")}
        return state["overrides"][category]

    @app.delete("/v1/overrides/{category}")
    async def delete(category: str) -> dict:
        state["writes"].append(("delete", category, None))
        state["overrides"].pop(category, None)
        return {}

    @app.post("/v1/chat/completions")
    async def complete(request: Request):
        body = await request.json()
        held = state["overrides"].get(body["vllm_xargs"]["specctl_category"])
        factor = 2 if held is None else (1 if held["off"] else held["k"] + 1)
        n = body["max_tokens"] * factor

        async def events():
            yield "data: " + json.dumps({"choices": [{"delta": {"content": "x"}}]}) + "\n\n"
            yield "data: " + json.dumps({"choices": [], "usage": {"completion_tokens": n}}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@pytest.fixture()
def served():
    state: dict = {"overrides": {}, "writes": []}
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = uvicorn.Server(uvicorn.Config(stand_in(state), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", state
    server.should_exit = True
    thread.join(5)


def ask(text: str, category: str, max_tokens: int, t: float | None = None) -> str:
    row = {"messages": [{"role": "user", "content": text}], "category": category, "max_tokens": max_tokens}
    return json.dumps(row if t is None else {"t": t, **row})


#: a request log in two 0.5 s windows: chat 2 + json 3 tokens asked in the first, chat 4 in the second
LOG = [ask("a", "chat", 2, 0.02), ask("b", "json", 3, 0.05), ask("c", "chat", 4, 0.55)]


def bench(url: str, tmp_path: Path, *extra: str) -> tuple[int, Path]:
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join(LOG) + "\n")
    out = tmp_path / "rows.jsonl"
    code = bench_cli.main(["--trace", str(log), "--window-s", "0.5", "--endpoint", url, "--controller", url,
                           "--settle", "0", "--warmup", "0", "--no-progress", "--json", str(out), *extra])
    return code, out


# configs -> goodput per configuration (tokens / 1.0 s of trace), best single static, specctl / best, specctl / k0
RUNS = [
    (["off", "k=2", "specctl"], {"k0": 9.0, "k2": 27.0, "specctl": 18.0}, "k2", 2 / 3, 2.0),
    (["off", "k=1"], {"k0": 9.0, "k1": 18.0}, "k1", None, None),
]


@pytest.mark.parametrize(("configs", "goodput", "best", "vs_best", "vs_off"), RUNS)
def test_every_configuration_plays_the_log_and_the_figures_are_its_tokens(served, tmp_path, capsys, configs,
                                                                          goodput, best, vs_best, vs_off):
    url, state = served
    code, out = bench(url, tmp_path, "--repeats", "2", *[x for c in configs for x in ("--config", c)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    rows = load_rows(out)
    assert sorted((r["config"], r["repeat"]) for r in rows) == sorted((c, r) for c in goodput for r in (0, 1))
    for r in rows:
        assert [p["name"] for p in r["phases"]] == ["t0", "t0.5"] and r["seconds"] == 1.0
    result = analyse(rows)
    assert {c: v["goodput"]["median"] for c, v in result["configs"].items()} == pytest.approx(goodput)
    assert result["best_single_static"] == best
    assert result["oracle"]["median"] == pytest.approx(goodput[best])  # one static is best in both phases
    if vs_best is not None:
        assert result["ratios"]["specctl/best_single_static"]["median"] == pytest.approx(vs_best)
        assert result["ratios"]["specctl/k0"]["median"] == pytest.approx(vs_off)
    assert "per-phase static oracle" in printed.out and "| t0.5 |" in printed.out
    assert json.loads(out.read_text().splitlines()[-1])["kind"] == "trace_analysis"
    assert state["overrides"] == {}  # nothing the bench pinned is left behind


def test_an_operators_override_is_refused_then_put_back_with_replace(served, tmp_path, capsys):
    url, state = served
    state["overrides"]["chat"] = dict(OPERATOR)
    code, _ = bench(url, tmp_path, "--config", "off", "--repeats", "1")
    err = capsys.readouterr().err
    assert code == 2 and "chat" in err and "--replace-overrides" in err and "Traceback" not in err
    assert state["writes"] == [] and state["overrides"] == {"chat": OPERATOR}
    code, out = bench(url, tmp_path, "--config", "off", "--repeats", "1", "--replace-overrides")
    assert code == 0
    (row,) = load_rows(out)
    assert row["tokens"] == 9.0  # chat and json ran off (x 1), not at the operator's k = 5
    assert state["overrides"] == {"chat": OPERATOR}  # the operator's override back as it was; json cleared


def test_a_phases_trace_draws_its_requests_from_the_request_file(served, tmp_path):
    url, _ = served
    trace = tmp_path / "phases.json"
    trace.write_text(json.dumps({"name": "two", "phases": [
        {"name": "a", "duration_s": 0.4, "concurrency": 2, "mix": {"chat": 1}, "output_tokens": {"min": 3, "max": 3}},
        {"name": "b", "duration_s": 0.4, "concurrency": 2, "mix": {"json": 1}, "output_tokens": {"min": 3, "max": 3}},
    ]}))
    requests = tmp_path / "r.jsonl"
    requests.write_text("\n".join([ask("a", "chat", 50), ask("b", "json", 50)]) + "\n")
    out = tmp_path / "rows.jsonl"
    assert bench_cli.main([str(requests), "--trace", str(trace), "--config", f"plain={url}", "--repeats", "1",
                           "--warmup", "0", "--no-progress", "--json", str(out)]) == 0
    (row,) = load_rows(out)
    a, b = row["phases"]
    assert (row["config"], row["trace"], row["seconds"]) == ("plain", "two", pytest.approx(0.8))
    assert a["finished"] > 0 and b["finished"] > 0
    assert "json" not in a["tokens_by_category"] and a["tokens_by_category"]["chat"] > 0
    assert b["tokens_by_category"]["json"] > 0
    # each request asks the phase's length (3), not the request file's (50): the endpoint's x 2 makes 6 at most
    assert 0 < row["tokens"] <= 6 * (a["started"] + b["started"])


PHASES = json.dumps({"phases": [{"duration_s": 1, "concurrency": 1, "mix": {"chat": 1}}]})


@pytest.mark.parametrize(("files", "args", "message"), [
    ({}, ["--trace", "missing.json"], "cannot read"),
    ({"t.json": "{\"phases\": []}"}, ["--trace", "t.json"], "'phases' must be a non-empty list"),
    ({"t.json": "not json"}, ["--trace", "t.json"], "not JSON"),
    ({"t.json": b"\xff\xfe"}, ["--trace", "t.json"], "UTF-8"),
    ({"t.json": "\n".join(LOG)}, ["--trace", "t.json", "--window-s", "0"], "--window-s must be a positive"),
    ({"t.json": "\n".join(LOG)}, ["--trace", "t.json", "--window-s", "-1"], "--window-s must be a positive"),
    ({"t.json": "\n".join(LOG)}, ["--trace", "t.json", "--window-s", "inf"], "--window-s must be a positive"),
    ({"t.json": PHASES}, ["--trace", "t.json"], "give the request file"),
    ({"t.json": PHASES, "r.jsonl": ask("x", "json", 4)}, ["r.jsonl", "--trace", "t.json"], "['chat']"),
    ({"t.json": "\n".join(LOG), "r.jsonl": ask("x", "chat", 4)}, ["r.jsonl", "--trace", "t.json"],
     "carries its own requests"),
])
def test_bad_trace_input_is_a_message_and_exit_2(tmp_path, monkeypatch, capsys, files, args, message):
    monkeypatch.chdir(tmp_path)
    for name, content in files.items():
        (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    assert bench_cli.main([*args, "--config", "a=http://127.0.0.1:9", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_window_default_shown_in_help_is_the_models():
    assert bench_cli.DEFAULT_WINDOW_S == trace_bench.DEFAULT_WINDOW_S


def test_sub_second_windows_have_distinct_names():
    parsed = trace_bench.parse_trace_input("\n".join(LOG), "log", window_s=0.25)
    assert [p.name for p in parsed.trace.phases] == ["t0", "t0.25", "t0.5"]
