"""Train the toy speech pair: a small Whisper target and a distil-Whisper-style draft.

* Features: ``WhisperFeatureExtractor`` (80 log-mel bins, 10 ms hop) with ``chunk_length`` =
  :data:`pipeline.toy.speech_data.CHUNK_SECONDS`, so every clip is padded to that many seconds, not 30; the
  encoder's ``max_source_positions`` is half the frame count (its second convolution has stride 2).
* Target: ``WhisperForConditionalGeneration`` (:data:`TARGET`, then its decoder grown to :data:`TARGET_GROWN`'s
  depth by :func:`grow_decoder` and fine-tuned briefly), trained from scratch with cross-entropy on
  ``<|startoftranscript|> <|notimestamps|> words <|endoftext|>`` (the two prompt tokens are not predicted)
  plus, weighted by ``ctc_weight``, a CTC loss over the words on the encoder's output (a linear head used only
  in training and not saved): it teaches the encoder to tell the words apart and where they are, which the
  decoder's cross-attention alone learns far more slowly.
* Draft (as distil-Whisper): the target's encoder, frozen, and one decoder layer initialised from the
  target's first decoder layer (embeddings, final layer norm included), then trained briefly on the same data
  with cross-entropy plus the KL divergence to the target's next-token distribution.

Both are saved with ``save_pretrained`` together with a ``WhisperProcessor`` (feature extractor and a
``WhisperTokenizer`` with Whisper's special tokens, see :mod:`pipeline.toy.vocab`). Their generation config
is that of an English-only Whisper (``*.en``): ``decoder_start_token_id`` = ``<|startoftranscript|>``,
``no_timestamps_token_id`` = ``<|notimestamps|>``, ``is_multilingual`` False, no ``lang_to_id`` and no
(deprecated) ``forced_decoder_ids``; so ``model.generate(input_features)`` prompts the decoder with
``<|startoftranscript|> <|notimestamps|>`` (the tokenizer's ``prefix_tokens``) and transcribes until
``<|endoftext|>``; as for hub Whisper models, the returned ids exclude that prompt.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from pipeline.data import load_task_data
from pipeline.io import write_json_atomic
from pipeline.quality import wer
from pipeline.toy.cost import decode_flops_per_token, median_step_seconds
from pipeline.toy.speech_data import CHUNK_SECONDS, WORDS
from pipeline.toy.train_text import lr_at, new_layer_states, optimizer_step, training_summary
from pipeline.toy.vocab import whisper_tokenizer

N_MELS = 80
MAX_TARGET_POSITIONS = 48
"""Decoder positions: room for the 2-token prompt, 32 new tokens and a speculative block of up to γ = 8 plus one
(what the default pipeline and its tuning space ask for)."""


@dataclass(frozen=True)
class SpeechModelSpec:
    """A Whisper shape (the draft's encoder is the target's) and a training schedule; ``ctc_weight`` > 0 adds the
    encoder CTC loss (target only)."""

    d_model: int
    encoder_layers: int
    decoder_layers: int
    heads: int
    steps: int
    batch_size: int
    lr: float
    ctc_weight: float = 0.0


# The target's loss stays near uniform for its first ~250 steps (the CTC "blank" phase) and then drops fast;
# the steps after its greedy output is already good sharpen its distribution, so that sampling at T = 1 (the
# default pipeline's setting) is nearly as accurate. The draft, trained briefly, stays clearly worse.
# The draft's KL-to-the-target loss falls steeply between 60 and 130 steps (final loss 1.8 at 60 steps, 0.54 at 80,
# 0.10 at 130; the target's and the draft's next-token distributions overlap 0.55, 0.83 and 0.97 under teacher
# forcing on the test clips): at 80 it proposes what the target would sample most of the time yet alone is
# clearly worse than the target. Re-measure after any change to the data, the shapes, the steps or the seed.
TARGET = SpeechModelSpec(d_model=128, encoder_layers=2, decoder_layers=2, heads=4, steps=750, batch_size=32, lr=2e-3,
                         ctc_weight=1.0)
DRAFT = SpeechModelSpec(d_model=128, encoder_layers=2, decoder_layers=1, heads=4, steps=80, batch_size=32, lr=1e-3)
# The target once its decoder is grown (:func:`grow_decoder`; same encoder, width and heads) and its fine-tune: a
# few steps of cross-entropy plus KL to the 2-layer target, encoder frozen (the draft's encoder is a copy of it)
TARGET_GROWN = SpeechModelSpec(d_model=128, encoder_layers=2, decoder_layers=12, heads=4, steps=20, batch_size=32,
                               lr=3e-4)
QUICK_TARGET = SpeechModelSpec(d_model=32, encoder_layers=1, decoder_layers=2, heads=2, steps=3, batch_size=4, lr=1e-3,
                               ctc_weight=1.0)
QUICK_DRAFT = SpeechModelSpec(d_model=32, encoder_layers=1, decoder_layers=1, heads=2, steps=2, batch_size=4, lr=1e-3)
QUICK_TARGET_GROWN = SpeechModelSpec(d_model=32, encoder_layers=1, decoder_layers=3, heads=2, steps=2, batch_size=4,
                                     lr=1e-4)


def build_processor(chunk_seconds: int):
    """A ``WhisperProcessor``: the feature extractor with ``chunk_length=chunk_seconds`` and the toy tokenizer."""
    from transformers import WhisperFeatureExtractor, WhisperProcessor


    fe = WhisperFeatureExtractor(feature_size=N_MELS, chunk_length=chunk_seconds)
    return WhisperProcessor(feature_extractor=fe, tokenizer=whisper_tokenizer(WORDS))


def special_ids(tokenizer) -> dict[str, int]:
    """Ids of the special tokens generation needs."""
    names = {"eot": "<|endoftext|>", "sot": "<|startoftranscript|>", "en": "<|en|>", "transcribe": "<|transcribe|>",
             "translate": "<|translate|>", "notimestamps": "<|notimestamps|>"}
    return {k: int(tokenizer.convert_tokens_to_ids(v)) for k, v in names.items()}


def word_classes(tokenizer) -> dict[int, int]:
    """Token id of each lexicon word (with its leading space) -> its CTC class, 1 .. len(WORDS) (0 is blank)."""

    return {tokenizer(" " + w, add_special_tokens=False).input_ids[0]: k + 1 for k, w in enumerate(WORDS)}


def build_target(spec: SpeechModelSpec, processor, seed: int):
    """A randomly initialised ``WhisperForConditionalGeneration`` of shape ``spec`` with an English-only
    generation config (see the module docstring)."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    ids = special_ids(processor.tokenizer)
    fe = processor.feature_extractor
    torch.manual_seed(seed)
    config = WhisperConfig(
        vocab_size=len(processor.tokenizer), num_mel_bins=fe.feature_size, d_model=spec.d_model,
        encoder_layers=spec.encoder_layers, decoder_layers=spec.decoder_layers, encoder_attention_heads=spec.heads,
        decoder_attention_heads=spec.heads, encoder_ffn_dim=4 * spec.d_model, decoder_ffn_dim=4 * spec.d_model,
        max_source_positions=fe.nb_max_frames // 2, max_target_positions=MAX_TARGET_POSITIONS,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, decoder_start_token_id=ids["sot"],
        pad_token_id=ids["eot"], bos_token_id=ids["eot"], eos_token_id=ids["eot"], tie_word_embeddings=True)
    model = WhisperForConditionalGeneration(config)
    configure_generation(model, ids)
    return model


