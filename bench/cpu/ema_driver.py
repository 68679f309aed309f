"""The SGLang-style EMA-tiers baseline on the real engine: tiers computed from telemetry, applied as overrides.

The tier logic is :mod:`specctl_vllm.controller.core.offline.ema_tiers` (a port of SGLang's adaptive steps). This driver is an
observer of :class:`bench.cpu.record.RecordingProxy`: every engine step in every telemetry batch updates the
slot of that step's batch size with the accepted draft counts of the requests that had drafts (requests
verified without drafts -- no n-gram match, prefill -- carry no acceptance signal; SGLang's EAGLE drafts for
every decode request, so it has no such case). After each batch, the engine-wide k is the current steps of
the slot of the batch's median batch size; when it changes, a worker thread pins every category to it
through the controller's overrides API (k = 0: speculation off). SGLang switches per step; here the change
reaches the engine with the next policy answer (one report interval, ~0.1 s) -- the one deviation.
"""

from __future__ import annotations

import queue
import statistics
import threading
import time
from collections import Counter

import httpx

from specctl_vllm.controller.core.offline import ema_tiers


class EmaOverrideDriver:
    def __init__(self, controller_url: str, admin_token: str, categories: list[str], k_max: int,
                 initial_steps: int = 3, method: str = "ngram") -> None:
        self.url = controller_url.rstrip("/")
        self.token = admin_token
        self.categories = categories
        self.method = method
        self.slots = ema_tiers.clamp_slots(ema_tiers.DEFAULT_SLOTS, k_max)
        self.state = ema_tiers.init_state(min(initial_steps, k_max), self.slots)
        self.applied: int | None = None
        self.steps_at_k: Counter[int] = Counter()  # engine steps seen while each k was in force (as decided)
        self.changes: list[tuple[float, int]] = []
        self.errors = 0
        self._t0 = time.monotonic()
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._thread = threading.Thread(target=self._apply_loop, name="ema-overrides", daemon=True)

    def start(self) -> EmaOverrideDriver:
        self._thread.start()
        self._push(self.state.steps_for_batch(1))
        return self

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(30.0)

    # -- observer (runs on the proxy's event loop: no I/O here) ---------------------------------------------
    def observe(self, batch: dict) -> None:
        sizes = []
        for step in batch.get("steps", []):
            n = int(step.get("batch_size", 0))
            if n <= 0:
                continue
            sizes.append(n)
            k_now = self.state.steps_for_batch(n)
            self.steps_at_k[k_now] += 1
            accepted: list[int] = []
            for cat in step.get("categories", []):
                for h in cat.get("hists", []):
                    for j, count in enumerate(h["accepted"]):
                        accepted.extend([j] * int(count))
            if k_now == 0:
                accepted = [0] * n  # SGLang still counts a no-spec batch toward its next re-evaluation
            if accepted:
                self.state = ema_tiers.update(self.state, self.slots, n, accepted)
        if sizes:
            self._push(self.state.steps_for_batch(int(statistics.median_low(sizes))))

    def _push(self, k: int) -> None:
        if k != self.applied:
            self.applied = k
            self.changes.append((round(time.monotonic() - self._t0, 3), k))
            self._queue.put(k)

    # -- worker ---------------------------------------------------------------------------------------------
    def _apply_loop(self) -> None:
        with httpx.Client(timeout=10.0, headers={"Authorization": f"Bearer {self.token}"}) as client:
            while True:
                k = self._queue.get()
                while not self._queue.empty():  # only the latest tier matters
                    k = self._queue.get()
                if k is None:
                    return
                body = {"k": None, "method": None, "off": True, "ttl_s": None, "reason": "ema tiers", "actor": "bench"}
                if k > 0:
                    body.update(k=k, method=self.method, off=False)
                for cat in self.categories:
                    try:
                        client.put(f"{self.url}/v1/overrides/{cat}", json=body).raise_for_status()
                    except httpx.HTTPError:
                        self.errors += 1
