"""A draft model whose proposal starts from a prompt-lookup match (pipeline/decoding/drafters/lookup_model.py).

Greedy decoding with it is the target alone's, token for token (GPT-2 and Llama, the static-cache forward and
transformers', batch and alone, a draft with fewer vocabulary rows, a reduced head, an adaptive draft length, Whisper
with either kind of draft); every draft law it hands the verify step is the law a fresh draft gives for the text
before that position, and every lookup position is one-hot (its cache stays consistent over steps with and without
a match and steps the draft sat out); at T = 1 and T = 0.7 the first emitted token and the first two jointly follow
the target's law, and a negative control (the lookup token verified with the draft's law at its position) fails the
same test; with per-example randomness a row's tokens do not depend on its batch; `specsweep run` runs it in a grid
and records what it did; bad combinations are one line. Chi-square tests here: 5 (counted against
tests/stat_utils.py's MAX_TESTS).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from stat_utils import THRESHOLD, chisquare_pvalue, counts, target_laws
from tiny_models import PROMPTS, load_saved_pair, save_pair, write_prompts

from pipeline.config import RunConfig
from pipeline.decoding.draft_policy import DraftPolicy
from pipeline.decoding.drafters.lookup_model import LookupModelDrafter
from pipeline.decoding.drafters.model import ModelDrafter
from pipeline.decoding.drafters.ngram import NgramIndex
from pipeline.decoding.drafters.vocab_map import VocabMapDrafter
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.errors import SpecsweepError
from pipeline.rng import RowGenerators
from pipeline.samplers import get_sampler

EOS = 1
# repeated phrases, so that lookup matches in some steps; the last prompts repeat nothing at first
REPEATING = ["the storm hit the city and the storm hit the",
             "police said the plane was late police said the plane",
             "a new report a new report a new",
             "water", PROMPTS[3]]
N_ROWS = 4000


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    return load_saved_pair(tmp_path_factory.mktemp("lookup-model"), kind="gpt2")


def _hybrid(draft, min_n: int = 1, max_n: int = 3, stop_ids=(EOS,)) -> LookupModelDrafter:
    return LookupModelDrafter(draft if isinstance(draft, ModelDrafter) else ModelDrafter(draft), min_n, max_n,
                              stop_ids)


def _alone(target, enc, new_tokens: int, static: bool = True):
    return SpeculativeEngine(target, None, get_sampler("greedy"), gamma=0, device="cpu", eos_token_ids=[EOS],
                             pad_token_id=0, static_cache=static).generate(
        enc.input_ids, enc.attention_mask, new_tokens).tokens


@pytest.mark.parametrize("kind,static", [("gpt2", True), ("gpt2", False), ("llama", True), ("llama", False)])
def test_greedy_decoding_is_the_target_alone(tmp_path, kind, static):
    target, draft, tok = load_saved_pair(tmp_path, kind=kind)
    enc = tok(REPEATING, return_tensors="pt", padding=True)
    reference = _alone(target, enc, 24, static)
    for gamma in (1, 4):
        engine = SpeculativeEngine(target, _hybrid(draft), get_sampler("greedy"), gamma=gamma, device="cpu",
                                   eos_token_ids=[EOS], pad_token_id=0, static_cache=static)
        result = engine.generate(enc.input_ids, enc.attention_mask, 24)
        assert result.tokens == reference
        done = result.extra["drafter_counts"]
        assert done["lookup_tokens"] > 0 and done["draft_tokens"] > 0 and done["accepted_draft"] > 0
        assert result.extra["draft_forwards"] > 0 and "lookup" in result.phase_time_s
        for i in (1, 3):
            one = tok(REPEATING[i], return_tensors="pt")
            assert engine.generate(one.input_ids, one.attention_mask, 24).tokens == [reference[i]]


def test_greedy_with_a_smaller_draft_vocabulary_and_a_reduced_head(tmp_path):
    """A draft with fewer rows than the target (lookup ids past them are still one-hot over the target's
    vocabulary), and a draft cut to K target ids (vocab_map.py): still the target alone's tokens."""
    target, short, tok = load_saved_pair(tmp_path / "short", draft_vocab_pad=-2)
    enc = tok(REPEATING, return_tensors="pt", padding=True)
    reference = _alone(target, enc, 20)
    ids = sorted({EOS, *range(2, 40)})
    _, draft, _ = load_saved_pair(tmp_path / "full")
    for inner in (ModelDrafter(short), VocabMapDrafter(draft, ids)):
        engine = SpeculativeEngine(target, _hybrid(inner), get_sampler("exact", temperature=0.0), gamma=3,
                                   device="cpu", eos_token_ids=[EOS], pad_token_id=0)
        result = engine.generate(enc.input_ids, enc.attention_mask, 20)
        assert result.tokens == reference
        assert result.extra["drafter_counts"]["accepted_lookup"] > 0