def configure_generation(model, ids: dict[str, int]) -> None:
    """Set the English-only Whisper generation config on ``model`` (in place)."""
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(
        decoder_start_token_id=ids["sot"], no_timestamps_token_id=ids["notimestamps"], is_multilingual=False,
        bos_token_id=ids["eot"], eos_token_id=ids["eot"], pad_token_id=ids["eot"], suppress_tokens=[],
        begin_suppress_tokens=[ids["eot"]], max_length=MAX_TARGET_POSITIONS)


def grow_decoder(model, decoder_layers: int):
    """A ``WhisperForConditionalGeneration`` with ``decoder_layers`` decoder layers that computes exactly what
    ``model`` (k < decoder_layers of them) computes: its encoder, embeddings, final layer norm and decoder layers
    0..k-1 are ``model``'s; decoder layer i >= k copies layer i mod k with the output projections of its
    self-attention, cross-attention and MLP (weight and bias) set to zero, so it adds nothing to the residual
    stream until trained (as :func:`pipeline.toy.train_text.grow_deeper` does for GPT-2). Returns the new model."""
    from transformers import WhisperForConditionalGeneration

    k = model.config.decoder_layers
    if not decoder_layers > k:
        raise ValueError(f"grow_decoder: decoder_layers must exceed the model's {k}; got {decoder_layers}")
    config = copy.deepcopy(model.config)
    config.decoder_layers = decoder_layers
    grown = WhisperForConditionalGeneration(config)
    state = {**model.state_dict(),
             **new_layer_states(model.model.decoder.layers, decoder_layers, "model.decoder.layers",
                                zeroed=("self_attn.out_proj.", "encoder_attn.out_proj.", "fc2."))}
    missing, unexpected = grown.load_state_dict(state, strict=False)
    if unexpected or any(not k.endswith("proj_out.weight") for k in missing):   # the head is tied to the embeddings
        raise RuntimeError(f"grow_decoder: missing {missing}, unexpected {unexpected}")
    grown.generation_config = copy.deepcopy(model.generation_config)
    return grown.eval()


