"""Drafts with a reduced vocabulary (pipeline/decoding/drafters/vocab_map.py): a draft cut to K of the target's tokens.

Greedy decoding with it is the target's own, token for token (GPT-2 with the static cache, Llama with transformers'
cache), and the loaded model is left as it was; its proposals are the mapped target ids and its proposal law is
zero outside them; at T = 1 the first emitted token and the first two jointly follow the target's law (chi-square,
4000 rows, against the laws by enumeration), and a negative control (the draft's K logits scattered without the
map) fails the same test. Chi-square tests here: 3 (counted against tests/stat_utils.py's MAX_TESTS).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from stat_utils import THRESHOLD, chisquare_pvalue, counts, target_laws
from tiny_models import PROMPTS, WORDS, load_saved_pair

from pipeline.decoding.drafters.vocab_map import VocabMapDrafter
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.samplers import get_sampler

EOS = 1
N_ROWS = 4000


def _vocabulary(target, tok) -> list[int]:
    """K target ids, a real subset of the tiny target's 100-odd: EOS, the target's 12 most probable first tokens after
    PROMPTS[0] (so that the chi-square tests' proposals are often accepted) and the first 20 words."""
    with torch.no_grad():
        first = target(tok(PROMPTS[0], return_tensors="pt").input_ids).logits[0, -1]
    return sorted({EOS, *first.topk(12).indices.tolist(), *tok.convert_tokens_to_ids(list(WORDS[:20]))})


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def pair(request, tmp_path_factory):
    return load_saved_pair(tmp_path_factory.mktemp(f"vocab-{request.param}"), kind=request.param)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """The tiny GPT-2 pair of the chi-square tests (one family is enough for them)."""
    return load_saved_pair(tmp_path_factory.mktemp("vocab-chi2"), kind="gpt2")


def test_greedy_decoding_with_a_reduced_vocabulary_is_the_target_alone(pair):
    target, draft, tok = pair
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    reference = SpeculativeEngine(target, None, get_sampler("greedy"), gamma=0, device="cpu", eos_token_ids=[EOS],
                                  pad_token_id=0).generate(
        enc.input_ids, enc.attention_mask, 16).tokens
    ids = _vocabulary(target, tok)
    drafter = VocabMapDrafter(draft, ids)
    assert drafter.lm.get_output_embeddings().weight.shape[0] == len(ids)
    assert draft.get_output_embeddings().weight.shape[0] == target.get_output_embeddings().weight.shape[0]  # as was
    for sampler in ("greedy", "exact"):
        engine = SpeculativeEngine(target, VocabMapDrafter(draft, ids), get_sampler(sampler, temperature=0.0), gamma=4,
                                   device="cpu", eos_token_ids=[EOS], pad_token_id=0)
        result = engine.generate(enc.input_ids, enc.attention_mask, 16)
        assert result.tokens == reference
        assert sum(s["accepted"] for s in result.row_stats) > 0       # proposals from the K tokens were taken
    one = tok(PROMPTS[1], return_tensors="pt")
    assert engine.generate(one.input_ids, one.attention_mask, 16).tokens == [reference[1]]


def test_proposals_are_the_mapped_ids_and_their_logits_are_zero_elsewhere(pair):
    target, draft, tok = pair
    ids = _vocabulary(target, tok)
    proposals = []

    class Spy(VocabMapDrafter):
        def propose(self, ask):
            out = super().propose(ask)
            proposals.append(out)
            return out

    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    SpeculativeEngine(target, Spy(draft, ids), get_sampler("exact", temperature=1.0), gamma=3, device="cpu",
                      eos_token_ids=[EOS], pad_token_id=0).generate(
        enc.input_ids, enc.attention_mask, 8, torch.Generator().manual_seed(0))
    inside = torch.zeros(target.get_output_embeddings().weight.shape[0], dtype=torch.bool)
    inside[ids] = True
    for out in proposals:
        assert inside[out.tokens].all()
        probs = torch.softmax(out.logits, -1)
        assert probs[..., ~inside].max() == 0 and torch.allclose(probs.sum(-1), torch.ones(()))


def _first_two(engine, tok, prompt: str, seed: int) -> np.ndarray:
    enc = tok([prompt] * N_ROWS, return_tensors="pt")
    result = engine.generate(enc.input_ids, enc.attention_mask, 3, torch.Generator().manual_seed(seed))
    assert sum(s["accepted"] for s in result.row_stats) > 0.1 * N_ROWS
    return np.array([row[:2] for row in result.tokens])


def _pvalues(target, tok, out: np.ndarray) -> tuple[float, float]:
    V = target.config.vocab_size
    (first, _), joint = target_laws(target, tok(PROMPTS[0], return_tensors="pt").input_ids, 1.0, 2)
    return (chisquare_pvalue(counts(out[:, 0], V), first),
            chisquare_pvalue(counts(out[:, 0] * V + out[:, 1], V * V), joint.flatten()))


@pytest.mark.slow
def test_sampling_with_a_reduced_vocabulary_follows_the_target(gpt2):
    target, draft, tok = gpt2
    engine = SpeculativeEngine(target, VocabMapDrafter(draft, _vocabulary(target, tok)), get_sampler("exact"), gamma=3,
                               device="cpu", eos_token_ids=[], pad_token_id=0)
    p = _pvalues(target, tok, _first_two(engine, tok, PROMPTS[0], seed=5))
    assert min(p) > THRESHOLD, f"chi-square p = {p} <= {THRESHOLD:.3g}"


class _Unmapped(VocabMapDrafter):
    """WRONG: scatters the draft's K logits into target ids 0 .. K - 1 (the map forgotten), while it proposes the
    mapped ids."""

    def target_logits(self, logits):
        wide = logits.new_full((*logits.shape[:-1], self.setup.target_vocab), float("-inf"))
        wide[..., : logits.shape[-1]] = logits
        return wide


@pytest.mark.slow
def test_negative_control_logits_without_the_map_fail(gpt2):
    target, draft, tok = gpt2
    engine = SpeculativeEngine(target, _Unmapped(draft, _vocabulary(target, tok)), get_sampler("exact"), gamma=3,
                               device="cpu", eos_token_ids=[], pad_token_id=0)
    enc = tok([PROMPTS[0]] * N_ROWS, return_tensors="pt")
    out = np.array([r[:2] for r in engine.generate(enc.input_ids, enc.attention_mask, 3,
                                                   torch.Generator().manual_seed(5)).tokens])
    assert min(_pvalues(target, tok, out)) <= THRESHOLD, "the unmapped logits passed: the test has no power"


def test_ranked_vocab_is_the_lowest_ids_and_the_special_tokens():
    from pipeline.decoding.drafters.vocab_map import ranked_vocab
    from pipeline.errors import SpecsweepError

    assert ranked_vocab(4, 100, [1, 97, 200]) == [0, 1, 2, 3, 97]     # 200 is past the head: ignored
    with pytest.raises(SpecsweepError, match="--draft-vocab 100 is not fewer than the draft's 100 tokens"):
        ranked_vocab(100, 100, [])


def test_run_with_draft_vocab_cuts_any_drafts_head_and_stays_the_target_alone(tmp_path):
    """`specsweep run --draft-vocab K` on a plain draft (no map of its own): a grid of the whole vocabulary and two
    K, greedy, each emitting the target alone's tokens; the results record K, and a K at least the vocabulary, or
    with a drafter without a model, is one line with exit code 2."""
    import json

    from tiny_models import save_pair, write_prompts

    from pipeline.cli import main

    target, draft = save_pair(tmp_path)
    data = write_prompts(tmp_path / "p.jsonl")
    common = ["run", "--target", str(target), "--data", str(data), "--device", "cpu", "--max-new-tokens", "12",
              "--temperature", "0", "--repeats", "3", "--no-progress"]
    assert main([*common, "--gamma", "0", "--out", str(tmp_path / "ar.json")]) == 0
    assert main([*common, "--draft", str(draft), "--gamma", "3", "--draft-vocab", "all,40,80", "--baseline",
                 str(tmp_path / "ar.json"), "--out", str(tmp_path / "k{draft_vocab}.json")]) == 0
    for name, k in (("kNone", None), ("k40", 40), ("k80", 80)):
        result = json.loads((tmp_path / f"{name}.json").read_text())
        assert result["config"]["draft_vocab"] == k
        if k is not None:      # K ids and the special tokens
            assert k <= result["resolved"]["drafter"]["draft_vocab"] <= k + 3
        agreement = result["metrics"]["greedy_agreement"]
        assert agreement["identical"] == agreement["samples"] == len(result["samples"]) > 0
    assert main([*common, "--draft", str(draft), "--gamma", "3", "--draft-vocab", "100000", "--out",
                 str(tmp_path / "big.json")]) == 2
    assert main([*common, "--drafter", "prompt-lookup", "--draft-vocab", "40", "--out", str(tmp_path / "pl.json")]) == 2