class Checked(LookupModelDrafter):
    """Checks each proposal against the text so far: the lookup tokens are a fresh prompt lookup's, one-hot; the
    draft law at each draft position is what the draft computes from scratch over the row's text and the proposal
    before that position (its cached state is the text's)."""

    checked = 0

    def propose(self, ask):
        texts = [list(row.tokens) for row in self.rows]
        proposal = super().propose(ask)
        m, wanted = self.layout.lookup, self.layout.wanted
        for i, text in enumerate(texts):
            fresh = NgramIndex(self.min_n, self.max_n, "first", self.stop_ids)
            fresh.start(text)
            assert proposal.tokens[i, : m[i]].tolist() == fresh.propose(wanted[i])
            if proposal.logits is None:
                continue
            laws = torch.softmax(proposal.logits[i, : wanted[i]].float(), dim=-1)
            assert torch.equal(laws[: m[i]], torch.nn.functional.one_hot(proposal.tokens[i, : m[i]], laws.shape[-1])
                               .float())
            if wanted[i] > m[i]:
                seq = torch.tensor([text + proposal.tokens[i, : wanted[i] - 1].tolist()])
                with torch.no_grad():
                    own = torch.softmax(self.draft.lm(seq).logits[0, len(text) - 1 + m[i]:].float(), dim=-1)
                V = own.shape[-1]
                torch.testing.assert_close(laws[m[i]:, :V], own, atol=1e-5, rtol=1e-4)
                self.checked += wanted[i] - m[i]
        return proposal


@pytest.mark.parametrize("static", [True, False])
@pytest.mark.parametrize("batch", [1, 4])
def test_the_drafts_cache_follows_the_text_over_steps_with_and_without_a_match(gpt2, static, batch):
    """Prompts where lookup matches in some steps and not in others (and with --lookup-min 2, less often): each
    step's draft law is a fresh draft's for the text so far (the draft read every token once, caught up after steps
    it sat out, and rolled back after rejections), at T = 1 so that rejections vary. All kinds of step occurred."""
    target, draft, tok = gpt2
    seen: dict[str, int] = {}
    for min_n, gamma in ((1, 4), (2, 3)):
        drafter = Checked(ModelDrafter(draft), min_n, 3, (EOS,))
        engine = SpeculativeEngine(target, drafter, get_sampler("exact", temperature=1.0), gamma=gamma,
                                   device="cpu", eos_token_ids=[EOS], pad_token_id=0, static_cache=static)
        for start in range(0, len(REPEATING), batch):
            enc = tok(REPEATING[start: start + batch], return_tensors="pt", padding=True)
            result = engine.generate(enc.input_ids, enc.attention_mask, 24, torch.Generator().manual_seed(start))
            done = result.extra["drafter_counts"]
            hist = done["lookup_histogram"]
            seen["none"] = seen.get("none", 0) + hist[0]                    # no match: the draft drafted all
            seen["part"] = seen.get("part", 0) + sum(hist[1:gamma])         # a match, then the draft
            seen["lookup only"] = seen.get("lookup only", 0) + done["lookup_only_steps"]
            seen["draft sat out"] = seen.get("draft sat out", 0) + done["steps_without_draft"]
            seen["rejected"] = seen.get("rejected", 0) + sum(s["drafted"] - s["accepted"] for s in result.row_stats)
        assert drafter.checked > 50
    assert min(seen.values()) > 0, seen