def build_draft(target):
    """The target's encoder and embeddings plus its first decoder layer: a 1-decoder-layer Whisper."""
    from transformers import WhisperForConditionalGeneration

    config = copy.deepcopy(target.config)
    config.decoder_layers = 1
    draft = WhisperForConditionalGeneration(config)
    state = {k: v for k, v in target.state_dict().items()
             if not k.startswith("model.decoder.layers.") or k.startswith("model.decoder.layers.0.")}
    missing, unexpected = draft.load_state_dict(state, strict=False)
    if unexpected or any(not k.endswith("proj_out.weight") for k in missing):
        raise RuntimeError(f"draft init: missing {missing}, unexpected {unexpected}")
    draft.generation_config = copy.deepcopy(target.generation_config)
    return draft


def load_split(manifest: Path, processor, progress: bool = True) -> tuple[torch.Tensor, list[list[int]], list[dict]]:
    """Read a manifest with :func:`pipeline.data.load_task_data` and featurise it.

    Returns ``features`` float32 [N, 80, frames], ``labels`` (per clip: ``[sot, notimestamps, *words, eot]``)
    and the records (``{"id", "text", "audio", "duration"}``).
    """

    records = load_task_data("librispeech", manifest, progress=progress)
    fe, tok = processor.feature_extractor, processor.tokenizer
    chunks = []
    for start in tqdm(range(0, len(records), 64), desc="features", unit="batch", disable=not progress, leave=False):
        batch = [r["audio"] for r in records[start:start + 64]]
        chunks.append(fe(batch, sampling_rate=fe.sampling_rate, return_tensors="pt").input_features)
    labels = [tok(" " + r["text"]).input_ids for r in records]  # the tokenizer adds sot, notimestamps and eot
    return torch.cat(chunks), labels, records


