"""The fault suite's stack: one real controller (SQLite) <- fault proxy <- patched vLLM CPU engine.

Settings chosen so that each fault resolves in seconds (all documented in docs/reliability.md):
policy TTL 2 s on the controller, engine reports every 0.1 s, backs off to at most 1 s, times a post out
after 1 s (the engine default), and buffers at most 128 step records (so a controller hung for longer
overflows the queue).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from bench.support.specctl_serve import SpecctlServe
from bench.support.vllm_server import NGRAM, VllmServer
from bench.support.workload import Prompt, Result
from tests.faults.harness import ContinuousLoad, Reports, Sampler
from tests.support.faultproxy import FaultProxy

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = Path(os.environ.get("SPECCTL_MODEL_DIR", ROOT / ".cache" / "models" / "SmolLM2-135M-Instruct"))
REPORT_PATH = Path(os.environ.get("SPECCTL_FAULTS_REPORT", ROOT / ".cache" / "faults-report.json"))

K_MAX = NGRAM["num_speculative_tokens"]
POLICY_TTL_S = 2.0
REPORT_INTERVAL_S = 0.1
BACKOFF_MAX_S = 1.0
REQUEST_TIMEOUT_S = 1.0  # the engine's default, set explicitly so the suite's bounds follow it
CONNECT_TIMEOUT_S = 0.25  # the engine's default
#: Large enough to keep every step of a short fault (so the engine's own step records show when it fell back),
#: small enough that the overflow test fills it within seconds of a hung controller.
QUEUE_STEPS = 128
SNAPSHOT_INTERVAL_S = 1.0
MAX_TOKENS = 32
CONCURRENCY = 4
#: Prompts whose answers copy from the prompt (n-gram lookups match almost every step). Two of the four
#: clients send only these, so the engine drafts continuously and the counters show at any moment which k
#: it applies; the other two send the whole mix.
DRAFT_RICH = ("json", "code_edit", "multi_turn")


@dataclass
class FaultSuite:
    controller: SpecctlServe
    proxy: FaultProxy
    engine: VllmServer
    prompts: list[Prompt]
    reports: Reports = field(default_factory=Reports)
    reference: dict[str, Result] = field(default_factory=dict)
    sampler: Sampler | None = None
    load: ContinuousLoad | None = None

    @property
    def categories(self) -> set[str]:
        return {p.category for p in self.prompts}

    def client_prompts(self) -> list[list[Prompt]]:
        rich = [p for p in self.prompts if p.category in DRAFT_RICH]
        return [self.prompts if i % 2 == 0 else rich for i in range(CONCURRENCY)]

    def config(self) -> dict:
        return {"k_max": K_MAX, "policy_ttl_s": POLICY_TTL_S, "report_interval_s": REPORT_INTERVAL_S,
                "backoff_max_s": BACKOFF_MAX_S, "request_timeout_s": REQUEST_TIMEOUT_S,
                "queue_steps": QUEUE_STEPS, "snapshot_interval_s": SNAPSHOT_INTERVAL_S,
                "max_tokens": MAX_TOKENS, "concurrency": CONCURRENCY, "prompts": len(self.prompts),
                "draft_rich_clients": CONCURRENCY // 2, "draft_rich": list(DRAFT_RICH),
                "cpus": os.cpu_count()}