def test_an_examples_tokens_do_not_depend_on_its_batch(gpt2):
    """Per-example randomness at T = 1: a row decodes to the same tokens alone and in batches with other rows
    (holes in the draft's cache where the rows' catch-ups and lookups differ in length), with a constant and an
    adaptive draft length."""
    target, draft, tok = gpt2

    def decode(engine, idx):
        enc = tok([REPEATING[i] for i in idx], return_tensors="pt", padding=True)
        result = engine.generate(enc.input_ids, enc.attention_mask, 20, RowGenerators(0, [f"r{i}" for i in idx], "cpu"))
        return dict(zip(idx, result.tokens)), result.extra["drafter_counts"]

    for policy in (None, DraftPolicy("heuristic", 0.5, 5)):
        engine = SpeculativeEngine(target, _hybrid(draft), get_sampler("exact", temperature=1.0), gamma=3,
                                   device="cpu", eos_token_ids=[EOS], pad_token_id=0, draft_policy=policy)
        alone = {i: decode(engine, [i])[0][i] for i in range(len(REPEATING))}
        for batch in ([0, 1, 2, 3, 4], [4, 2, 0, 3, 1]):
            together, done = decode(engine, batch)
            assert together == {i: alone[i] for i in batch}
            assert done["lookup_tokens"] > 0 and done["draft_tokens"] > 0


def test_greedy_with_an_adaptive_draft_length(gpt2):
    """--draft-schedule heuristic and --draft-confidence: the lookup is cut to each row's length, the draft pads
    after its confidence falls; still the target alone's tokens, in a batch."""
    target, draft, tok = gpt2
    enc = tok(REPEATING, return_tensors="pt", padding=True)
    reference = _alone(target, enc, 24)
    for policy in (DraftPolicy("heuristic", 0.0, 6), DraftPolicy("constant", 0.6, 6), DraftPolicy("heuristic", 0.5, 6)):
        engine = SpeculativeEngine(target, _hybrid(draft), get_sampler("greedy"), gamma=2, device="cpu",
                                   eos_token_ids=[EOS], pad_token_id=0, draft_policy=policy)
        result = engine.generate(enc.input_ids, enc.attention_mask, 24)
        assert result.tokens == reference
        assert any(s["drafted"] != 2 * s["verify_steps"] for s in result.row_stats)     # lengths did vary


@pytest.mark.parametrize("kind", ["seq2seq", "decoder_only"])
def test_greedy_whisper_is_the_target_alone(tmp_path, kind):
    """A Whisper target with a full Whisper draft (its own encoder) or a decoder-only draft on the target's
    encoder output: the target alone's tokens."""
    from test_whisper import features
    from transformers import AutoModelForCausalLM, AutoProcessor, WhisperForConditionalGeneration

    from pipeline.synthetic import save_whisper_pair

    tp, dp = save_whisper_pair(tmp_path, draft_kind=kind)
    target = WhisperForConditionalGeneration.from_pretrained(tp).eval()
    draft = (WhisperForConditionalGeneration if kind == "seq2seq" else AutoModelForCausalLM).from_pretrained(dp).eval()
    processor = AutoProcessor.from_pretrained(tp)
    feats = features(processor)
    ids = torch.tensor([processor.tokenizer.prefix_tokens] * feats.shape[0])
    inputs = {"input_features": feats}
    reference = SpeculativeEngine(target, None, get_sampler("greedy"), gamma=0, device="cpu", eos_token_ids=[0],
                                  pad_token_id=0).generate(ids, torch.ones_like(ids), 16, encoder_inputs=inputs).tokens
    engine = SpeculativeEngine(target, _hybrid(draft, stop_ids=(0,)), get_sampler("greedy"), gamma=3, device="cpu",
                               eos_token_ids=[0], pad_token_id=0)
    result = engine.generate(ids, torch.ones_like(ids), 16, encoder_inputs=inputs)
    assert result.tokens == reference
    assert result.extra["drafter_counts"]["lookup_tokens"] > 0 and result.extra["draft_forwards"] > 0


# ---- the output law at T > 0 -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def echo(gpt2) -> str:
    """A prompt whose first step mixes both kinds of token: a phrase, the target's greedy next token t, EOS, and the
    phrase again; lookup proposes t (its continuation stops before EOS), the draft the rest."""
    target, _, tok = gpt2
    phrase = "a new report"
    enc = tok(phrase, return_tensors="pt")
    t = _alone(target, enc, 1)[0][0]
    return f"{phrase} {tok.decode([t])} {tok.convert_ids_to_tokens(EOS)} {phrase}"