def pad_labels(batch: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> decoder inputs int64 [B, L-1] (pad ``pad_id``) and targets int64 [B, L-1] (-100 on padding and on
    the forced ``<|notimestamps|>``)."""
    width = max(len(x) for x in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    targets = torch.full((len(batch), width), -100, dtype=torch.long)
    for i, x in enumerate(batch):
        ids[i, :len(x)] = torch.tensor(x)
        targets[i, :len(x)] = torch.tensor(x)
    targets[:, 1] = -100
    return ids[:, :-1], targets[:, 1:]


def ctc_targets(batch: list[list[int]], word_ids: dict[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Label sequences -> CTC targets: int64 [B, W] word classes (1..len(word_ids), blank = 0; padded with 0)
    and their lengths int64 [B]. Special tokens are dropped."""
    rows = [[word_ids[t] for t in x if t in word_ids] for x in batch]
    width = max(1, max(len(r) for r in rows))
    out = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    return out, torch.tensor([len(r) for r in rows], dtype=torch.long)


def train(model, features: torch.Tensor, labels: list[list[int]], spec: SpeechModelSpec, pad_id: int, seed: int,
          desc: str, teacher=None, progress: bool = True, word_ids: dict[int, int] | None = None) -> dict:
    """AdamW on ``model`` for ``spec.steps`` steps of ``spec.batch_size`` random clips.

    Without ``teacher``, given ``word_ids`` (:func:`word_classes`) and ``spec.ctc_weight`` > 0, the loss adds
    ``ctc_weight`` times a CTC loss of a linear word classifier over the encoder's output (the head is dropped
    after training). With ``teacher`` (the target), the encoder is frozen (run without gradients) and the loss
    is cross-entropy plus KL(teacher || model) over the next-token distributions. Returns ``{"steps",
    "losses", "first_loss", "final_loss", "seconds"}``.
    """
    g = torch.Generator().manual_seed(seed)
    params = [p for n, p in model.named_parameters() if teacher is None or not n.startswith("model.encoder.")]
    ctc_head = None
    if teacher is None and word_ids and spec.ctc_weight > 0:
        torch.manual_seed(seed)
        ctc_head = torch.nn.Linear(model.config.d_model, len(word_ids) + 1)
        params = params + list(ctc_head.parameters())
    opt = torch.optim.AdamW(params, lr=spec.lr, weight_decay=0.01, betas=(0.9, 0.98))
    model.train()
    losses: list[float] = []
    t0 = time.perf_counter()
    bar = tqdm(range(spec.steps), desc=desc, unit="step", disable=not progress)
    for step in bar:
        idx = torch.randint(0, features.shape[0], (spec.batch_size,), generator=g)
        dec_in, targets = pad_labels([labels[i] for i in idx.tolist()], pad_id)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, spec.steps, spec.lr)
        if teacher is None:
            enc = model.model.encoder(features[idx])
            logits = model(encoder_outputs=enc, decoder_input_ids=dec_in).logits
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
            if ctc_head is not None:
                # [frames, B, classes]
                ctc_in = F.log_softmax(ctc_head(enc.last_hidden_state), -1).transpose(0, 1).contiguous()
                ctc_y, ctc_len = ctc_targets([labels[i] for i in idx.tolist()], word_ids)
                frames = torch.full((ctc_in.shape[1],), ctc_in.shape[0], dtype=torch.long)
                loss = loss + spec.ctc_weight * F.ctc_loss(ctc_in, ctc_y, frames, ctc_len, zero_infinity=True)
        else:
            with torch.no_grad():
                enc = model.model.encoder(features[idx])
                t_logits = teacher(encoder_outputs=enc, decoder_input_ids=dec_in).logits
            logits = model(encoder_outputs=enc, decoder_input_ids=dec_in).logits
            keep = targets.flatten() != -100
            ce = F.cross_entropy(logits.flatten(0, 1)[keep], targets.flatten()[keep])
            kl = F.kl_div(F.log_softmax(logits.flatten(0, 1)[keep], -1),
                          F.log_softmax(t_logits.flatten(0, 1)[keep], -1), log_target=True, reduction="batchmean")
            loss = ce + kl
        optimizer_step(opt, loss, params, losses, bar)
    bar.close()
    model.eval()
    return training_summary(spec.steps, losses, t0)


