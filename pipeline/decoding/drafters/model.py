"""A draft model with the target's tokenizer: its KV cache, the tokens it has not read yet, and its proposals."""

from __future__ import annotations

import torch

from pipeline.decoding.cache import CachedModel, model_kind
from pipeline.decoding.draft_policy import row_limits
from pipeline.decoding.drafters.base import DraftAsk, Drafter, DraftPrompt, DraftSetup, Proposal, StepOutcome
from pipeline.samplers.contract import draft_sample, sample_from_weights


class ModelDrafter(Drafter):
    """A draft LM (or a Whisper-style draft: a decoder with its own encoder, or a decoder that reads the target's
    encoder output) proposing γ tokens autoregressively, the shape of transformers' CandidateGenerator.

    The draft never sees x_γ when it proposes it, and it reads the emitted token only at the next proposal, so
    after a step it has a short backlog (x_γ where every draft was accepted, then the emitted token), read in the
    next step's first forward. Target ids it cannot embed (rows of a padded target vocabulary) reach it as the pad
    id: that only changes what it proposes (acceptance), never the output distribution, which the verify step
    guarantees whatever the draft's context was.

    With an adaptive draft length (``ask.confidence`` set), rows past their own length or past the position where
    their confidence fell pad with the draft's argmax and one-hot logits, a deterministic draft the verify rule
    treats exactly (past ``ask.limits`` the verify step never reads it).
    """

    def __init__(self, model) -> None:
        super().__init__()
        self.lm = model
        self.carry: torch.Tensor | None = None   # logits [b, V_d] of the next proposal, when already computed
        self.backlog = self.backlog_valid = None
        self.backlog_holes = False

    def bind(self, setup: DraftSetup) -> None:
        super().bind(setup)
        self.model = CachedModel(self.lm, model_kind(self.lm, setup.target_kind == "seq2seq"), setup.static,
                                 setup.quant, setup.packed, setup.compile)
        self.vocab_size = self.lm.get_output_embeddings().weight.shape[0]
        self.vocab_in = self.lm.get_input_embeddings().num_embeddings
        self.pad = setup.pad
        self.temperature = setup.draft_temperature
        self.mask_logits = setup.mask_logits

    def readable(self, ids: torch.Tensor) -> torch.Tensor:
        """Target ids int64 [...] as the draft reads them: ids past its input embedding become the pad id."""
        return torch.where(ids < self.vocab_in, ids, self.pad)

    def start(self, prompt: DraftPrompt) -> None:
        """Read the prompts; their last logits give the first proposal. A draft with its own encoder (a seq2seq
        draft) encodes the inputs itself; a decoder-only draft of a seq2seq target reads the target's encoding."""
        B, dev = prompt.input_ids.shape[0], prompt.input_ids.device
        hidden = prompt.encoder_hidden
        if self.model.kind == "seq2seq":
            with prompt.timer.phase("encode"):
                hidden = self.lm.get_encoder()(**prompt.encoder_inputs).last_hidden_state
        self.model.reset(B, dev, hidden, prompt.capacity)
        with prompt.timer.phase("prefill"):
            self.carry = self.model.forward(prompt.input_ids, prompt.attention_mask, last=1,
                                            holes=prompt.padded)[:, 0]
        self.backlog = torch.empty(B, 0, dtype=torch.int64, device=dev)
        self.backlog_valid = torch.ones_like(self.backlog, dtype=torch.bool)
        self.forwards = 0

    def propose(self, ask: DraftAsk) -> Proposal:
        """γ proposals sampled with the uniforms ask.u float32 [b, γ] (the argmax at temperature 0), their logits
        [b, γ, V_d]. Adaptive draft length (``ask.confidence`` not None, pipeline/decoding/draft_policy.py): row b
        proposes for itself at positions i < limits[b] until the first position whose draft confidence (the largest
        probability of its distribution) is below ``ask.confidence`` (0: never), that position included; at its other
        positions it pads with the draft's argmax and one-hot logits. ``confident`` is then int64 [b], the positions
        each row proposed for itself. With ``ask.in_step`` (a CPU) the draft stops after the first position where
        every row has stopped, the proposal is that wide, and each row's own length is its confident count (no
        padding past its fall: a row's proposal is then the same alone and in a batch). No host sync."""
        logits = self.first_logits()
        gamma, u, limits = ask.gamma, ask.u, ask.limits
        adaptive = ask.confidence is not None or limits is not None
        proposals, proposal_logits = [], []
        stopped = torch.zeros(u.shape[0], dtype=torch.bool, device=u.device) if adaptive else None
        confident = torch.zeros(u.shape[0], dtype=torch.int64, device=u.device) if adaptive else None
        for i in range(gamma):
            if i > 0:
                logits = self.model.forward(self.target_ids(proposals[-1])[:, None], last=1)[:, 0]
                self.forwards += 1
            if self.mask_logits is not None:
                logits = self.mask_logits(logits, first_position=False)
                if ask.first_step and i == 0:
                    self.mask_logits(logits, first_position=True)
            if not adaptive:
                proposals.append(draft_sample(logits, self.temperature, u[:, i]))
                proposal_logits.append(logits)
                continue
            own = ~stopped if limits is None else ~stopped & (limits > i)                     # bool [b]
            token, probs = self.sample_with_probs(logits, u[:, i])
            greedy = logits.argmax(dim=-1)
            one_hot = torch.full_like(logits, float("-inf")).scatter_(-1, greedy[:, None], 0.0)
            proposals.append(torch.where(own, token, greedy))
            proposal_logits.append(torch.where(own[:, None], logits, one_hot))
            confident += own.long()
            stopped = ~own
            if ask.confidence:
                stopped |= probs.amax(dim=-1) < ask.confidence
            if ask.in_step and i + 1 < gamma and bool(stopped.all()):   # a CPU read, no sync (DraftAsk.in_step)
                break
        lengths, lengths_host = limits, ask.wants if limits is not None else None
        if ask.in_step and ask.confidence:      # each row's draft ends where it stopped: the same alone or batched
            lengths_host = confident.tolist()   # a CPU read, no sync
            lengths = row_limits(lengths_host, len(proposals), confident.device)
            lengths_host = None if lengths is None else lengths_host
        return Proposal(self.target_ids(torch.stack(proposals, dim=1)), self.target_logits(torch.stack(proposal_logits,
                        dim=1)), lengths, lengths_host, confident if ask.confidence is not None else None)

    def target_ids(self, rows: torch.Tensor) -> torch.Tensor:
        """The draft's output rows int64 [...] as target ids (the draft reads target ids and proposes them): the same
        here, where the draft's head is the target's vocabulary (a reduced head maps them, vocab_map.py)."""
        return rows

    def target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The proposals' logits [b, γ, V_d] over the target's vocabulary [b, γ, V]: the same here."""
        return logits

    def first_logits(self) -> torch.Tensor:
        """The draft's logits [b, V_d] for the step's first proposal: carried from the prompt's forward, or from a
        forward over the backlog (the tokens the draft has not read yet)."""
        if self.carry is not None:
            logits, self.carry = self.carry, None
            return logits
        self.forwards += 1
        return self.model.forward(self.backlog, self.backlog_valid, 1, self.backlog_holes)[:, 0]

    def sample_with_probs(self, logits: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The proposal of :func:`draft_sample` (the same token for the same uniforms u [b]) and the draft's
        distribution float32 [b, V_d] it was drawn from (softmax of the logits at T = 0, where it proposes the
        argmax)."""
        if self.temperature == 0.0:
            return logits.argmax(dim=-1), torch.softmax(logits, dim=-1, dtype=torch.float32)
        scaled = logits if self.temperature == 1.0 else logits.float() / self.temperature
        probs = torch.softmax(scaled, dim=-1, dtype=torch.float32)
        return sample_from_weights(probs, u), probs

    def commit(self, outcome: StepOutcome) -> None:
        """Back to the accepted prefix, and queue what follows: x_γ where every draft was accepted, then the emitted
        token (a step that drafted nothing, the last one, queues the emitted token alone)."""
        gamma, readable = outcome.proposal.width, self.readable(outcome.next_token)
        if gamma == 0:
            self.carry = None
            self.backlog = torch.cat([self.backlog, readable[:, None]], dim=1)
            self.backlog_valid = torch.cat([self.backlog_valid, _ones(readable.shape[0], readable.device)], dim=1)
            return
        accepted, max_acc, min_acc = outcome.accepted, max(outcome.accepted_host), min(outcome.accepted_host)
        # the draft appended its backlog, then x_1..x_{γ-1}; it never saw x_γ
        self.model.retain(gamma - 1, accepted.clamp_max(gamma - 1), min(max_acc, gamma - 1), min(min_acc, gamma - 1))
        self.queue(outcome, gamma, outcome.proposal.tokens[:, -1])

    def queue(self, outcome: StepOutcome, depth: int, last: torch.Tensor) -> None:
        """The backlog the next proposal reads first: ``last`` int64 [b] (the deepest proposal, which the draft never
        read) where a row accepted all ``depth`` of its path, then the emitted token."""
        accepted, max_acc, min_acc = outcome.accepted, max(outcome.accepted_host), min(outcome.accepted_host)
        readable = self.readable(outcome.next_token)
        self.backlog_holes = min_acc < depth <= max_acc   # some rows feed [x_γ, y], others [hole, y]
        if max_acc == depth:
            all_accepted = accepted == depth
            self.backlog = torch.stack([torch.where(all_accepted, last, self.pad), readable], 1)
            self.backlog_valid = torch.stack([all_accepted, torch.ones_like(all_accepted)], dim=1)
        else:
            self.backlog, self.backlog_valid = readable[:, None], _ones(readable.shape[0], readable.device)

    def select(self, rows: torch.Tensor, keep: list[int]) -> None:
        self.model.select(rows)
        self.carry = self.carry[rows] if self.carry is not None else None
        self.backlog, self.backlog_valid = self.backlog[rows], self.backlog_valid[rows]


def _ones(b: int, dev: torch.device) -> torch.Tensor:
    return torch.ones(b, 1, dtype=torch.bool, device=dev)
