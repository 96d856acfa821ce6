"""Drafts with another tokenizer than the target's (pipeline/decoding/drafters/cross_tokenizer.py).

The pair: a tiny word-level target and a draft over a byte-level BPE in which only the frequent words are one token
(tests/tiny_models.py ``cross_tokenizer_pair``). Exactness of the intersection mode at T = 1 and T = 0.7, and of the
string mode with the exact rule at T = 1: chi-square tests of the first emitted token and of the first two jointly,
6000 rows decoded together, against the target's laws by enumeration, and a negative control (proposal logits that
disagree with the proposals) that the same test rejects. Greedy: the string and intersection modes reproduce the
target's greedy decoding token for token, batched and alone, for GPT-2 (static cache) and Llama (transformers'
cache), over ragged batches, and with two BPEs whose re-tokenisation cuts the draft's cache back past a step's
start; transformers' own string-level drafting gives the same tokens. Chi-square tests here: 6 (counted against
tests/stat_utils.py's MAX_TESTS).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from stat_utils import THRESHOLD, chisquare_pvalue, counts, target_laws
from tiny_models import PROMPTS, WORDS, build_bpe_tokenizer, build_tokenizer, cross_tokenizer_pair

from pipeline.decoding.drafters.cross_tokenizer import TextDrafter, build_bridge, resolve_mode, same_vocabulary
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.errors import SpecsweepError
from pipeline.samplers import get_sampler

EOS = 1
N_ROWS = 6000


@pytest.fixture(scope="module")
def pair():
    target, target_tok, draft, draft_tok = cross_tokenizer_pair()
    bridge = build_bridge(target_tok, draft_tok, len(target_tok), len(draft_tok), "cpu")
    return target, target_tok, draft, draft_tok, bridge


def _engine(pair, mode: str, sampler, gamma: int = 3, eos=(EOS,), drafter=TextDrafter):
    target, target_tok, draft, _, bridge = pair
    return SpeculativeEngine(target, drafter(draft, bridge, mode), sampler, gamma=gamma, device="cpu",
                             eos_token_ids=list(eos), pad_token_id=0,
                             char_lengths=bridge.target.char_lengths(len(target_tok), "cpu"))


# ---- the bridge ---------------------------------------------------------------------------------------------------

def test_the_intersection_maps_tokens_by_the_text_they_add():
    target_tok, draft_tok = build_tokenizer(), build_bpe_tokenizer(WORDS, 450)    # a BPE too small for every word
    bridge = build_bridge(target_tok, draft_tok, len(target_tok), len(draft_tok), "cpu")
    assert not same_vocabulary(target_tok, draft_tok)
    fox = draft_tok.convert_tokens_to_ids("Ġthe")                 # the BPE's " the" is the word-level "the"
    assert bridge.d2t[fox] == target_tok.convert_tokens_to_ids("the")
    assert bridge.d2t[draft_tok.eos_token_id] == target_tok.eos_token_id
    mapped = (bridge.d2t >= 0).nonzero().flatten().tolist()
    for d in mapped:
        if d != draft_tok.eos_token_id:
            assert bridge.draft.surfaces[d] == bridge.target.surfaces[int(bridge.d2t[d])]
    # some words are split in the BPE: the intersection is a real subset of the target's vocabulary
    assert 10 < bridge.size < len(bridge.target.surfaces)
    assert bridge.target_in.sum() == len(mapped) and bridge.expansion >= 2
    assert 0 < bridge.summary()["target_share_in_intersection"] < 1


def test_the_mode_is_chosen_from_the_vocabularies_and_the_rule():
    assert resolve_mode("auto", True, False) == "shared"
    assert resolve_mode("auto", False, True) == "string"
    assert resolve_mode("auto", False, False) == "intersection"
    assert resolve_mode("string", False, False) == "string"
    with pytest.raises(SpecsweepError, match="shared needs the draft to use the target's tokenizer"):
        resolve_mode("shared", False, False)
    with pytest.raises(SpecsweepError, match="unknown draft tokenizer mode"):
        resolve_mode("bytes", False, False)


# ---- greedy: the target's own greedy output -----------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("mode", ["string", "intersection"])
def test_greedy_output_is_the_targets_token_for_token(kind, mode):
    target, target_tok, draft, draft_tok = cross_tokenizer_pair(kind)
    bridge = build_bridge(target_tok, draft_tok, len(target_tok), len(draft_tok), "cpu")
    enc = target_tok(PROMPTS, return_tensors="pt", padding=True)
    reference = SpeculativeEngine(target, None, get_sampler("greedy"), gamma=0, device="cpu", eos_token_ids=[EOS],
                                  pad_token_id=0).generate(
        enc.input_ids, enc.attention_mask, 24).tokens
    engine = _engine((target, target_tok, draft, draft_tok, bridge), mode, get_sampler("greedy"), gamma=4)
    result = engine.generate(enc.input_ids, enc.attention_mask, 24, prompt_texts=PROMPTS)
    assert result.tokens == reference
    stats = result.row_stats
    assert 0 < sum(s["accepted"] for s in stats) < sum(s["drafted"] for s in stats)
    assert 0 < sum(s["accepted_chars"] for s in stats) < sum(s["drafted_chars"] for s in stats)
    assert result.extra["cross_tokenizer"]["mode"] == mode
    for i in (0, 3):                                                     # alone, and without the prompt text
        one = target_tok(PROMPTS[i], return_tensors="pt")
        assert engine.generate(one.input_ids, one.attention_mask, 24).tokens == [reference[i]]


def test_string_mode_proposes_several_target_words_from_the_drafts_text(pair, monkeypatch):
    """A step's proposals are the target tokens of the draft's text, at most γ, cut at a word the target does not
    know; the draft reads what was emitted re-tokenised with its own tokenizer."""
    target_tok = pair[1]
    widths = []
    through_text = TextDrafter._through_text

    def spy(self, drafted, gamma, wants):
        out = through_text(self, drafted, gamma, wants)
        own = out.lengths_host or [out.width] * out.tokens.shape[0]
        widths.append((out.width, own))
        for row, n in zip(out.tokens.tolist(), own):
            assert target_tok.unk_token_id not in row[:n]
        return out

    monkeypatch.setattr(TextDrafter, "_through_text", spy)
    enc = target_tok(PROMPTS[:2], return_tensors="pt", padding=True)
    engine = _engine(pair, "string", get_sampler("greedy"), gamma=4)
    engine.generate(enc.input_ids, enc.attention_mask, 16, prompt_texts=PROMPTS[:2])
    assert widths and all(w == max(d) <= 4 for w, d in widths)
    assert any(max(d) >= 2 for _, d in widths)


# ---- sampling: the target's distribution --------------------------------------------------------------------------

def _emitted(engine, tok, prompt: str, seed: int) -> np.ndarray:
    """The first two tokens of N_ROWS rows of ``prompt``, decoded together for 4 tokens. int [N_ROWS, 2]."""
    enc = tok([prompt] * N_ROWS, return_tensors="pt", padding=True)
    result = engine.generate(enc.input_ids, enc.attention_mask, 4, torch.Generator().manual_seed(seed),
                             prompt_texts=[prompt] * N_ROWS)
    stats = result.row_stats
    assert 0.01 * sum(s["drafted"] for s in stats) < sum(s["accepted"] for s in stats)
    return np.array(result.tokens)[:, :2]


def _pvalues(out: np.ndarray, target, tok, temperature: float) -> tuple[float, float]:
    V = target.config.vocab_size
    (first, _), joint = target_laws(target, tok(PROMPTS[0], return_tensors="pt").input_ids, temperature, 2)
    return (chisquare_pvalue(counts(out[:, 0], V), first),
            chisquare_pvalue(counts(out[:, 0] * V + out[:, 1], V * V), joint.flatten()))


@pytest.mark.slow
@pytest.mark.parametrize("mode,temperature", [("intersection", 1.0), ("intersection", 0.7), ("string", 1.0)])
def test_exact_sampling_through_another_tokenizer_follows_the_target(pair, mode, temperature):
    target, target_tok, *_ = pair
    engine = _engine(pair, mode, get_sampler("exact", temperature=temperature), gamma=3, eos=())
    first, joint = _pvalues(_emitted(engine, target_tok, PROMPTS[0], seed=5), target, target_tok, temperature)
    assert first > THRESHOLD and joint > THRESHOLD, \
        f"{mode}, T={temperature}: chi-square p = {first:.3g} (first token), {joint:.3g} (first two) <= {THRESHOLD:.3g}"


class _ShiftedLogitsDrafter(TextDrafter):
    """WRONG: hands the verifier each proposal with the distribution of the position before it (an off-by-one in
    the scattered proposal logits)."""

    def _scatter(self, logits):
        return torch.roll(super()._scatter(logits), 1, dims=1)


@pytest.mark.slow
def test_negative_control_proposal_logits_off_the_proposals_fail(pair):
    target, target_tok, *_ = pair
    engine = _engine(pair, "intersection", get_sampler("exact"), gamma=3, eos=(), drafter=_ShiftedLogitsDrafter)
    pvalues = _pvalues(_emitted(engine, target_tok, PROMPTS[0], seed=5), target, target_tok, 1.0)
    assert min(pvalues) <= THRESHOLD, f"the wrong proposal logits passed (p = {pvalues}): the test has no power"


def test_intersection_mode_reports_the_mass_it_covers(pair):
    target_tok = pair[1]
    enc = target_tok(PROMPTS, return_tensors="pt", padding=True)
    result = _engine(pair, "intersection", get_sampler("exact")).generate(
        enc.input_ids, enc.attention_mask, 12, torch.Generator().manual_seed(0), prompt_texts=PROMPTS)
    stats = result.extra["cross_tokenizer"]
    assert 0 < stats["target_mass_on_intersection"] < 1 and 0 < stats["draft_mass_on_intersection"] < 1
    accepted = sum(s["accepted"] for s in result.row_stats) / sum(s["drafted"] for s in result.row_stats)
    assert accepted <= stats["target_mass_on_intersection"]
    assert stats["intersection_size"] == int(pair[4].target_in.sum())


def test_an_adaptive_draft_length_is_refused_with_another_tokenizer(pair):
    from pipeline.decoding.draft_policy import DraftPolicy

    target, _, draft, _, bridge = pair
    with pytest.raises(SpecsweepError, match="fixed γ"):
        SpeculativeEngine(target, TextDrafter(draft, bridge, "intersection"), get_sampler("exact"), gamma=3,
                          device="cpu", eos_token_ids=[EOS], pad_token_id=0,
                          draft_policy=DraftPolicy("heuristic", 0.0, 6))


# ---- `specsweep run` ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The pair saved with save_pretrained (models and tokenizers), and a prompts file."""
    from tiny_models import write_prompts

    root = tmp_path_factory.mktemp("cross")
    target, target_tok, draft, draft_tok = cross_tokenizer_pair()
    for name, model, tok in (("target", target, target_tok), ("draft", draft, draft_tok)):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return root, write_prompts(root / "prompts.jsonl")


