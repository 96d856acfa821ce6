"""A draft model replayed on a greedy run's own texts: what `python -m pipeline.benchmarks.replay --draft MODEL`
replays for ``--drafters model`` and ``lookup-model``.

Why it can be replayed. At T = 0 the verify step accepts the longest prefix of the draft's proposal that equals the
target's own next tokens (every lossless rule emits the target's greedy text), so what a step accepts depends on the
draft's greedy tokens only while they are the target's. While they are, the draft has read exactly the target's
text: its greedy token and its confidence (its largest probability) after any prefix of the text are those of one
teacher-forced forward over prompt + output (:func:`trace`), one forward per sample instead of one per draft token.
Past a proposal's first token that is not the target's, nothing more is accepted, and those tokens are not needed.

What a step costs the draft (:attr:`DraftReplay.forwards`: the widths of the draft forwards it ran), as the engine's
drafters run them (pipeline/decoding/drafters/model.py, lookup_model.py):
  model         k proposals cost k forwards: the first reads the tokens the draft has not read yet (the emitted
                token; also the step's last proposal after a step that accepted all of them), each later one reads
                one token; the first step's first proposal comes from the prompt's forward (none)
  lookup-model  prompt lookup proposes m tokens first (the engine's index, pipeline/decoding/drafters/ngram.py);
                where m < the step's length, one forward reads the unread text and the m lookup tokens, then one
                forward per further draft token; where the lookup fills the length the draft does not run and its
                unread text waits for its next forward
With a confidence threshold (``confidence``), a step stops drafting after the first position whose confidence is
below it (that position proposed): the engine's in-step stop on a CPU (pipeline/decoding/draft_policy.py). A
confidence is known while the draft has read the target's text; after a proposal that is not the target's, the
draft's own later confidences are not, and the replay counts the forwards it would run to the step's length
(``after_miss="draft"``: the most the step can cost) or none (``"stop"``: the least).

The draft's numerics. :func:`trace` runs the engine's static forward of the draft (its --draft-quant weights, packed
as the run's) over each whole text; the engine's one-token forwards round some products differently, so a near tie
can go the other way. It is a model: a setting worth using is measured with `specsweep run`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from pipeline.decoding.drafters.ngram import NgramIndex

AFTER_MISS = ("draft", "stop")
UNKNOWN = -1
"""A proposal the replay cannot know (after one that is not the target's token); it is never accepted."""


@dataclass(frozen=True)
class DraftTrace:
    """One sample's teacher-forced draft: after prompt + output[:i], the draft's greedy token ``greedy[i]`` and its
    confidence ``confidence[i]`` (its largest probability), for i = 0 .. len(output) (host lists)."""

    prompt: tuple[int, ...]
    output: tuple[int, ...]
    greedy: tuple[int, ...]
    confidence: tuple[float, ...]


@torch.inference_mode()
def trace(draft, texts: Sequence[tuple[list[int], list[int]]], quant: str = "none", packed: bool = True,
          progress=None) -> list[DraftTrace]:
    """The teacher-forced draft of each (prompt, output) text: one static-cache forward of ``draft`` (a causal LM
    on the CPU, with the engine's ``--draft-quant`` weights) over prompt + output, its logits [L, V] reduced to
    the greedy token and confidence at each position from the prompt's last on. ``progress``: called once per
    sample."""
    from pipeline.decoding.cache import CachedModel, model_kind  # kept local: the replay's steps need no model code

    cached = CachedModel(draft, model_kind(draft), static=True, quant=quant, packed=packed)
    device = next(draft.parameters()).device
    out = []
    for prompt, output in texts:
        ids = torch.tensor([list(prompt) + list(output)], dtype=torch.int64, device=device)
        cached.reset(1, device, capacity=ids.shape[1] + 1)
        logits = cached.forward(ids)[0, len(prompt) - 1:]                                      # [len(output)+1, V]
        top = torch.softmax(logits.float(), dim=-1).max(dim=-1)
        out.append(DraftTrace(tuple(prompt), tuple(output), tuple(logits.argmax(dim=-1).tolist()),
                              tuple(top.values.tolist())))
        if progress is not None:
            progress()
    return out


class DraftReplay:
    """A replayed draft's proposer over one sample's :class:`DraftTrace`, with the Proposer protocol the replay loop
    drives (``start``, ``propose``, ``extend``; pipeline/decoding/drafters/ngram.py) and ``forwards``: the widths
    of the draft forwards its last proposal ran (module docstring).

    lookup        None (``--drafter model``), or (lookup_min, lookup_max, stop ids): ``lookup-model``
    confidence    stop a step's drafting after the first position below it (0: never)
    after_miss    "draft" or "stop": the forwards counted past a proposal that is not the target's (module docstring)
    """

    def __init__(self, row: DraftTrace, lookup: tuple[int, int, Iterable[int]] | None = None,
                 confidence: float = 0.0, after_miss: str = "draft") -> None:
        if after_miss not in AFTER_MISS:
            raise ValueError(f"after_miss must be one of {AFTER_MISS}; got {after_miss!r}")
        self.row, self.confidence, self.after_miss = row, confidence, after_miss
        self.index = None if lookup is None else NgramIndex(lookup[0], lookup[1], "first", tuple(lookup[2]))
        self.forwards: tuple[int, ...] = ()
        self.i = 0              # output tokens emitted so far
        self.unread = 0         # text tokens the draft has not read (the prompt's last is read by its prefill)
        self.read_prompt = False
        self.last: list[int] = []
        self.drafted = 0        # of ``last``, the tokens the draft proposed (after the lookup's)
        self.lookup_len = 0

    def start(self, prompt_ids: Sequence[int]) -> None:
        if tuple(prompt_ids) != self.row.prompt:
            raise ValueError("the trace was taken over another prompt than the one replayed")
        if self.index is not None:
            self.index.start(prompt_ids)

    def _chain(self, at: int, k: int) -> list[int]:
        """Up to ``k`` draft tokens from output position ``at`` (the draft having read the target's text up to
        there), stopping after the first below the confidence threshold. Past a token that is not the target's
        (the output's end included): UNKNOWN, to ``k`` (no threshold, or ``after_miss="draft"``) or none."""
        row, tokens = self.row, []
        for j in range(k):
            token = row.greedy[at + j]          # at + j <= len(output): every token before it was the target's
            tokens.append(token)
            if self.confidence and row.confidence[at + j] < self.confidence:
                break
            if at + j == len(row.output) or token != row.output[at + j]:
                if self.after_miss == "draft" or not self.confidence:
                    tokens += [UNKNOWN] * (k - j - 1)
                break
        return tokens

    def propose(self, max_tokens: int) -> list[int]:
        row, i = self.row, self.i
        found = self.index.propose(max_tokens) if self.index is not None else []
        self.lookup_len = m = len(found)
        rest = max(0, max_tokens - m)
        matched = list(found) == list(row.output[i:i + m])
        if rest and matched:
            drafted = self._chain(i + m, rest)
        elif rest:      # a lookup token was not the target's: the draft's tokens after it are never accepted
            drafted = [UNKNOWN] * (rest if self.after_miss == "draft" or not self.confidence else 1)
        else:
            drafted = []
        # the draft's forwards: the first reads its unread text and the lookup tokens (or none: the prompt's
        # forward gave the first step's first token), each later one the token before
        if drafted:
            first = self.unread + m
            self.forwards = ((first,) if first else ()) + (1,) * (len(drafted) - 1)
        else:
            self.forwards = ()
        self.last, self.drafted = list(found) + drafted, len(drafted)
        return self.last

    def extend(self, new_ids: Iterable[int]) -> None:
        emitted = list(new_ids)
        accepted = len(emitted) - 1
        if self.index is not None:
            self.index.extend(emitted)
        if self.drafted:
            # it read the unread text, the lookup tokens and its draft tokens but the last; of them it keeps what the
            # target accepted, and reads the rest of the emitted text next
            read = self.lookup_len + self.drafted - 1
            self.unread = len(emitted) - min(accepted, read)
        else:
            self.unread += len(emitted)
        self.i += len(emitted)
