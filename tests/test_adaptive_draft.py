"""Adaptive draft length (pipeline/decoding/draft_policy.py): the heuristic schedule and the confidence threshold.

Exactness: the stopping rule depends only on the draft's own distribution and on earlier steps, and a row that stops
pads with one-hot argmax proposals, so the emitted tokens still follow the target: chi-square tests of the first
three emitted tokens of many rows decoded together (rows ragged: each wants its own draft length), and a negative
control (padding whose proposal disagrees with its one-hot distribution) that the same test rejects. Greedy
verification with an adaptive length still reproduces the target's greedy decoding, and a generate call adds no
host sync. Chi-square tests here: 6 (counted against tests/stat_utils.py's MAX_TESTS).
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch
from stat_utils import THRESHOLD, assert_fits, chisquare_pvalue, counts, target_marginals
from tiny_models import PROMPTS, load_saved_pair

from pipeline.config import RunConfig
from pipeline.decoding.draft_policy import DraftLengths, DraftPolicy, row_limits
from pipeline.decoding.drafters.base import DraftAsk, DraftPrompt
from pipeline.decoding.drafters.model import ModelDrafter
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.decoding.timing import PhaseTimer
from pipeline.errors import SpecsweepError
from pipeline.samplers import get_sampler

EOS = 1
N_ROWS = 6000


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(target, draft, tokenizer) of the tiny GPT-2 pair, on the CPU."""
    return load_saved_pair(tmp_path_factory.mktemp("adaptive"), kind="gpt2")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---- the host-side rules --------------------------------------------------------------------------------------

def test_heuristic_grows_by_two_after_a_full_acceptance_and_shrinks_by_one_after_a_rejection():
    lengths = DraftLengths(DraftPolicy("heuristic", 0.0, 6), gamma=3, ceiling=6)
    accepted = [0, 0, 0]
    assert lengths.step_gamma([0, 1, 2], accepted, room=50) == 3
    accepted = [3, 1, 0]                                  # row 0 accepted all 3, row 1 one, row 2 none
    assert lengths.step_gamma([0, 1, 2], accepted, room=50) == 5
    assert lengths.want == {0: 5, 1: 2, 2: 2}
    limits = row_limits(lengths.wanted(), 5, torch.device("cpu"))
    assert limits.tolist() == [5, 2, 2]                   # rows 1 and 2 pad their positions 2..4
    accepted = [8, 1, 0]                                  # row 0 all 5 again: capped at γ_max; rows 1, 2 rejected
    assert lengths.step_gamma([0, 1, 2], accepted, room=50) == 6
    assert lengths.want == {0: 6, 1: 1, 2: 1}
    accepted = [8, 2, 1]                                  # rows 1, 2 accepted their single token; row 0 rejected
    assert lengths.step_gamma([1, 2], accepted, room=50) == 3   # row 0 finished: only active rows count
    assert lengths.want == {0: 5, 1: 3, 2: 3}
    assert row_limits(lengths.wanted(), 3, torch.device("cpu")) is None   # every active row drafts all 3
    assert lengths.step_gamma([1, 2], [8, 5, 4], room=3) == 2   # never more than the room left allows


def test_confidence_rule_drafts_next_about_as_far_as_the_draft_stayed_confident():
    lengths = DraftLengths(DraftPolicy("constant", 0.5, 6), gamma=4, ceiling=6)
    assert lengths.step_gamma([0, 1], [0, 0], room=50) == 4
    lengths.record(torch.tensor([4, 1]))                  # row 0 stayed confident at all 4; row 1 fell at position 0
    assert lengths.step_gamma([0, 1], [2, 0], room=50) == 5
    assert lengths.want == {0: 5, 1: 1}
    lengths.record(torch.tensor([3, 1]))                  # row 0 fell at position 2 (3 proposed); row 1 never fell
    assert lengths.step_gamma([0, 1], [2, 1], room=50) == 3
    assert lengths.want == {0: 3, 1: 2}