def _run(saved, out, *extra):
    from pipeline.cli import main

    root, data = saved
    return main(["run", "--target", str(root / "target"), "--draft", str(root / "draft"), "--data", str(data),
                 "--device", "cpu", "--max-new-tokens", "10", "--gamma", "3", "--repeats", "3",
                 "--samples-per-repeat", "2", "--no-progress", "--out", str(out), *extra])


@pytest.mark.parametrize("extra,mode", [((), "intersection"), (("--sampler", "greedy"), "string"),
                                        (("--temperature", "0", "--sampler", "greedy",
                                          "--draft-tokenizer-mode", "intersection"), "intersection")])
def test_run_picks_and_records_the_mode(saved, tmp_path, extra, mode):
    import json

    out = tmp_path / "run.json"
    assert _run(saved, out, *extra) == 0
    res = json.loads(out.read_text())
    assert res["resolved"]["draft_tokenizer_mode"] == mode
    m = res["metrics"]
    bridge = m["cross_tokenizer"]
    assert bridge["mode"] == mode and bridge["intersection_size"] > 10
    if mode == "intersection":
        assert 0 < bridge["target_mass_on_intersection"] <= 1
    assert 0 <= m["acceptance_rate_chars"] <= 1 and m["chars_per_step"] > 0
    assert m["accepted_chars"] == sum(s["accepted_chars"] for s in res["samples"])
    assert m["speedup"] > 0 and 0 < m["bridge_time_s"] < m["wall_time_s"]   # the host's re-reading is timed


