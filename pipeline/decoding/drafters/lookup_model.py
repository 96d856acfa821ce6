"""A draft model whose proposal starts from a prompt-lookup match: the lookup's tokens first, the draft's after them.

Each step, for each row with its own draft length g (γ, or its adaptive or end-of-text limit):
  1. prompt lookup proposes m <= g tokens, exactly as ``--drafter prompt-lookup`` does (the same index and rule,
     pipeline/decoding/drafters/ngram.py, with --lookup-min / --lookup-max; m = 0 without a match);
  2. the draft model reads, in one forward, the text it has not read yet and the m lookup tokens (its catch-up),
     then drafts the remaining g - m tokens one forward each, as ``--drafter model`` does. A row whose lookup fills
     its g needs no draft token; a step where every row's does runs no draft forward at all, and the tokens wait
     for the draft's next forward.
A step costs the draft at most max over rows of (g - m) forwards, against γ for the model drafter (both read the
text they have not seen in their first forward).

Probabilities. A lookup token is a function of the text before it, so its draft law is the point mass at it: its
row of the proposal's logits is one-hot (0 at the token, -inf elsewhere), as prompt lookup's deterministic draft is
verified (pipeline/samplers/contract.py). A draft token carries the draft's logits at its position, as the model
drafter's do. The verify rule gets them position by position ([b, γ, V_t]), so exact verification stays exact at any
temperature (it is for any draft law that depends only on the tokens before it; a one-hot position accepts x with
the target's p(x) and on rejection samples p without x). A step in which no row needed the draft is a
deterministic draft (no logits), as prompt lookup's. The rules that refuse a deterministic draft (sigmoid at T > 0)
refuse this drafter.

The draft's cache. The draft reads every token of the text once, in order: per row it keeps the tokens of the text it
has not read yet (``unread``, host ints: the emitted tokens come in the step's one sync, which prompt lookup reads
anyway) and reads them first in its next forward. A step that runs the draft appends to its cache, for b rows:

    [ catch-up: C columns, row i's unread tokens and its m_i lookup tokens right-aligned, holes before them ]
    [ G - 1 columns: the draft tokens it read, G = max_i (g_i - m_i); row i's past its own g_i - m_i are padding ]

After verification row i keeps what it read and the target accepted (its catch-up up to its a_i-th lookup token; or
all of it and its first a_i - m_i draft tokens, as far as it read them); everything after becomes holes
(:meth:`~pipeline.decoding.cache.CachedModel.truncate`), and the accepted tokens it did not read and the emitted
token are its new ``unread``. At B = 1 there are no holes. The draft never reads the last token it proposes (as the
model drafter), so after a fully accepted step that token and the emitted one are read next.

Host work: the lookup (timed as the "lookup" phase, as prompt lookup's) and one host-to-device copy per step of the
lookup tokens and the catch-up; no host sync. With an adaptive draft length (``--draft-schedule heuristic``,
``--draft-confidence``) the lookup is cut to the row's length; a lookup token's confidence is 1, and a row whose
draft confidence falls pads its later positions with the draft's argmax and one-hot logits, as the model drafter
does.

What it records (``statistics()["drafter_counts"]``, summed over a run into ``metrics.drafter_counts``):
row_steps, lookup_tokens and draft_tokens (proposed by each, within the rows' lengths), accepted_lookup and
accepted_draft (accepted of each), lookup_only_steps (row-steps whose lookup filled their length), steps_without_draft
(verify steps in which the draft did not run) and lookup_histogram (row-steps whose lookup proposed k = 0..γ tokens);
``draft_forwards`` counts the catch-up and draft forwards, as for the model drafter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.decoding.draft_policy import row_limits
from pipeline.decoding.drafters.base import DraftAsk, Drafter, DraftPrompt, DraftSetup, Proposal, StepOutcome
from pipeline.decoding.drafters.model import ModelDrafter
from pipeline.decoding.drafters.ngram import NgramIndex
from pipeline.errors import SpecsweepError
from pipeline.samplers.contract import draft_sample

COUNTS = ("row_steps", "lookup_tokens", "draft_tokens", "accepted_lookup", "accepted_draft", "lookup_only_steps",
          "steps_without_draft")
"""The integer counts in ``drafter_counts`` (and ``lookup_histogram``, a list): see the module docstring."""


@dataclass
class StepLayout:
    """What a step's proposal put where, for its commit (host ints).

    start     the draft cache's length before the step
    width     C, the catch-up's columns (0: the draft read nothing before drafting, or did not run)
    rounds    G, the draft tokens each row drafted (0: the draft did not run)
    lookup    per row, m_i: its lookup tokens
    wanted    per row, g_i: its draft length (lookup and draft tokens)
    """

    start: int
    width: int
    rounds: int
    lookup: list[int]
    wanted: list[int]

    def read(self, i: int) -> int:
        """Row i's proposed tokens the draft has read: its lookup tokens and the draft tokens before the last round."""
        return self.lookup[i] + min(self.rounds - 1, self.wanted[i] - self.lookup[i]) if self.rounds else 0

    def cut(self, i: int, kept: int) -> int:
        """The cache position before which row i keeps its entries, keeping ``kept`` proposed tokens."""
        m = self.lookup[i]
        return self.start + self.width - m + kept if kept <= m else self.start + self.width + kept - m


