"""Token ids a model never emits (Whisper's suppress_tokens) or never emits first (its begin_suppress_tokens), masked
in logits of any vocabulary size: the decoding loop's target and drafts, and a distilled draft's teacher and student
(pipeline/distill/) apply the same mask."""

from __future__ import annotations

import torch


class LogitMask:
    """Ids never emitted (Whisper's suppress_tokens), and ids never emitted first (its begin_suppress_tokens): set to
    -inf in logits [..., V] of any vocabulary size, in place. The id tensor of each size is made once (boolean-mask
    indexing inside a step would be a host sync on a GPU)."""

    def __init__(self, suppress, begin_suppress, device: torch.device) -> None:
        self.ids = sorted({int(i) for i in suppress or ()})
        self.begin_ids = sorted({int(i) for i in begin_suppress or ()})
        self.active = bool(self.ids or self.begin_ids)
        self.device = device
        self._tensors: dict[tuple[bool, int], torch.Tensor | None] = {}

    def prepare(self, *vocab_sizes: int) -> None:
        """Make the id tensors for these vocabulary sizes now (a first call with a new size makes its own, with a
        host-to-device copy)."""
        for V in vocab_sizes:
            for first in (False, True):
                ids = [i for i in (self.begin_ids if first else self.ids) if 0 <= i < V]
                self._tensors[first, V] = torch.tensor(ids, dtype=torch.int64, device=self.device) if ids else None

    def restricted(self, ids: list[int]) -> LogitMask:
        """The same mask over a head of the target ids ``ids`` (a draft's vocabulary map, vocab_map.py): row k is
        target id ids[k]; suppressed ids outside ``ids`` need no mask there."""
        row = {t: k for k, t in enumerate(ids)}
        return LogitMask([row[i] for i in self.ids if i in row], [row[i] for i in self.begin_ids if i in row],
                         self.device)

    def __call__(self, logits: torch.Tensor, first_position: bool) -> torch.Tensor:
        """With ``first_position`` only begin_suppress (applied on top of logits already masked with suppress)."""
        if (first_position, logits.shape[-1]) not in self._tensors:
            self.prepare(logits.shape[-1])
        ids = self._tensors[first_position, logits.shape[-1]]
        if ids is not None:
            logits.index_fill_(-1, ids, float("-inf"))
        return logits

    def at(self, logits: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        """In place: suppress at every position of logits [..., V], begin_suppress too where ``first`` bool [...]
        (the positions whose law is a continuation's first token's)."""
        self(logits, False)
        logits[first] = self(logits[first], True)
        return logits
