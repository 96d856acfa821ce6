"""Tiny random-init draft/target pairs and a word-level tokenizer, built in the test (no downloads).

Saved with save_pretrained so the real loading code (from_pretrained on a local directory) is exercised.
Weights are initialised with a large std so logits are peaked: greedy decoding is then robust to the tiny
numeric differences between batched/padded and single-row forwards.
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


def save_pair(root: Path, kind: str = "gpt2", draft_vocab_pad: int = 0, seed: int = 0,
              noise: float = 0.05) -> tuple[Path, Path]:
    """Write target/ and draft/ (model + tokenizer) under root. The target's embedding matrix is padded
    past the tokenizer (as real checkpoints often are); ``draft_vocab_pad`` < 0 gives the draft fewer rows.
    The draft is a noisy copy of the target (``noise`` = 0 makes it identical)."""
    tok = build_tokenizer()
    V = len(tok)
    target = build_model(kind, V + 3, layers=2, width=64, seed=seed)
    draft = noisy_copy(target, noise, seed + 1)
    if draft_vocab_pad:
        draft.resize_token_embeddings(V + 3 + draft_vocab_pad, mean_resizing=False)
    paths = []
    for name, model in (("target", target), ("draft", draft)):
        path = root / name
        model.save_pretrained(path)
        tok.save_pretrained(path)
        paths.append(path)
    return paths[0], paths[1]


PROMPTS = [
    "the storm hit the city",
    "police said the plane was",
    "a new report",
    "the president of the world team said that the game was not",
    "water",
]
