"""Drafts whose tokenizer is not the target's: the vocabulary bridge, and the drafter that reads text.

The best small draft for a target often comes from another model family, with another tokenizer. Two ways to use
it (after Timor et al., ICML 2025, "Accelerating LLM Inference with Lossless Speculative Decoding Algorithms for
Heterogeneous Vocabularies", and transformers' Universal Assisted Generation):

  intersection  lossless at any temperature. Tokens whose text is the same in both vocabularies are mapped
                (:class:`VocabBridge`; "fox" of a word-level tokenizer and "Ġfox" of a byte-level BPE both add
                " fox"). The draft samples from its distribution restricted to the intersection (renormalised over
                it), so each proposal is one target token, and the target verifies it with the verify rule against
                its full distribution, the draft's restricted distribution scattered into the target's vocabulary
                [b, γ, V_t]. At a position the acceptance probability, Σ min(p, q), is at most the target's
                probability mass on the intersection, which the run measures and reports.
  string        the draft proposes γ of its own tokens; their text is re-tokenised with the target's tokenizer
                (cut at the first token the target does not know, at most γ target tokens) and verified as a
                deterministic draft (no proposal logits: the verify rule reads it as one-hot). At T = 0 that is
                greedy verification (the output is the target's greedy output, token for token); at T > 0 the exact
                rule accepts a proposed token with the target's probability of it (exact-match acceptance). Both are
                lossless: the exact rule is exact for any proposal drawn independently of its uniforms. It costs a
                second host sync per step: the proposals' text is built on the host.

In both modes the draft reads text, not the target's tokens. After each verify step the row's generated text (the
target's emitted tokens, decoded) is tokenised with the draft's tokenizer; the draft's KV cache is cut back to the
longest prefix it shares with that tokenisation and the rest becomes its backlog, read in the next step's first
forward. So the draft always conditions on the tokenisation it was trained on (a BPE draft fed a word-level target's
tokens one by one would see spellings it never saw). The prompt is tokenised once, from its text; the generated text
after it separately, as a chat template separates turns. The price is host work per row and step (a decode and an
encode of the generated text), which the run's timings include.

``shared`` (the same token -> id map) is the plain engine; :func:`resolve_mode` picks the mode when none is given.
:class:`TextDrafter` drafts for causal LMs; a Whisper draft of a Whisper target (its own encoder, decoder prompt and
suppressed ids) is its subclass in pipeline/decoding/drafters/whisper_text.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pipeline.decoding.cache import CachedModel
from pipeline.decoding.draft_policy import row_limits
from pipeline.decoding.drafters.base import DraftAsk, Drafter, DraftPrompt, DraftSetup, Proposal, StepOutcome
from pipeline.errors import SpecsweepError
from pipeline.models import max_positions
from pipeline.samplers.contract import draft_sample

MODES = ("shared", "intersection", "string")
AUTO = "auto"


def same_vocabulary(target_tok, draft_tok) -> bool:
    """True when both tokenizers map every token string to the same id (embedding sizes may still differ)."""
    return target_tok.get_vocab() == draft_tok.get_vocab()


def resolve_mode(requested: str, same_vocab: bool, verifies_by_argmax: bool) -> str:
    """The draft-tokenizer mode of a run: ``requested`` unless it is ``auto``, which picks ``shared`` when the
    token -> id maps match, else ``string`` when the verify rule reproduces greedy decoding (T = 0 or the greedy
    rule) and ``intersection`` otherwise. A pair with different vocabularies cannot run ``shared``."""
    if requested == AUTO:
        return "shared" if same_vocab else ("string" if verifies_by_argmax else "intersection")
    if requested not in MODES:
        raise SpecsweepError(f"unknown draft tokenizer mode {requested!r}: choose auto, {', '.join(MODES)}")
    if requested == "shared" and not same_vocab:
        raise SpecsweepError("--draft-tokenizer-mode shared needs the draft to use the target's tokenizer (their "
                             "token -> id maps differ): use auto, intersection or string")
    return requested


def _anchor(tokenizer) -> int:
    """A plain word token to decode in front of others, so a token's leading space survives decoding (a
    SentencePiece or word-level decoder drops the first token's)."""
    special = set(tokenizer.all_special_ids)
    for word in ("the", "a", "x", "0"):
        ids = tokenizer.encode(word, add_special_tokens=False)
        if len(ids) == 1 and ids[0] not in special:
            return ids[0]
    return next(i for i in range(len(tokenizer)) if i not in special)