class LookupModelDrafter(Drafter):
    """Prompt lookup, then a draft model (see the module docstring). ``draft``: the model drafter that runs the draft
    (a :class:`ModelDrafter`, or a :class:`~pipeline.decoding.drafters.vocab_map.VocabMapDrafter` for a reduced head):
    its prefill, cache, head and sampling temperature are used; its own ``propose`` and ``commit`` are not."""

    reads_emitted = True

    def __init__(self, draft: ModelDrafter, min_n: int, max_n: int, stop_ids=()) -> None:
        super().__init__()
        if not 1 <= min_n <= max_n:
            raise SpecsweepError(f"prompt lookup needs 1 <= --lookup-min <= --lookup-max; got {min_n}, {max_n}")
        self.draft = draft
        self.min_n, self.max_n, self.stop_ids = min_n, max_n, tuple(stop_ids)
        self.settings = {"drafter": "lookup-model", "lookup_min": min_n, "lookup_max": max_n,
                         **{k: v for k, v in draft.settings.items() if k != "drafter"}}
        self.rows: list[NgramIndex] = []
        self.unread: list[list[int]] = []           # per row, the text's tokens the draft has not read yet
        self.layout: StepLayout | None = None
        self.counts: dict = {}
        self.timer = None

    def bind(self, setup: DraftSetup) -> None:
        super().bind(setup)
        self.draft.bind(setup)
        self.model = self.draft.model

    def start(self, prompt: DraftPrompt) -> None:
        """The draft reads the prompts (its prefill, whose last logits give a row's first draft token when its
        lookup finds nothing in the first step); a lookup index per row over its real prompt tokens (one host copy
        of the prompts per generate call)."""
        self.draft.start(prompt)
        ids, real = prompt.input_ids.tolist(), prompt.attention_mask.tolist()
        self.timer = prompt.timer
        with prompt.timer.phase("lookup"):
            self.rows = []
            for row, keep in zip(ids, real):
                index = NgramIndex(self.min_n, self.max_n, "first", self.stop_ids)
                index.start([t for t, m in zip(row, keep) if m])
                self.rows.append(index)
        self.unread = [[] for _ in self.rows]
        self.forwards = 0
        self.counts = {**dict.fromkeys(COUNTS, 0), "lookup_histogram": [0] * (self.setup.gamma + 1)}

    def propose(self, ask: DraftAsk) -> Proposal:
        """Row i's lookup tokens, then its draft tokens, g_i in all (``ask.wants``, else ask.gamma): tokens int64
        [b, γ] and logits [b, γ, V_t] (one-hot at the lookup positions), or no logits where no row needed the draft.
        No host sync."""
        gamma = ask.gamma
        wants = ask.wants or [gamma] * len(self.rows)
        with self.timer.phase("lookup"):
            found = [row.propose(g) for row, g in zip(self.rows, wants)]
        m = [len(f) for f in found]
        rounds = max(g - k for g, k in zip(wants, m))
        chunk = [u + f for u, f in zip(self.unread, found)] if rounds else [[] for _ in found]
        width = max(map(len, chunk))
        lookup, ids, valid, m_dev = self._to_device(found, chunk, gamma, ask.u.device)
        self.layout = StepLayout(self.model.length, width, rounds, m, list(wants))
        if not rounds:                      # every row's lookup filled its length: the draft does not run
            self._count_proposal(m, wants, rounds)
            confident = m_dev if ask.confidence is not None else None
            return Proposal(lookup, None, ask.limits, ask.wants if ask.limits is not None else None, confident)
        logits = self._first_logits(ids, valid, len(set(map(len, chunk))) > 1)     # ragged: shorter rows have holes
        tokens, draft_logits, confident = self._draft(logits, rounds, m_dev, ask)
        limits, wants_host, ends = ask.limits, ask.wants if ask.limits is not None else None, wants
        if ask.in_step and ask.confidence:  # each row ends where its draft stopped (a CPU read), the step at the last
            self.layout.rounds = tokens.shape[1]
            ends = (m_dev + confident).tolist()
            gamma = max(ends)
            limits = row_limits(ends, gamma, ask.u.device)
            wants_host = None if limits is None else ends
            lookup = lookup[:, :gamma]
        self._count_proposal(m, ends, self.layout.rounds)
        proposal_tokens, proposal_logits = self._assemble(lookup, m_dev, tokens, draft_logits, gamma)
        return Proposal(proposal_tokens, proposal_logits, limits, wants_host,
                        m_dev + confident if ask.confidence is not None else None)

    def _to_device(self, found: list[list[int]], chunk: list[list[int]], gamma: int, device: torch.device):
        """One host-to-device copy of the step's host ints: (lookup tokens int64 [b, γ] left-aligned, the catch-up's
        ids int64 [b, C] right-aligned with the pad id before them, its real-token flags bool [b, C], m int64 [b])."""
        C = max(map(len, chunk))
        host = torch.zeros((len(found), gamma + 2 * C + 1), dtype=torch.int64, pin_memory=device.type == "cuda")
        host[:, gamma: gamma + C] = self.setup.pad
        for i, (f, c) in enumerate(zip(found, chunk)):
            host[i, : len(f)] = torch.tensor(f, dtype=torch.int64)
            if c:
                host[i, gamma + C - len(c): gamma + C] = torch.tensor(c, dtype=torch.int64)
                host[i, gamma + 2 * C - len(c): gamma + 2 * C] = 1
            host[i, -1] = len(f)
        packed = host.to(device, non_blocking=True)
        return (packed[:, :gamma], packed[:, gamma: gamma + C], packed[:, gamma + C: gamma + 2 * C].bool(),
                packed[:, -1])

    def _first_logits(self, ids: torch.Tensor, valid: torch.Tensor, holes: bool) -> torch.Tensor:
        """The draft's logits [b, V_d] for each row's first draft token: the catch-up forward's last position (every
        row's last real catch-up token), or the prompt's logits where a row read nothing yet (the first step)."""
        carry, self.draft.carry = self.draft.carry, None
        if ids.shape[1] == 0:
            return carry
        self.forwards += 1
        logits = self.model.forward(self.draft.readable(ids), valid, last=1, holes=holes)[:, 0]
        return logits if carry is None else torch.where(valid[:, -1:], logits, carry)

    def _draft(self, logits: torch.Tensor, rounds: int, m: torch.Tensor, ask: DraftAsk):
        """``rounds`` draft tokens per row from its first logits [b, V_d], row i's j-th at proposal position m_i + j
        with that position's uniform: (target ids int64 [b, G], logits [b, G, V_d], and int64 [b] the draft tokens
        each row proposed for itself before its confidence fell, with ``ask.confidence``; else None)."""
        d, u = self.draft, ask.u
        confident = torch.zeros_like(m) if ask.confidence is not None else None
        if confident is not None:
            need = (ask.limits if ask.limits is not None else torch.full_like(m, ask.gamma)) - m      # int64 [b]
            stopped = torch.zeros_like(m, dtype=torch.bool)
        tokens, kept = [], []
        for j in range(rounds):
            if j:
                logits = self.model.forward(d.target_ids(tokens[-1])[:, None], last=1)[:, 0]
                self.forwards += 1
            if d.mask_logits is not None:
                logits = d.mask_logits(logits, first_position=False)
                if ask.first_step and j == 0:   # begin-suppressed ids: only where the draft's token is the first
                    first = d.mask_logits(logits.clone(), first_position=True)
                    logits = torch.where((m == 0)[:, None], first, logits)
            at = u.gather(1, (m + j).clamp_max(ask.gamma - 1)[:, None])[:, 0]
            if confident is None:
                tokens.append(draft_sample(logits, d.temperature, at))
                kept.append(logits)
                continue
            own = ~stopped & (need > j)
            token, probs = d.sample_with_probs(logits, at)
            greedy = logits.argmax(dim=-1)
            one_hot = torch.full_like(logits, float("-inf")).scatter_(-1, greedy[:, None], 0.0)
            tokens.append(torch.where(own, token, greedy))
            kept.append(torch.where(own[:, None], logits, one_hot))
            confident += own.long()
            stopped = ~own | (probs.amax(dim=-1) < ask.confidence)
            if ask.in_step and j + 1 < rounds and bool(stopped.all()):   # a CPU read, no sync (DraftAsk.in_step)
                break
        return d.target_ids(torch.stack(tokens, dim=1)), torch.stack(kept, dim=1), confident

    def _assemble(self, lookup: torch.Tensor, m: torch.Tensor, tokens: torch.Tensor, logits: torch.Tensor,
                  gamma: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row i's proposal: lookup [i, :m_i], then its draft tokens (target ids int64 [b, G] with logits [b, G, V_d]):
        tokens int64 [b, γ] and logits [b, γ, V_t], one-hot at the lookup positions."""
        wide = self.draft.target_logits(logits)
        if wide.shape[-1] < self.setup.target_vocab:      # a draft head smaller than the target's: -inf past it
            wide = torch.cat([wide, wide.new_full((*wide.shape[:-1], self.setup.target_vocab - wide.shape[-1]),
                                                  float("-inf"))], dim=-1)
        position = torch.arange(gamma, device=m.device)
        from_lookup = position < m[:, None]                                                   # bool [b, γ]
        at = (position - m[:, None]).clamp(0, tokens.shape[1] - 1)                          # int64 [b, γ]
        out_tokens = torch.where(from_lookup, lookup, tokens.gather(1, at))
        out = wide.gather(1, at[..., None].expand(-1, -1, wide.shape[-1]))                  # [b, γ, V_t]
        kept = out.gather(2, out_tokens[..., None])
        out.masked_fill_(from_lookup[..., None], float("-inf"))
        out.scatter_(2, out_tokens[..., None], torch.where(from_lookup[..., None], torch.zeros_like(kept), kept))
        return out_tokens, out

    def commit(self, outcome: StepOutcome) -> None:
        """Each row's lookup index reads the emitted tokens; the draft's cache keeps, per row, what it read and the
        target accepted (module docstring), and the rest of the emitted text waits in ``unread``."""
        layout, accepted, emitted = self.layout, outcome.accepted_host, outcome.emitted
        with self.timer.phase("lookup"):
            for row, new in zip(self.rows, emitted):
                row.extend(new)
        for i, a in enumerate(accepted):
            self.counts["accepted_lookup"] += min(a, layout.lookup[i])
            self.counts["accepted_draft"] += max(0, a - layout.lookup[i])
        if not layout.rounds:               # the draft did not run: all of it waits for its next forward
            self.draft.carry = None
            self.unread = [u + e for u, e in zip(self.unread, emitted)]
            return
        kept = [min(a, layout.read(i)) for i, a in enumerate(accepted)]
        self.model.truncate([layout.cut(i, k) for i, k in enumerate(kept)])
        self.unread = [e[k:] for e, k in zip(emitted, kept)]

    def select(self, rows: torch.Tensor, keep: list[int]) -> None:
        self.draft.select(rows, keep)
        self.rows = [self.rows[i] for i in keep]
        self.unread = [self.unread[i] for i in keep]

    def _count_proposal(self, m: list[int], wants: list[int], rounds: int) -> None:
        c = self.counts
        c["row_steps"] += len(m)
        c["lookup_tokens"] += sum(m)
        c["draft_tokens"] += sum(wants) - sum(m)
        c["lookup_only_steps"] += sum(1 for k, g in zip(m, wants) if k == g > 0)
        c["steps_without_draft"] += int(rounds == 0)
        for k in m:
            c["lookup_histogram"][k] += 1

    def statistics(self) -> dict:
        return {"draft_forwards": self.forwards, "drafter_counts": {k: (list(v) if isinstance(v, list) else v)
                                                                     for k, v in self.counts.items()}}