def test_shared_mode_with_another_tokenizer_is_one_line_exit_2(saved, tmp_path, capsys):
    assert _run(saved, tmp_path / "x.json", "--draft-tokenizer-mode", "shared") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "different tokenizers" in err[0]
    assert not (tmp_path / "x.json").exists()


def test_the_hf_engine_refuses_another_tokenizer_when_sampling_in_one_line(saved, tmp_path, capsys):
    assert _run(saved, tmp_path / "x.json", "--engine", "hf") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--temperature 0 only" in err[0]


def test_transformers_universal_assisted_generation_is_the_greedy_baseline(pair):
    """--engine hf at T = 0 runs transformers' string-level drafting: the target's greedy output too, as our string
    mode gives it."""
    from pipeline.decoding.hf_engine import HFEngine

    target, target_tok, draft, draft_tok, _ = pair
    enc = target_tok(PROMPTS, return_tensors="pt", padding=True)
    reference = SpeculativeEngine(target, None, get_sampler("greedy"), gamma=0, device="cpu", eos_token_ids=[EOS],
                                  pad_token_id=0).generate(
        enc.input_ids, enc.attention_mask, 16).tokens
    hf = HFEngine(target, draft, get_sampler("greedy"), 4, 0.0, "cpu", [EOS], 0, (target_tok, draft_tok))
    result = hf.generate(enc.input_ids, enc.attention_mask, 16)
    assert result.tokens == reference and hf.bridge_mode == "string"
    assert sum(s["accepted"] for s in result.row_stats) > 0