class TokenText:
    """One tokenizer's view of text: what each token adds, and decoding/encoding without special tokens.

    surfaces   dict id -> the text the token adds after a word (" fox"), for every non-special token whose text is
               whole characters (a byte-level token that is part of a UTF-8 character has none)
    special    the tokenizer's special ids (Whisper's <|startoftranscript|>, <|en|>, <|notimestamps|>, EOS, ...)
    unknown    the id the tokenizer gives text it cannot encode, or None: a byte-level BPE (GPT-2, Whisper) encodes
               any text and names EOS as its unknown token, which is no sign of unknown text there
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.anchor = _anchor(tokenizer)
        self._prefix = tokenizer.decode([self.anchor], clean_up_tokenization_spaces=False)
        special = set(tokenizer.all_special_ids)
        self.special = frozenset(special)
        ids = [i for i in range(len(tokenizer)) if i not in special]
        texts = tokenizer.batch_decode([[self.anchor, i] for i in ids], clean_up_tokenization_spaces=False)
        self.surfaces: dict[int, str] = {}
        for i, text in zip(ids, texts):
            if text.startswith(self._prefix):
                s = text[len(self._prefix):]
                if s and "\ufffd" not in s:
                    self.surfaces[i] = s
        unknown = tokenizer.unk_token_id
        self.unknown = None if unknown is not None and unknown == tokenizer.eos_token_id else unknown

    def decode(self, ids: list[int]) -> str:
        """The text ``ids`` add after a word (a leading space kept)."""
        if not ids:
            return ""
        return self.tokenizer.decode([self.anchor, *ids], clean_up_tokenization_spaces=False)[len(self._prefix):]

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids if text else []

    def char_lengths(self, rows: int, device) -> torch.Tensor:
        """int64 [rows]: characters each id adds (0 for special tokens and ids past the tokenizer)."""
        lengths = torch.zeros(rows, dtype=torch.int64)
        for i, s in self.surfaces.items():
            if i < rows:
                lengths[i] = len(s)
        return lengths.to(device)


@dataclass
class VocabBridge:
    """Two vocabularies side by side, for a draft whose tokenizer is not the target's.

    target, draft  :class:`TokenText` of each tokenizer
    d2t            int64 [V_d]  the target id of each draft id in the intersection, -1 elsewhere (V_d, V_t: the
                   models' output rows, which may exceed the tokenizers' lengths)
    draft_in       bool  [V_d]  draft ids in the intersection
    target_in      bool  [V_t]  target ids in the intersection
    target_pad     the id a string-mode row with fewer proposals pads with (never counted as drafted)
    expansion      the most draft tokens one target token's text takes (bounds the draft's context per target token)
    size           tokens in the intersection; target_share: the share of the target's tokens with text in it
                   (both counted on the host when the bridge is built, so reading them never syncs a GPU)
    """

    target: TokenText
    draft: TokenText
    d2t: torch.Tensor
    draft_in: torch.Tensor
    target_in: torch.Tensor
    target_pad: int
    expansion: int
    size: int
    target_share: float

    def summary(self) -> dict:
        return {"intersection_size": self.size, "target_vocab": len(self.target.tokenizer),
                "draft_vocab": len(self.draft.tokenizer), "target_share_in_intersection": self.target_share,
                "draft_tokens_per_target_token_max": self.expansion}


def build_bridge(target_tok, draft_tok, target_rows: int, draft_rows: int, device) -> VocabBridge:
    """Map the tokens whose text is the same in both tokenizers (and EOS to EOS). ``*_rows``: the models' output
    embedding rows. Of several draft tokens with one text, the lowest id is mapped."""
    target, draft = TokenText(target_tok), TokenText(draft_tok)
    by_text: dict[str, int] = {}
    for i in sorted(draft.surfaces):
        by_text.setdefault(draft.surfaces[i], i)
    d2t = torch.full((draft_rows,), -1, dtype=torch.int64)
    pairs = [(by_text[s], t) for t, s in target.surfaces.items() if s in by_text]
    if target_tok.eos_token_id is not None and draft_tok.eos_token_id is not None:
        pairs.append((draft_tok.eos_token_id, target_tok.eos_token_id))
    for d, t in pairs:
        if d < draft_rows and t < target_rows:
            d2t[d] = t
    target_in = torch.zeros(target_rows, dtype=torch.bool)
    target_in[d2t[d2t >= 0]] = True
    pieces = draft_tok([s for s in target.surfaces.values()], add_special_tokens=False).input_ids \
        if target.surfaces else [[]]
    expansion = max(1, max(len(p) for p in pieces))
    pad = target_tok.pad_token_id if target_tok.pad_token_id is not None else (target_tok.eos_token_id or 0)
    with_text = [i for i in target.surfaces if i < target_rows]
    share = int(target_in[with_text].sum()) / max(1, len(target.surfaces)) if with_text else 0.0
    return VocabBridge(target, draft, d2t.to(device), (d2t >= 0).to(device), target_in.to(device), int(pad),
                       expansion, int(target_in.sum()), share)


def _probability_on(logits: torch.Tensor, inside: torch.Tensor, temperature: float) -> torch.Tensor:
    """float32 [...]: the probability logits [..., V] put on ids where inside bool [V] (at T = 0: 1 where the
    argmax is inside, else 0)."""
    if temperature == 0.0:
        return inside[logits.argmax(dim=-1)].float()
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return (probs * inside[: probs.shape[-1]]).sum(dim=-1)


def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class TextDrafter(Drafter):
    """A draft whose tokenizer is not the target's (see the module docstring for the two modes): proposals in target
    ids, and after each step the emitted text re-read with the draft's tokenizer.

    Its :class:`Proposal`: intersection mode, K = γ tokens and the draft's logits scattered into the target's
    vocabulary [b, γ, V_t]; string mode, K = the most target tokens a row's text gave (≤ γ, and ≤ the row's limit),
    rows with fewer padded and their own counts in ``lengths`` (the sampler contract's per-row lengths), and no
    logits (a deterministic draft). It reads the step's emitted tokens (``reads_emitted``) and, in intersection mode,
    brings the draft ids it fed in the step's one sync (:meth:`host_rows`).

    Host mirror, per active row: ``ids`` the draft ids in its cache (real positions, in order), ``pos`` their cache
    positions, ``generated`` the target ids emitted so far, ``prompt`` its draft prompt ids.

    The target's suppressed ids (Whisper's suppress lists, the engine's ``setup.mask_logits``) are about the target's
    vocabulary: the draft's own logits are left as they are (:meth:`own_logits`), and a proposal of an id the target
    suppresses is rejected by the verify step, which reads the target's masked logits (lossless). A Whisper draft
    (pipeline/decoding/drafters/whisper_text.py) masks its own suppressed ids instead.
    """

    reads_emitted = True

    def __init__(self, model, bridge: VocabBridge, mode: str) -> None:
        super().__init__()
        if mode not in ("intersection", "string"):
            raise SpecsweepError(f"a draft with another tokenizer runs in intersection or string mode; got {mode!r}")
        self.lm = model
        self.bridge = bridge
        self.mode = mode
        self.settings = {"drafter": "model", "draft_tokenizer_mode": mode}
        draft_tok = bridge.draft.tokenizer
        self.pad = draft_tok.pad_token_id if draft_tok.pad_token_id is not None else (draft_tok.eos_token_id or 0)
        self.draft_limit = max_positions(model.config)
        self.carry: torch.Tensor | None = None
        self.backlog = self.backlog_valid = None
        self.backlog_holes = False
        self.ids: list[list[int]] = []
        self.pos: list[list[int]] = []
        self.generated: list[list[int]] = []
        self.prompt: list[list[int]] = []
        self._backlog_host: list[list[int]] = []
        self._fed: tuple[int, int] = (0, 0)          # (cache position of the first fed proposal, proposals fed)
        self._fed_host: list[list[int]] | None = None
        self._fed_device: torch.Tensor | None = None
        self._timer = None
        # intersection mass, summed on the device: target positions scored, draft positions proposed
        self.target_mass = self.draft_mass = None
        self.target_positions = self.draft_positions = 0

    def bind(self, setup: DraftSetup) -> None:
        if setup.target_kind != "causal":
            raise SpecsweepError("a draft with another tokenizer for an encoder-decoder target must be a full "
                                 "encoder-decoder (a Whisper draft with its own encoder): drop --draft-decoder-only, "
                                 "or use a draft with the target's tokenizer")
        self.attach(setup, "causal")

    def attach(self, setup: DraftSetup, kind: str) -> None:
        """What :meth:`bind` sets up once the setup is accepted: the draft's cache (``kind``: how the draft is
        driven, pipeline/decoding/cache.py) and the settings it reads. Refuses an adaptive draft length."""
        if setup.adaptive:
            raise SpecsweepError("a draft with another tokenizer drafts a fixed γ: drop --draft-schedule and "
                                 "--draft-confidence, or use a draft with the target's tokenizer")
        super().bind(setup)
        self.model = CachedModel(self.lm, kind, setup.static, setup.quant, setup.packed, setup.compile)
        self.vocab_size = self.bridge.target_in.shape[0]        # proposals arrive in target ids
        self.temperature = setup.draft_temperature

    # ---- start --------------------------------------------------------------------------------------------------

    def prompt_ids(self, texts: list[str], room: int) -> list[list[int]]:
        """Each prompt text tokenised by the draft, cut from its start to leave ``room`` of the draft's positions."""
        out = []
        for text in texts:
            ids = self.bridge.draft.tokenizer(text, add_special_tokens=False).input_ids
            if self.draft_limit is not None:
                keep = self.draft_limit - room
                if keep < 1:
                    raise SpecsweepError(f"the draft's {self.draft_limit} positions leave no room for a prompt after "
                                         f"{room} for the generated text: lower --max-new-tokens or γ")
                ids = ids[-keep:]
            out.append(ids or [self.bridge.draft.anchor])
        return out

    def start(self, prompt: DraftPrompt) -> None:
        """Each row's prompt read from its text (``prompt.texts``, else its target tokens decoded)."""
        texts = prompt.texts
        if texts is None:
            ids, real = prompt.input_ids.tolist(), prompt.attention_mask.tolist()
            texts = [self.bridge.target.tokenizer.decode([t for t, m in zip(row, keep) if m], skip_special_tokens=True)
                     for row, keep in zip(ids, real)]
        if len(texts) != prompt.input_ids.shape[0]:
            raise SpecsweepError(f"{len(texts)} prompt texts for {prompt.input_ids.shape[0]} prompts")
        room = draft_room(self.bridge, prompt.max_new_tokens, self.setup.gamma)
        prompts = self.prompt_ids(texts, room)
        self._timer = prompt.timer
        with prompt.timer.phase("prefill"):
            self._read_prompts(prompts, prompt.input_ids.device, max(len(p) for p in prompts) + room + 2)

    def _read_prompts(self, prompts: list[list[int]], device, capacity: int,
                      encoder_hidden: torch.Tensor | None = None) -> None:
        """prompts: per row, the draft's prompt ids (:meth:`prompt_ids`); encoder_hidden [B, S, D]: the draft's own
        encoder output, for an encoder-decoder draft (else None)."""
        B = len(prompts)
        width = max(len(p) for p in prompts)
        ids = torch.full((B, width), self.pad, dtype=torch.int64)
        valid = torch.zeros((B, width), dtype=torch.bool)
        for b, p in enumerate(prompts):
            ids[b, width - len(p):] = torch.tensor(p)
            valid[b, width - len(p):] = True
        padded = any(len(p) < width for p in prompts)
        self.model.reset(B, device, encoder_hidden, capacity)
        self.carry = self.model.forward(ids.to(device), valid.to(device), last=1, holes=padded)[:, 0]
        self.prompt = [list(p) for p in prompts]
        self.ids = [list(p) for p in prompts]
        self.pos = [list(range(width - len(p), width)) for p in prompts]
        self.generated = [[] for _ in prompts]
        dev = torch.device(device)
        self.target_mass = torch.zeros((), dtype=torch.float32, device=dev)
        self.draft_mass = torch.zeros((), dtype=torch.float32, device=dev)
        self.target_positions = self.draft_positions = self.forwards = 0

    # ---- propose ------------------------------------------------------------------------------------------------

    def _read_backlog(self) -> torch.Tensor:
        start, width = self.model.length, self.backlog.shape[1]
        logits = self.model.forward(self.backlog, self.backlog_valid, 1, self.backlog_holes)[:, 0]
        self.forwards += 1
        for b, queued in enumerate(self._backlog_host):
            self.ids[b].extend(queued)
            self.pos[b].extend(range(start + width - len(queued), start + width))
        return logits

    def propose(self, ask: DraftAsk) -> Proposal:
        """γ draft tokens sampled with the uniforms ask.u float32 [b, γ], returned as target proposals (see the
        class)."""
        gamma, u = ask.gamma, ask.u
        if self.carry is not None:
            logits, self.carry = self.carry, None
        else:
            logits = self._read_backlog()
        drafted, kept_logits = [], []
        self._fed = (self.model.length, max(0, gamma - 1))
        for i in range(gamma):
            if i > 0:
                logits = self.model.forward(drafted[-1][:, None], last=1)[:, 0]
                self.forwards += 1
            logits = self.own_logits(logits, ask.first_step and i == 0)
            if self.mode == "intersection":
                mass = _probability_on(logits, self.bridge.draft_in, self.temperature)        # [b]
                self.draft_mass = self.draft_mass + (mass if ask.limits is None else mass * (ask.limits > i)).sum()
                logits = logits.masked_fill(~self.bridge.draft_in[: logits.shape[-1]], float("-inf"))
            drafted.append(draft_sample(logits, self.temperature, u[:, i]))
            kept_logits.append(logits)
        self.draft_positions += u.shape[0] * gamma if ask.wants is None else sum(ask.wants)
        drafted_d = torch.stack(drafted, dim=1)                                   # int64 [b, γ], draft ids
        self._fed_device = drafted_d[:, : gamma - 1]
        if self.mode == "intersection":
            self._fed_host = None
            return Proposal(self.bridge.d2t[drafted_d], self._scatter(torch.stack(kept_logits, dim=1)), ask.limits,
                            ask.wants if ask.limits is not None else None)
        return self._through_text(drafted_d, gamma, ask.wants)

    def own_logits(self, logits: torch.Tensor, first_position: bool) -> torch.Tensor:
        """The draft's logits [b, V_d] before it samples a proposal (``first_position``: the first token the draft
        proposes after its prompt): as they are here (see the class on suppressed ids)."""
        return logits

    def _scatter(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [b, γ, V_d] (already -inf outside the intersection) -> [b, γ, V_t], -inf where no draft
        token maps."""
        V_t = self.bridge.target_in.shape[0]
        wide = logits.new_full((*logits.shape[:2], V_t + 1), float("-inf"))     # column V_t: dropped
        d2t = self.bridge.d2t[: logits.shape[-1]]
        mapped = torch.where(d2t >= 0, d2t, V_t)                                  # unmapped -> the dropped column
        wide.scatter_(-1, mapped.expand(*logits.shape[:2], -1), logits)
        return wide[..., :V_t]

    def _through_text(self, drafted_d: torch.Tensor, gamma: int, wants: list[int] | None) -> Proposal:
        """String mode: the draft's tokens -> their text -> the target's tokens (the mode's second host sync), each
        row's cut at its limit (``wants``)."""
        host = drafted_d.tolist()
        self._fed_host = [row[: gamma - 1] for row in host]
        proposals = []
        for b, row in enumerate(host):
            ids = self.bridge.target.encode(self.bridge.draft.decode(row))
            if self.bridge.target.unknown is not None and self.bridge.target.unknown in ids:
                ids = ids[: ids.index(self.bridge.target.unknown)]
            proposals.append(ids[: gamma if wants is None else wants[b]])
        own = [len(p) for p in proposals]
        K = max(own)
        out = torch.full((len(host), K), self.bridge.target_pad, dtype=torch.int64)
        for b, p in enumerate(proposals):
            if p:
                out[b, : len(p)] = torch.tensor(p)
        out = out.to(drafted_d.device)
        lengths = row_limits(own, K, drafted_d.device) if K else None
        return Proposal(out, None, lengths, own if lengths is not None else None)

    def observe_target(self, target_logits: torch.Tensor, proposal: Proposal) -> None:
        """Intersection mode: add the target's probability on the intersection at the positions the verify step reads
        (of target_logits [b, K+1, V_t], row b's first lengths[b] + 1; on the device, no sync)."""
        if self.mode != "intersection":
            return
        mass = _probability_on(target_logits, self.bridge.target_in, self.setup.temperature)          # [b, K+1]
        if proposal.lengths is None:
            self.target_positions += mass.numel()
        else:
            mass = mass * (torch.arange(mass.shape[1], device=mass.device) <= proposal.lengths[:, None])
            self.target_positions += sum(proposal.lengths_host) + len(proposal.lengths_host)
        self.target_mass = self.target_mass + mass.sum()

    # ---- after verification -------------------------------------------------------------------------------------

    def host_rows(self) -> torch.Tensor | None:
        """The draft ids fed as proposals this step (int64 [b, γ-1]), for the step's sync (intersection mode)."""
        return self._fed_device if self._fed_host is None else None

    def commit(self, outcome: StepOutcome) -> None:
        """The draft's cache cut back to the canonical tokenisation of each row's text, the rest queued (timed as
        the "bridge" phase: host work)."""
        with self._timer.phase("bridge"):
            self._commit_text(outcome.emitted, outcome.host_rows)

    def _commit_text(self, emitted: list[list[int]], shipped: list[list[int]] | None) -> None:
        """emitted: per active row, the target ids the step emitted; shipped: :meth:`host_rows` on the host."""
        fed = self._fed_host if self._fed_host is not None else shipped
        start, n_fed = self._fed
        cuts, self._backlog_host = [], []
        for b, new in enumerate(emitted):
            if n_fed:
                self.ids[b].extend(fed[b][:n_fed])
                self.pos[b].extend(range(start, start + n_fed))
            self.generated[b].extend(new)
            canonical = self.context_ids(b)
            k = _lcp(self.ids[b], canonical)
            if k == len(canonical):           # always read at least one token: its logits give the next proposal
                k -= 1
            cuts.append(self.pos[b][k] if k < len(self.pos[b]) else self.model.length)
            del self.ids[b][k:], self.pos[b][k:]
            self._backlog_host.append(canonical[k:])
        self._fed, self._fed_host, self._fed_device = (0, 0), None, None
        self.model.truncate(cuts)
        width = max(len(q) for q in self._backlog_host)
        ids = torch.full((len(emitted), width), self.pad, dtype=torch.int64)
        valid = torch.zeros((len(emitted), width), dtype=torch.bool)
        for b, q in enumerate(self._backlog_host):
            ids[b, width - len(q):] = torch.tensor(q, dtype=torch.int64)
            valid[b, width - len(q):] = True
        dev = self.carry.device if self.carry is not None else self.target_mass.device
        self.backlog, self.backlog_valid = ids.to(dev), valid.to(dev)
        self.backlog_holes = any(len(q) < width for q in self._backlog_host)
        self.carry = None

    def context_ids(self, b: int) -> list[int]:
        """Active row b's context as the draft reads it: its draft prompt, then the text generated so far (the target's
        emitted tokens, decoded) tokenised by the draft's tokenizer."""
        return self.prompt[b] + self.bridge.draft.encode(self.bridge.target.decode(self.generated[b]))

    def select(self, rows: torch.Tensor, keep: list[int]) -> None:
        self.model.select(rows)
        self.carry = self.carry[rows] if self.carry is not None else None
        if self.backlog is not None:
            self.backlog, self.backlog_valid = self.backlog[rows], self.backlog_valid[rows]
            width = self.backlog.shape[1]
            self.backlog_holes = any(len(self._backlog_host[i]) < width for i in keep)
        for name in ("ids", "pos", "generated", "prompt", "_backlog_host"):
            values = getattr(self, name)
            if values:
                setattr(self, name, [values[i] for i in keep])

    def statistics(self) -> dict:
        """The draft's forwards and what the run records about the bridge (one host read, at the end):
        :func:`merge_statistics` of one."""
        sums = {}
        if self.mode == "intersection":
            target_mass, draft_mass = torch.stack([self.target_mass, self.draft_mass]).tolist()
            sums = {"target_mass_sum": target_mass, "target_positions": self.target_positions,
                    "draft_mass_sum": draft_mass, "draft_positions": self.draft_positions}
        return {"draft_forwards": self.forwards,
                "cross_tokenizer": merge_statistics([{"mode": self.mode, **self.bridge.summary(), **sums}])}


_SUMS = ("target_mass_sum", "target_positions", "draft_mass_sum", "draft_positions")


def merge_statistics(parts: list[dict]) -> dict:
    """The statistics of several generate calls (batches, ranks) as one: the sums added, and from them, in
    intersection mode, the target's mean probability on the intersection at the positions it scored
    (``target_mass_on_intersection``, an upper bound of the acceptance rate) and the draft's at the positions it
    proposed from (``draft_mass_on_intersection``, before restriction)."""
    out = dict(parts[0])
    if "target_positions" in out:
        for key in _SUMS:
            out[key] = sum(p[key] for p in parts)
        out["target_mass_on_intersection"] = out["target_mass_sum"] / max(1, out["target_positions"])
        out["draft_mass_on_intersection"] = out["draft_mass_sum"] / max(1, out["draft_positions"])
    return out


def draft_room(bridge: VocabBridge, max_new_tokens: int, gamma: int) -> int:
    """Draft positions to keep free after the prompt: the generated text's draft tokens at most, plus a step's
    proposals."""
    return math.ceil(max_new_tokens * bridge.expansion) + gamma + 2
