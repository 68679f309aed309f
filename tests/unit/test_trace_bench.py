"""specctl bench --trace: trace files, request logs, and one pass against a stand-in OpenAI endpoint."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from specctl_vllm.controller.bench import BenchError, parse_requests
from specctl_vllm.controller.trace_bench import check_categories, parse_trace_input, run_trace

REQUESTS = [json.dumps({"messages": [{"role": "user", "content": f"hi {i}"}], "category": c})
            for i, c in enumerate(["chat", "chat", "json"])]


def phases(concurrency=2, seconds=0.6):
    return json.dumps({"name": "t", "phases": [
        {"name": "a", "duration_s": seconds, "concurrency": concurrency, "mix": {"chat": 1},
         "output_tokens": {"min": 4, "max": 4}},
        {"name": "b", "duration_s": seconds, "concurrency": concurrency, "mix": {"json": 1},
         "output_tokens": {"min": 4, "max": 4}}]})


@pytest.mark.parametrize("text, message", [
    ("", "empty trace file"),
    ('{"phases": [{"duration_s": 1, "mix": {"a": 1}}]}', "exactly one of concurrency"),
    ('{"t": -1, "messages": [{"role": "user", "content": "x"}]}', "needs \"t\""),
    ('{"messages": [{"role": "user", "content": "x"}]}', "needs \"t\""),
    ('{"t": 1, "messages": [], "bogus": 1}', "bogus"),
    ("not json", "not JSON"),
])
def test_bad_trace_files_are_refused_with_the_reason(text, message):
    with pytest.raises(BenchError, match=message):
        parse_trace_input(text, "trace.json")


def test_a_request_log_becomes_windows():
    log = "\n".join(json.dumps({"t": t, "messages": [{"role": "user", "content": "x"}], "category": c})
                    for t, c in [(0.5, "chat"), (61, "json"), (62, "chat")])
    parsed = parse_trace_input(log, "log.jsonl", window_s=60)
    assert [p.name for p in parsed.trace.phases] == ["t0", "t60"]
    assert [r.t for r in parsed.log] == [0.5, 61, 62]
    assert parsed.trace.phases[1].categories == ("chat", "json")


def test_every_trace_category_needs_a_request():
    trace = parse_trace_input(phases(), "t").trace
    with pytest.raises(BenchError, match=r"\['json'\]"):
        check_categories(trace, parse_requests(REQUESTS[:2]))


def stand_in_endpoint(tokens_per_chunk=2, chunks=2):
    """An OpenAI endpoint that streams ``chunks`` chunks of ``tokens_per_chunk`` tokens, then the usage."""
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        events = [{"choices": [{"delta": {"content": "ab"}}]} for _ in range(chunks)]
        events.append({"choices": [], "usage": {"completion_tokens": tokens_per_chunk * chunks}})
        text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})

    return httpx.MockTransport(handler), seen


def test_one_pass_keeps_the_load_and_counts_streamed_tokens_per_phase():
    transport, seen = stand_in_endpoint()
    parsed = parse_trace_input(phases(), "t")
    pool = check_categories(parsed.trace, parse_requests(REQUESTS))
    record = asyncio.run(run_trace("http://e", "m", parsed, pool, timeout=5, api_key="", transport=transport))
    a, b = record["phases"]
    assert a["tokens"] > 0 and b["tokens"] > 0
    # tokens are credited when they arrive: a request started late in a may stream into b
    assert set(a["tokens_by_category"]) == {"chat"} and "json" in b["tokens_by_category"]
    # every request counted its usage total (4), not its chunk count (2)
    assert record["tokens"] == pytest.approx(4 * (a["finished"] + b["finished"]), abs=4 * 4)
    assert all(body["max_tokens"] == 4 and body["stream"] for body in seen)