def test_a_study_of_a_pair_with_another_tokenizer_searches_the_mode_with_a_fixed_gamma(saved, capsys):
    """The default space searches adaptive draft lengths, which this drafter does not run: the study narrows them
    instead of failing those trials, and its trials choose intersection or string (which is faster depends on the
    pair), unless the run fixes the mode; a pair with one tokenizer keeps the space as it is."""
    import dataclasses

    import optuna

    from pipeline.config import RunConfig
    from pipeline.tuning.space import SearchSpace, space_for_pair

    root, data = saved
    space = SearchSpace.load("sweeps/optuna_space.yaml")
    assert space.searches_drafts and not space.tokenizer_modes
    cross = RunConfig(task="prompts", data=str(data), target=str(root / "target"), draft=str(root / "draft"))
    narrowed = space_for_pair(space, cross)
    assert not narrowed.searches_drafts and narrowed.tokenizer_modes == ("intersection", "string")
    assert "another tokenizer" in capsys.readouterr().err
    assert narrowed.first_point()["draft_tokenizer_mode"] == "intersection"
    assert "tokenizer_modes" in narrowed.recorded() and "tokenizer_modes" not in space.recorded()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    chosen = {narrowed.suggest(study.ask())["draft_tokenizer_mode"] for _ in range(12)}
    assert chosen == {"intersection", "string"}
    fixed = space_for_pair(space, dataclasses.replace(cross, draft_tokenizer_mode="string"))
    assert not fixed.tokenizer_modes and not fixed.searches_drafts
    same = RunConfig(task="prompts", data=str(data), target=str(root / "target"), draft=str(root / "target"))
    assert space_for_pair(space, same) is space


def test_run_with_the_hf_engine_records_transformers_string_drafting(saved, tmp_path):
    import json

    out = tmp_path / "hf.json"
    assert _run(saved, out, "--engine", "hf", "--temperature", "0", "--sampler", "greedy") == 0
    res = json.loads(out.read_text())
    assert res["resolved"]["draft_tokenizer_mode"] == "string" and res["metrics"]["speedup"] > 0


