"""Per-category histograms reach the controller and reconcile exactly with vLLM's own counters."""

from __future__ import annotations

import pytest

from bench.support import controller_api
from bench.support.vllm_server import spec_counters
from bench.support.workload import CATEGORIES, build_workload, run_workload

pytestmark = pytest.mark.e2e


def test_histograms_reconcile_exactly_with_vllm_metrics(engine, controller) -> None:
    before_vllm = spec_counters(engine.metrics())
    before = controller_api.wait_stable(controller.url)

    results = run_workload(engine.url, build_workload(per_category=2, max_tokens=48), concurrency=8)
    assert [r.status for r in results] == [200] * len(results), [r.error for r in results if not r.ok]

    after = controller_api.wait_stable(controller.url)
    vllm = spec_counters(engine.metrics()) - before_vllm
    delta = after - before
    total = delta.total()
    print(f"\nvLLM:       drafts={vllm.drafts:.0f} draft_tokens={vllm.draft_tokens:.0f} "
          f"accepted={vllm.accepted_tokens:.0f}")
    print(f"controller: drafts={total.drafts:.0f} draft_tokens={total.draft_tokens:.0f} "
          f"accepted={total.accepted_tokens:.0f}")
    for name in sorted(delta):
        c = delta[name]
        print(f"  {name:12s} request_steps={c.request_steps:5.0f} drafts={c.drafts:4.0f} "
              f"draft_tokens={c.draft_tokens:5.0f} accepted={c.accepted_tokens:5.0f}")

    assert vllm.draft_tokens > 0 and vllm.accepted_tokens > 0  # the workload did speculate
    assert total.draft_tokens == vllm.draft_tokens
    assert total.accepted_tokens == vllm.accepted_tokens
    assert total.drafts == vllm.drafts
    # Every category of the workload (explicit, and derived from response_format / tools) reported steps.
    assert {name for name in CATEGORIES if delta.get_or_zero(name).request_steps > 0} == set(CATEGORIES)
