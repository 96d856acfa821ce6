"""A draft with a reduced output vocabulary: it reads the target's tokens but predicts only K of them.

Most of a small draft's cost can be its LM head (SmolLM2-135M's 49152 x 576 head is as large as eight of its
layers), and most of the head is tokens a task never writes. A draft saved with a **draft vocabulary map**, the
sorted target ids of its K output tokens in its ``config.json`` (``draft_vocab_ids``, written by ``specsweep
distill --draft-vocab K``), is otherwise a plain draft with the target's tokenizer and embedding:

  - its head is cut to those K rows when the drafter is built (:func:`with_head_rows`: a shallow copy of the model
    with its own K-row head; the loaded model is not changed, so a grid's runs may share it), so each draft forward
    computes K logits instead of V_t;
  - it proposes from its law over the K tokens, mapped to target ids (``d2t``), and hands the verify step that law
    scattered into the target's vocabulary [b, γ, V_t], -inf elsewhere: the vocabulary-intersection mode of a draft
    with another tokenizer (pipeline/decoding/drafters/cross_tokenizer.py), with an intersection that is given
    rather than found by text. The verify rule compares it with the target's full law, so decoding stays lossless
    at any temperature; a position's acceptance probability is at most the target's mass on the K tokens.

Any draft with the target's tokenizer gets such a map with ``--draft-vocab K`` (:func:`ranked_vocab`): the K lowest
ids and the special tokens. A byte-level BPE numbers its tokens in the order its merges were learned, most frequent
pair first, so the lowest ids are (roughly) the most frequent tokens of the tokenizer's training text: FR-Spec's
frequency-ranked head (Zhao et al. 2025) without a corpus to count.

It needs no text round trip (the draft reads the target's own token ids, as a shared-tokenizer draft does), no
second sync, and no change to the loop. transformers' ``generate(assistant_model=DIR)`` ignores the map and uses the
full head (still lossless; no cheaper).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools

import torch

from pipeline.decoding.drafters.base import DraftSetup
from pipeline.decoding.drafters.model import ModelDrafter
from pipeline.errors import SpecsweepError

CONFIG_KEY = "draft_vocab_ids"
"""The model config's key that holds the map: the sorted target ids of the draft's K output tokens."""


def draft_vocab(model) -> list[int] | None:
    """The draft vocabulary map a model's config carries (sorted target ids), or None."""
    ids = getattr(getattr(model, "config", None), CONFIG_KEY, None)
    return [int(i) for i in ids] if ids else None


def ranked_vocab(k: int, vocab: int, keep: list[int]) -> list[int]:
    """The vocabulary map of ``--draft-vocab K`` for a head of ``vocab`` rows: ids 0 .. K - 1 (a BPE's most frequent
    tokens) and the ids in ``keep`` (special tokens: end of text, the chat template's), sorted. One-line
    SpecsweepError for K >= ``vocab``."""
    if k >= vocab:
        raise SpecsweepError(f"--draft-vocab {k} is not fewer than the draft's {vocab} tokens: give K < {vocab}, or "
                             "leave it out for the whole vocabulary")
    return sorted(set(range(k)) | {i for i in keep if 0 <= i < vocab})


def head_rows(model, d2t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The K rows d2t int64 [K] of a model's output head: (weight [K, H], bias [K] or None). Differentiable (a
    gather), so training and decoding use the same restricted head."""
    head = model.get_output_embeddings()
    bias = getattr(head, "bias", None)
    return head.weight[d2t], (bias[d2t] if bias is not None else None)


def with_head_rows(model, ids: list[int]):
    """A shallow copy of ``model`` whose output head is the K rows ``ids`` of its own (a new K-row ``nn.Linear``,
    not tied to the input embedding); every other module and parameter is shared with ``model``, which is left as
    it is."""
    weight = model.get_output_embeddings().weight
    d2t = torch.tensor(ids, dtype=torch.long, device=weight.device)
    rows, bias = head_rows(model, d2t)
    head = torch.nn.Linear(weight.shape[1], len(ids), bias=bias is not None, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        head.weight.copy_(rows)
        if bias is not None:
            head.bias.copy_(bias)
    head.requires_grad_(False)
    pruned = copy.copy(model)
    pruned._modules = dict(model._modules)            # own module table: replacing the head leaves model's alone
    pruned.config = copy.copy(model.config)
    pruned.config.vocab_size = len(ids)
    pruned.set_output_embeddings(head)
    return pruned


def widen(logits: torch.Tensor, d2t: torch.Tensor, target_vocab: int) -> torch.Tensor:
    """Logits over the draft's K tokens [..., K] -> over the target's vocabulary [..., V_t], -inf at the ids the draft
    cannot propose."""
    wide = logits.new_full((*logits.shape[:-1], target_vocab), float("-inf"))
    return wide.index_copy_(logits.dim() - 1, d2t, logits)


class VocabMapDrafter(ModelDrafter):
    """A :class:`ModelDrafter` over a draft whose head is cut to the K target ids of its vocabulary map (see the
    module docstring). It samples a row of its K-row head, reads and proposes that row's target id, and hands the
    verify step its logits widened to [b, γ, V_t]."""

    def __init__(self, model, ids: list[int]) -> None:
        if len(ids) < 2 or any(b <= a for a, b in itertools.pairwise(ids)):
            raise SpecsweepError(f"the draft's vocabulary map ({CONFIG_KEY} in its config.json) must list at least 2 "
                                 "target ids in increasing order: re-save the draft with specsweep distill")
        super().__init__(with_head_rows(model, ids))
        self.ids = ids
        self.d2t: torch.Tensor | None = None
        self.settings = {"drafter": "model", "draft_vocab": len(ids)}

    def bind(self, setup: DraftSetup) -> None:
        """As a :class:`ModelDrafter`, with the target's suppressed ids (a Whisper target's) masked in the K-row
        head's rows."""
        if self.ids[-1] >= setup.target_vocab:
            raise SpecsweepError(f"the draft's vocabulary map names target id {self.ids[-1]}, past the target's "
                                 f"{setup.target_vocab} tokens: was it distilled for another target?")
        mask = setup.mask_logits.restricted(self.ids) if setup.mask_logits is not None else None
        super().bind(dataclasses.replace(setup, mask_logits=mask))
        self.d2t = torch.tensor(self.ids, dtype=torch.long, device=setup.device)
        self.vocab_size = setup.target_vocab                  # proposals arrive in target ids

    def target_ids(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows of the K-row head int64 [...] -> their target ids."""
        return self.d2t[rows]

    def target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """[b, γ, K] -> [b, γ, V_t], -inf at the ids the draft cannot propose."""
        return widen(logits, self.d2t, self.setup.target_vocab)