@pytest.mark.parametrize("gamma", [1, 2, 5])
def test_ragged_batches_keep_the_targets_greedy_output(pair, gamma):
    """Prompts of many lengths, rows ending at EOS or at different lengths and leaving the batch at different steps,
    and caches cut back into earlier steps: every row's tokens are still the target's greedy ones, in both modes."""
    import random

    target, target_tok, *_ = pair
    rng = random.Random(gamma)
    words = [w for w in target_tok.get_vocab() if not w.startswith("<")]
    prompts = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 12))) for _ in range(7)]
    enc = target_tok(prompts, return_tensors="pt", padding=True)
    for max_new in (3, 17):
        reference = SpeculativeEngine(target, None, get_sampler("greedy"), gamma=0, device="cpu", eos_token_ids=[EOS],
                                      pad_token_id=0).generate(
            enc.input_ids, enc.attention_mask, max_new).tokens
        for mode in ("string", "intersection"):
            engine = _engine(pair, mode, get_sampler("greedy"), gamma=gamma)
            assert engine.generate(enc.input_ids, enc.attention_mask, max_new,
                                   prompt_texts=prompts).tokens == reference, (mode, max_new)


def test_cuts_back_into_earlier_steps_keep_the_targets_greedy_output(monkeypatch):
    """Two byte-level BPEs with different merges: a target token is often part of a word, so appending text changes
    how the draft tokenises what it read in earlier steps, and its cache is cut back past the step's start. The
    output is still the target's greedy output, in both modes."""
    import random

    from pipeline.synthetic import build_model

    target_tok, draft_tok = build_bpe_tokenizer(WORDS, 380), build_bpe_tokenizer(list(WORDS)[::-1], 600)
    target, draft = build_model("gpt2", len(target_tok), 2, 32, 0), build_model("gpt2", len(draft_tok), 1, 32, 1)
    bridge = build_bridge(target_tok, draft_tok, len(target_tok), len(draft_tok), "cpu")
    deep = []
    commit = TextDrafter._commit_text

    def spy(self, emitted, shipped):
        before = [p[-1] if p else -1 for p in self.pos]
        commit(self, emitted, shipped)
        deep.extend(p[-1] < last for p, last in zip(self.pos, before) if p)

    monkeypatch.setattr(TextDrafter, "_commit_text", spy)
    rng = random.Random(0)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(7)]
    enc = target_tok(prompts, return_tensors="pt", padding=True)
    reference = SpeculativeEngine(target, None, get_sampler("greedy"), gamma=0, device="cpu", eos_token_ids=[EOS],
                                  pad_token_id=0).generate(
        enc.input_ids, enc.attention_mask, 17).tokens
    for mode in ("string", "intersection"):
        engine = SpeculativeEngine(target, TextDrafter(draft, bridge, mode), get_sampler("greedy"), gamma=3,
                                   device="cpu", eos_token_ids=[EOS], pad_token_id=0)
        assert engine.generate(enc.input_ids, enc.attention_mask, 17, prompt_texts=prompts).tokens == reference
    assert any(deep), "no cache was cut back past a step's start: the test lost its point"


def test_statistics_of_batches_and_ranks_merge_from_their_sums():
    from pipeline import distributed
    from pipeline.decoding.drafters.cross_tokenizer import merge_statistics
    from pipeline.tasks.base import Cuts

    static = {"mode": "intersection", "intersection_size": 10, "target_vocab": 20, "draft_vocab": 30,
              "target_share_in_intersection": 0.5, "draft_tokens_per_target_token_max": 3}
    a = {**static, "target_mass_sum": 3.0, "target_positions": 4, "draft_mass_sum": 1.0, "draft_positions": 2}
    b = {**static, "target_mass_sum": 1.0, "target_positions": 4, "draft_mass_sum": 2.0, "draft_positions": 2}
    merged = merge_statistics([a, b])
    assert merged["target_mass_on_intersection"] == 0.5 and merged["draft_mass_on_intersection"] == 0.75
    assert merged["target_positions"] == 8 and merged["intersection_size"] == 10

    def part(stats):
        return {"wall": 1.0, "draft_forwards": 1, "peak": 1.0, "phase_time": {}, "phase_calls": {},
                "cuts": Cuts(), "cross_tokenizer": stats}

    assert distributed.merge_totals([part(a), part(b)])["cross_tokenizer"] == merged


