"""A Whisper draft distilled on its target's encoder: a shallow decoder that reads the target's encoder output.

transformers' assisted generation and a full Whisper draft (tiny.en for base) encode each clip a second time with
the draft's own encoder; on a CPU that pass alone costs more than the target steps a good draft saves (the real
profile measured it). distil-whisper's recipe makes the draft from the target instead: keep the encoder, train a
decoder of 1-2 layers on the target's transcripts. Made a draft, that decoder is a ``WhisperForCausalLM`` (the
target's config with ``is_encoder_decoder`` off) that ``specsweep run --draft DIR --draft-decoder-only`` feeds the
target's encoder output (docs/engine.md): no second encoder pass.

    forward = encoder_forward(target, hidden)                         # hidden float32 [B, F, H]
    sequences = teacher_pass(target, encode, records, eos, pad, max_new_tokens, top_k, mask)   # encode: the task's
    draft = build_student(target, settings)                           # WhisperForCausalLM, float32, train mode

The teacher pass: the target encodes each clip once (the task's encoder, as `specsweep run` reads the clip) and
transcribes it greedily with its suppress lists (as ``specsweep run`` decodes it), keeping its law at every decoder
position (:mod:`pipeline.distill.teacher`); each :class:`~pipeline.distill.teacher.TeacherSequence` carries its
clip's encoder output as ``context`` [F, H], which the draft's cross-attention reads in training as it will in
decoding. The draft starts from the target's token and position embeddings, final norm and head and the decoder
layers ``--init-layers`` (default: the first ``--layers``); the embedding (tied to the head) stays frozen.
"""

from __future__ import annotations

import copy

import torch
from tqdm.auto import tqdm

from pipeline.distill.teacher import TeacherSequence, continue_batch

CLIP_BATCH = 8
"""Clips the target encodes and transcribes together (their decoder prompts are the same length: no padding)."""


def is_speech(model) -> bool:
    """Whether ``model`` is an encoder-decoder speech target (a Whisper)."""
    return bool(getattr(model.config, "is_encoder_decoder", False))


def encoder_forward(target, hidden: torch.Tensor):
    """The target's decoder over its encoder output ``hidden`` float32 [B, F, H], as
    :func:`pipeline.distill.teacher.target_laws` calls a forward (left-padded decoder tokens: the teacher pass's
    prompts all have the same length, an on-policy batch's prefixes do not)."""
    def forward(ids, mask, positions, cache):
        out = target(encoder_outputs=(hidden,), decoder_input_ids=ids, decoder_attention_mask=mask,
                     decoder_position_ids=positions, past_key_values=cache, use_cache=True)
        return out.logits, out.past_key_values
    return forward


def teacher_pass(target, encode, records: list[dict], eos: list[int], pad: int, max_new_tokens: int, top_k: int,
                 mask_logits, progress: bool = True,
                 desc: str = "target transcribes the clips") -> list[TeacherSequence]:
    """A :class:`TeacherSequence` per clip record, in order: the decoder prompt, the target's greedy transcript, its
    law at every position, the clip's encoder output as context. ``encode`` is the task's encoder, as `specsweep run`
    builds it (records -> the decoder prompts [B, P] and the log-mel ``input_features``, long clips cut to the
    window)."""
    device, dtype = next(target.parameters()).device, next(target.parameters()).dtype
    out: list[TeacherSequence] = []
    bar = tqdm(total=len(records), desc=desc, unit="clip", disable=not progress)
    for start in range(0, len(records), CLIP_BATCH):
        chunk = records[start: start + CLIP_BATCH]
        batch, _ = encode(chunk)
        with torch.inference_mode():
            features = batch["encoder_inputs"]["input_features"].to(device, dtype)
            hidden = target.get_encoder()(features).last_hidden_state                       # [B, F, H]
        seqs = continue_batch(encoder_forward(target, hidden), batch["input_ids"].tolist(), eos, pad,
                              max_new_tokens, 0.0, top_k, None, device, mask_logits)
        for seq, h in zip(seqs, hidden):
            seq.context = h.float().cpu()
            out.append(seq)
        bar.update(len(chunk))
    bar.close()
    return out


def draft_config(target, layers: int):
    """The target's config as a decoder-only draft of ``layers`` decoder layers, dropout off."""
    config = copy.deepcopy(target.config)
    config.is_encoder_decoder = False
    config.decoder_layers = layers
    config.architectures = ["WhisperForCausalLM"]
    for name in ("dropout", "attention_dropout", "activation_dropout", "decoder_layerdrop", "encoder_layerdrop"):
        if hasattr(config, name):
            setattr(config, name, 0.0)
    config.use_cache = True
    return config


def decoder_hidden(draft, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   context: torch.Tensor) -> torch.Tensor:
    """The draft decoder's last hidden states [B, L, H] over right-padded tokens int64 [B, L], reading the
    encoder output ``context`` float32 [B, F, H]."""
    return draft.model.decoder(input_ids=input_ids, attention_mask=attention_mask, encoder_hidden_states=context,
                               use_cache=False).last_hidden_state

