"""Greedy outputs are token-identical with and without the patch, whatever k and method it applies.

Runs (float32, temperature 0, the same mixed prompts): unpatched vLLM without speculation (the reference),
unpatched vLLM with static n-gram k=4, the patched engine under the controller's policy, and the patched
engine under overrides that pin k=1, turn speculation off, pin k=2, and switch a category to the patch's own
suffix drafter. Token ids are compared, not text. A divergence is accepted only at a numerical near-tie of
the reference (top-2 log-probabilities closer than ``NEAR_TIE``), and is printed either way.
"""

from __future__ import annotations

import time

import pytest

from bench.support import controller_api
from bench.support.controller_api import CategoryCounters
from bench.support.stack import POLICY_INTERVAL_S, REPORT_INTERVAL_S, plain_engine
from bench.support.vllm_server import NGRAM
from bench.support.workload import Result, build_workload, run_workload

pytestmark = pytest.mark.e2e

PROMPTS = build_workload(per_category=2, max_tokens=64)
NEAR_TIE = 1e-3  # nats between the reference's top-2 tokens
OVERRIDES = {"code": {"k": 1}, "prose": {"off": True}, "json": {"k": 2}, "summarise": {"method": "suffix"},
             "multi_turn": {"method": "suffix"}}


def greedy(url: str) -> dict[str, Result]:
    results = run_workload(url, PROMPTS, concurrency=8, logprobs=2)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    return {r.prompt.id: r for r in results}


def divergences(reference: dict[str, Result], other: dict[str, Result]) -> list[tuple[str, int, float]]:
    """(prompt id, first differing position, reference top-2 margin there) for every differing output."""
    out = []
    for pid, ref in reference.items():
        got = other[pid].token_ids
        if got == ref.token_ids:
            continue
        pos = next((i for i, (a, b) in enumerate(zip(ref.token_ids, got)) if a != b), min(len(ref.token_ids), len(got)))
        tops = ref.top_logprobs[pos] if pos < len(ref.top_logprobs) else []
        margin = tops[0][1] - tops[1][1] if len(tops) >= 2 else float("inf")
        out.append((pid, pos, margin))
    return out


def test_greedy_outputs_are_token_identical(engine, controller, model_dir, e2e_dir, admin_token) -> None:
    runs: dict[str, dict[str, Result]] = {}
    before = controller_api.read_method_counters(controller.url)
    runs["patched, controller policy"] = greedy(engine.url)
    print("\npolicy in force (category: k, method, adapt bounds, source):")
    for view in controller_api.categories(controller.url):
        d = view.get("decision") or {}
        print(f"   {view['category']:12s} k={d.get('k')} {d.get('method')} [{d.get('adapt_k_min')}, "
              f"{d.get('adapt_k_max')}] {d.get('source')}: {d.get('reason', '')[:80]}")

    try:
        for name, change in OVERRIDES.items():
            controller_api.set_override(controller.url, admin_token, name, reason="e2e equality", **change)
        time.sleep(POLICY_INTERVAL_S + 2 * REPORT_INTERVAL_S)
        mid = controller_api.read_method_counters(controller.url)
        runs["patched, overrides"] = greedy(engine.url)
        time.sleep(4 * REPORT_INTERVAL_S)
        after = controller_api.read_method_counters(controller.url)
    finally:
        for name in OVERRIDES:
            controller_api.clear_override(controller.url, admin_token, name)

    suffix_drafts = sum(v.drafts - mid.get(k, CategoryCounters()).drafts for k, v in after.items() if k[1] == "suffix")
    print(f"drafts by the patch's suffix drafter under overrides: {suffix_drafts:.0f}")
    assert suffix_drafts > 0  # the method switch really ran, not only the caps
    assert sum(v.drafts for v in after.values()) > sum(v.drafts for v in before.values())

    with plain_engine(model_dir, e2e_dir / "plain-nospec", speculative=None) as server:
        runs["vLLM, no speculation"] = greedy(server.url)
    with plain_engine(model_dir, e2e_dir / "plain-static", speculative=dict(NGRAM)) as server:
        runs["vLLM, static n-gram k=4"] = greedy(server.url)

    reference = runs.pop("vLLM, no speculation")
    tokens = sum(len(r.token_ids) for r in reference.values())
    failures = []
    for label, run in runs.items():
        diffs = divergences(reference, run)
        print(f"{label}: {len(PROMPTS) - len(diffs)}/{len(PROMPTS)} identical ({tokens} reference tokens)")
        for pid, pos, margin in diffs:
            print(f"   {pid} diverges at token {pos}, reference top-2 margin {margin:.2e} nats")
            if margin >= NEAR_TIE:
                failures.append((label, pid, pos, margin))
    assert not failures, f"divergences away from near-ties: {failures}"