def _first_two(engine, tok, prompt: str, seed: int) -> tuple[np.ndarray, dict]:
    enc = tok([prompt] * N_ROWS, return_tensors="pt")
    result = engine.generate(enc.input_ids, enc.attention_mask, 3, torch.Generator().manual_seed(seed))
    return np.array([row[:2] for row in result.tokens]), result.extra["drafter_counts"]


def _pvalues(target, tok, prompt: str, out: np.ndarray, temperature: float) -> tuple[float, float]:
    V = target.config.vocab_size
    (first, _), joint = target_laws(target, tok(prompt, return_tensors="pt").input_ids, temperature, 2)
    return (chisquare_pvalue(counts(out[:, 0], V), first),
            chisquare_pvalue(counts(out[:, 0] * V + out[:, 1], V * V), joint.flatten()))


@pytest.mark.slow
@pytest.mark.parametrize("temperature,policy", [(1.0, None), (0.7, DraftPolicy("heuristic", 0.5, 4))])
def test_sampling_follows_the_target(gpt2, echo, temperature, policy):
    target, draft, tok = gpt2
    engine = SpeculativeEngine(target, _hybrid(draft), get_sampler("exact", temperature=temperature), gamma=3,
                               device="cpu", eos_token_ids=[], pad_token_id=0, draft_policy=policy)
    out, done = _first_two(engine, tok, echo, seed=3)
    assert done["accepted_lookup"] > 0.2 * N_ROWS and done["accepted_draft"] > 0.05 * N_ROWS   # both were on offer
    p = _pvalues(target, tok, echo, out, temperature)
    assert min(p) > THRESHOLD, f"T={temperature}: p = {p}"


class _DraftLawForLookup(LookupModelDrafter):
    """WRONG: in the first step a row's first lookup token is verified with the draft's law at its position (the
    prompt's last logits) instead of the point mass at it."""

    def propose(self, ask):
        carry = self.draft.carry
        proposal = super().propose(ask)
        if ask.first_step and proposal.logits is not None:
            first = torch.tensor(self.layout.lookup) > 0
            V = carry.shape[-1]
            proposal.logits[first, 0, :V] = carry[first].to(proposal.logits.dtype)
            proposal.logits[first, 0, V:] = float("-inf")
        return proposal


@pytest.mark.slow
def test_negative_control_the_drafts_law_on_a_lookup_token_fails(gpt2, echo):
    target, draft, tok = gpt2
    engine = SpeculativeEngine(target, _DraftLawForLookup(ModelDrafter(draft), 1, 3, (EOS,)),
                               get_sampler("exact", temperature=1.0), gamma=3, device="cpu", eos_token_ids=[],
                               pad_token_id=0)
    out, done = _first_two(engine, tok, echo, seed=3)
    assert done["lookup_histogram"][1] >= N_ROWS          # the first step of every row had one lookup token
    assert min(_pvalues(target, tok, echo, out, 1.0)) <= THRESHOLD, "the test has no power"


# ---- settings and `specsweep run` ------------------------------------------------------------------------------

def test_bad_settings_fail_in_one_line(tmp_path):
    data = write_prompts(tmp_path / "p.jsonl")
    base = {"target": "t", "draft": "d", "data": str(data), "drafter": "lookup-model"}
    for extra, words in (({"draft": None}, "--drafter lookup-model with --gamma > 0 needs --draft MODEL"),
                         ({"engine": "hf"}, "runs in our engine"),
                         ({"draft_tree": "2,1"}, "--drafter lookup-model proposes a chain"),
                         ({"draft_tokenizer_mode": "string"}, "a draft with the target's tokenizer"),
                         ({"lookup_min": 3, "lookup_max": 2}, "need 1 <= --lookup-min <= --lookup-max"),
                         ({"sampler": "sigmoid", "temperature": 1.0}, "sigmoid")):
        with pytest.raises(SpecsweepError, match=re.escape(words)) as e:
            RunConfig.from_dict({**base, **extra}).validate()
        assert "\n" not in str(e.value)
    RunConfig.from_dict({**base, "draft_schedule": "heuristic", "draft_vocab": 40, "batch_size": 4}).validate()
    RunConfig.from_dict({**base, "sampler": "sigmoid", "temperature": 0.0}).validate()