@torch.inference_mode()
def _grow_check(shallow, grown, features: torch.Tensor, prompt: list[int]) -> dict:
    """How far the grown target's logits are from the shallow one's on a few clips right after growing (float32
    round-off only: the new layers add exact zeros)."""
    ids = torch.tensor([prompt] * features.shape[0])
    shallow.eval()
    grown.eval()
    diff = (grown(input_features=features, decoder_input_ids=ids).logits
            - shallow(input_features=features, decoder_input_ids=ids).logits).abs().max().item()
    if diff > 1e-3:
        raise RuntimeError(f"grow_decoder changed the model's output (max |Δlogit| {diff:.3g}); it must not")
    return {"from_layers": shallow.config.decoder_layers, "to_layers": grown.config.decoder_layers,
            "max_abs_logit_change_at_growth": diff}


@torch.inference_mode()
def transcribe(model, processor, features: torch.Tensor, batch_size: int = 50) -> list[str]:
    """Greedy ``model.generate`` over ``features`` (float32 [N, 80, frames]) -> decoded texts."""
    texts: list[str] = []
    for start in range(0, features.shape[0], batch_size):
        out = model.generate(features[start:start + batch_size], do_sample=False)
        texts.extend(processor.batch_decode(out, skip_special_tokens=True))
    return texts


@torch.inference_mode()
def decoder_step_seconds(model, features: torch.Tensor, prefix: list[int], repeats: int = 30) -> float:
    """Median seconds of one cached decoder step (encoder output and cross-attention cache precomputed)."""

    enc = model.model.encoder(features[:1])
    out = model(encoder_outputs=enc, decoder_input_ids=torch.tensor([prefix]), use_cache=True)
    cache = out.past_key_values
    token = out.logits[:, -1:].argmax(-1)

    def step():
        model(encoder_outputs=enc, decoder_input_ids=token, past_key_values=cache, use_cache=True)
        cache.crop(-1)

    return median_step_seconds(step, repeats=repeats)


def decoder_matrix_params(model) -> int:
    """Decoder matrix parameters applied per decoded token: all decoder weights but the embedding tables and
    the cross-attention key/value projections (applied once per clip), plus the output projection."""
    dec = model.model.decoder
    skip = {id(dec.embed_tokens.weight), id(dec.embed_positions.weight)}
    n = 0
    for name, p in dec.named_parameters():
        if id(p) in skip or "encoder_attn.k_proj" in name or "encoder_attn.v_proj" in name:
            continue
        n += p.numel()
    return n + model.proj_out.weight.numel()


def measure_cost(target, draft, features: torch.Tensor, prefix: list[int]) -> dict:
    """FLOPs and seconds per decoded token (decoder only; the encoder runs once per clip) and the ratios."""

    out = {}
    for name, m in (("target", target), ("draft", draft)):
        c = m.config
        out[name] = {"flops_per_token": decode_flops_per_token(decoder_matrix_params(m), c.decoder_layers, c.d_model,
                                                               len(prefix), cross_ctx=c.max_source_positions),
                     "seconds_per_token": decoder_step_seconds(m, features, prefix)}
    out["flop_ratio"] = out["draft"]["flops_per_token"] / out["target"]["flops_per_token"]
    out["time_ratio"] = out["draft"]["seconds_per_token"] / out["target"]["seconds_per_token"]
    return out


