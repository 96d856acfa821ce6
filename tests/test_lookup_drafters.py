"""Drafters without a draft model (pipeline/decoding/drafters/lookup.py): prompt lookup and suffix decoding through
the engine, lossless at T = 0 and at T > 0, with ragged per-row proposals, and through `specsweep run`."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from stat_utils import THRESHOLD, chisquare_pvalue, counts, target_laws
from tiny_models import load_saved_pair, write_prompts

from pipeline.config import RunConfig
from pipeline.decoding.drafters.lookup import LookupDrafter, prompt_lookup, suffix_decoding
from pipeline.decoding.drafters.ngram import NgramIndex
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.errors import SpecsweepError
from pipeline.samplers import get_sampler

EOS = 1
# repeated phrases, so that both proposers find matches from the first step; the last prompt repeats nothing
REPEATING = ["the storm hit the city and the storm hit the",
             "police said the plane was late police said the plane",
             "a new report a new report a new",
             "water"]
N_ROWS = 4000


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(target, draft, tokenizer) of the tiny GPT-2 pair; the lookup drafters use the target alone."""
    return load_saved_pair(tmp_path_factory.mktemp("lookup"), kind="gpt2")


def _drafters():
    return {"prompt-lookup": lambda: prompt_lookup(1, 3, [EOS]), "suffix": lambda: suffix_decoding(24, 2.0, 0.1, False),
            "suffix+outputs": lambda: suffix_decoding(24, 2.0, 0.1, True)}


@pytest.mark.parametrize("name", list(_drafters()))
@pytest.mark.parametrize("sampler", ["greedy", "exact", "block"])
def test_greedy_decoding_with_a_lookup_drafter_is_the_target_alone(pair, name, sampler):
    target, _, tok = pair
    enc = tok(REPEATING, return_tensors="pt", padding=True)
    reference = SpeculativeEngine(target, None, get_sampler("greedy"), 0, "cpu", [EOS], 0).generate(
        enc.input_ids, enc.attention_mask, 24).tokens
    engine = SpeculativeEngine(target, _drafters()[name](), get_sampler(sampler, temperature=0.0), 4, "cpu", [EOS], 0)
    for _ in range(2):   # the second call reads the first's outputs (suffix+outputs): still the target's tokens
        result = engine.generate(enc.input_ids, enc.attention_mask, 24)
        assert result.tokens == reference
    stats = result.row_stats
    assert sum(s["accepted"] for s in stats) > 0 and result.extra["draft_forwards"] == 0
    assert "lookup" in result.phase_time_s
    one = tok(REPEATING[1], return_tensors="pt")
    assert engine.generate(one.input_ids, one.attention_mask, 24).tokens == [reference[1]]


def test_rows_without_a_match_propose_nothing_and_are_verified_alone(pair):
    """A batch where one row matches and one never does: the empty row's steps emit one target token each, the other
    row's proposals are verified at their own lengths; with per-example randomness each row decodes as it would
    alone."""
    from pipeline.rng import RowGenerators

    target, _, tok = pair
    prompts = [REPEATING[2], REPEATING[3]]
    enc = tok(prompts, return_tensors="pt", padding=True)
    engine = SpeculativeEngine(target, prompt_lookup(2, 3, [EOS]), get_sampler("exact", temperature=1.0), 4, "cpu",
                               [EOS], 0)
    both = engine.generate(enc.input_ids, enc.attention_mask, 16, RowGenerators(7, ["a", "b"], "cpu"))
    for i, p in enumerate(prompts):
        one = tok(p, return_tensors="pt")
        alone = engine.generate(one.input_ids, one.attention_mask, 16, RowGenerators(7, ["ab"[i]], "cpu"))
        assert alone.tokens[0] == both.tokens[i]
    assert both.row_stats[0]["drafted"] > 0


@pytest.fixture(scope="module")
def echo(pair) -> str:
    """A prompt whose lookup proposals the target often takes at T = 1: a phrase, the target's greedy continuation of
    it, and the phrase again (prompt lookup and suffix decoding then propose that continuation)."""
    target, _, tok = pair
    phrase = "a new report"
    enc = tok(phrase, return_tensors="pt")
    greedy = SpeculativeEngine(target, None, get_sampler("greedy"), 0, "cpu", [], 0).generate(
        enc.input_ids, enc.attention_mask, 8).tokens[0]
    return f"{phrase} {tok.decode(greedy)} {phrase}"


def _first_two(engine, tok, prompt: str, seed: int) -> np.ndarray:
    enc = tok([prompt] * N_ROWS, return_tensors="pt")
    result = engine.generate(enc.input_ids, enc.attention_mask, 3, torch.Generator().manual_seed(seed))
    assert sum(s["accepted"] for s in result.row_stats) > 0.2 * N_ROWS      # proposals were on offer and taken
    return np.array([row[:2] for row in result.tokens])


@pytest.mark.slow
@pytest.mark.parametrize("name,sampler,temperature", [("prompt-lookup", "exact", 1.0), ("prompt-lookup", "exact", 0.7),
                                                      ("suffix", "block", 1.0)])
