"""The engine patch's side of the model-free drafters: the per-request token buffer they read.

The drafters themselves are :mod:`specctl_vllm.kernel.proposers` (pure functions shared with ``specctl replay``);
they are re-exported here for the hook. :class:`TokenHistory` keeps a request's tokens in a growing int32
buffer, appending only what is new.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specctl_vllm.kernel.proposers import PROPOSERS, propose_ngram, propose_suffix

__all__ = ["PROPOSERS", "TokenHistory", "propose_ngram", "propose_suffix"]


class TokenHistory:
    """A request's tokens as a growing int32 array; :meth:`sync` appends only the tokens not yet copied."""

    __slots__ = ("buf", "n")

    def __init__(self, capacity: int = 256) -> None:
        self.buf = np.empty(max(capacity, 16), dtype=np.int32)
        self.n = 0

    def sync(self, tokens: Sequence[int]) -> np.ndarray:
        """Bring the buffer up to ``tokens`` (which only ever grows) and return the filled view."""
        total = len(tokens)
        if total < self.n:  # the request was rewound (cannot happen for committed tokens); start again
            self.n = 0
        if total > self.n:
            if total > self.buf.shape[0]:
                grown = np.empty(max(total, 2 * self.buf.shape[0]), dtype=np.int32)
                grown[: self.n] = self.buf[: self.n]
                self.buf = grown
            self.buf[self.n : total] = tokens[self.n : total]
            self.n = total
        return self.buf[: self.n]
