"""The learned state at start: the newest snapshot that loads (:func:`restore_brain`)."""

from __future__ import annotations

import logging

from specctl_vllm.controller.core.brain import Brain
from specctl_vllm.controller.core.config import BrainConfig
from specctl_vllm.controller.service.store import Store

log = logging.getLogger("controller.service")


def restore_brain(store: Store, config: BrainConfig) -> tuple[Brain, float | None]:
    """The newest snapshot that loads, else a fresh Brain; returns it with the snapshot's time.

    Every snapshot is validated on load (:meth:`Brain.load` leaves out what does not validate, and the
    restored state must answer a scrape and a dump). One that fails is quarantined (moved to the
    ``quarantined_snapshots`` table, logged) and the next older one is tried; one that loads only in part
    is copied there and its valid part kept. Nothing here stops the service.
    """
    partial: tuple[Brain, float] | None = None
    for snapshot_id, ts, data in store.latest_snapshots():
        try:
            brain = Brain.load(data, config) if data is not None else None
            if brain is None or brain.load_problems == ["unknown snapshot format"]:
                raise ValueError("not a specctl snapshot" if data is not None else "not JSON")
            brain.metrics(ts)  # the restored state must be readable, else it would fail every scrape
            brain.dump()
        except Exception as exc:  # noqa: BLE001 -- a snapshot that cannot load must not stop the service
            reason = f"{type(exc).__name__}: {exc}"[:300]
            log.warning("snapshot quarantined, trying an older one",
                        extra={"snapshot_id": snapshot_id, "snapshot_ts": ts, "error": reason})
            store.quarantine_snapshot(snapshot_id, reason)
            continue
        if not brain.load_problems:
            return brain, ts
        # parts of it do not validate: kept for inspection; an older snapshot that loads whole is preferred
        log.warning("snapshot loads only in part, copy quarantined",
                    extra={"snapshot_id": snapshot_id, "snapshot_ts": ts, "problems": brain.load_problems[:10]})
        store.quarantine_snapshot(snapshot_id, "; ".join(brain.load_problems)[:500], keep=True)
        partial = partial or (brain, ts)
    if partial is not None:
        return partial
    return Brain(config), None
