"""The speculative decoding loop: a drafter proposes, the target scores, a sampler verifies.

One step, for B rows at once (``SpeculativeEngine.generate``: draft, score, verify, emit, sync, roll back, drop
finished rows):
  1. the drafter proposes up to γ tokens per row                           tokens [b, K], logits [b, K, V] or None
     (None: a deterministic draft, verified as one-hot without building it)
     (pipeline/decoding/drafters/: a draft model, a draft with another tokenizer, ...; the loop never asks which)
  2. the target scores the pending token and the K proposals in one forward  logits [b, K+1, V_t]
     (in the first step it takes the whole prompt before the proposals: no separate target prefill)
  3. the sampler verifies (any sampler from pipeline.samplers)              accepted [b], tokens [b, K+1]
  4. the target's cache rolls back to the accepted prefix, the drafter is told what was accepted and emitted
     (:class:`~pipeline.decoding.drafters.base.StepOutcome`), and the emitted token is fed on.
γ = 0 is plain autoregressive decoding through the same code (no drafter is called).

The target's side is a :class:`~pipeline.decoding.cache.CachedModel` (its KV cache, the per-row mask of real
positions, a static-cache forward where the family has one). Rows accept different numbers of tokens: caches are
cropped to the longest accepted prefix and the rest become masked holes. Rows that finish (EOS or max_new_tokens)
are dropped from every cache, so they stop costing work.

Synchronisation. Each step makes exactly one host sync (:func:`to_host`): after the verify step, the accepted
counts, finished flags and emitted lengths come to the host, because cropping the cache and dropping rows need
host integers; the step's tokens come in the same transfer when a callback or the drafter reads them, and so does
what the drafter asks for (``host_rows``). Token bookkeeping (EOS, length limits, output buffers, statistics) stays
on the device, and the forwards add no sync. A drafter may do host work of its own (a draft with another
tokenizer's string mode builds text on the host, a second sync; prompt lookup searches on the host), timed in a
phase of its own.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field

import torch

from pipeline import rng
from pipeline.decoding.cache import CachedModel, model_kind
from pipeline.decoding.draft_policy import DraftLengths, DraftPolicy, row_limits
from pipeline.decoding.drafters.base import DraftAsk, Drafter, DraftPrompt, DraftSetup, Proposal, StepOutcome
from pipeline.decoding.drafters.model import ModelDrafter
from pipeline.decoding.host_sync import to_host
from pipeline.decoding.logit_mask import LogitMask
from pipeline.decoding.timing import PhaseTimer, peak_memory_mb, reset_peak_memory
from pipeline.errors import SpecsweepError
from pipeline.models import max_positions
from pipeline.origins import BONUS, N_ORIGINS, origin_table
from pipeline.rng import RowGenerators
from pipeline.samplers import FiniteCheck, Sampler
from pipeline.tree_tensors import outcomes


@dataclass
class GenerationResult:
    """Output of one ``generate`` call over B rows.

    tokens            per row, the new token ids (EOS included when reached; nothing past it)
    row_stats         per row: new_tokens, verify_steps, accepted, drafted, wall_time_s
    phase_time_s      seconds in prefill / draft / target / verify (/ bridge: a draft with another tokenizer)
    phase_calls       forward or verify calls per phase
    extra             draft_forwards; drafter_counts (a drafter that counts more, Drafter.statistics);
                      accepted_histogram [γ+1]: full-γ steps (one per row) that accepted k tokens;
                      node_acceptance {"reached", "accepted"}: per depth (1, 2, ...) a list per sibling rank (0:
                      the first child; a chain has rank 0 only) of the nodes the verify steps tried there (parent
                      accepted, earlier siblings rejected) and of those accepted, over every step (None at γ = 0)
    origins           per row, aligned with tokens: each token's origin code (pipeline/origins.py: accepted
                      draft, corrected, bonus, target alone); None where the engine cannot know (``--engine hf``)
    origin_steps      per row, aligned with tokens: the verify step (1, 2, ...) each token came from; None likewise
    """

    tokens: list[list[int]]
    row_stats: list[dict]
    wall_time_s: float
    verify_steps: int
    phase_time_s: dict[str, float]
    phase_calls: dict[str, int]
    peak_memory_mb: float
    extra: dict = field(default_factory=dict)
    origins: list[list[int]] | None = None
    origin_steps: list[list[int]] | None = None


class SpeculativeEngine:
    """Speculative decoding with any drafter and any sampler; γ = 0 is autoregressive decoding.

    target            a transformers causal LM, or an encoder-decoder (Whisper) whose decoder is driven, on ``device``
    draft             a :class:`~pipeline.decoding.drafters.base.Drafter`, or a draft model (wrapped in a
                      :class:`~pipeline.decoding.drafters.model.ModelDrafter`), or None (γ = 0)
    sampler           a pipeline.samplers Sampler (its temperature is the decoding temperature)
    eos_token_ids     ids that end a row (empty: run to max_new_tokens)
    pad_token_id      id fed at cache holes and left padding (never attended to)
    suppress_tokens   ids never emitted (their logits are -inf for draft and target), as Whisper's
                      generation config asks; begin_suppress_tokens: the same for the first new token only
    static_cache      use the static-cache forward for models whose family has one (pipeline/decoding/static/);
                      False: transformers' forward for every model
    draft_quant       the draft model's weights in its static forward: none, int8 or int4
                      (pipeline/decoding/static/quant.py; a target quantised with --target-quant is quantised in
                      place as it loads, and its forward runs the quantised modules as they are)
    packed_weights    static forwards multiply packed copies of their weights where the family, device and dtype
                      allow (pipeline/decoding/static/packed.py): the same products, faster on a CPU (a quantised
                      draft: the dequantised weights of its prefill)
    compile           the static forwards' decoding steps through torch.compile in this mode (under CUDA graphs on a
                      GPU: pipeline/decoding/static/compiled.py), or "off"; packed weights are then not used
    draft_policy      an adaptive draft length (pipeline/decoding/draft_policy.py), or None: a fixed γ
    char_lengths      int64 [V_t]: characters each target token adds; with it the statistics count accepted and
                      drafted characters too, comparable across tokenizers (None: tokens only)

    Encoder-decoder targets (Whisper): ``generate`` takes the encoder inputs (``input_features``); the target's
    encoder runs once per batch; input_ids are the decoder prompt (e.g. <|startoftranscript|><|notimestamps|>).
    """

    def __init__(self, target, draft, sampler: Sampler, *, gamma: int, device: str, eos_token_ids: list[int],
                 pad_token_id: int = 0, suppress_tokens: list[int] = (),
                 begin_suppress_tokens: list[int] = (), static_cache: bool = True,
                 draft_policy: DraftPolicy | None = None, char_lengths: torch.Tensor | None = None,
                 draft_quant: str = "none", packed_weights: bool = True, compile: str = "off") -> None:
        if gamma < 0:
            raise SpecsweepError(f"gamma must be >= 0; got {gamma}")
        if gamma > 0 and draft is None:
            raise SpecsweepError("gamma > 0 needs a drafter (a draft model, prompt lookup, ...)")
        self.target = CachedModel(target, model_kind(target), static_cache, packed=packed_weights, compile=compile)
        self.sampler = sampler
        self.device = torch.device(device)
        self.mask = LogitMask(suppress_tokens, begin_suppress_tokens, self.device)
        # adaptive draft length: γ is where each row starts, self.gamma the most a step drafts
        self.policy = draft_policy.on(self.device) if draft_policy is not None and draft_policy.adaptive \
            and gamma > 0 else None
        self.gamma_start = gamma
        self.gamma = self.policy.ceiling(gamma) if self.policy is not None else gamma
        self._lengths: DraftLengths | None = None
        self.eos = torch.tensor(sorted(set(eos_token_ids)), dtype=torch.int64, device=self.device)
        self.pad = pad_token_id
        # The drafter proposes at the temperature the verify rule assumes (its argmax for greedy verification).
        self.draft_temperature = sampler.draft_temperature
        self.target_vocab = target.get_output_embeddings().weight.shape[0]
        self.drafter: Drafter | None = None
        if gamma > 0:
            self.drafter = draft if isinstance(draft, Drafter) else ModelDrafter(draft)
            self.drafter.bind(DraftSetup(self.device, self.gamma, self.draft_temperature, sampler.temperature,
                                         self.target.kind, self.mask if self.mask.active else None, pad_token_id,
                                         self.policy is not None, static_cache, self.target_vocab, draft_quant,
                                         packed_weights, compile))
        self.mask.prepare(self.target_vocab, *([self.drafter.vocab_size] if self.drafter is not None else []))
        self.char_lengths = char_lengths.to(self.device) if char_lengths is not None else None

    def _encode(self, encoder_inputs: dict, timer: PhaseTimer) -> tuple[dict, torch.Tensor | None]:
        """The encoder inputs on the device in the target's dtype, and the target's encoder output (None for a
        causal target)."""
        if self.target.kind != "seq2seq":
            return {}, None
        dtype = next(self.target.model.parameters()).dtype
        inputs = {k: v.to(self.device, dtype=dtype if v.is_floating_point() else v.dtype)
                  for k, v in encoder_inputs.items()}
        with timer.phase("encode"):
            # .to: a target spread over several GPUs may leave them on another GPU than the draft's
            hidden = self.target.model.get_encoder()(**inputs).last_hidden_state.to(self.device)
        return inputs, hidden

    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                 generator: torch.Generator | None = None, encoder_inputs: dict | None = None,
                 on_step=None, prompt_texts: list[str] | None = None) -> GenerationResult:
        """input_ids, attention_mask: int64 [B, L], left-padded (the last column is a real token).
        encoder_inputs: for an encoder-decoder target, e.g. {"input_features": float [B, n_mels, frames]}.
        generator: a ``torch.Generator`` (None: torch's global one) for every draw of the batch, or a
        :class:`pipeline.rng.RowGenerators` with one generator per row (per example: a row's tokens then do not
        depend on the other rows of its batch); the drafter and the verify step draw from it.

        on_step: None, or called after every verify step (for streaming) as
        ``on_step(rows, tokens, accepted, finished, lengths)``: the original row indices active in the step, the
        tokens each emitted in it (list of int lists), its accepted draft tokens, whether it finished (EOS or
        max_new_tokens), and the draft length it was verified with (the step's γ, or its own where rows draft their
        own: an adaptive draft length, per-row rooms near the end, a drafter's own count; accepted == length means a
        bonus token). It returns the original indices of rows to cancel (or None): they end as finished rows do,
        keeping the tokens emitted so far. The step's tokens come to the host in the step's one sync.

        prompt_texts: each row's prompt as text, for a drafter that reads text (tokenised its own way); None: the
        prompt's tokens decoded with the target's tokenizer."""
        B, L = input_ids.shape
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device).bool()
        # one sync before decoding: is the last column all real tokens, and is there any padding?
        last_real, unpadded = torch.stack([attention_mask[:, -1].all(), attention_mask.all()]).tolist()
        self._check_inputs(L, max_new_tokens, last_real, encoder_inputs)
        timer = PhaseTimer(str(self.device))
        guard = FiniteCheck()
        reset_peak_memory(self.device)
        t_start = time.perf_counter()

        encoder_inputs, h_target = self._encode(encoder_inputs or {}, timer)
        capacity = L + max_new_tokens + self.gamma + 2          # positions a static cache allocates up front
        self.target.reset(B, self.device, h_target, capacity)
        if self.drafter is not None:
            self.drafter.start(DraftPrompt(input_ids, attention_mask, not unpadded, prompt_texts, encoder_inputs,
                                           h_target, capacity, max_new_tokens, timer))
        state = _Decoding.start(input_ids, attention_mask, not unpadded, max_new_tokens + self.gamma + 2,
                                self.gamma)

        while state.rows_host and max_new_tokens > 0:                   # one verify step per trip
            state.steps += 1
            gamma, wants = self._step_lengths(state, max_new_tokens, per_row=isinstance(generator, RowGenerators))
            proposal = self._draft(state, gamma, wants, generator, timer)
            target_logits, scored = self._score(state, proposal, timer)
            if self.drafter is not None:
                self.drafter.observe_target(target_logits, proposal)
            draft_logits = proposal.logits
            if draft_logits is None and proposal.width == 0:   # nothing proposed: an empty draft, for every rule
                draft_logits = target_logits[:, :0]
            with timer.phase("verify"):
                res = self.sampler(proposal.tokens, draft_logits, target_logits, generator=generator,
                                   **proposal.verify_args())
            guard.update(res)
            self._count_nodes(state, proposal, res)
            finished = self._emit(state, res, res.tokens.shape[1] - 1, max_new_tokens,
                                  proposal.bonus(res.accepted, res.path))
            host = self._sync(state, res, finished, proposal, time.perf_counter() - t_start, on_step)
            self._roll_back(state, res, proposal, scored, host)
            self._drop_finished(state, host["finished"])

        guard.check()
        return self._result(state, timer, time.perf_counter() - t_start)

    def _check_inputs(self, L: int, max_new_tokens: int, last_real: bool, encoder_inputs: dict | None) -> None:
        if not last_real:
            raise SpecsweepError("prompts must be left-padded and non-empty (the last column must be real tokens)")
        limit = max_positions(self.target.model.config)
        if limit is not None and L + max_new_tokens + self.gamma + 1 > limit:
            raise SpecsweepError(
                f"prompt ({L} tokens) + max_new_tokens ({max_new_tokens}) + γ + 1 exceeds the target's "
                f"{limit} positions: shorten the prompts (--max-prompt-tokens) or lower --max-new-tokens")
        if self.target.kind == "seq2seq" and encoder_inputs is None:
            raise SpecsweepError("an encoder-decoder target needs encoder inputs (e.g. input_features)")

    # ---- the steps of generate ---------------------------------------------------------------------------------

    def _step_lengths(self, state: _Decoding, max_new_tokens: int,
                      per_row: bool = False) -> tuple[int, list[int] | None]:
        """(γ for this step, each active row's own draft limit as host ints, or None where every row may draft γ).

        γ is the longest any row drafts: the constant γ, or with an adaptive draft length (self.policy) the longest
        any active row wants (pipeline/decoding/draft_policy.py), decided on the host from what the last step's sync
        brought. Near the end, a step never drafts more than a row can still emit (one slot is the corrected token):
        with one generator for the batch, the roomiest row's room cuts the step's γ; with per-row generators
        (``per_row``) each row's own room cuts its own limit, so how much room the other rows have never changes a
        row's step, and so its tokens."""
        rooms = [max_new_tokens - state.len_host[r] for r in state.rows_host]
        if self.policy is None:
            if not per_row:
                return min(self.gamma, max(rooms) - 1), None
            wants = [self.gamma] * len(rooms)
        else:
            if state.steps == 1:
                self._lengths = DraftLengths(self.policy, self.gamma_start, self.gamma)
            gamma = self._lengths.step_gamma(state.rows_host, state.accepted, None if per_row else max(rooms))
            wants = self._lengths.wanted()
            if not per_row:
                return gamma, wants
        wants = [max(0, min(w, room - 1)) for w, room in zip(wants, rooms)]
        return max(wants), wants

    def _draft(self, state: _Decoding, gamma: int, wants: list[int] | None, generator, timer: PhaseTimer) -> Proposal:
        """The drafter's proposals (an empty one when γ = 0). Where rows have their own limits (``wants``, host ints:
        an adaptive draft length, or per-row rooms near the end), the drafter proposes at most that many for each
        row, and its :class:`Proposal` says how many each row proposed; the verify step verifies each row up to its
        own length, as it would alone.

        A :class:`~pipeline.rng.RowGenerators` first follows the active rows (finished rows were dropped after the
        last step), so this step's draws, the drafter's and the verify step's, come from each active row's own
        generator; where rows draft their own lengths each draws only for its own positions
        (RowGenerators.set_step), so its stream does not depend on the other rows' lengths."""
        per_row = isinstance(generator, RowGenerators)
        if per_row:
            generator.follow(state.rows_host)
            if wants is not None and gamma > 0:
                generator.set_step(gamma, wants)
        if gamma <= 0:
            return Proposal(torch.empty(state.batch, 0, dtype=torch.int64, device=self.device), None)
        with timer.phase("draft"):
            u = rng.rand(generator, (state.batch, gamma), self.device)
            limits = None if wants is None else row_limits(wants, gamma, self.device)
            policy = self.policy
            proposal = self.drafter.propose(DraftAsk(gamma, u, state.steps == 1, limits, wants,
                                                     policy.confidence if policy is not None else None,
                                                     policy is not None and policy.in_step))
        if self.policy is not None:
            self._lengths.record(proposal.confident)
        if per_row and (proposal.width, proposal.lengths_host) != (gamma, wants):
            generator.set_step(proposal.width, proposal.lengths_host)   # the verify step draws for what was proposed
        return proposal

    def _score(self, state: _Decoding, proposal: Proposal, timer: PhaseTimer):
        """The target's logits [b, K+1, V_t] for the pending token and the K proposals (a tree's nodes attend along
        their branches, ``proposal.span``), and how many positions the target appended.

        The first step reads the prompt but its last token (timed as prefill; the last column is a real token in
        every row, ``_check_inputs``), and that token is the step's pending one: every step, the first included and
        at any γ, scores its pending token and proposals in a forward of its own width. A forward's rows may round
        with its row count (oneDNN's product over a prompt's rows does), so this keeps the target alone's tokens and
        a speculative loop's computed alike; the static forward on a CPU makes a forward of up to 9 tokens the
        one-token forwards bit for bit (pipeline/decoding/static/base.py's KEY_BLOCK)."""
        drafted, width = proposal.tokens, proposal.width
        if state.prompt is not None:  # first step
            if state.prompt.shape[1] > 1:
                with timer.phase("prefill"):   # its one row of logits is not used (last=0 would compute them all)
                    self.target.forward(state.prompt[:, :-1], state.prompt_valid[:, :-1], last=1,
                                        holes=state.padded)
            state.pending = state.prompt[:, -1]
            state.prompt = state.prompt_valid = None
        target_in = torch.cat([state.pending[:, None], drafted], dim=1) if width else state.pending[:, None]
        with timer.phase("target"):
            logits = self.target.forward(target_in, span=proposal.span)
        if self.mask.active:
            self.mask(logits, first_position=False)
            if state.steps == 1:
                self.mask(logits[:, :1], first_position=True)
        return logits, target_in.shape[1]

    def _emit(self, state: _Decoding, res, gamma: int, max_new_tokens: int,
              bonus: torch.Tensor | None = None) -> torch.Tensor:
        """Write the emitted tokens (up to EOS and the length limit) into the output, on the device. Returns bool
        [b]: rows that finished. ``bonus``: bool [b], rows whose emitted token is a bonus, where that is not
        ``accepted == gamma`` (rows drafted their own lengths or trees: :meth:`Proposal.bonus`)."""
        j = torch.arange(gamma + 1, device=self.device)
        n_emit = res.accepted + 1
        hit_eos = None
        if self.eos.numel():
            is_eos = torch.isin(res.tokens, self.eos) & (j < n_emit[:, None])
            hit_eos = is_eos.any(dim=1)
            n_emit = torch.where(hit_eos, is_eos.long().argmax(dim=1) + 1, n_emit)
        n_emit = torch.minimum(n_emit, max_new_tokens - state.act_len)
        finished = state.act_len + n_emit >= max_new_tokens
        if hit_eos is not None:
            finished |= hit_eos
        write = j < n_emit[:, None]
        width = state.out.shape[1]
        cols = torch.where(write, state.act_len[:, None] + j, width - 1)         # the last column: a dummy
        where = (state.rows[:, None].expand_as(cols), cols)
        state.out.index_put_(where, torch.where(write, res.tokens, -1))
        # each emitted token's origin and step, packed as step * N_ORIGINS + origin (pipeline/origins.py): row k
        # of the table is a step that accepted k drafts (A...A, then C, B, or T at γ = 0); slots not written go to
        # the dummy column
        codes = origin_table(gamma, self.device)[res.accepted]
        if bonus is not None:       # a row that accepted its whole (shorter) draft emitted a bonus token
            codes = torch.where((j == res.accepted[:, None]) & bonus[:, None], BONUS, codes)
        codes = codes + state.steps * N_ORIGINS
        state.origin.index_put_(where, codes)
        state.act_len = state.act_len + n_emit
        return finished

    def _count_nodes(self, state: _Decoding, proposal: Proposal, res) -> None:
        """Add the step's tried and accepted nodes per (depth, sibling rank) to ``state.node_counts`` on the device
        (no host sync; read once in :meth:`_result`). A chain's position j is depth j + 1, rank 0; a row's own
        shorter draft (``proposal.lengths``) or tree (``proposal.real``) counts only its own positions."""
        width = proposal.width
        if state.node_counts is None or width == 0:
            return
        if proposal.tree is not None:
            tested, accepted = outcomes(proposal.tree, res.path, proposal.real)               # [b, N] each
            group = _node_groups(proposal.tree, self.gamma, str(self.device))
        else:
            j = torch.arange(width, device=self.device)
            tested = res.accepted[:, None] >= j                                                  # [b, K]
            if proposal.lengths is not None:
                tested &= j < proposal.lengths[:, None]
            accepted = res.accepted[:, None] > j
            group = j * self.gamma
        state.node_counts.index_add_(1, group, torch.stack([tested.sum(0), (accepted & tested).sum(0)]))

    def _sync(self, state: _Decoding, res, finished: torch.Tensor, proposal: Proposal, now: float,
              on_step=None) -> dict:
        """The one host sync of the step (:func:`to_host`): accepted counts, finished flags and emitted lengths, the
        per-row character counts (with the engine's char_lengths), the step's tokens [K+1, b] when ``on_step`` or
        the drafter reads them, and the drafter's ``host_rows``. Keeps the per-row statistics on the host, calls
        ``on_step`` (the rows it cancels are marked finished) and returns the host record: "accepted", "finished",
        and "emitted" / "drafter" (per-row lists) where they came."""
        width = proposal.width
        parts = {"accepted": res.accepted, "finished": finished.long(), "emitted_len": state.act_len}
        if self.char_lengths is not None:
            parts["accepted_chars"], parts["drafted_chars"] = self._step_chars(res, proposal)
        if on_step is not None or (self.drafter is not None and self.drafter.reads_emitted):
            parts["tokens"] = res.tokens.long().T                                        # [K + 1, b]
        extra = self.drafter.host_rows() if self.drafter is not None else None
        if extra is not None:
            parts["drafter"] = extra.T                                                   # [k, b]
        host = to_host(parts)
        rows = list(state.rows_host)
        # per row, the draft length its verify step used (a tree row: the nodes it proposed)
        own = proposal.lengths_host or proposal.drafted_host or [width] * len(rows)
        if "tokens" in host:
            host["emitted"] = [[col[i] for col in host["tokens"][: host["emitted_len"][i] - state.len_host[r]]]
                               for i, r in enumerate(rows)]
        if "drafter" in host:
            host["drafter"] = [list(x) for x in zip(*host["drafter"])] or [[] for _ in rows]
        if on_step is not None:
            cancel = set(on_step(rows, host["emitted"], host["accepted"], [bool(f) for f in host["finished"]],
                                 own) or ())
            host["finished"] = [1 if r in cancel else f for r, f in zip(rows, host["finished"])]
        for i, r in enumerate(rows):
            state.len_host[r] = host["emitted_len"][i]
            state.accepted[r] += host["accepted"][i]
            state.drafted[r] += own[i]
            state.row_steps[r] += 1
            if "accepted_chars" in host:
                state.accepted_chars[r] += host["accepted_chars"][i]
                state.drafted_chars[r] += host["drafted_chars"][i]
            if host["finished"][i]:
                state.finish_time[r] = now
            if own[i] == self.gamma > 0:     # a full-γ step of this row (the histogram's steps)
                state.accepted_hist[host["accepted"][i]] += 1
        return host

    def _step_chars(self, res, proposal: Proposal) -> tuple[torch.Tensor, torch.Tensor]:
        """int64 [b] each: characters of the accepted proposals (the step's tokens before the emitted one: a tree's
        accepted path) and of all proposals (no sync)."""
        gamma = proposal.width
        if not gamma:
            zero = torch.zeros_like(res.accepted)
            return zero, zero
        top = self.char_lengths.shape[0] - 1
        chars = self.char_lengths[proposal.tokens.clamp(0, top)]                               # [b, K]
        kept = self.char_lengths[res.tokens[:, :-1].clamp(0, top)]                             # [b, K or D]
        j = torch.arange(kept.shape[1], device=self.device)
        took = res.accepted if proposal.lengths is None else torch.minimum(res.accepted, proposal.lengths)
        accepted = (kept * (j < took[:, None])).sum(dim=1)
        proposed = proposal.proposed()
        return accepted, (chars if proposed is None else chars * proposed).sum(dim=1)

    def _roll_back(self, state: _Decoding, res, proposal: Proposal, scored: int, host: dict) -> None:
        """The target's cache back to the accepted prefix, the drafter told what the step decided; the emitted token
        becomes the pending one."""
        accepted_h = host["accepted"]
        max_acc, min_acc = max(accepted_h), min(accepted_h)
        next_token = res.tokens.gather(1, res.accepted[:, None]).squeeze(1)
        fed = scored - proposal.width  # the target keeps the pending token (if it was fed) and the accepted drafts
        self.target.retain(scored, res.accepted + fed, max_acc + fed, min_acc + fed, res.path, proposal.width)
        if self.drafter is not None:
            self.drafter.commit(StepOutcome(proposal, res.accepted, accepted_h, next_token, host.get("emitted"),
                                            host.get("drafter"), res.path))
        state.pending = next_token

    def _drop_finished(self, state: _Decoding, finished_h: list[int]) -> None:
        """Rows that finished leave every cache and every per-row tensor."""
        if not any(finished_h):
            return
        keep = [i for i, f in enumerate(finished_h) if not f]
        state.rows_host = [state.rows_host[i] for i in keep]
        if not state.rows_host:
            return
        keep_t = torch.tensor(keep, dtype=torch.int64, device=self.device)
        self.target.select(keep_t)
        if self.drafter is not None:
            self.drafter.select(keep_t, keep)
        state.rows, state.pending, state.act_len = state.rows[keep_t], state.pending[keep_t], state.act_len[keep_t]

    def _result(self, state: _Decoding, timer: PhaseTimer, wall: float) -> GenerationResult:
        parts = [state.out, state.origin] + ([] if state.node_counts is None else [state.node_counts])
        flat = torch.cat([t.flatten() for t in parts]).tolist()             # one transfer, at the end
        size = state.out.numel()
        width = state.out.shape[1]
        out_h, packed_h = ([flat[k + r * width: k + (r + 1) * width] for r in range(state.out.shape[0])]
                           for k in (0, size))
        node_counts = None if state.node_counts is None else flat[2 * size:]
        phase_time = timer.totals()
        peak = peak_memory_mb(self.device)
        B = len(state.len_host)
        tokens = [out_h[r][: state.len_host[r]] for r in range(B)]
        packed = [packed_h[r][: state.len_host[r]] for r in range(B)]
        row_stats = [{"new_tokens": state.len_host[r], "verify_steps": state.row_steps[r],
                      "accepted": state.accepted[r], "drafted": state.drafted[r],
                      "wall_time_s": state.finish_time[r]} for r in range(B)]
        if self.char_lengths is not None:
            for r, stats in enumerate(row_stats):
                stats.update(accepted_chars=state.accepted_chars[r], drafted_chars=state.drafted_chars[r])
        extra = {"accepted_histogram": state.accepted_hist, "node_acceptance": _node_table(node_counts),
                 **(self.drafter.statistics() if self.drafter is not None else {"draft_forwards": 0})}
        return GenerationResult(tokens=tokens, row_stats=row_stats, wall_time_s=wall, verify_steps=state.steps,
                                phase_time_s=phase_time, phase_calls=dict(timer.counts), peak_memory_mb=peak,
                                extra=extra,
                                origins=[[c % N_ORIGINS for c in row] for row in packed],
                                origin_steps=[[c // N_ORIGINS for c in row] for row in packed])


@functools.lru_cache(maxsize=256)
def _node_groups(tree, gamma: int, device: str) -> torch.Tensor:
    """int64 [N]: each node's slot in ``_Decoding.node_counts``, (depth - 1) · γ + its sibling rank."""
    return torch.tensor([(d - 1) * gamma + k for d, k in zip(tree.depths, tree.ranks)], dtype=torch.int64,
                        device=device)


def _node_table(counts: list[int] | None) -> dict | None:
    """``_Decoding.node_counts`` [2, γ·γ] as host ints (flat) -> {"reached": [[int per rank] per depth],
    "accepted": likewise}, cut to the depths and ranks ever tried; None at γ = 0."""
    if counts is None:
        return None
    gamma = math.isqrt(len(counts) // 2)
    rows = [counts[i: i + gamma] for i in range(0, len(counts), gamma)]
    reached, accepted = rows[:gamma], rows[gamma:]
    depths = max((d + 1 for d in range(gamma) if any(reached[d])), default=0)
    ranks = max((k + 1 for row in reached for k in range(gamma) if row[k]), default=0)
    return {"reached": [row[:ranks] for row in reached[:depths]],
            "accepted": [row[:ranks] for row in accepted[:depths]]}


@dataclass
class _Decoding:
    """The state of one generate call.

    On the device: out int64 [B, width] (emitted tokens per original row, -1 after), origin int64 [B, width] (each
    emitted token's step * N_ORIGINS + origin code, pipeline/origins.py; -1 after), act_len int64 [b] (tokens
    emitted per active row), rows int64 [b] (original index of each active row), pending int64 [b] (the last
    emitted token, not yet in the target), prompt / prompt_valid [B, L] (until the target reads them, in the
    first step). On the host (the step's sync brings them): the active rows and per-row statistics.
    """

    out: torch.Tensor
    origin: torch.Tensor
    act_len: torch.Tensor
    rows: torch.Tensor
    prompt: torch.Tensor | None
    prompt_valid: torch.Tensor | None
    padded: bool
    rows_host: list[int]
    len_host: list[int]
    accepted: list[int]
    drafted: list[int]
    row_steps: list[int]
    finish_time: list[float]
    accepted_chars: list[int]    # characters of the accepted drafts (with the engine's char_lengths)
    drafted_chars: list[int]
    accepted_hist: list[int]     # full-γ steps (one per row) that accepted k = 0..γ tokens
    # int64 [2, γ·γ] on the device (None at γ = 0): nodes tried / accepted at (depth - 1) · γ + sibling rank
    node_counts: torch.Tensor | None
    pending: torch.Tensor | None = None
    steps: int = 0

    @classmethod
    def start(cls, input_ids: torch.Tensor, attention_mask: torch.Tensor, padded: bool, width: int,
              gamma: int) -> _Decoding:
        B, dev = input_ids.shape[0], input_ids.device
        return cls(out=torch.full((B, width), -1, dtype=torch.int64, device=dev),
                   origin=torch.full((B, width), -1, dtype=torch.int64, device=dev),
                   act_len=torch.zeros(B, dtype=torch.int64, device=dev), rows=torch.arange(B, device=dev),
                   prompt=input_ids, prompt_valid=attention_mask, padded=padded, rows_host=list(range(B)),
                   len_host=[0] * B, accepted=[0] * B, drafted=[0] * B, row_steps=[0] * B, finish_time=[0.0] * B,
                   accepted_chars=[0] * B, drafted_chars=[0] * B,
                   accepted_hist=[0] * (gamma + 1),
                   node_counts=torch.zeros(2, gamma * gamma, dtype=torch.int64, device=dev) if gamma else None)

    @property
    def batch(self) -> int:
        return len(self.rows_host)
