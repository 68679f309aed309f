"""Operator overrides reach the engine within one policy interval, per category, and clearing restores.

vLLM's counters have no category label, so the per-category claims on vLLM's side are checked with runs
that contain only the overridden category; the controller's per-category counters check the mixed runs.
"""

from __future__ import annotations

import time

import pytest

from bench.support import controller_api
from bench.support.stack import POLICY_INTERVAL_S, REPORT_INTERVAL_S
from bench.support.vllm_server import SERVED_MODEL, SpecCounters, spec_counters
from bench.support.workload import build_workload, run_workload

pytestmark = pytest.mark.e2e

TARGET = "code_edit"  # the most draft-friendly category: the override visibly changes it
OTHERS = ("json", "summarise")
#: An override must be in force after one policy interval plus the engine's next report round trip.
APPLY_WITHIN_S = POLICY_INTERVAL_S + 2 * REPORT_INTERVAL_S


def only(category: str, n: int = 3) -> list:
    return [p for p in build_workload(per_category=n, categories=(category,), max_tokens=64)]


def decided_k(controller, name: str) -> int:
    """The k the controller's policy currently gives the category (overrides included)."""
    return int(controller_api.category(controller.url, name, model=SERVED_MODEL).get("decision", {}).get("k", 0))


def run(engine, controller, prompts) -> tuple[SpecCounters, controller_api.Counters]:
    before_vllm = spec_counters(engine.metrics())
    before = controller_api.wait_stable(controller.url)
    results = run_workload(engine.url, prompts, concurrency=6)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    after = controller_api.wait_stable(controller.url)
    return spec_counters(engine.metrics()) - before_vllm, after - before


def test_override_k1_k0_and_clear(engine, controller, admin_token) -> None:
    url = controller.url
    try:
        # k = 1: the category drafts exactly one token per step, the others keep theirs.
        controller_api.set_override(url, admin_token, TARGET, k=1, reason="e2e k=1")
        time.sleep(APPLY_WITHIN_S)
        vllm, ctl = run(engine, controller, only(TARGET))
        print(f"\nk=1  vLLM drafts={vllm.drafts:.0f} tokens={vllm.draft_tokens:.0f} per_pos={vllm.per_pos}")
        assert vllm.drafts > 0
        assert vllm.draft_tokens == vllm.drafts  # every draft one token long
        assert all(n == 0 for n in vllm.per_pos[1:])
        assert ctl[TARGET].draft_tokens == ctl[TARGET].drafts == vllm.drafts

        before = {name: decided_k(controller, name) for name in OTHERS}
        _, mixed = run(engine, controller, only(TARGET, 2) + [p for c in OTHERS for p in only(c, 2)])
        stable = {name: k for name, k in before.items() if decided_k(controller, name) == k}
        for name in OTHERS:
            print(f"k=1  mixed: {name} policy k={before[name]} tokens/draft="
                  f"{mixed.get_or_zero(name).tokens_per_draft:.2f}")
        assert mixed[TARGET].tokens_per_draft == 1.0
        # The other categories keep the policy's k: never above it, and more than one token where k > 1.
        assert all(mixed.get_or_zero(name).tokens_per_draft <= k for name, k in stable.items())
        wider = [name for name, k in stable.items() if k > 1]
        assert wider, f"no other category at k > 1 to compare with: {stable}"
        assert all(mixed[name].tokens_per_draft > 1.0 for name in wider)

        # k = 0: no drafts at all for the category.
        controller_api.set_override(url, admin_token, TARGET, k=0, reason="e2e k=0")
        time.sleep(APPLY_WITHIN_S)
        vllm, ctl = run(engine, controller, only(TARGET))
        print(f"k=0  vLLM drafts={vllm.drafts:.0f}; controller spec-off steps={ctl[TARGET].spec_off_request_steps:.0f}")
        assert vllm.drafts == 0 and vllm.draft_tokens == 0
        assert ctl[TARGET].draft_tokens == 0
        assert ctl[TARGET].spec_off_request_steps == ctl[TARGET].request_steps > 0
    finally:
        controller_api.clear_override(url, admin_token, TARGET)

    # Cleared: the policy decides again; with its k > 1 the category drafts more than one token again.
    time.sleep(APPLY_WITHIN_S)
    decision = controller_api.category(url, TARGET, model=SERVED_MODEL).get("decision", {})
    vllm, _ = run(engine, controller, only(TARGET))
    print(f"clear: decision k={decision.get('k')} source={decision.get('source')}; "
          f"vLLM tokens/draft={vllm.draft_tokens / max(vllm.drafts, 1):.2f}")
    assert decision.get("override") is None
    if decision.get("k", 0) > 1:
        assert vllm.draft_tokens > vllm.drafts
    else:
        assert vllm.draft_tokens <= vllm.drafts * max(decision.get("k", 0), 1)
