"""Closed-loop load against vLLM's OpenAI chat endpoint: N requests in flight, one progress bar, full records.

Each request keeps what the benchmark needs afterwards: its category, prompt and output token ids (greedy
equality, request token traces for ``specctl replay``), latency, and vLLM's per-request speculative-decoding
metrics (``--per-request-spec-decode-metrics detailed``: drafted / accepted per verify step).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
from tqdm import tqdm

from bench.support.workload import Prompt


@dataclass
class Record:
    id: str
    category: str
    status: int
    started: float = 0.0  # monotonic seconds
    ended: float = 0.0
    prompt_token_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    spec: dict[str, Any] | None = None  # vLLM's metrics.speculative_decoding
    top2: list[tuple[float, float]] = field(default_factory=list)  # reference top-2 log-probs per position
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def latency(self) -> float:
        return self.ended - self.started


@dataclass
class Phase:
    """One pass of the workload at one concurrency."""

    concurrency: int
    records: list[Record]
    started: float
    ended: float

    @property
    def wall_s(self) -> float:
        return self.ended - self.started

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.records)


def _parse(prompt: Prompt, response: httpx.Response, started: float, ended: float) -> Record:
    rec = Record(prompt.id, prompt.category, response.status_code, started, ended)
    if response.status_code != 200:
        rec.error = response.text[:500]
        return rec
    body = response.json()
    choice = body["choices"][0]
    rec.prompt_token_ids = list(body.get("prompt_token_ids") or [])
    rec.token_ids = list(choice.get("token_ids") or [])
    rec.finish_reason = choice.get("finish_reason")
    rec.spec = (body.get("metrics") or {}).get("speculative_decoding")
    for entry in (choice.get("logprobs") or {}).get("content") or []:
        tops = [t["logprob"] for t in entry.get("top_logprobs", [])]
        rec.top2.append((tops[0], tops[1]) if len(tops) >= 2 else (tops[0] if tops else 0.0, float("-inf")))
    return rec


def run_phase(base_url: str, prompts: list[Prompt], concurrency: int, *, model: str = "smollm2",
              desc: str = "", logprobs: int | None = None, timeout_s: float = 600.0, leave: bool = False) -> Phase:
    """Send every prompt with ``concurrency`` in flight (closed loop); records in prompt order."""
    bar = tqdm(total=len(prompts), desc=desc, unit="req", leave=leave, dynamic_ncols=True)
    lock = threading.Lock()
    tokens = [0]
    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
    with httpx.Client(base_url=base_url, timeout=timeout_s, limits=limits) as client:
        def one(prompt: Prompt) -> Record:
            t0 = time.monotonic()
            try:
                response = client.post("/v1/chat/completions", json=prompt.body(model, logprobs=logprobs))
            except httpx.HTTPError as exc:
                rec = Record(prompt.id, prompt.category, 0, t0, time.monotonic(), error=f"{type(exc).__name__}: {exc}")
            else:
                rec = _parse(prompt, response, t0, time.monotonic())
            with lock:
                tokens[0] += len(rec.token_ids)
                bar.update(1)
                bar.set_postfix(tok=tokens[0], refresh=False)
            return rec

        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            records = list(pool.map(one, prompts))
        ended = time.monotonic()
    bar.close()
    return Phase(concurrency, records, started, ended)


#: One short greedy request (8 tokens): what :func:`touch` sends.
TOUCH = Prompt("touch", "prose", [{"role": "user", "content": "Name three colours."}], max_tokens=8)


def touch(base_url: str, *, model: str = "smollm2") -> Record:
    """One short, unmeasured request right before an engine's measured chunk.

    Why: on the benchmark machine an engine that sat idle for a minute (while the other side served, or while
    another configuration's engine started) ran its next chunk up to 15 % slower than a busy one -- the
    kernel pages out memory it has not touched lately (bench/cpu/identical.py measures it). The touch faults
    the model's pages back in before the clock starts, for both sides of a pairing alike.
    """
    return run_phase(base_url, [TOUCH], 1, model=model).records[0]
