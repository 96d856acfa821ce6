"""Tiny synthetic pairs for the tests (see pipeline/synthetic.py) and prompts in their vocabulary."""

import json

from pipeline.synthetic import WORDS, build_model, build_tokenizer, noisy_copy, save_pair  # noqa: F401

PROMPTS = [
    "the storm hit the city",
    "police said the plane was",
    "a new report",
    "the president of the world team said that the game was not",
    "water",
]


def write_prompts(path):
    """A prompts-task JSONL of PROMPTS: {id: p<i>, prompt}."""
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    return path


def write_articles(path, n: int, repeat: int):
    """A CNN/DailyMail-schema JSONL of n rows: article = prompt i repeated ``repeat`` times, highlights = prompt i."""
    path.write_text("".join(json.dumps({"id": f"a{i}", "article": " ".join([p] * repeat), "highlights": p}) + "\n"
                            for i, p in enumerate(PROMPTS[:n])))
    return path


def build_bpe_tokenizer(words, vocab_size: int):
    """A byte-level BPE over ``words`` (pipeline/toy/vocab.py ``bpe_tokenizer``: ``<pad>`` = 0, ``<eos>`` = 1),
    another tokenizer than build_tokenizer's: earlier words are more frequent and merge first, so with a small
    ``vocab_size`` only they are single tokens (" fox", and "fox" for a text's first word), the others split."""
    from pipeline.toy.vocab import bpe_tokenizer

    return bpe_tokenizer([s + w for i, w in enumerate(words) for s in ("", " ") for _ in range(len(words) - i)],
                         vocab_size)


def cross_tokenizer_pair(kind: str = "gpt2", bpe_size: int = 1000, noise: float = 0.05, seed: int = 0):
    """(target, target tokenizer, draft, draft tokenizer): a tiny word-level target and a draft with a byte-level
    BPE. The draft copies the target's layers (with noise) and, for each of its tokens whose text is a target word,
    that word's embedding, so on the shared words it roughly agrees with the target (acceptance well above 0)."""
    import torch

    from pipeline.decoding.drafters.cross_tokenizer import build_bridge

    target_tok, draft_tok = build_tokenizer(), build_bpe_tokenizer(WORDS, bpe_size)
    target = build_model(kind, len(target_tok), 2, 32, seed)
    draft = build_model(kind, len(draft_tok), 2, 32, seed + 1)
    bridge = build_bridge(target_tok, draft_tok, len(target_tok), len(draft_tok), "cpu")
    if draft.get_output_embeddings().weight is draft.get_input_embeddings().weight:   # GPT-2: untie them
        draft.config.tie_word_embeddings = False
        draft.get_output_embeddings().weight = torch.nn.Parameter(draft.get_input_embeddings().weight.clone())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        t_state = target.state_dict()
        for name, tensor in draft.state_dict().items():
            source = t_state[name]
            if source.shape == tensor.shape:
                tensor.copy_(source + noise * source.std() * torch.randn(source.shape, generator=g))
        mapped = (bridge.d2t >= 0).nonzero().flatten()
        # the draft's other tokens (bytes, pieces of words) get logit 0, far below the words' peaked logits; a word
        # without its leading space (a text's first word) reads as the word does
        draft.get_output_embeddings().weight[bridge.d2t < 0] = 0.0
        words = {s.strip(): t for t, s in bridge.target.surfaces.items()}
        for d, s in bridge.draft.surfaces.items():
            if s.strip() in words:
                draft.get_input_embeddings().weight[d] = target.get_input_embeddings().weight[words[s.strip()]]
        for src, dst in ((target.get_input_embeddings(), draft.get_input_embeddings()),
                         (target.get_output_embeddings(), draft.get_output_embeddings())):
            dst.weight[mapped] = src.weight[bridge.d2t[mapped]]
    return target.eval(), target_tok, draft.eval(), draft_tok


def load_saved_pair(root, **kwargs):
    """(target, draft, tokenizer) of a tiny pair saved under ``root`` by :func:`save_pair` (``kwargs``: its settings),
    loaded back with the real loading code, fp32 on the CPU."""
    import torch

    from pipeline.models import load_causal_lm, load_tokenizer

    tp, dp = save_pair(root, **kwargs)
    return load_causal_lm(str(tp), torch.float32, "cpu"), load_causal_lm(str(dp), torch.float32, "cpu"), \
        load_tokenizer(str(tp))


def record_engines(monkeypatch) -> list:
    """Every SpeculativeEngine built from now on, in order (its __init__ patched for the test)."""
    from pipeline.decoding.engine import SpeculativeEngine  # kept local: only the tests that record engines need it

    engines = []
    init = SpeculativeEngine.__init__

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        engines.append(self)

    monkeypatch.setattr(SpeculativeEngine, "__init__", recording)
    return engines


def saved_cli_pair(root):
    """(root, target path, draft path, prompts path): a tiny Llama pair (widths multiples of 128, as int4 needs) and
    a prompts file under ``root``, for tests that run the CLI on it (:func:`cli_run_args`)."""
    tp, dp = save_pair(root, kind="llama", width=128)
    return root, tp, dp, write_prompts(root / "prompts.jsonl")


def cli_run_args(saved, out, *extra):
    """`specsweep run` on :func:`saved_cli_pair`'s pair: 2 prompts, 8 greedy tokens, 3 repeats of 2, then ``extra``."""
    _, tp, dp, data = saved
    return ["run", "--target", str(tp), "--draft", str(dp), "--data", str(data), "--device", "cpu", "--limit", "2",
            "--max-new-tokens", "8", "--temperature", "0", "--repeats", "3", "--samples-per-repeat", "2",
            "--no-progress", "--out", str(out), *extra]
