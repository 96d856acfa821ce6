"""The draft model's side of the loop: a draft LM with the target's tokenizer, its KV cache and its proposals."""

from __future__ import annotations

import torch

from pipeline.decoding.cache import CachedModel
from pipeline.samplers.contract import draft_sample, sample_from_weights


class Drafter:
    """The draft model's side of the loop (the shape of transformers' CandidateGenerator): its KV cache, the
    tokens it has not read yet, and its proposals.

        start(prompt)                       read the prompt; its last logits give the first proposal
        propose(γ, u)                       γ tokens int64 [b, γ] and their logits [b, γ, V_d] (with an adaptive
                                            draft length, rows past their own length pad with one-hot argmax)
        commit(γ, accepted, ..., next)      after verification: back to the accepted prefix, queue what follows
        skip(next)                          a step that drafted nothing (the last one): queue the emitted token
        select(rows)                        keep only these rows

    The draft never sees x_γ when it proposes it, and it reads the emitted token only at the next proposal, so
    after a step it has a short backlog (x_γ where every draft was accepted, then the emitted token), read in the
    next step's first forward. Target ids it cannot embed reach it as the pad id.
    """

    def __init__(self, model: CachedModel, temperature: float, mask_logits, pad: int, vocab_in: int) -> None:
        self.model = model
        self.temperature = temperature
        self.mask_logits = mask_logits        # (logits, first_position) -> logits, or None
        self.pad = pad
        self.vocab_in = vocab_in
        self.forwards = 0
        self.carry: torch.Tensor | None = None   # logits [b, V_d] of the next proposal, when already computed
        self.confident: torch.Tensor | None = None   # int64 [b]: positions each row proposed for itself (adaptive)
        self.backlog = self.backlog_valid = None
        self.backlog_holes = False

    def _readable(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.where(ids < self.vocab_in, ids, self.pad)

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, padded: bool,
              encoder_hidden: torch.Tensor | None, capacity: int = 0) -> None:
        B, dev = input_ids.shape[0], input_ids.device
        self.model.reset(B, dev, encoder_hidden, capacity)
        self.carry = self.model.forward(input_ids, attention_mask, last=1, holes=padded)[:, 0]
        self.backlog = torch.empty(B, 0, dtype=torch.int64, device=dev)
        self.backlog_valid = torch.ones_like(self.backlog, dtype=torch.bool)

    def propose(self, gamma: int, u: torch.Tensor, first_step: bool, limits: torch.Tensor | None = None,
                confidence: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """γ proposals sampled with uniforms u float32 [b, γ] (argmax at temperature 0).

        Adaptive draft length (pipeline/decoding/draft_policy.py; ``confidence`` not None): row b proposes for itself at
        positions i < limits[b] (int64 [b]; None: all γ) until the first position whose draft confidence (the largest
        probability of its distribution) is below ``confidence`` (0: never), that position included; at its other
        positions it pads with the draft's argmax and one-hot logits (a deterministic draft the verify rule treats
        exactly; past limits[b] the verify step never reads it, since the engine hands it ``limits`` as the rows'
        lengths). ``self.confident`` then holds int64 [b], the positions each row proposed for itself. No host
        sync."""
        if self.carry is not None:
            logits, self.carry = self.carry, None
        else:
            logits = self.model.forward(self.backlog, self.backlog_valid, 1, self.backlog_holes)[:, 0]
            self.forwards += 1
        proposals, proposal_logits = [], []
        stopped = confident = None
        if confidence is not None:
            stopped = torch.zeros(u.shape[0], dtype=torch.bool, device=u.device)
            confident = torch.zeros(u.shape[0], dtype=torch.int64, device=u.device)
        for i in range(gamma):
            if i > 0:
                logits = self.model.forward(proposals[-1][:, None], last=1)[:, 0]
                self.forwards += 1
            if self.mask_logits is not None:
                logits = self.mask_logits(logits, first_position=False)
                if first_step and i == 0:
                    self.mask_logits(logits, first_position=True)
            if stopped is None:
                proposals.append(draft_sample(logits, self.temperature, u[:, i]))
                proposal_logits.append(logits)
                continue
            own = ~stopped if limits is None else ~stopped & (limits > i)                     # bool [b]
            token, probs = self._sample_with_probs(logits, u[:, i])
            greedy = logits.argmax(dim=-1)
            one_hot = torch.full_like(logits, float("-inf")).scatter_(-1, greedy[:, None], 0.0)
            proposals.append(torch.where(own, token, greedy))
            proposal_logits.append(torch.where(own[:, None], logits, one_hot))
            confident += own.long()
            stopped = ~own
            if confidence > 0:
                stopped |= probs.amax(dim=-1) < confidence
        self.confident = confident
        return torch.stack(proposals, dim=1), torch.stack(proposal_logits, dim=1)

    def _sample_with_probs(self, logits: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The proposal of :func:`draft_sample` (the same token for the same uniforms u [b]) and the draft's
        distribution float32 [b, V_d] it was drawn from (softmax of the logits at T = 0, where it proposes the
        argmax)."""
        if self.temperature == 0.0:
            return logits.argmax(dim=-1), torch.softmax(logits, dim=-1, dtype=torch.float32)
        scaled = logits if self.temperature == 1.0 else logits.float() / self.temperature
        probs = torch.softmax(scaled, dim=-1, dtype=torch.float32)
        return sample_from_weights(probs, u), probs

    def commit(self, gamma: int, accepted: torch.Tensor, max_acc: int, min_acc: int, drafted: torch.Tensor,
               next_token: torch.Tensor) -> None:
        """accepted int64 [b] of drafted int64 [b, γ]; next_token int64 [b] the corrected or bonus token."""
        # the draft appended its backlog, then x_1..x_{γ-1}; it never saw x_γ
        self.model.retain(gamma - 1, accepted.clamp_max(gamma - 1), min(max_acc, gamma - 1), min(min_acc, gamma - 1))
        readable = self._readable(next_token)
        self.backlog_holes = min_acc < gamma <= max_acc   # some rows feed [x_γ, y], others [hole, y]
        if max_acc == gamma:
            all_accepted = accepted == gamma
            self.backlog = torch.stack([torch.where(all_accepted, drafted[:, -1], self.pad), readable], 1)
            self.backlog_valid = torch.stack([all_accepted, torch.ones_like(all_accepted)], dim=1)
        else:
            self.backlog, self.backlog_valid = readable[:, None], _ones(readable.shape[0], readable.device)

    def skip(self, next_token: torch.Tensor) -> None:
        self.carry = None
        b = next_token.shape[0]
        self.backlog = torch.cat([self.backlog, self._readable(next_token)[:, None]], dim=1)
        self.backlog_valid = torch.cat([self.backlog_valid, _ones(b, next_token.device)], dim=1)

    def select(self, rows: torch.Tensor) -> None:
        self.model.select(rows)
        self.carry = self.carry[rows] if self.carry is not None else None
        self.backlog, self.backlog_valid = self.backlog[rows], self.backlog_valid[rows]


def _ones(b: int, dev: torch.device) -> torch.Tensor:
    return torch.ones(b, 1, dtype=torch.bool, device=dev)
