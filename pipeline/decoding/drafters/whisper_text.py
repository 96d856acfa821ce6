"""A Whisper draft whose tokenizer is not the Whisper target's (whisper-tiny.en drafting for multilingual
whisper-base): its own encoder, its own decoder prompt, its own suppressed tokens, and the target's text re-read.

The bridge between the vocabularies and both modes (intersection, string) are the causal drafter's
(:class:`~pipeline.decoding.drafters.cross_tokenizer.TextDrafter`); what a speech draft adds:

  encoder   the draft encodes the target's encoder inputs (``input_features`` [B, n_mels, frames], the log-mel
            spectrogram of the same audio) with its own encoder, once per generate call (timed as "encode"). Both
            models must compute the same features: the pair's loader (pipeline/stack.py) compares the feature
            extractors and refuses a pair whose extractors differ; here the draft checks its mel bins.
  prompt    the draft's decoder prompt is its own prefix (``prefix``: its <|startoftranscript|>, then its language and
            task tokens if it is multilingual, and <|notimestamps|>; the task builds it, pipeline/tasks/librispeech.py
            ``decoder_prompt``), never the target's ids. After each verify step the draft reads its prefix, then the
            text the target emitted (decoded with the target's tokenizer, without its special tokens) tokenised by
            its own tokenizer, as the causal drafter reads a prompt's text and what followed it.
  masks     the target's suppressed ids are masked in the target's logits by the engine, as always; this draft masks
            its own: its generation config's ``suppress_tokens`` at every position and ``begin_suppress_tokens`` at
            its first proposal after its prefix, in its own vocabulary, so it proposes what it would emit decoding
            alone. A proposal of an id the target suppresses is rejected by the verify step (lossless).
  positions the draft's context (prefix + re-read text + a step's proposals) must fit its decoder positions
            (Whisper: 448); a row whose text outgrows them stops the run in one line (lower --max-new-tokens).

Timestamps are not drafted: the project decodes Whisper with <|notimestamps|>, and the re-read text has no
timestamp tokens (the tokenizers drop them when decoding).
"""

from __future__ import annotations

import torch

from pipeline.decoding.cache import model_kind
from pipeline.decoding.drafters.base import DraftPrompt, DraftSetup
from pipeline.decoding.drafters.cross_tokenizer import TextDrafter, VocabBridge
from pipeline.errors import SpecsweepError


class WhisperTextDrafter(TextDrafter):
    """A Whisper draft with another tokenizer for a Whisper target (see the module docstring).

    model   the draft, an encoder-decoder (WhisperForConditionalGeneration)
    bridge  the two vocabularies (:func:`~pipeline.decoding.drafters.cross_tokenizer.build_bridge`)
    mode    "intersection" or "string"
    prefix  the draft's own decoder prompt ids, e.g. tiny.en's [<|startoftranscript|>, <|notimestamps|>]
    """

    def __init__(self, model, bridge: VocabBridge, mode: str, prefix: list[int]) -> None:
        super().__init__(model, bridge, mode)
        if not prefix:
            raise SpecsweepError("a Whisper draft needs its decoder prompt (<|startoftranscript|> ...): got none")
        self.prefix = [int(i) for i in prefix]
        self.settings = {**self.settings, "draft_prefix": list(self.prefix)}
        self.suppress: torch.Tensor | None = None
        self.begin_suppress: torch.Tensor | None = None

    def bind(self, setup: DraftSetup) -> None:
        if setup.target_kind != "seq2seq" or model_kind(self.lm) != "seq2seq":
            raise SpecsweepError("a Whisper draft with another tokenizer drafts for an encoder-decoder target with "
                                 "its own encoder: use it with a Whisper target, without --draft-decoder-only")
        self.attach(setup, "seq2seq")
        config = self.lm.generation_config
        rows = self.lm.get_output_embeddings().weight.shape[0]
        self.suppress = _ids(getattr(config, "suppress_tokens", None), rows, setup.device)
        self.begin_suppress = _ids(getattr(config, "begin_suppress_tokens", None), rows, setup.device)

    def start(self, prompt: DraftPrompt) -> None:
        """The draft's encoder over the target's encoder inputs (``input_features`` [B, n_mels, frames]), then its
        own prefix for every row."""
        features = prompt.encoder_inputs.get("input_features")
        mels = getattr(self.lm.config, "num_mel_bins", None)
        if features is None or features.shape[1] != mels:
            got = "no input_features" if features is None else f"{features.shape[1]} mel bins"
            raise SpecsweepError(f"the Whisper draft reads {mels} mel bins and the target's inputs have {got}: "
                                 "pick a draft whose feature extractor is the target's")
        with prompt.timer.phase("encode"):
            hidden = self.lm.get_encoder()(**prompt.encoder_inputs).last_hidden_state
        self._timer = prompt.timer
        B = features.shape[0]
        with prompt.timer.phase("prefill"):
            self._read_prompts([list(self.prefix)] * B, features.device, len(self.prefix) + 2, hidden)

    def own_logits(self, logits: torch.Tensor, first_position: bool) -> torch.Tensor:
        """The draft's logits [b, V_d] with its own suppressed ids at -inf (and its begin-suppressed ids at its first
        proposal); a new tensor, no sync."""
        for ids in (self.suppress, self.begin_suppress if first_position else None):
            if ids is not None:
                logits = logits.index_fill(-1, ids, float("-inf"))
        return logits

    def context_ids(self, b: int) -> list[int]:
        """Row b's context: the draft's prefix, then the target's emitted text without its special tokens (EOS,
        <|notimestamps|>, ...) tokenised by the draft. Refuses a context the draft's positions cannot hold with a
        step's proposals."""
        special = self.bridge.target.special
        text = self.bridge.target.decode([t for t in self.generated[b] if t not in special])
        ids = self.prompt[b] + self.bridge.draft.encode(text)
        if self.draft_limit is not None and len(ids) + self.setup.gamma + 1 > self.draft_limit:
            raise SpecsweepError(f"the Whisper draft's {self.draft_limit} positions cannot hold a row's text "
                                 f"({len(ids)} draft tokens) and a step's {self.setup.gamma} proposals: lower "
                                 "--max-new-tokens or γ")
        return ids


def _ids(values, rows: int, device) -> torch.Tensor | None:
    """int64 [k] of the ids in ``values`` below ``rows`` on ``device`` (None: none), made once at bind."""
    ids = sorted({int(i) for i in values or () if 0 <= int(i) < rows})
    return torch.tensor(ids, dtype=torch.int64, device=device) if ids else None
