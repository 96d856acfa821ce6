"""Random-init draft/target pairs and a word-level tokenizer, built locally (no downloads).

Used by the tests and by `specsweep bench engine` when no models are given: they measure the decoding loop,
not language quality. Saved with save_pretrained, so the real loading code (from_pretrained on a local
directory) is exercised. Weights use a large init std so logits are peaked: greedy decoding is then robust
to the tiny numeric differences between batched/padded and single-row forwards. The draft is a noisy copy
of the target, so the two partly agree (acceptance well between 0 and 1).
"""

from __future__ import annotations

from pathlib import Path

import torch

WORDS = tuple(
    """
the a of to and in is was for on that with as by at from his her it be are this had not but were
have one which their said they an has all been would will who more if out so up when about new two
time year there can people first after other some could also into than over only its most years
state even made many before what president news city world police court week team game home house
water money power party report family school storm fire plane car road bridge
"""
    .split()
)


def build_tokenizer(words=WORDS):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for w in words:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    from tokenizers import decoders

    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                   padding_side="left")


def build_model(kind: str, vocab_size: int, layers: int, width: int, seed: int, init_std: float = 0.4):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    if kind == "gpt2":
        cfg = GPT2Config(vocab_size=vocab_size, n_positions=256, n_embd=width, n_layer=layers, n_head=4,
                         bos_token_id=1, eos_token_id=1, pad_token_id=0, initializer_range=init_std)
        model = GPT2LMHeadModel(cfg)
    elif kind == "llama":
        cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=width, intermediate_size=2 * width,
                          num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=256, bos_token_id=1, eos_token_id=1, pad_token_id=0,
                          initializer_range=init_std, tie_word_embeddings=False)
        model = LlamaForCausalLM(cfg)
    else:
        raise ValueError(kind)
    return model.eval()


def noisy_copy(model, noise: float, seed: int):
    """A draft that partly agrees with the target: its weights plus Gaussian noise (relative std ``noise``)."""
    import copy

    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise * (p.std() if p.numel() > 1 else 1.0))
    return draft


def truncate_layers(model, layers: int):
    """Keep the first ``layers`` decoder layers (a cheaper draft that still resembles its target)."""
    if hasattr(model, "transformer"):  # GPT-2
        model.transformer.h = model.transformer.h[:layers]
        model.config.n_layer = layers
    else:  # Llama-style
        model.model.layers = model.model.layers[:layers]
        model.config.num_hidden_layers = layers
        if getattr(model.config, "layer_types", None):
            model.config.layer_types = model.config.layer_types[:layers]
    return model


def damp_layers(model, start: int, factor: float):
    """Scale the residual-branch output projections of layers >= ``start`` by ``factor``: those layers keep
    their full compute cost but change the output little, so a draft made of the first ``start`` layers
    partly agrees with the target. GPT-2, Llama-style and Whisper-decoder layers."""
    if hasattr(model, "transformer"):  # GPT-2
        blocks = model.transformer.h
    elif hasattr(model.model, "decoder"):  # Whisper
        blocks = model.model.decoder.layers
    else:
        blocks = model.model.layers
    with torch.no_grad():
        for block in list(blocks)[start:]:
            for name in ("attn.c_proj", "mlp.c_proj", "self_attn.o_proj", "mlp.down_proj", "self_attn.out_proj",
                         "encoder_attn.out_proj", "fc2"):
                proj = block.get_submodule(name) if _has_submodule(block, name) else None
                if proj is not None:
                    proj.weight.mul_(factor)
    return model


def _has_submodule(module, name: str) -> bool:
    try:
        module.get_submodule(name)
        return True
    except AttributeError:
        return False


def save_models(root: Path, target, draft, preprocessor) -> tuple[Path, Path]:
    """root/target and root/draft, each with the tokenizer or processor beside the weights (as on the Hub)."""
    paths = (root / "target", root / "draft")
    for path, model in zip(paths, (target, draft)):
        model.save_pretrained(path)
        preprocessor.save_pretrained(path)
    return paths


def save_pair(root: Path, kind: str = "gpt2", draft_vocab_pad: int = 0, seed: int = 0, noise: float = 0.05,
              layers: int = 2, width: int = 64, draft_layers: int | None = None,
              deep_layer_scale: float = 0.1) -> tuple[Path, Path]:
    """Write target/ and draft/ (model + tokenizer) under root and return their paths.

    The target's embedding matrix is padded past the tokenizer (as real checkpoints often are);
    ``draft_vocab_pad`` < 0 gives the draft fewer rows. The draft is a noisy copy of the target (``noise`` = 0
    makes it identical), truncated to ``draft_layers`` decoder layers when given; the target's deeper layers
    are then damped by ``deep_layer_scale`` (see damp_layers) so the two still partly agree.
    """
    tok = build_tokenizer()
    V = len(tok)
    target = build_model(kind, V + 3, layers=layers, width=width, seed=seed)
    if draft_layers is not None:
        damp_layers(target, draft_layers, deep_layer_scale)
    draft = noisy_copy(target, noise, seed + 1)
    if draft_layers is not None:
        truncate_layers(draft, draft_layers)
    if draft_vocab_pad:
        draft.resize_token_embeddings(V + 3 + draft_vocab_pad, mean_resizing=False)
    return save_models(root, target, draft, tok)


