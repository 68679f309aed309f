"""`specctl bench` on the user's own request file, against the real patched CPU engine and its controller:
overrides off / specctl pinned and cleared, a table, the JSON and the plots."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from specctl_vllm.controller import bench_cli

pytestmark = pytest.mark.e2e


def request_file(path: Path) -> Path:
    lines = [
        {"messages": [{"role": "user", "content": "Write two sentences about the sea."}], "category": "prose",
         "max_tokens": 24},
        {"messages": [{"role": "user", "content": "Give a JSON object with keys a and b."}],
         "response_format": {"type": "json_object"}, "max_tokens": 24},
        {"prompt": "def fibonacci(n):\n    ", "category": "code_edit", "max_tokens": 24},
        {"messages": [{"role": "user", "content": "What is the weather in Paris?"}], "max_tokens": 24,
         "tools": [{"type": "function", "function": {"name": "weather", "parameters": {
             "type": "object", "properties": {"city": {"type": "string"}}}}}]},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_user_bench_on_the_real_engine(engine, controller, admin_token, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SPECCTL_ADMIN_TOKEN", admin_token)
    out, plots = tmp_path / "bench.json", tmp_path / "plots"
    code = bench_cli.main([str(request_file(tmp_path / "requests.jsonl")), "--endpoint", engine.url,
                           "--controller", controller.url, "--config", "off", "--config", "specctl",
                           "--concurrency", "2", "--repeats", "2", "--warmup", "1", "--settle", "2",
                           "--json", str(out), "--plots", str(plots)])
    printed = capsys.readouterr()
    assert code == 0, printed.err[-2000:]
    assert "goodput tok/s" in printed.out
    data = json.loads(out.read_text())
    assert sorted(r["config"] for r in data["runs"]) == ["off", "off", "specctl", "specctl"]
    for config in ("off", "specctl"):
        overall = data["aggregate"][config]["overall"]
        assert overall["errors"]["mean"] == 0
        assert overall["output_tokens"]["mean"] > 0 and overall["ttft_p50_ms"]["mean"] > 0
    assert {"prose", "structured", "code_edit", "tool_call"} <= set(data["aggregate"]["specctl"])
    assert any(p.suffix in (".png", ".svg") for p in plots.iterdir())
    # the overrides the bench pinned are gone
    response = httpx.get(f"{controller.url}/v1/overrides", timeout=10.0)
    response.raise_for_status()
    assert response.json() == []