def run(data_dir: Path, out_dir: Path, seed: int = 0, quick: bool = False, progress: bool = True) -> dict:
    """Train the pair on ``<data_dir>/speech/train``; evaluate both on ``<data_dir>/speech/test`` (greedy
    ``generate``, WER); write ``<out_dir>/speech/{target,draft}`` and ``<out_dir>/speech/training.json``."""

    root = Path(data_dir) / "speech"
    processor = build_processor(CHUNK_SECONDS)
    tok = processor.tokenizer
    ids = special_ids(tok)
    t_feat = time.perf_counter()
    features, labels, _ = load_split(root / "train" / "manifest.jsonl", processor, progress)
    test_features, _, test_records = load_split(root / "test" / "manifest.jsonl", processor, progress)
    feature_seconds = time.perf_counter() - t_feat
    target_spec, draft_spec, grown_spec = ((QUICK_TARGET, QUICK_DRAFT, QUICK_TARGET_GROWN) if quick
                                           else (TARGET, DRAFT, TARGET_GROWN))
    t0 = time.perf_counter()
    shallow = build_target(target_spec, processor, seed)
    word_ids = word_classes(tok)
    target_log = train(shallow, features, labels, target_spec, ids["eot"], seed, "train speech target",
                       progress=progress, word_ids=word_ids)
    draft = build_draft(shallow)
    shallow.requires_grad_(False)
    draft_log = train(draft, features, labels, draft_spec, ids["eot"], seed + 1, "train speech draft",
                      teacher=shallow, progress=progress)
    # Why grow: as for the text pair (pipeline/toy/train_text.py), a decoder step costs about the same per layer
    # whatever its width at these sizes, so with a 2-layer target the 1-layer draft cost about 0.6 of it per token
    # and no speech run was faster than the target alone.
    target = grow_decoder(shallow, grown_spec.decoder_layers)
    growth_log = _grow_check(shallow, target, test_features[:4], [ids["sot"], ids["notimestamps"]])
    growth_log["fine_tune"] = train(target, features, labels, grown_spec, ids["eot"], seed + 2,
                                    f"fine-tune speech target at {grown_spec.decoder_layers} decoder layers",
                                    teacher=shallow, progress=progress)
    target.requires_grad_(False)
    train_seconds = time.perf_counter() - t0
    out = Path(out_dir) / "speech"
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(out / name)
        processor.save_pretrained(out / name)
    references = [r["text"] for r in test_records]
    evaluation = {}
    for name, model in (("target", target), ("draft", draft)):
        t = time.perf_counter()
        predictions = transcribe(model, processor, test_features)
        result = wer(predictions, references, tokenizer=processor)
        evaluation[name] = {"wer": result.wer, "seconds": time.perf_counter() - t, "examples": predictions[:5]}
    evaluation["references"] = references[:5]
    evaluation["clips"] = len(references)
    cost = measure_cost(target, draft, test_features, [ids["sot"], ids["notimestamps"]])
    record = {
        "task": "speech",
        "seed": seed,
        "quick": quick,
        "train_clips": int(features.shape[0]),
        "test_clips": int(test_features.shape[0]),
        "feature_seconds": feature_seconds,
        "train_seconds": train_seconds,
        "threads": torch.get_num_threads(),
        "feature_extractor": {"chunk_length": processor.feature_extractor.chunk_length,
                              "n_samples": processor.feature_extractor.n_samples,
                              "nb_max_frames": processor.feature_extractor.nb_max_frames,
                              "feature_size": processor.feature_extractor.feature_size,
                              "max_source_positions": target.config.max_source_positions},
        "special_token_ids": ids,
        "decoder_prompt": [ids["sot"], ids["notimestamps"]],
        "models": {
            name: {"path": str(out / name), "architecture": "WhisperForConditionalGeneration", "spec": asdict(spec),
                   "parameters": sum(p.numel() for p in m.parameters()),
                   "decoder_matrix_parameters": decoder_matrix_params(m), "training": log}
            for name, m, spec, log in (("target", target, target_spec, target_log),
                                       ("draft", draft, draft_spec, draft_log))
        },
        "target_growth": {"spec": asdict(grown_spec), **growth_log},
        "eval_greedy": evaluation,
        "cost": cost,
    }
    write_json_atomic(out / "training.json", record)
    return record