# ---- Whisper-architecture pairs -------------------------------------------------------------------------------

WHISPER_SPECIALS = ("<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>")


def build_whisper_processor(chunk_seconds: int = 2):
    """A WhisperProcessor built offline: a byte-level BPE tokenizer with no merges (every byte a token) plus
    Whisper's special tokens, and a feature extractor whose window is ``chunk_seconds`` long."""
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import WhisperFeatureExtractor, WhisperProcessor, WhisperTokenizer

    vocab = {"<|endoftext|>": 0}
    for ch in sorted(ByteLevel.alphabet()):
        vocab.setdefault(ch, len(vocab))
    tok = WhisperTokenizer(vocab=vocab, merges=[], unk_token="<|endoftext|>", bos_token="<|endoftext|>",
                           eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": list(WHISPER_SPECIALS)})
    fe = WhisperFeatureExtractor(feature_size=80, sampling_rate=16_000, chunk_length=chunk_seconds)
    return WhisperProcessor(feature_extractor=fe, tokenizer=tok)


def build_whisper(processor, decoder_layers: int, seed: int, width: int = 64, encoder_layers: int = 1,
                  init_std: float = 0.4):
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    tok = processor.tokenizer
    ids = {t: tok.convert_tokens_to_ids(t) for t in WHISPER_SPECIALS}
    frames = processor.feature_extractor.nb_max_frames
    cfg = WhisperConfig(vocab_size=len(tok), num_mel_bins=80, d_model=width, encoder_layers=encoder_layers,
                        decoder_layers=decoder_layers, encoder_attention_heads=4, decoder_attention_heads=4,
                        encoder_ffn_dim=2 * width, decoder_ffn_dim=2 * width, max_source_positions=frames // 2,
                        max_target_positions=128, pad_token_id=0, bos_token_id=0, eos_token_id=0,
                        decoder_start_token_id=ids["<|startoftranscript|>"], suppress_tokens=[],
                        begin_suppress_tokens=[], init_std=init_std)
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(cfg).eval()
    from transformers import GenerationConfig

    # as an English-only Whisper checkpoint has it: HF's generate then decodes after
    # <|startoftranscript|><|notimestamps|>, the tokenizer's prefix_tokens
    model.generation_config = GenerationConfig(
        decoder_start_token_id=ids["<|startoftranscript|>"], no_timestamps_token_id=ids["<|notimestamps|>"],
        is_multilingual=False, eos_token_id=0, pad_token_id=0, bos_token_id=0, suppress_tokens=[],
        begin_suppress_tokens=[], max_length=128)
    return model


def save_whisper_pair(root: Path, draft_kind: str = "seq2seq", seed: int = 0, noise: float = 0.05,
                      decoder_layers: int = 2, chunk_seconds: int = 2) -> tuple[Path, Path]:
    """target/ (WhisperForConditionalGeneration) and draft/ under root, with the processor saved beside both.

    draft_kind "seq2seq": a full Whisper (own encoder, one decoder layer), like distil-small.en;
    "decoder_only": a WhisperForCausalLM that reuses the target's encoder outputs, like distil-large-v2 used
    as an assistant. Either way the draft is a noisy copy of the target, truncated to one decoder layer.
    """
    import copy

    from transformers import WhisperForCausalLM

    processor = build_whisper_processor(chunk_seconds)
    target = build_whisper(processor, decoder_layers, seed)
    damp_layers(target, 1, 0.1)
    draft = noisy_copy(target, noise, seed + 1)
    draft.model.decoder.layers = draft.model.decoder.layers[:1]
    draft.config.decoder_layers = 1
    if draft_kind == "decoder_only":
        cfg = copy.deepcopy(draft.config)
        cfg.is_encoder_decoder = False
        causal = WhisperForCausalLM(cfg).eval()
        causal.model.decoder.load_state_dict(draft.model.decoder.state_dict())
        causal.proj_out.load_state_dict(draft.proj_out.state_dict())
        causal.generation_config = copy.deepcopy(draft.generation_config)
        draft = causal
    elif draft_kind != "seq2seq":
        raise ValueError(draft_kind)
    return save_models(root, target, draft, processor)