@pytest.mark.slow
def test_two_processes_give_the_tokens_of_one_through_another_tokenizer(saved, tmp_path):
    import json

    one, two = tmp_path / "one.json", tmp_path / "two.json"
    assert _run(saved, one, "--seed-per-example", "--batch-size", "2") == 0
    assert _run(saved, two, "--processes", "2", "--batch-size", "2") == 0
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    assert [s["token_ids"] for s in a["samples"]] == [s["token_ids"] for s in b["samples"]]
    assert b["resolved"]["processes"] == 2 and b["resolved"]["draft_tokenizer_mode"] == "intersection"
    ma, mb = a["metrics"]["cross_tokenizer"], b["metrics"]["cross_tokenizer"]
    assert mb["target_positions"] == ma["target_positions"]
    assert mb["target_mass_on_intersection"] == pytest.approx(ma["target_mass_on_intersection"], rel=1e-5)


def test_a_tuned_mode_travels_through_the_schedule_and_export():
    """The mode a trial chose is part of its deployable settings: the json export carries it and `run --from-config`
    reads it back; a run left on auto (one tokenizer) adds nothing."""
    from pipeline.settings_file import run_values
    from pipeline.tuning.schedule import settings_of

    settings = settings_of({"gamma": 4, "sampler": "exact", "temperature": 1.0, "draft_tokenizer_mode": "string"})
    assert settings["draft_tokenizer_mode"] == "string"
    assert run_values({"settings": settings}, "d", [])["draft_tokenizer_mode"] == "string"
    assert "draft_tokenizer_mode" not in settings_of({"gamma": 4, "sampler": "exact", "draft_tokenizer_mode": "auto"})


def test_bench_engine_compares_string_mode_with_transformers_string_level_drafting(saved, tmp_path, capsys):
    """`specsweep bench engine` on a pair with two tokenizers: T = 0 only, our string mode against transformers'
    Universal Assisted Generation, the same tokens (the target's greedy output) in both, and a paired ratio."""
    import json

    from pipeline.cli import main

    root, data = saved
    out = tmp_path / "bench.json"
    assert main(["bench", "engine", "--target", str(root / "target"), "--draft", str(root / "draft"), "--data",
                 str(data), "--device", "cpu", "--repeats", "1", "--max-new-tokens", "8", "--gamma", "3",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert {r["temperature"] for r in result["results"]} == {0.0}
    assert result["settings"]["draft_tokenizer"].startswith("another")
    by = {r["loop"]: r for r in result["results"]}
    assert by["ours_speculative"]["identical_to_hf_assisted"] and by["ours_speculative"]["identical_to_hf_forward"]
    assert 0 < by["ours_speculative"]["acceptance_rate"] <= 1
    assert by["hf_assisted"]["new_tokens"] == by["ours_speculative"]["new_tokens"] == 8 * by["hf_assisted"]["prompts"]
    assert result["goals"]["T=0.0"]["speculative_over_hf_assisted"] > 0
    assert "ours/HF assisted at equal γ 3" in capsys.readouterr().out


@pytest.mark.parametrize("mode", ["intersection", "string"])
def test_with_per_example_randomness_a_rows_tokens_do_not_depend_on_its_batch(pair, mode):
    """Exact sampling at T = 1 through another tokenizer: a row proposes as many target tokens as its draft's text
    gives (string mode: fewer than the step's for some rows) and is verified with that many, drawing only its own
    uniforms, so it decodes alone and inside a batch to the same tokens."""
    from pipeline.rng import RowGenerators

    _, target_tok, *_ = pair
    engine = _engine(pair, mode, get_sampler("exact", temperature=1.0))
    prompts = ["the fox", "police said the", "a new report on", "the court said that", "water and"]

    def decode(idx):
        enc = target_tok([prompts[i] for i in idx], return_tensors="pt", padding=True)
        rows = RowGenerators(3, [f"p{i}" for i in idx], "cpu")
        return engine.generate(enc.input_ids, enc.attention_mask, 12, rows,
                               prompt_texts=[prompts[i] for i in idx]).tokens

    alone = {i: decode([i])[0] for i in range(len(prompts))}
    assert len({tuple(t) for t in alone.values()}) > 1
    for batch in ([0, 1, 2, 3, 4], [4, 2, 0, 3, 1]):
        assert dict(zip(batch, decode(batch))) == alone