def test_drafter_pads_past_each_rows_length_with_one_hot_argmax(pair):
    """Row 0 may draft 3 positions, row 1 only 1: row 1's positions 1 and 2 are the draft's argmax with one-hot
    logits, and the confident counts say so. With a confidence threshold of 1 every row stops after position 0."""
    target, draft, tok = pair
    enc = tok(PROMPTS[:2], return_tensors="pt", padding=True)
    engine = SpeculativeEngine(target, draft, get_sampler("exact"), gamma=3, device="cpu", eos_token_ids=[],
                               pad_token_id=0)
    for confidence, limits, want in ((0.0, torch.tensor([3, 1]), [3, 1]), (0.999999, None, [1, 1])):
        drafter = ModelDrafter(draft)
        drafter.bind(dataclasses.replace(engine.drafter.setup, draft_temperature=1.0))
        drafter.start(DraftPrompt(enc.input_ids, enc.attention_mask.bool(), True, None, {}, None, 64, 8,
                                  PhaseTimer("cpu")))
        proposal = drafter.propose(DraftAsk(3, torch.rand(2, 3, generator=_gen(0)), True, limits,
                                            None if limits is None else limits.tolist(), confidence))
        tokens, logits = proposal.tokens, proposal.logits
        assert proposal.confident.tolist() == want
        for row, n in enumerate(want):
            pad = logits[row, n:]
            assert (torch.isinf(pad).sum(-1) == pad.shape[-1] - 1).all()          # one finite entry per position
            assert (pad.argmax(-1) == tokens[row, n:]).all()
            assert torch.isfinite(logits[row, :n]).all()                        # its own positions: the draft's