def test_sampling_with_a_lookup_drafter_follows_the_target(pair, echo, name, sampler, temperature):
    target, _, tok = pair
    engine = SpeculativeEngine(target, _drafters()[name](), get_sampler(sampler, temperature=temperature), 3, "cpu",
                               [], 0)
    out = _first_two(engine, tok, echo, seed=3)
    V = target.config.vocab_size
    (first, _), joint = target_laws(target, tok(echo, return_tensors="pt").input_ids, temperature, 2)
    p = (chisquare_pvalue(counts(out[:, 0], V), first), chisquare_pvalue(counts(out[:, 0] * V + out[:, 1], V * V),
                                                                           joint.flatten()))
    assert min(p) > THRESHOLD, f"{name}/{sampler} T={temperature}: p = {p}"


class _AcceptEverything:
    """WRONG: a sampler that keeps every deterministic proposal (as if its probability were 1)."""

    def __init__(self):
        self.inner = get_sampler("exact", temperature=1.0)
        self.name, self.backend, self.temperature = "wrong", "torch", 1.0
        self.draft_temperature, self.verifies_by_argmax, self.params = 1.0, False, {}

    def __call__(self, tokens, draft_logits, target_logits, generator=None, lengths=None):
        res = self.inner(tokens, draft_logits, target_logits, generator=generator, lengths=lengths)
        full = torch.full_like(res.accepted, tokens.shape[1]) if lengths is None else lengths
        bonus = target_logits[torch.arange(tokens.shape[0]), full].argmax(-1)
        res.tokens = torch.cat([tokens, bonus[:, None]], 1)
        res.accepted = full
        return res


@pytest.mark.slow
def test_negative_control_accepting_every_lookup_proposal_fails(pair, echo):
    target, _, tok = pair
    engine = SpeculativeEngine(target, prompt_lookup(1, 3, [EOS]), _AcceptEverything(), 3, "cpu", [], 0)
    out = _first_two(engine, tok, echo, seed=3)
    V = target.config.vocab_size
    (first, _), _ = target_laws(target, tok(echo, return_tensors="pt").input_ids, 1.0, 2)
    assert chisquare_pvalue(counts(out[:, 0], V), first) <= THRESHOLD, "the test has no power"


def test_suffix_outputs_are_shared_but_never_a_prompts_own():
    """A finished row's output joins the shared tree once; a row whose prompt was decoded before does not read
    it."""
    drafter = suffix_decoding(24, 4.0, 0.0, True)
    assert isinstance(drafter, LookupDrafter) and drafter.outputs is not None
    seen_before = drafter.make(None)
    seen_before.start([5, 6])
    seen_before.extend([7, 8, 9, 5, 6])
    assert seen_before.propose(3) == [7, 8, 9]          # its own context, always
    assert drafter.settings == {"drafter": "suffix", "suffix_depth": 24, "suffix_factor": 4.0,
                                "suffix_min_prob": 0.0, "suffix_outputs": True}
    fresh = drafter.make(drafter.outputs)
    drafter.outputs.add([1, 2, 3, 4])
    fresh.start([9, 1, 2])
    assert fresh.propose(2) == [3, 4]                   # another prompt's output, read from the shared tree


def test_prompt_lookup_proposes_what_followed_the_longest_match():
    index = NgramIndex(1, 3, "first", [EOS])
    index.start([4, 5, 6, 7, 4, 5])
    assert index.propose(2) == [6, 7]


def test_run_settings_for_drafters_without_a_model_fail_in_one_line(tmp_path):
    data = write_prompts(tmp_path / "p.jsonl")
    base = {"target": "t", "data": str(data), "drafter": "prompt-lookup"}
    for extra, words in (({"draft": "d"}, "needs no draft model: drop --draft"),
                         ({"engine": "hf", "batch_size": 1}, "runs in our engine"),
                         ({"draft_schedule": "heuristic"}, "drop --draft-schedule"),
                         ({"lookup_min": 3, "lookup_max": 2}, "need 1 <= --lookup-min <= --lookup-max"),
                         ({"drafter": "suffix", "suffix_min_prob": 1.5}, "--suffix-min-prob in [0, 1]"),
                         ({"sampler": "sigmoid", "temperature": 1.0}, "sigmoid")):
        with pytest.raises(SpecsweepError, match=re.escape(words)) as e:
            RunConfig.from_dict({**base, **extra}).validate()
        assert "\n" not in str(e.value)
    RunConfig.from_dict(base).validate()
    with pytest.raises(SpecsweepError, match="--drafter prompt-lookup or suffix"):
        RunConfig.from_dict({"target": "t", "data": str(data), "gamma": 2}).validate()


def test_specsweep_run_with_prompt_lookup_records_its_drafter(pair, tmp_path):
    from pipeline.cli import main

    root = tmp_path / "pair"
    load_saved_pair(root, kind="gpt2")
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i}", "prompt": p}) + "\n" for i, p in enumerate(REPEATING)))
    out = tmp_path / "lookup.json"
    assert main(["run", "--target", str(root / "target"), "--drafter", "prompt-lookup", "--lookup-max", "2",
                 "--data", str(data), "--device", "cpu", "--temperature", "0", "--sampler", "greedy",
                 "--max-new-tokens", "12", "--repeats", "3", "--samples-per-repeat", "2", "--no-progress",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["resolved"]["drafter"] == {"drafter": "prompt-lookup", "lookup_min": 1, "lookup_max": 2}
    assert result["config"]["drafter"] == "prompt-lookup" and result["metrics"]["draft_forwards"] == 0
    assert result["metrics"]["accepted_tokens"] > 0
