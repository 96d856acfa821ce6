"""Prompt lookup: propose the tokens that followed an earlier occurrence of the context's last n tokens.

Model-free drafting (Saxena 2023, "prompt lookup decoding"; transformers' ``prompt_lookup_num_tokens`` with
``max_matching_ngram_size``, vLLM's ``ngram`` method with ``prompt_lookup_min`` / ``prompt_lookup_max``). For a row
whose context (its prompt, then the tokens emitted so far) is x_0 .. x_{m-1}:

    for n = max_n down to min_n: if the suffix x_{m-n} .. x_{m-1} occurs earlier, at some p with p + n < m,
    propose x_{p+n} .. x_{p+n+k-1} with k = max_tokens, cut at the context's end (and before the first stop
    token); the first n with an occurrence decides, even when its proposal is empty after the stop cut.
    No occurrence at any n: propose nothing.

Which occurrence (``occurrence``):
  first  the earliest p. transformers takes it (windows scanned left to right, the first match with a
         continuation) and so does vLLM (its KMP matcher keeps the earliest occurrence of the longest n-gram);
         with ``min_n=1``, ``stop_ids={eos}`` this is transformers' ``PromptLookupCandidateGenerator``, proposal
         for proposal (tests/test_ngram.py holds it to it).
  last   the most recent p: in repetitive text (a list being written, a summary copying the sentence it is at,
         code being edited) it continues where the text is now rather than where the phrase first appeared.
The default is ``first``, the deployed choice; what each gives on real articles: ``python -m
pipeline.benchmarks.proposers``.

Stop tokens: a proposal ends before its first stop token (transformers' rule for EOS). Proposing the EOS itself
gains nothing: the target emits it as the step's bonus or correction token anyway.

The index maps every n-gram (min_n <= n <= max_n) that has a continuation to its first or last position, so a step
costs O(new tokens * N) dict updates (N = max_n - min_n + 1) plus O(N * max_n + max_tokens) for the proposal,
whatever the context's length; memory is one dict entry per position and n.

Several matches (``NgramIndex(..., every=True)``, for a token tree, docs/trees.md): the index also keeps every
occurrence of each n-gram, and :meth:`NgramIndex.propose_many` returns distinct continuations, best first: the
chain's proposal, then the other occurrences of the same (longest) n-gram, most recent first, then those of the
shorter n-grams likewise; at most ``count`` occurrences per n are read (O(N * count * max_tokens) per step).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Generic, Literal, Protocol, TypeVar


class Proposer(Protocol):
    """A row's model-free proposer: ``start(prompt_ids)``, ``extend(new_ids)``, ``propose(max_tokens) -> ids``."""

    def start(self, prompt_ids: Sequence[int]) -> None: ...

    def extend(self, new_ids: Iterable[int]) -> None: ...

    def propose(self, max_tokens: int) -> list[int]: ...

    def propose_many(self, max_tokens: int, widths: Sequence[int]) -> list[list[int]]: ...