def test_run_settings_are_checked_with_one_line_errors(tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text('{"id": "a", "prompt": "the storm"}\n')
    base = {"target": "t", "draft": "d", "data": str(data)}
    for extra, words in (({"draft_confidence": 1.5}, "--draft-confidence must be in [0, 1)"),
                         ({"gamma_max": 6}, "--gamma-max applies to an adaptive draft length"),
                         ({"draft_schedule": "heuristic", "gamma_max": 2}, "--gamma-max must be >= --gamma"),
                         ({"draft_schedule": "heuristic", "gamma": 0}, "needs --gamma > 0"),
                         ({"draft_confidence": 0.4, "engine": "hf"}, "use --engine specsweep")):
        with pytest.raises(SpecsweepError, match=re.escape(words)) as e:
            RunConfig.from_dict({**base, **extra}).validate()
        assert "\n" not in str(e.value)
    assert DraftPolicy.of(RunConfig.from_dict({**base, "gamma": 3})) is None
    policy = DraftPolicy.of(RunConfig.from_dict({**base, "gamma": 3, "draft_schedule": "heuristic", "gamma_max": 7}))
    assert policy.adaptive and policy.ceiling(3) == 7


# ---- the engine -------------------------------------------------------------------------------------------------

POLICIES = {"heuristic": DraftPolicy("heuristic", 0.0, 6), "confidence": DraftPolicy("constant", 0.6, 5),
            "both": DraftPolicy("heuristic", 0.7, 6)}


@pytest.mark.parametrize("name", list(POLICIES))
def test_greedy_verification_with_an_adaptive_length_is_lossless(pair, name):
    target, draft, tok = pair
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    reference = SpeculativeEngine(target, None, get_sampler("greedy"), gamma=0, device="cpu", eos_token_ids=[EOS],
                                  pad_token_id=0).generate(
        enc.input_ids, enc.attention_mask, 24).tokens
    engine = SpeculativeEngine(target, draft, get_sampler("greedy", temperature=0.0), gamma=2, device="cpu",
                               eos_token_ids=[EOS], pad_token_id=0, draft_policy=POLICIES[name])
    result = engine.generate(enc.input_ids, enc.attention_mask, 24)
    assert result.tokens == reference
    one = tok(PROMPTS[3], return_tensors="pt")
    assert engine.generate(one.input_ids, one.attention_mask, 24).tokens == [reference[3]]


@pytest.mark.parametrize("batch", [1, len(PROMPTS)])
def test_an_adaptive_length_adds_no_host_sync(pair, batch):
    """The only syncs the op-level detector may see in a generate call are the two of the final finite check: the
    per-row lengths reach the device and the confident lengths the host without one (tests/test_engine.py has the
    same bound for a fixed γ). That is the policy as a GPU runs it (no in-step stop); on a CPU the in-step stop reads
    one value per draft forward, and nothing else."""
    from sync_detector import NoHostSync

    target, draft, tok = pair
    enc = tok(PROMPTS[:batch], return_tensors="pt", padding=True)
    engine = SpeculativeEngine(target, draft, get_sampler("exact"), gamma=2, device="cpu", eos_token_ids=[],
                               pad_token_id=0, draft_policy=POLICIES["both"])
    assert engine.policy.in_step                                                  # a CPU stops in the step
    for in_step in (False, True):
        engine.policy = dataclasses.replace(engine.policy, in_step=in_step)
        with NoHostSync() as mode:
            res = engine.generate(enc.input_ids, enc.attention_mask, 24, _gen(0))
        assert res.verify_steps >= 5
        if not in_step:
            assert len(mode.syncs) <= 2, sorted(set(mode.syncs))
        else:
            assert set(mode.syncs) <= {"aten::is_nonzero", "aten::item", "aten::_local_scalar_dense"}
            assert len(mode.syncs) <= 2 + res.extra["draft_forwards"] + res.verify_steps


def test_on_a_cpu_the_confidence_rule_stops_drafting_in_the_step(pair):
    """At batch 1, a threshold no confidence reaches stops every step's drafting after its first token (on a CPU:
    DraftPolicy.on): each step proposes one token where γ_max is 5, so the draft runs about one forward a step (the
    first step's first token comes from its prompt's forward), and the output is the target alone's. On a GPU the
    policy pads instead (in_step off)."""
    target, draft, tok = pair
    one = tok(PROMPTS[3], return_tensors="pt")
    reference = SpeculativeEngine(target, None, get_sampler("greedy"), gamma=0, device="cpu", eos_token_ids=[EOS],
                                  pad_token_id=0).generate(one.input_ids, one.attention_mask, 24).tokens
    policy = DraftPolicy("constant", 0.999999, 5)
    assert policy.on(torch.device("cpu")).in_step and not policy.on(torch.device("cuda")).in_step
    assert not DraftPolicy("heuristic", 0.0, 5).on(torch.device("cpu")).in_step     # no threshold, nothing to stop
    engine = SpeculativeEngine(target, draft, get_sampler("greedy", temperature=0.0), gamma=2, device="cpu",
                               eos_token_ids=[EOS], pad_token_id=0, draft_policy=policy)
    widths = []
    propose = engine.drafter.propose

    def spy(ask):
        proposal = propose(ask)
        widths.append((ask.gamma, proposal.width))
        return proposal

    engine.drafter.propose = spy
    result = engine.generate(one.input_ids, one.attention_mask, 24)
    assert result.tokens == reference
    assert widths and all(w == 1 for _, w in widths) and max(g for g, _ in widths) == 5
    assert result.extra["draft_forwards"] == result.verify_steps - 1
    assert result.row_stats[0]["drafted"] == result.verify_steps


def _emitted(engine, tok, prompt: str, n: int, seed: int) -> np.ndarray:
    """The first ``n`` tokens of N_ROWS rows of ``prompt``, decoded together for n + 2 tokens (so the second step has
    room for more than one draft token, and rows wanting fewer pad). int [N_ROWS, n]."""
    enc = tok([prompt] * N_ROWS, return_tensors="pt", padding=True)
    result = engine.generate(enc.input_ids, enc.attention_mask, n + 2, _gen(seed))
    stats = result.row_stats
    assert 0 < sum(s["accepted"] for s in stats) < sum(s["drafted"] for s in stats)
    return np.array(result.tokens)[:, :n]


@pytest.mark.slow
@pytest.mark.parametrize("name,temperature,in_step", [("both", 1.0, False), ("confidence", 0.7, False),
                                                      ("confidence", 0.7, True)])
def test_exact_sampling_with_an_adaptive_length_follows_the_target(pair, name, temperature, in_step, monkeypatch):
    """First, second and third emitted tokens of `exact` with an adaptive draft length, 6000 rows decoded together
    (each row wants its own length from the second step on), against the target's laws by enumeration. The rows
    did pad: some after their confidence fell, some past a length shorter than the step's. Without the in-step stop
    (as on a GPU) and with it (a CPU's: the rows start alike, so their first step stops drafting where they fell)."""
    target, draft, tok = pair
    engine = SpeculativeEngine(target, draft, get_sampler("exact", temperature=temperature), gamma=2, device="cpu",
                               eos_token_ids=[], pad_token_id=0, draft_policy=POLICIES[name])
    engine.policy = dataclasses.replace(engine.policy, in_step=in_step)
    import pipeline.decoding.engine

    padded, limited = [], []
    record = DraftLengths.record

    def spy_record(self, confident):
        padded.append(self._gamma * confident.numel() - int(confident.sum()))
        return record(self, confident)

    def spy_limits(lengths, gamma, device):
        limits = row_limits(lengths, gamma, device)
        limited.append(limits is not None)
        return limits

    narrow = []
    propose = engine.drafter.propose

    def spy_propose(ask):
        proposal = propose(ask)
        narrow.append(proposal.width < ask.gamma)
        return proposal

    monkeypatch.setattr(DraftLengths, "record", spy_record)
    monkeypatch.setattr(pipeline.decoding.engine, "row_limits", spy_limits)
    monkeypatch.setattr(engine.drafter, "propose", spy_propose)
    out = _emitted(engine, tok, PROMPTS[0], 3, seed=3)
    assert sum(padded) > 0 and (any(limited) or name == "confidence")
    assert any(narrow) == in_step                 # the in-step stop cut a step's proposal short
    V = target.config.vocab_size
    laws = target_marginals(target, tok(PROMPTS[0], return_tensors="pt").input_ids, temperature, 3)
    for k, law in enumerate(laws):
        assert_fits(counts(out[:, k], V), law, f"{name}, T={temperature}: emitted token {k + 1}")


class _PaddingOffItsDistribution(ModelDrafter):
    """WRONG: where a row pads, it proposes another token than the one its one-hot draft distribution names."""

    def propose(self, ask):
        proposal = super().propose(ask)
        logits = proposal.logits
        one_hot = torch.isinf(logits).sum(-1) == logits.shape[-1] - 1                  # [b, γ]
        proposal.tokens = torch.where(one_hot, (proposal.tokens + 1) % logits.shape[-1], proposal.tokens)
        return proposal


def _short_draft_corrected(monkeypatch, draft):
    """WRONG: a row that accepted its whole draft, shorter than the step's, gets a corrected token (the residual
    against the padding at its length) instead of a bonus token from the target there."""
    import pipeline.samplers.torch_ref

    monkeypatch.setattr(pipeline.samplers.torch_ref, "is_full", lambda accepted, gamma, lengths: accepted == gamma)
    return draft


def _padding_off_its_distribution(monkeypatch, draft):
    return _PaddingOffItsDistribution(draft)


@pytest.mark.slow
@pytest.mark.parametrize("wrong", [_padding_off_its_distribution, _short_draft_corrected])
def test_negative_controls_fail_the_same_test(pair, monkeypatch, wrong):
    target, draft, tok = pair
    engine = SpeculativeEngine(target, wrong(monkeypatch, draft), get_sampler("exact", temperature=1.0), gamma=2,
                               device="cpu", eos_token_ids=[], pad_token_id=0, draft_policy=POLICIES["both"])
    engine.policy = dataclasses.replace(engine.policy, in_step=False)    # the padding these get wrong, as on a GPU
    out = _emitted(engine, tok, PROMPTS[0], 3, seed=3)
    V = target.config.vocab_size
    laws = target_marginals(target, tok(PROMPTS[0], return_tensors="pt").input_ids, 1.0, 3)
    pvalues = [chisquare_pvalue(counts(out[:, k], V), law) for k, law in enumerate(laws)]
    assert min(pvalues) <= THRESHOLD, f"{wrong.__name__} passed (p = {pvalues}): the test has no power"


def test_the_study_searches_the_threshold_and_gamma_max(tmp_path):
    """The search space's draft modes: heuristic trials sample γ_max >= their γ, confidence trials a threshold in
    its range; a space without draft modes records no draft keys, so a study created before them continues."""
    import optuna

    from pipeline.tuning.space import SearchSpace

    path = tmp_path / "space.yaml"
    path.write_text("gamma: {low: 1, high: 4}\nsampler: [exact]\ndraft: [fixed, heuristic, confidence]\n"
                    "draft_confidence: {low: 0.2, high: 0.8}\ngamma_max: {low: 3, high: 6}\n")
    space = SearchSpace.load(path)
    assert space.first_point()["draft"] == "fixed"
    study = optuna.create_study(directions=["maximize", "maximize"], sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(30):
        trial = study.ask()
        p = space.suggest(trial)
        study.tell(trial, [1.0, 1.0])
        RunConfig.from_dict({"target": "t", "draft": "d", "data": str(path), **p}).validate()
        if p["draft_schedule"] == "heuristic":
            seen.add("heuristic")
            assert max(p["gamma"], 3) <= p["gamma_max"] <= 6 and p["draft_confidence"] == 0
        elif p["draft_confidence"] > 0:
            seen.add("confidence")
            assert 0.2 <= p["draft_confidence"] <= 0.8 and p["gamma_max"] is None
        else:
            seen.add("fixed")
    assert seen == {"fixed", "heuristic", "confidence"}
    assert "drafts" in space.recorded()
    path.write_text("gamma: {low: 1, high: 4}\nsampler: [exact]\n")
    assert set(SearchSpace.load(path).recorded()) == {"gamma", "samplers", "params", "dtypes", "known_good"}
    for bad, words in (("draft: [sometimes]\n", "draft must be"), ("draft_confidence: {low: 0.0, high: 0.5}\n",
                       "draft_confidence needs"), ("gamma_max: {low: 5, high: 3}\n", "gamma_max needs")):
        path.write_text("sampler: [exact]\n" + bad)
        with pytest.raises(SpecsweepError, match=words) as e:
            SearchSpace.load(path)
        assert "\n" not in str(e.value)