def test_specsweep_run_grid_records_what_the_drafter_did(tmp_path):
    """`specsweep run --drafter model,lookup-model`: both runs emit the target alone's tokens; the hybrid's results
    record its settings, its draft and its counts (lookup and draft tokens add up to the drafted ones)."""
    from pipeline.cli import main
    from pipeline.results_table import result_row

    target, draft = save_pair(tmp_path)
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i}", "prompt": p}) + "\n" for i, p in enumerate(REPEATING)))
    common = ["run", "--target", str(target), "--data", str(data), "--device", "cpu", "--max-new-tokens", "12",
              "--temperature", "0", "--repeats", "3", "--samples-per-repeat", "2", "--no-progress"]
    assert main([*common, "--gamma", "0", "--out", str(tmp_path / "ar.json")]) == 0
    assert main([*common, "--draft", str(draft), "--gamma", "3", "--drafter", "model,lookup-model", "--lookup-max",
                 "2", "--baseline", str(tmp_path / "ar.json"), "--out", str(tmp_path / "{drafter}.json")]) == 0
    hybrid = json.loads((tmp_path / "lookup-model.json").read_text())
    assert hybrid["resolved"]["drafter"] == {"drafter": "lookup-model", "lookup_min": 1, "lookup_max": 2}
    assert hybrid["config"]["draft"] == str(draft)
    metrics = hybrid["metrics"]
    done = metrics["drafter_counts"]
    assert done["lookup_tokens"] + done["draft_tokens"] == metrics["drafted_tokens"]
    assert done["accepted_lookup"] + done["accepted_draft"] == metrics["accepted_tokens"]
    # every step that drafted (a row's last step near --max-new-tokens may draft nothing)
    assert sum(done["lookup_histogram"]) == done["row_steps"] <= metrics["verify_steps"] < done["row_steps"] + 5
    assert 0 < metrics["draft_forwards"]
    for name in ("model", "lookup-model"):
        agreement = json.loads((tmp_path / f"{name}.json").read_text())["metrics"]["greedy_agreement"]
        assert agreement["identical"] == agreement["samples"] > 0
    assert json.loads((tmp_path / "model.json").read_text())["metrics"]["drafter_counts"] is None
    # the report pairs it with its target apart from the draft model alone
    assert result_row(hybrid, tmp_path / "lookup-model.json")["draft"] == f"lookup-model+{draft}"


def test_the_search_space_and_the_exports_take_it_where_they_can():
    """A study's trial may pick lookup-model (with lookup_max, a draft length, no tree); a pair without a draft
    leaves it out; transformers, vLLM and TensorRT-LLM have no such drafter (one line), our JSON keeps it."""
    import optuna
    from test_lookup_drafters import _lookup_schedule

    from pipeline.tuning.export import export
    from pipeline.tuning.schedule import settings_of
    from pipeline.tuning.space import SearchSpace, space_for_pair

    space = SearchSpace(drafters=("model", "lookup-model", "prompt-lookup"), drafts=("fixed", "heuristic"),
                        trees=("chain", "2,1")).check()
    params = space.suggest(optuna.trial.FixedTrial({"gamma": 4, "sampler": "exact", "dtype": "float32",
                                                    "drafter": "lookup-model", "lookup_max": 2, "draft": "heuristic",
                                                    "gamma_max": 6}))
    assert params["drafter"] == "lookup-model" and params["lookup_max"] == 2 and "draft_tree" not in params
    assert params["draft_schedule"] == "heuristic"
    base = RunConfig.from_dict({"target": "t", "data": "d", "drafter": "prompt-lookup"})
    assert space_for_pair(space, base).drafters == ("prompt-lookup",)
    settings = settings_of({"gamma": 5, "sampler": "exact", "drafter": "lookup-model", "lookup_min": 1,
                            "lookup_max": 3})
    assert settings["drafter"] == {"drafter": "lookup-model", "lookup_min": 1, "lookup_max": 3}
    schedule = {**_lookup_schedule(settings["drafter"]), "draft": "models/draft"}
    for fmt in ("hf", "vllm", "trtllm"):
        with pytest.raises(SpecsweepError, match=f"{fmt} has no drafter that starts from a prompt-lookup match") as e:
            export(schedule, fmt, "unused.json")
        assert "\n" not in str(e.value)
