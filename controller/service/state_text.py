"""The learned state as the snapshot's JSON text, dumped and encoded piece by piece with the Brain's lock let go
in between (run from a worker thread).

Dumping a full budget at once held the lock for 15-50 ms and encoding it the GIL for 30-40 ms, and posts waited
behind both (ingest p99 107 ms with a snapshot every second, docs/reliability.md#budget); so each model is one
piece. The engines were one piece: at the engine cap (4096 engines, each book with its prefill histogram) that
piece was a 36 MB dict and 48 MB of encoder output at once, holding the lock for most of a second, and the
server's RSS stayed ~130 MB higher after it (the soak's 278 MB). Engines now go :data:`ENGINES_PER_PIECE` at a
time, each encoded as it is dumped.

Each piece is consistent; a batch merged between two pieces is in the snapshot or not as a whole; a model or
engine forgotten meanwhile is left out.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from specctl_vllm.controller.core.brain import Brain

#: Engine books dumped under one hold of the lock (~20 us each).
ENGINES_PER_PIECE = 256
#: Seconds the thread sleeps between two pieces: a waiting ingest takes the lock.
YIELD_S = 0.0005


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def state_text(brain: Brain, lock: AbstractContextManager, pause: Callable[[float], None] | None = None) -> str:
    """``json.dumps(brain.dump())``'s document (keys in another order), built without holding ``lock`` for more
    than one model or :data:`ENGINES_PER_PIECE` engines; ``pause`` (default ``time.sleep``) between pieces."""
    pause = pause or time.sleep
    with lock:
        models = brain.model_names()
    model_parts: dict[str, str] = {}
    for model in models:
        with lock:
            data = brain.dump_model(model)
        if data is not None:
            model_parts[model] = _compact(data)
        pause(YIELD_S)
    with lock:
        engines = brain.engine_ids()
    engine_parts: dict[str, str] = {}
    for start in range(0, len(engines), ENGINES_PER_PIECE):
        with lock:
            books = brain.dump_engines(engines[start:start + ENGINES_PER_PIECE])
        engine_parts.update((e, _compact(book)) for e, book in books.items())
        pause(YIELD_S)
    with lock:
        rest = brain.dump(models={}, engines={})
        live_models, live_engines = set(brain.model_names()), set(brain.engine_ids())
    rest.pop("models")
    rest.pop("engines")
    head = _compact(rest)
    models_text = ",".join(f"{json.dumps(m)}:{text}" for m, text in model_parts.items() if m in live_models)
    engines_text = ",".join(f"{json.dumps(e)}:{text}" for e, text in engine_parts.items() if e in live_engines)
    return '{"models":{' + models_text + '},"engines":{' + engines_text + "}," + head[1:]
