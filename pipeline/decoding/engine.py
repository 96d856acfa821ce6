"""The speculative decoding loop for a draft/target pair of causal LMs (or a Whisper-style target's decoder).

One step, for B rows at once (``SpeculativeEngine.generate``: draft, score, verify, emit, sync, roll back, drop
finished rows):
  1. the draft proposes γ tokens autoregressively with its KV cache          [B, γ], logits [B, γ, V_d]
     (:class:`Drafter` owns the draft's side: its cache, the tokens it has not read yet, its proposals)
  2. the target scores the pending token and the γ proposals in one forward  logits [B, γ+1, V_t]
     (in the first step it takes the whole prompt before the γ proposals: no separate target prefill)
  3. the sampler verifies (any sampler from pipeline.samplers)              accepted [B], tokens [B, γ+1]
  4. both caches roll back to the accepted prefix; the emitted token is fed on.
γ = 0 is plain autoregressive decoding through the same code (the draft is never called).

A draft with another tokenizer (pipeline/decoding/drafters/cross_tokenizer.py) swaps :class:`Drafter` for
``TextDrafter``, which
proposes in target ids (through the two vocabularies' intersection, or through text: then K ≤ γ target tokens per
step) and re-reads the emitted text with its own tokenizer; the steps are the same.

Cache layout. Both models keep one KV cache whose length is common to all rows, plus a per-row mask of which
cache positions hold real tokens (:class:`CachedModel`): a static cache with the engine's own forward where the
model's family has one (pipeline/decoding/static/: GPT-2), else a transformers ``DynamicCache``. Rows accept
different numbers of tokens: the cache is cropped to the longest accepted prefix and the positions a row rejected
stay in the cache as masked holes, with explicit ``position_ids`` counting only real tokens. At B = 1 there
are never holes. Rows that finish (EOS or max_new_tokens) are dropped from both caches, so they stop costing
target work.

Synchronisation. Each step makes exactly one host sync: after the verify step, a small tensor (accepted
counts, finished flags) comes to the host, because cropping the cache and dropping rows need host integers.
Token bookkeeping (EOS, length limits, output buffers, statistics) stays on the device. The model forwards
add none: with holes the engine hands the model a ready 4-D attention mask (transformers would otherwise
read the 2-D mask back to decide whether it can skip masking: one sync per forward), and GPT-2-style
models' "is there padding without a mask?" warning check (another per-forward read) is switched off while
the engine calls them, since the engine tracks padding itself. A draft with another tokenizer brings the step's
tokens in that sync too (it re-reads the text on the host); in its string mode the proposals' text is built on the
host, a second sync per step.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from pipeline import rng
from pipeline.decoding.cache import CachedModel, model_kind
from pipeline.decoding.draft_policy import DraftLengths, DraftPolicy, row_limits
from pipeline.decoding.drafters.model import Drafter
from pipeline.decoding.timing import PhaseTimer, peak_memory_mb, reset_peak_memory
from pipeline.errors import SpecsweepError
from pipeline.models import max_positions
from pipeline.provenance import BONUS, N_ORIGINS, origin_table
from pipeline.rng import RowGenerators
from pipeline.samplers import FiniteCheck, Sampler


@dataclass
class GenerationResult:
    """Output of one ``generate`` call over B rows.

    tokens            per row, the new token ids (EOS included when reached; nothing past it)
    row_stats         per row: new_tokens, verify_steps, accepted, drafted, wall_time_s
    phase_time_s      seconds in prefill / draft / target / verify (/ bridge: a draft with another tokenizer)
    phase_calls       forward or verify calls per phase
    extra             draft_forwards; accepted_histogram [γ+1]: full-γ steps (one per row) that accepted k tokens
    origins           per row, aligned with tokens: each token's origin code (pipeline/provenance.py: accepted
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
    """Speculative decoding of a draft/target pair with any sampler; γ = 0 is autoregressive decoding.

    target, draft     transformers causal LMs on ``device`` (draft may be None when gamma == 0)
    sampler           a pipeline.samplers Sampler (its temperature is the decoding temperature)
    eos_token_ids     ids that end a row (empty: run to max_new_tokens)
    pad_token_id      id fed at cache holes and left padding (never attended to)
    suppress_tokens   ids never emitted (their logits are -inf for draft and target), as Whisper's
                      generation config asks; begin_suppress_tokens: the same for the first new token only
    static_cache      use the static-cache forward for models whose family has one (pipeline/decoding/static/);
                      False: transformers' forward for every model
    bridge            a pipeline.decoding.drafters.cross_tokenizer.VocabBridge for a draft whose tokenizer is not the
    target's, with
                      ``bridge_mode`` "intersection" or "string" (pipeline/decoding/drafters/cross_tokenizer.py); None:
                      one tokenizer
    char_lengths      int64 [V_t]: characters each target token adds; with it the statistics count accepted and
                      drafted characters too, comparable across tokenizers (None: tokens only)

    Encoder-decoder targets (Whisper): ``generate`` takes the encoder inputs (``input_features``); the target's
    encoder runs once per batch; the draft uses its own encoder (a seq2seq draft) or the target's outputs (a
    decoder-only draft). input_ids are then the decoder prompt (e.g. <|startoftranscript|><|notimestamps|>).
    """

    def __init__(self, target, draft, sampler: Sampler, gamma: int, device: str, eos_token_ids: list[int],
                 pad_token_id: int = 0, suppress_tokens: list[int] = (),
                 begin_suppress_tokens: list[int] = (), static_cache: bool = True,
                 draft_policy: DraftPolicy | None = None, bridge=None, bridge_mode: str = "shared",
                 char_lengths: torch.Tensor | None = None) -> None:
        if gamma < 0:
            raise SpecsweepError(f"gamma must be >= 0; got {gamma}")
        if gamma > 0 and draft is None:
            raise SpecsweepError("gamma > 0 needs a draft model")
        self.target = CachedModel(target, model_kind(target), static_cache)
        seq2seq = self.target.kind == "seq2seq"
        self.draft = CachedModel(draft, model_kind(draft, seq2seq), static_cache) if draft is not None else None
        # Suppressed ids, filtered once per vocabulary size (target and draft rows may differ): boolean-mask
        # indexing inside the step would be a host sync on a GPU.
        vocabs = {target.get_output_embeddings().weight.shape[0]}
        if draft is not None:
            vocabs.add(draft.get_output_embeddings().weight.shape[0])
        self.suppress = {v: _id_tensor(suppress_tokens, v, device) for v in vocabs}
        self.begin_suppress = {v: _id_tensor(begin_suppress_tokens, v, device) for v in vocabs}
        self.masked = any(t is not None for t in (*self.suppress.values(), *self.begin_suppress.values()))
        self.sampler = sampler
        # adaptive draft length (pipeline/decoding/draft_policy.py): γ is where each row starts, self.gamma the most a
        # step
        # drafts
        self.policy = draft_policy if draft_policy is not None and draft_policy.adaptive and gamma > 0 else None
        self.gamma_start = gamma
        self.gamma = self.policy.ceiling(gamma) if self.policy is not None else gamma
        self._lengths: DraftLengths | None = None
        self.device = torch.device(device)
        self.eos = torch.tensor(sorted(set(eos_token_ids)), dtype=torch.int64, device=self.device)
        self.pad = pad_token_id
        # The draft proposes at the temperature the verify rule assumes (its argmax for greedy verification).
        self.draft_temperature = sampler.draft_temperature
        self.v_draft = draft.get_output_embeddings().weight.shape[0] if draft is not None else None
        # The target may emit ids the draft cannot embed (rows of a padded target vocabulary). They reach the
        # draft as the pad id: that only changes what the draft proposes (acceptance), never the output
        # distribution, which the verify step guarantees whatever the draft's context was.
        self.draft_vocab_in = draft.get_input_embeddings().num_embeddings if draft is not None else None
        self.bridge = bridge if bridge_mode != "shared" and gamma > 0 else None
        self.bridge_mode = bridge_mode if self.bridge is not None else "shared"
        if self.bridge is not None:
            if self.target.kind != "causal" or self.masked or self.policy is not None:
                raise SpecsweepError("a draft with another tokenizer works with causal LMs, without suppressed tokens "
                                     "and with a fixed γ: use a draft with the target's tokenizer here")
            self.v_draft = target.get_output_embeddings().weight.shape[0]   # proposals arrive in target ids
        self.char_lengths = char_lengths.to(self.device) if char_lengths is not None else None

    def _mask_logits(self, logits: torch.Tensor, first_position: bool) -> torch.Tensor:
        """logits [..., V]: suppressed ids set to -inf in place; with ``first_position`` only begin_suppress
        (applied on top of a tensor already masked with suppress). No host sync."""
        V = logits.shape[-1]
        ids = self.begin_suppress[V] if first_position else self.suppress[V]
        if ids is not None:
            logits.index_fill_(-1, ids, float("-inf"))
        return logits

    def _encode(self, encoder_inputs: dict, timer: PhaseTimer) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Encoder hidden states for the target and the draft (None for causal models)."""
        if self.target.kind != "seq2seq":
            return None, None
        dtype = next(self.target.model.parameters()).dtype
        inputs = {k: v.to(self.device, dtype=dtype if v.is_floating_point() else v.dtype)
                  for k, v in encoder_inputs.items()}
        with timer.phase("encode"):
            # .to: a target spread over several GPUs may leave them on another GPU than the draft's
            h_target = self.target.model.get_encoder()(**inputs).last_hidden_state.to(self.device)
            h_draft = h_target
            if self.draft is not None and self.draft.kind == "seq2seq" and self.gamma > 0:
                h_draft = self.draft.model.get_encoder()(**inputs).last_hidden_state
        return h_target, h_draft

    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                 generator: torch.Generator | None = None, encoder_inputs: dict | None = None,
                 on_step=None, prompt_texts: list[str] | None = None) -> GenerationResult:
        """input_ids, attention_mask: int64 [B, L], left-padded (the last column is a real token).
        encoder_inputs: for an encoder-decoder target, e.g. {"input_features": float [B, n_mels, frames]}.
        generator: a ``torch.Generator`` (None: torch's global one) for every draw of the batch, or a
        :class:`pipeline.rng.RowGenerators` with one generator per row (per example: a row's tokens then do not
        depend on the other rows of its batch); the draft and the verify step draw from it.

        on_step: None, or called after every verify step (for streaming) as
        ``on_step(rows, tokens, accepted, finished, lengths)``: the original row indices active in the step, the
        tokens each emitted in it (list of int lists), its accepted draft tokens, whether it finished (EOS or
        max_new_tokens), and the draft length it was verified with (the step's γ, or its own where rows draft their
        own: an adaptive draft length, per-row rooms near the end, another tokenizer's text; accepted == length
        means a bonus token). It
        returns the original indices of rows to cancel (or None): they end as finished rows do, keeping the tokens
        emitted so far. The step's tokens come to the host in the step's one sync; without on_step the loop is
        unchanged.

        prompt_texts: each row's prompt as text, which a draft with another tokenizer reads (tokenised its own way);
        None: the prompt's tokens decoded with the target's tokenizer."""
        B, L = input_ids.shape
        dev = self.device
        input_ids, attention_mask = input_ids.to(dev), attention_mask.to(dev).bool()
        # one sync before decoding: is the last column all real tokens, and is there any padding?
        last_real, unpadded = torch.stack([attention_mask[:, -1].all(), attention_mask.all()]).tolist()
        if not last_real:
            raise SpecsweepError("prompts must be left-padded and non-empty (the last column must be real tokens)")
        limit = max_positions(self.target.model.config)
        if limit is not None and L + max_new_tokens + self.gamma + 1 > limit:
            raise SpecsweepError(
                f"prompt ({L} tokens) + max_new_tokens ({max_new_tokens}) + γ + 1 exceeds the target's "
                f"{limit} positions: shorten the prompts (--max-prompt-tokens) or lower --max-new-tokens")
        if self.target.kind == "seq2seq" and encoder_inputs is None:
            raise SpecsweepError("an encoder-decoder target needs encoder inputs (e.g. input_features)")
        timer = PhaseTimer(str(dev))
        guard = FiniteCheck()
        reset_peak_memory(dev)
        t_start = time.perf_counter()

        h_target, h_draft = self._encode(encoder_inputs or {}, timer)
        capacity = L + max_new_tokens + self.gamma + 2          # positions a static cache allocates up front
        self.target.reset(B, dev, h_target, capacity)
        drafter = None
        if self.bridge is not None:
            drafter = self._text_drafter(input_ids, attention_mask, prompt_texts, max_new_tokens, timer)
        elif self.gamma > 0:
            drafter = Drafter(self.draft, self.draft_temperature, self._mask_logits if self.masked else None,
                              self.pad, self.draft_vocab_in)
            with timer.phase("prefill"):
                drafter.start(input_ids, attention_mask, not unpadded, h_draft, capacity)
        state = _Decoding.start(input_ids, attention_mask, not unpadded, max_new_tokens + self.gamma + 2,
                                self.gamma)

        while state.rows_host and max_new_tokens > 0:                   # one verify step per trip
            state.steps += 1
            gamma, wants = self._step_lengths(state, max_new_tokens, per_row=isinstance(generator, RowGenerators))
            drafted, draft_logits, lengths = self._draft(drafter, state, gamma, wants, generator, timer)
            width = drafted.shape[1]         # target tokens proposed: γ, or fewer from another tokenizer's text
            target_logits, scored = self._score(state, drafted, width, timer)
            if draft_logits is None:
                draft_logits = target_logits.new_empty(state.batch, 0, self.v_draft or target_logits.shape[-1])
            if self.bridge is not None:
                drafter.observe_target(target_logits, self.sampler.temperature)
            with timer.phase("verify"):
                res = self.sampler(drafted, draft_logits, target_logits, generator=generator,
                                   **({} if lengths is None else {"lengths": lengths}))
            guard.update(res)
            finished = self._emit(state, res, width, max_new_tokens, lengths)
            accepted_h, finished_h = self._sync(state, res, finished, width, time.perf_counter() - t_start, on_step,
                                                drafter, drafted, lengths)
            self._roll_back(drafter, state, res, drafted, width, scored, accepted_h, timer)
            self._drop_finished(drafter, state, finished_h)

        guard.check()
        return self._result(state, drafter, timer, time.perf_counter() - t_start)

    def _text_drafter(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_texts: list[str] | None,
                      max_new_tokens: int, timer: PhaseTimer):
        """The drafter of a draft with another tokenizer, its prompts read
        (pipeline/decoding/drafters/cross_tokenizer.py)."""
        from pipeline.decoding.drafters.cross_tokenizer import TextDrafter, draft_room

        draft_tok = self.bridge.draft.tokenizer
        pad = draft_tok.pad_token_id if draft_tok.pad_token_id is not None else (draft_tok.eos_token_id or 0)
        drafter = TextDrafter(self.draft, self.bridge, self.bridge_mode, self.draft_temperature, pad,
                              max_positions(self.draft.model.config))
        if prompt_texts is None:
            ids, real = input_ids.tolist(), attention_mask.tolist()
            prompt_texts = [self.bridge.target.tokenizer.decode([t for t, m in zip(row, keep) if m],
                                                                skip_special_tokens=True)
                            for row, keep in zip(ids, real)]
        if len(prompt_texts) != input_ids.shape[0]:
            raise SpecsweepError(f"{len(prompt_texts)} prompt texts for {input_ids.shape[0]} prompts")
        room = draft_room(self.bridge, max_new_tokens, self.gamma)
        prompts = drafter.prompt_ids(prompt_texts, room)
        with timer.phase("prefill"):
            drafter.start(prompts, self.device, max(len(p) for p in prompts) + room + 2)
        return drafter

    # ---- the steps of generate ---------------------------------------------------------------------------------

    def _step_lengths(self, state: _Decoding, max_new_tokens: int,
                      per_row: bool = False) -> tuple[int, list[int] | None]:
        """(γ for this step, each active row's own draft length as host ints, or None where every row drafts γ).

        γ is the longest any row drafts: the constant γ, or with an adaptive draft length (self.policy) the longest
        any active row wants (pipeline/decoding/draft_policy.py), decided on the host from what the last step's sync
        brought.
        Near the end, a step never drafts more than a row can still emit (one slot is the corrected token): with one
        generator for the batch, the roomiest row's room cuts the step's γ; with per-row generators (``per_row``)
        each row's own room cuts its own length, so how much room the other rows have never changes a row's step,
        and so its tokens. (A draft with another tokenizer is not cut here: its rows' lengths come from their text,
        :meth:`_text_lengths`; the tokens past max_new_tokens are not emitted either way.)"""
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
        if self.bridge is not None:
            return max(wants), None
        wants = [max(0, min(w, room - 1)) for w, room in zip(wants, rooms)]
        return max(wants), wants

    def _draft(self, drafter: Drafter | None, state: _Decoding, gamma: int, wants: list[int] | None, generator,
               timer: PhaseTimer):
        """The draft's γ proposals: (int64 [b, γ], logits [b, γ, V_d], lengths); (empty [b, 0], None, None) when
        γ = 0. Where rows draft their own lengths (``wants``, host ints: an adaptive draft length, or per-row rooms
        near the end), ``lengths`` is int64 [b] on the device (None where every row drafts all γ): a row past its
        length, or past the position where its confidence fell, proposes the draft's argmax with one-hot logits. The
        verify step verifies each row up to its own length, as it would alone.

        A :class:`~pipeline.rng.RowGenerators` first follows the active rows (finished rows were dropped after the
        last step), so this step's draws, the draft's and the verify step's, come from each active row's own
        generator; where rows draft their own lengths each draws only for its own positions
        (RowGenerators.set_step), so its stream does not depend on the other rows' lengths."""
        if isinstance(generator, RowGenerators):
            generator.follow(state.rows_host)
            if wants is not None and gamma > 0:
                generator.set_step(gamma, wants)
        if gamma <= 0:
            return torch.empty(state.batch, 0, dtype=torch.int64, device=self.device), None, None
        with timer.phase("draft"):
            u = rng.rand(generator, (state.batch, gamma), self.device)
            limits = None if wants is None else row_limits(wants, gamma, self.device)
            if self.policy is None and limits is None:
                drafted, logits = drafter.propose(gamma, u, first_step=state.steps == 1)
                return drafted, logits, self._text_lengths(drafter, drafted.shape[1], generator)
            out = drafter.propose(gamma, u, first_step=state.steps == 1, limits=limits,
                                  confidence=self.policy.confidence if self.policy is not None else 0.0)
            if self.policy is not None:
                self._lengths.record(drafter.confident)
            return *out, limits

    def _text_lengths(self, drafter, width: int, generator) -> torch.Tensor | None:
        """A draft with another tokenizer in string mode proposes as many target tokens as its text gives, fewer than
        the step's ``width`` for some rows (pipeline/decoding/drafters/cross_tokenizer.py): those rows draft their own
        lengths, int64
        [b] on the device (None where every row proposed ``width``), and with per-row generators each draws only
        its own length's verify uniforms."""
        if not getattr(drafter, "reads_text", False) or width == 0:
            return None
        own = drafter.drafted_host
        if isinstance(generator, RowGenerators) and min(own) < width:
            generator.set_step(width, own)
        return row_limits(own, width, self.device)

    def _score(self, state: _Decoding, drafted: torch.Tensor, gamma: int, timer: PhaseTimer):
        """The target's logits [b, γ+1, V_t] for the pending token and the proposals (in the first step: for the
        prompt and the proposals, timed as prefill), and how many positions the target appended."""
        if state.prompt is not None:  # first step: the prompt and the drafts in one forward
            target_in = torch.cat([state.prompt, drafted], dim=1)
            valid = torch.cat([state.prompt_valid, torch.ones_like(drafted, dtype=torch.bool)], dim=1)
            with timer.phase("prefill"):
                logits = self.target.forward(target_in, valid, last=gamma + 1, holes=state.padded)
            state.prompt = state.prompt_valid = None
        else:
            target_in = torch.cat([state.pending[:, None], drafted], dim=1) if gamma else state.pending[:, None]
            with timer.phase("target"):
                logits = self.target.forward(target_in)
        if self.masked:
            self._mask_logits(logits, first_position=False)
            if state.steps == 1:
                self._mask_logits(logits[:, :1], first_position=True)
        return logits, target_in.shape[1]

    def _emit(self, state: _Decoding, res, gamma: int, max_new_tokens: int,
              lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Write the emitted tokens (up to EOS and the length limit) into the output, on the device. Returns bool
        [b]: rows that finished. ``lengths``: per-row draft lengths (int64 [b]) where the rows drafted their own."""
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
        # each emitted token's origin and step, packed as step * N_ORIGINS + origin (pipeline/provenance.py): row k
        # of the table is a step that accepted k drafts (A...A, then C, B, or T at γ = 0); slots not written go to
        # the dummy column
        codes = origin_table(gamma, self.device)[res.accepted]
        if lengths is not None:     # a row that accepted its whole (shorter) draft emitted a bonus token
            codes = torch.where((j == res.accepted[:, None]) & (res.accepted == lengths)[:, None], BONUS, codes)
        codes = codes + state.steps * N_ORIGINS
        state.origin.index_put_(where, codes)
        state.act_len = state.act_len + n_emit
        return finished

    def _sync(self, state: _Decoding, res, finished: torch.Tensor, gamma: int, now: float, on_step=None,
              drafter=None, drafted: torch.Tensor | None = None, lengths: torch.Tensor | None = None):
        """The one host sync of the step: accepted counts, finished flags and lengths come to the host, where the
        per-row statistics are kept (with the engine's char_lengths, accepted and drafted characters too). The
        step's tokens res.tokens [b, γ+1] come in the same transfer when something needs them: ``on_step`` (see
        generate: the callback sees each row's emitted ones, and the rows it cancels are marked finished), or a
        draft that reads text (pipeline/decoding/drafters/cross_tokenizer.py; with what it fed in the step). Returns
        (accepted,
        finished) as host lists. ``lengths``: each row's own draft length, where the rows drafted their own (an
        adaptive draft length, per-row rooms near the end, another tokenizer's text), which then comes in the same
        transfer."""
        reads_text = getattr(drafter, "reads_text", False)
        parts = [res.accepted, finished.long(), state.act_len]
        counts_chars = self.char_lengths is not None
        if counts_chars:
            parts += self._step_chars(res, drafted, gamma, lengths)
        if lengths is not None:
            parts.append(lengths)
        parts = [torch.stack(parts)]
        if on_step is not None or reads_text:
            parts.append(res.tokens.long().T)                                           # [γ + 1, b]
        shipped = drafter.shipped() if reads_text else None
        if shipped is not None:
            parts.append(shipped.T)
        host = torch.cat(parts).tolist() if len(parts) > 1 else parts[0].tolist()
        acc_h, fin_h, len_h = host[0], host[1], host[2]
        chars_h = host[3:5] if counts_chars else None
        rest = host[5 if counts_chars else 3:]
        own = [gamma] * state.batch         # per row, the draft length its verify step used
        if lengths is not None:
            own, rest = rest[0], rest[1:]
        rows = list(state.rows_host)
        if rest:
            columns = rest[: gamma + 1]
            state.step_emitted = [[col[i] for col in columns[: len_h[i] - state.len_host[r]]]
                                  for i, r in enumerate(rows)]
            state.step_shipped = None if shipped is None else [list(x) for x in zip(*rest[gamma + 1:])] \
                if rest[gamma + 1:] else [[] for _ in rows]
        if on_step is not None:
            cancel = set(on_step(rows, state.step_emitted, acc_h, [bool(f) for f in fin_h], own) or ())
            fin_h = [1 if r in cancel else f for r, f in zip(rows, fin_h)]
        for i, r in enumerate(rows):
            state.len_host[r] = len_h[i]
            state.accepted[r] += acc_h[i]
            state.drafted[r] += own[i]
            state.row_steps[r] += 1
            if chars_h is not None:
                state.accepted_chars[r] += chars_h[0][i]
                state.drafted_chars[r] += chars_h[1][i]
            if fin_h[i]:
                state.finish_time[r] = now
            if own[i] == self.gamma > 0:     # a full-γ step of this row (the histogram's steps)
                state.accepted_hist[acc_h[i]] += 1
        return acc_h, fin_h

    def _step_chars(self, res, drafted: torch.Tensor, gamma: int,
                    lengths: torch.Tensor | None = None) -> list[torch.Tensor]:
        """int64 [b] each: characters of the accepted drafts and of the proposed ones (no sync). ``lengths``: each
        row's own draft length on the device, where the rows drafted their own."""
        if not gamma:
            zero = torch.zeros_like(res.accepted)
            return [zero, zero]
        chars = self.char_lengths[drafted.clamp(0, self.char_lengths.shape[0] - 1)]              # [b, γ]
        j = torch.arange(gamma, device=self.device)
        if lengths is not None:                 # rows that drafted their own lengths
            limit = lengths
        else:                                   # every row proposed γ: a fill on the device, no copy
            limit = torch.full((res.accepted.shape[0],), gamma, dtype=torch.int64, device=self.device)
        accepted = (chars * (j < torch.minimum(res.accepted, limit)[:, None])).sum(dim=1)
        return [accepted, (chars * (j < limit[:, None])).sum(dim=1)]

    def _roll_back(self, drafter: Drafter | None, state: _Decoding, res, drafted: torch.Tensor, gamma: int,
                   scored: int, accepted_h: list[int], timer: PhaseTimer | None = None) -> None:
        """Both caches back to the accepted prefix; the emitted token becomes the pending one. A draft with another
        tokenizer re-reads the emitted text instead, timed as the "bridge" phase (host work)."""
        max_acc, min_acc = max(accepted_h), min(accepted_h)
        next_token = res.tokens.gather(1, res.accepted[:, None]).squeeze(1)
        fed = scored - gamma         # the target keeps the pending token (if it was fed) and the accepted drafts
        self.target.retain(scored, res.accepted + fed, max_acc + fed, min_acc + fed)
        if getattr(drafter, "reads_text", False):
            with timer.phase("bridge") if timer is not None else nullcontext():
                drafter.commit_text(state.step_emitted, state.step_shipped)
        elif drafter is not None:
            if gamma > 0:
                drafter.commit(gamma, res.accepted, max_acc, min_acc, drafted, next_token)
            else:                    # the draft sat this step out (the last step)
                drafter.skip(next_token)
        state.pending = next_token

    def _drop_finished(self, drafter: Drafter | None, state: _Decoding, finished_h: list[int]) -> None:
        """Rows that finished leave both caches and every per-row tensor."""
        if not any(finished_h):
            return
        keep = [i for i, f in enumerate(finished_h) if not f]
        state.rows_host = [state.rows_host[i] for i in keep]
        if not state.rows_host:
            return
        keep_t = torch.tensor(keep, dtype=torch.int64, device=self.device)
        self.target.select(keep_t)
        if drafter is not None:
            if getattr(drafter, "reads_text", False):
                drafter.select(keep_t, keep)
            else:
                drafter.select(keep_t)
        state.rows, state.pending, state.act_len = state.rows[keep_t], state.pending[keep_t], state.act_len[keep_t]

    def _result(self, state: _Decoding, drafter: Drafter | None, timer: PhaseTimer, wall: float) -> GenerationResult:
        out_h, packed_h = torch.stack([state.out, state.origin]).tolist()   # one transfer, at the end
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
        extra = {"draft_forwards": drafter.forwards if drafter is not None else 0,
                 "accepted_histogram": state.accepted_hist}
        if getattr(drafter, "reads_text", False):
            extra["cross_tokenizer"] = drafter.statistics()
        return GenerationResult(tokens=tokens, row_stats=row_stats, wall_time_s=wall, verify_steps=state.steps,
                                phase_time_s=phase_time, phase_calls=dict(timer.counts), peak_memory_mb=peak,
                                extra=extra,
                                origins=[[c % N_ORIGINS for c in row] for row in packed],
                                origin_steps=[[c // N_ORIGINS for c in row] for row in packed])


@dataclass
class _Decoding:
    """The state of one generate call.

    On the device: out int64 [B, width] (emitted tokens per original row, -1 after), origin int64 [B, width] (each
    emitted token's step * N_ORIGINS + origin code, pipeline/provenance.py; -1 after), act_len int64 [b] (tokens
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
    pending: torch.Tensor | None = None
    steps: int = 0
    step_emitted: list[list[int]] | None = None   # the step's emitted tokens per active row, when brought to the host
    step_shipped: list[list[int]] | None = None   # what a text-reading draft fed in the step (cross_tokenizer.py)

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
                   accepted_hist=[0] * (gamma + 1))

    @property
    def batch(self) -> int:
        return len(self.rows_host)


def _id_tensor(ids, vocab: int, device) -> torch.Tensor | None:
    ids = sorted({int(i) for i in ids or () if 0 <= int(i) < vocab})
    return torch.tensor(ids, dtype=torch.int64, device=device) if ids else None
