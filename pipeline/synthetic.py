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
    partly agrees with the target."""
    blocks = model.transformer.h if hasattr(model, "transformer") else model.model.layers
    with torch.no_grad():
        for block in list(blocks)[start:]:
            if hasattr(block, "attn"):  # GPT-2
                block.attn.c_proj.weight.mul_(factor)
                block.mlp.c_proj.weight.mul_(factor)
            else:
                block.self_attn.o_proj.weight.mul_(factor)
                block.mlp.down_proj.weight.mul_(factor)
    return model


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
    paths = []
    for name, model in (("target", target), ("draft", draft)):
        path = root / name
        model.save_pretrained(path)
        tok.save_pretrained(path)
        paths.append(path)
    return paths[0], paths[1]
