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
    reference = SpeculativeEngine(target, None, get_sampler("greedy"), gamma=0, device="cpu", eos_token_ids=[EOS],
                                  pad_token_id=0).generate(
        enc.input_ids, enc.attention_mask, 24).tokens
    engine = SpeculativeEngine(target, _drafters()[name](), get_sampler(sampler, temperature=0.0), gamma=4,
                               device="cpu", eos_token_ids=[EOS], pad_token_id=0)
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
    engine = SpeculativeEngine(target, prompt_lookup(2, 3, [EOS]), get_sampler("exact", temperature=1.0), gamma=4,
                               device="cpu", eos_token_ids=[EOS], pad_token_id=0)
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
    greedy = SpeculativeEngine(target, None, get_sampler("greedy"), gamma=0, device="cpu", eos_token_ids=[],
                               pad_token_id=0).generate(
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
    engine = SpeculativeEngine(target, _drafters()[name](), get_sampler(sampler, temperature=temperature), gamma=3,
                               device="cpu", eos_token_ids=[], pad_token_id=0)
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
    engine = SpeculativeEngine(target, prompt_lookup(1, 3, [EOS]), _AcceptEverything(), gamma=3, device="cpu",
                               eos_token_ids=[], pad_token_id=0)
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
    for extra, words in (({"engine": "hf", "batch_size": 1}, "runs in our engine"),
                         ({"draft_schedule": "heuristic"}, "drop --draft-schedule"),
                         ({"lookup_min": 3, "lookup_max": 2}, "need 1 <= --lookup-min <= --lookup-max"),
                         ({"drafter": "suffix", "suffix_min_prob": 1.5}, "--suffix-min-prob in [0, 1]"),
                         ({"sampler": "sigmoid", "temperature": 1.0}, "sigmoid")):
        with pytest.raises(SpecsweepError, match=re.escape(words)) as e:
            RunConfig.from_dict({**base, **extra}).validate()
        assert "\n" not in str(e.value)
    RunConfig.from_dict(base).validate()
    RunConfig.from_dict({**base, "draft": "d"}).validate()        # a grid's draft, not loaded for this drafter
    with pytest.raises(SpecsweepError, match="--drafter prompt-lookup or suffix"):
        RunConfig.from_dict({"target": "t", "data": str(data), "gamma": 2}).validate()


def test_specsweep_run_with_prompt_lookup_records_its_drafter(pair, tmp_path):
    from pipeline.cli import main

    root = tmp_path / "pair"
    load_saved_pair(root, kind="gpt2")
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i}", "prompt": p}) + "\n" for i, p in enumerate(REPEATING)))
    out = tmp_path / "lookup.json"
    assert main(["run", "--target", str(root / "target"), "--draft", str(root / "draft"),
                 "--drafter", "prompt-lookup", "--lookup-max", "2",
                 "--data", str(data), "--device", "cpu", "--temperature", "0", "--sampler", "greedy",
                 "--max-new-tokens", "12", "--repeats", "3", "--samples-per-repeat", "2", "--no-progress",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["resolved"]["drafter"] == {"drafter": "prompt-lookup", "lookup_min": 1, "lookup_max": 2}
    assert result["config"]["drafter"] == "prompt-lookup" and result["metrics"]["draft_forwards"] == 0
    assert result["config"]["draft"] is None                   # given, but not loaded: recorded as none
    assert result["metrics"]["accepted_tokens"] > 0


def _lookup_schedule(drafter: dict) -> dict:
    """A one-cell schedule whose every pick is exact sampling at γ 5 with ``drafter`` (no draft model)."""
    settings = {"gamma": 5, "sampler": "exact", "params": {}, "draft_schedule": "constant", "draft_confidence": 0.0,
                "gamma_max": None, "temperature": 0.0, "drafter": drafter}
    pick = {"settings": settings, "speedup": 1.3, "ci_low": 1.2, "ci_high": 1.4, "faster_than_target": True}
    return {"draft": None, "cells": [{"batch_size": 1, "context": None, "choice": pick, "standard": pick,
                                      "standard_fixed": pick}]}


def test_drafters_export_to_the_tools_that_have_them(tmp_path):
    from transformers import GenerationConfig

    from pipeline.tuning.export import export
    from pipeline.tuning.schedule import settings_of

    lookup = settings_of({"gamma": 5, "sampler": "exact", "drafter": "prompt-lookup", "lookup_min": 1,
                          "lookup_max": 3})["drafter"]
    assert lookup == {"drafter": "prompt-lookup", "lookup_min": 1, "lookup_max": 3}
    path, _ = export(_lookup_schedule(lookup), "vllm", tmp_path / "vllm.json")
    assert json.loads(path.read_text()) == {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 1,
                                            "prompt_lookup_max": 3}
    path, _ = export(_lookup_schedule(lookup), "hf", tmp_path / "hf")
    config = GenerationConfig.from_pretrained(str(path.parent))
    assert (config.prompt_lookup_num_tokens, config.max_matching_ngram_size) == (5, 3)
    path, _ = export(_lookup_schedule(lookup), "trtllm", tmp_path / "trt.yaml")
    assert "decoding_type: NGram" in path.read_text()
    suffix = {"drafter": "suffix", "suffix_depth": 24, "suffix_factor": 2.0, "suffix_min_prob": 0.1,
              "suffix_outputs": True}
    path, _ = export(_lookup_schedule(suffix), "vllm", tmp_path / "suffix.json")
    assert json.loads(path.read_text())["method"] == "suffix"
    with pytest.raises(SpecsweepError, match="transformers has no suffix drafter"):
        export(_lookup_schedule(suffix), "hf", tmp_path / "hf-suffix")


def test_the_search_space_searches_drafters_and_prunes_what_cannot_run():
    import optuna

    from pipeline.tuning.space import SearchSpace

    space = SearchSpace(samplers=("exact", "sigmoid"), drafters=("model", "prompt-lookup", "suffix"),
                        drafts=("fixed", "heuristic")).check()
    params = space.suggest(optuna.trial.FixedTrial({"gamma": 4, "sampler": "exact", "dtype": "float32",
                                                    "drafter": "prompt-lookup", "lookup_max": 2}))
    assert params["drafter"] == "prompt-lookup" and params["lookup_max"] == 2 and "draft_schedule" not in params
    params = space.suggest(optuna.trial.FixedTrial({"gamma": 4, "sampler": "exact", "dtype": "float32",
                                                    "drafter": "model", "draft": "heuristic", "gamma_max": 6}))
    assert params["drafter"] == "model" and params["draft_schedule"] == "heuristic"
    with pytest.raises(optuna.TrialPruned):
        space.suggest(optuna.trial.FixedTrial({"gamma": 4, "sampler": "sigmoid", "dtype": "float32", "alpha": 1.0,
                                               "beta": 0.0, "drafter": "suffix", "suffix_factor": 1.0}), 1.0)
    assert "drafters" not in SearchSpace().recorded()          # a study made before drafters continues


def test_the_report_compares_a_targets_drafters(tmp_path):
    """Runs of one target with its draft model and with prompt lookup: the report's Drafters section has a row per
    drafter with its fastest lossless setting, and a figure of them on one front."""
    from test_schedule import fake_result

    from pipeline.analysis.build import build_report
    from pipeline.results_table import load_runs

    runs = tmp_path / "runs"
    model = fake_result(runs / "model-g4.json", gamma=4, ratios=[1.5, 1.6, 1.55, 1.52, 1.58, 1.6])
    measured = json.loads(model.read_text())
    measured["metrics"]["cost_ratio"] = 0.12
    model.write_text(json.dumps(measured))
    fake_result(runs / "model-sigmoid.json", gamma=4, ratios=[1.9, 2.0, 1.95, 1.9, 1.92, 2.0], sampler="sigmoid",
                rouge=0.49)
    lookup = fake_result(runs / "lookup-g4.json", gamma=4, ratios=[1.2, 1.25, 1.22, 1.22, 1.24, 1.2])
    result = json.loads(lookup.read_text())
    result["config"].update(drafter="prompt-lookup", draft=None, lookup_min=1, lookup_max=3)
    lookup.write_text(json.dumps(result))
    table = load_runs(runs)
    assert sorted(table["draft"]) == ["models/draft", "models/draft", "prompt-lookup"]
    written = build_report(table, tmp_path / "report")
    text = (tmp_path / "report" / "report.md").read_text()
    section = text[text.index("## Drafters"):]
    section = section[: section.index("\n## ", 3)] if "\n## " in section[3:] else section
    assert "| models/draft | exact | 4 | 1.56x" in section and "| prompt-lookup | exact | 4 | 1.22x" in section
    assert "sigmoid" not in section                        # the fastest *lossless* setting of each drafter
    assert any(name.startswith("drafters-") for name in written)
    # a draft model's cost ratio c is shown, a drafter without a model has none
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]] for line in section.splitlines()
            if line.startswith("| models/draft") or line.startswith("| prompt-lookup")}
    assert "| c (draft / target forward) |" in section
    assert rows["prompt-lookup"][6] == "-" and rows["models/draft"][6] == "0.12"