class NgramIndex:
    """One row's prompt lookup (module docstring): an index of the row's n-grams, grown token by token."""

    def __init__(self, min_n: int = 1, max_n: int = 3, occurrence: Literal["first", "last"] = "first",
                 stop_ids: Iterable[int] = (), every: bool = False) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n; got min_n={min_n}, max_n={max_n}")
        if occurrence not in ("first", "last"):
            raise ValueError(f"occurrence must be 'first' or 'last'; got {occurrence!r}")
        self.min_n, self.max_n, self.occurrence = min_n, max_n, occurrence
        self.stop_ids = frozenset(stop_ids)
        self.tokens: list[int] = []
        self._positions: dict[tuple[int, ...], int] = {}   # n-gram -> its first or last start p (p + n < len)
        self.every = every
        self._starts: dict[tuple[int, ...], list[int]] = {}  # with ``every``: n-gram -> all its starts, in order

    def start(self, prompt_ids: Sequence[int]) -> None:
        """Forget everything and index ``prompt_ids``: O(len(prompt_ids) * N), in bulk (the index
        :meth:`extend` would build token by token, 2-3 times faster)."""
        self.tokens = tokens = [int(t) for t in prompt_ids]
        self._positions = positions = {}
        self._starts = {}
        for n in range(self.min_n, self.max_n + 1):
            count = len(tokens) - n   # the n-grams at p < count have a continuation
            if count <= 0:
                break
            grams = zip(*(tokens[k:k + count] for k in range(n)))
            if self.every:
                grams = list(grams)
                for p, gram in enumerate(grams):
                    self._starts.setdefault(gram, []).append(p)
            if self.occurrence == "last":
                positions.update(zip(grams, range(count)))
            else:   # written latest first, so that the earliest position stays
                positions.update(zip(reversed(list(grams)), range(count - 1, -1, -1)))

    def extend(self, new_ids: Iterable[int]) -> None:
        """Append tokens to the context: each new token gives the n-grams just before it a continuation, which
        indexes them (O(N) per token)."""
        tokens, positions, last = self.tokens, self._positions, self.occurrence == "last"
        for token in new_ids:
            end = len(tokens)   # the n-grams ending at end - 1 are followed by the new token
            tokens.append(int(token))
            for n in range(self.min_n, min(self.max_n, end) + 1):
                key = tuple(tokens[end - n:end])
                if last:
                    positions[key] = end - n
                else:
                    positions.setdefault(key, end - n)
                if self.every:
                    self._starts.setdefault(key, []).append(end - n)

    def propose(self, max_tokens: int) -> list[int]:
        """Up to ``max_tokens`` proposed tokens (module docstring); [] without a match or when max_tokens <= 0."""
        tokens, m = self.tokens, len(self.tokens)
        if max_tokens <= 0:
            return []
        for n in range(min(self.max_n, m - 1), self.min_n - 1, -1):
            p = self._positions.get(tuple(tokens[m - n:]))
            if p is not None:
                return self._continuation(p + n, max_tokens)
        return []

    def propose_many(self, max_tokens: int, widths: Sequence[int]) -> list[list[int]]:
        """Distinct non-empty continuations of up to ``max_tokens`` tokens, best first (module docstring), at most
        as many as a tree of ``widths`` per depth has leaves; needs ``every``."""
        if not self.every:
            raise ValueError("propose_many needs an index built with every=True")
        tokens, m = self.tokens, len(self.tokens)
        count = math.prod(widths)
        out: list[list[int]] = []
        seen: set[tuple[int, ...]] = set()
        if max_tokens <= 0:
            return out
        for n in range(min(self.max_n, m - 1), self.min_n - 1, -1):
            key = tuple(tokens[m - n:])
            starts = self._starts.get(key)
            if not starts:
                continue
            for p in (self._positions[key], *reversed(starts[-count:])):
                proposal = self._continuation(p + n, max_tokens)
                if proposal and tuple(proposal) not in seen:
                    seen.add(tuple(proposal))
                    out.append(proposal)
                    if len(out) == count:
                        return out
        return out

    def _continuation(self, start: int, max_tokens: int) -> list[int]:
        """Up to ``max_tokens`` context tokens from ``start``, ending before the first stop token."""
        proposal = self.tokens[start:min(start + max_tokens, len(self.tokens))]
        for i, token in enumerate(proposal):
            if token in self.stop_ids:
                return proposal[:i]
        return proposal


P = TypeVar("P", bound=Proposer)


class Rows(Generic[P]):
    """The per-row proposers of a batch, for a drafter; any :class:`Proposer` (an :class:`NgramIndex`, a
    ``SuffixDecoder``), one per row, made by ``make()``.

        start(prompts)          a fresh proposer per prompt (the batch is these rows)
        add(prompts)            rows that join the batch, after the others
        extend(new_ids)         each row's tokens emitted in the verify step, in row order
        propose(max_tokens)     each row's proposals: max_tokens is one int for every row or one per row
        select(keep)            keep these rows, in this order (a finished row leaves the batch)

    ``rows[i]`` is row i's proposer.
    """

    def __init__(self, make: Callable[[], P]) -> None:
        self.make = make
        self.rows: list[P] = []

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> P:
        return self.rows[i]

    def start(self, prompts: Iterable[Sequence[int]]) -> None:
        self.rows = []
        self.add(prompts)

    def add(self, prompts: Iterable[Sequence[int]]) -> None:
        for prompt in prompts:
            row = self.make()
            row.start(prompt)
            self.rows.append(row)

    def extend(self, new_ids: Sequence[Iterable[int]]) -> None:
        if len(new_ids) != len(self.rows):
            raise ValueError(f"{len(new_ids)} rows of new tokens for a batch of {len(self.rows)}")
        for row, ids in zip(self.rows, new_ids):
            row.extend(ids)

    def propose(self, max_tokens: int | Sequence[int]) -> list[list[int]]:
        limits = [max_tokens] * len(self.rows) if isinstance(max_tokens, int) else list(max_tokens)
        if len(limits) != len(self.rows):
            raise ValueError(f"{len(limits)} limits for a batch of {len(self.rows)}")
        return [row.propose(k) for row, k in zip(self.rows, limits)]

    def select(self, keep: Sequence[int]) -> None:
        self.rows = [self.rows[i] for i in keep]