def test_a_pair_without_a_draft_model_searches_the_drafters_that_need_none():
    from pipeline.tuning.space import SearchSpace, space_for_pair

    both = SearchSpace(drafters=("model", "prompt-lookup", "suffix")).check()
    no_draft = RunConfig(target="t", data="d", drafter="prompt-lookup")
    assert space_for_pair(both, no_draft).drafters == ("prompt-lookup", "suffix")
    assert space_for_pair(both, no_draft).first_point()["drafter"] == "prompt-lookup"
    lookup = SearchSpace(drafters=("prompt-lookup",)).check()
    assert space_for_pair(lookup, no_draft) is lookup
    with pytest.raises(SpecsweepError, match="this pair has no --draft"):
        space_for_pair(SearchSpace().check(), RunConfig(target="t", data="d"))


def test_gamma_has_a_range_per_drafter(tmp_path):
    """gamma_by_drafter: a lookup drafter's trials sample γ from its own range (where lookup pays), the draft model's
    from gamma; the space reads it from YAML, refuses a drafter it does not search, and records it only when set."""
    import optuna

    from pipeline.tuning.space import SearchSpace

    path = tmp_path / "space.yaml"
    path.write_text("gamma: {low: 2, high: 6}\nsampler: [exact]\ndrafter: [model, prompt-lookup]\n"
                    "gamma_by_drafter: {prompt-lookup: {low: 8, high: 12}}\n")
    space = SearchSpace.load(path)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen: dict[str, set[int]] = {"model": set(), "prompt-lookup": set()}
    for _ in range(60):
        trial = study.ask()
        params = space.suggest(trial)
        seen[params["drafter"]].add(params["gamma"])
        study.tell(trial, 1.0)
    assert seen["model"] and seen["model"] <= set(range(2, 7)), seen
    assert seen["prompt-lookup"] and seen["prompt-lookup"] <= set(range(8, 13)), seen
    assert space.recorded()["gamma_by_drafter"] == {"prompt-lookup": [8, 12]}
    assert "gamma_by_drafter" not in SearchSpace().recorded()     # a study made before it continues
    # the known-good first trial's γ is clamped into its drafter's range
    lookup_first = SearchSpace(drafters=("prompt-lookup",), gamma_by_drafter={"prompt-lookup": (8, 12)}).check()
    assert lookup_first.first_point(gamma=2) == {"sampler": "exact", "gamma": 8, "dtype": "float32",
                                                 "drafter": "prompt-lookup"}
    path.write_text("drafter: [model]\ngamma_by_drafter: {suffix: {low: 4, high: 8}}\n")
    with pytest.raises(SpecsweepError, match="gamma_by_drafter names 'suffix', which is not in drafter"):
        SearchSpace.load(path)
    path.write_text("drafter: [suffix]\ngamma_by_drafter: {suffix: {low: 0, high: 8}}\n")
    with pytest.raises(SpecsweepError, match="needs 1 <= low <= high"):
        SearchSpace.load(path)
