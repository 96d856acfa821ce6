"""`specsweep bench engine`'s settings on a tiny pair: the dtype reaches both loops' models, the prompts are
`specsweep run`'s, HF's out-of-the-box loop drafts with transformers' own defaults, our loop's draft settings reach
it, and bad flags are one-line errors. Speed is never asserted here (docs/benchmarks.md has the figures)."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import record_engines, save_pair, write_articles

from pipeline.benchmarks import engine as bench
from pipeline.cli import main
from pipeline.decoding.drafters.lookup import LookupDrafter
from pipeline.decoding.drafters.vocab_map import VocabMapDrafter
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.decoding.hf_engine import assistant_defaults
from pipeline.models import auto_dtype, load_tokenizer

CHAT = "{% for m in messages %}news {{ m['content'] }} report{% endfor %}"
QUICK = ["--device", "cpu", "--repeats", "1", "--temperature", "0", "--max-new-tokens", "6"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(target folder, draft folder, articles JSONL): a tiny GPT-2 pair whose tokenizer has a chat template, and 5
    CNN/DailyMail-schema articles of 15-36 words."""
    root = tmp_path_factory.mktemp("bench-engine")
    target, draft = save_pair(root / "pair")
    for folder in (target, draft):
        tok = load_tokenizer(str(folder))
        tok.chat_template = CHAT
        tok.save_pretrained(folder)
    return str(target), str(draft), str(write_articles(root / "articles.jsonl", 5, repeat=3))


def _bench(pair, tmp_path, *flags) -> dict:
    """`specsweep bench engine` on the tiny pair at γ 2, T = 0, one repeat, 6 new tokens, the first 2 built-in prompts
    unless ``flags`` say otherwise; its results JSON."""
    target, draft, _ = pair
    out = tmp_path / "bench.json"
    limit = [] if "--limit" in flags else ["--limit", "2"]
    assert main(["bench", "engine", "--target", target, "--draft", draft, "--gamma", "2", *QUICK, *limit, *flags,
                 "--out", str(out)]) == 0
    return json.loads(out.read_text())


def _capture_prompts(monkeypatch) -> list[tuple]:
    """Every prompt our engine is asked to continue from now on, as a tuple of token ids (patched in place)."""
    seen: list[tuple] = []
    generate = SpeculativeEngine.generate

    def recording(self, input_ids, *args, **kwargs):
        seen.extend(tuple(row) for row in input_ids.tolist())
        return generate(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(SpeculativeEngine, "generate", recording)
    return seen


def test_dtype_reaches_both_loops_models_and_is_recorded(pair, tmp_path, monkeypatch):
    loaded = []
    load = bench.load_causal_lm

    def recording(*args, **kwargs):
        loaded.append(load(*args, **kwargs))
        return loaded[-1]

    monkeypatch.setattr(bench, "load_causal_lm", recording)
    result = _bench(pair, tmp_path, "--dtype", "bfloat16")
    assert len(loaded) == 2 and {p.dtype for m in loaded for p in m.parameters()} == {torch.bfloat16}
    assert result["settings"]["dtype"] == "bfloat16" and result["settings"]["dtype_choice"] is None
    assert {r["new_tokens"] for r in result["results"]} == {6 * 2} and len(result["results"]) == 7   # every loop ran


def test_dtype_auto_is_resolved_as_specsweep_run_resolves_it(pair, tmp_path):
    result = _bench(pair, tmp_path, "--dtype", "auto", "--limit", "1")
    assert (result["settings"]["dtype"], result["settings"]["dtype_choice"]) == auto_dtype(pair[0], "cpu")


def test_the_prompts_are_those_specsweep_run_builds_for_the_same_articles(pair, tmp_path, monkeypatch):
    """CNN/DailyMail articles in the chat template, cut to 12 prompt tokens, a seeded subset of 2 of the 5: the
    bench's engine sees exactly the prompts `specsweep run` decodes."""
    target, draft, articles = pair
    prompt_flags = ["--task", "cnn_dailymail", "--data", articles, "--chat-template", "--max-prompt-tokens", "12",
                    "--limit", "2"]
    seen = _capture_prompts(monkeypatch)
    assert main(["run", "--target", target, "--draft", draft, *prompt_flags, "--gamma", "2", "--max-new-tokens", "6",
                 "--dtype", "float32", "--device", "cpu", "--repeats", "3", "--samples-per-repeat", "1",
                 "--no-progress", "--wandb-mode", "disabled", "--out", str(tmp_path / "run.json")]) == 0
    run_prompts = set(seen)
    seen.clear()
    result = _bench(pair, tmp_path, *prompt_flags)
    tok = load_tokenizer(target)
    assert len(run_prompts) == 2 and set(seen) == run_prompts
    assert all(tok.decode(p).startswith("news") and tok.decode(p).endswith("report") for p in run_prompts)
    assert result["settings"]["prompts"] == {"task": "cnn_dailymail", "data": articles, "chat_template": True,
                                             "max_prompt_tokens": 12, "limit": 2, "subset_seed": 0}


def test_hf_out_of_the_box_loop_drafts_with_transformers_defaults(pair, tmp_path, monkeypatch):
    """transformers' table of defaults, changed here to 3 tokens per step and no confidence threshold: the bench
    records them and HF's out-of-the-box loop drafts 3 per step (it never sets a schedule of its own)."""
    from transformers import GenerationConfig

    table = GenerationConfig._get_default_generation_params()
    monkeypatch.setattr(GenerationConfig, "_get_default_generation_params", staticmethod(
        lambda: {**table, "num_assistant_tokens": 3, "assistant_confidence_threshold": 0.0}))
    result = _bench(pair, tmp_path, "--max-new-tokens", "24")
    default = result["settings"]["hf_assisted_default"]
    assert (default["num_assistant_tokens"], default["num_assistant_tokens_schedule"],
            default["assistant_confidence_threshold"]) == (3, table["num_assistant_tokens_schedule"], 0.0)
    row = next(r for r in result["results"] if r["loop"] == "hf_assisted_default")
    assert row["gamma"] == 3 and 2.5 <= row["drafted_per_step"] <= 3.0, row["drafted_per_step"]
    assert result["goals"]["T=0.0"]["intervals"]["speculative_over_hf_assisted_default"]["n"] == 1


def test_assistant_defaults_are_the_drafts_own_then_transformers(pair):
    from transformers import AutoModelForCausalLM, GenerationConfig

    draft = AutoModelForCausalLM.from_pretrained(pair[1])
    table = GenerationConfig._get_default_generation_params()
    keys = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    assert assistant_defaults(draft) == {k: table[k] for k in keys}
    draft.generation_config.num_assistant_tokens = 7          # a draft's own setting wins, as in transformers
    assert assistant_defaults(draft)["num_assistant_tokens"] == 7


def test_our_draft_settings_reach_our_loop_only(pair, tmp_path, monkeypatch):
    engines = record_engines(monkeypatch)
    result = _bench(pair, tmp_path, "--draft-vocab", "50", "--draft-schedule", "heuristic", "--gamma-max", "5")
    speculative = [e for e in engines if e.drafter is not None]
    assert speculative and all(isinstance(e.drafter, VocabMapDrafter) and len(e.drafter.ids) >= 50
                               and e.gamma == 5 and e.policy.schedule == "heuristic" for e in speculative)
    s = result["settings"]
    assert s["ours"] == {"drafter": "model", "gamma": 2, "draft_schedule": "heuristic", "draft_confidence": 0.0,
                         "gamma_max": 5, "draft_vocab": 50, "draft_quant": "none"}
    assert s["hf_assisted"]["num_assistant_tokens"] == 2 and not s["equal_gamma"]
    assert result["goals"]["T=0.0"]["speculative_at_least_hf_assisted_met"] is None      # not at equal γ
    ours = next(r for r in result["results"] if r["loop"] == "ours_speculative")
    assert len(ours["full_step_histogram"]) == 6 and ours["identical_to_hf_assisted"]      # lossless at T = 0
    assert bench.describe_ours(s["ours"]) == "heuristic from γ 2, at most 5 per step, head cut to 50 tokens"


def test_another_drafter_reaches_our_loop_only_and_is_no_comparison_of_loops(pair, tmp_path, monkeypatch):
    """--drafter prompt-lookup: our loop drafts from the prompt (with --lookup-min/--lookup-max's n-grams), HF's
    assisted loops still with the draft model, so ours against HF's assisted loop at equal γ is a comparison of
    settings and its goal is not judged."""
    engines = record_engines(monkeypatch)
    result = _bench(pair, tmp_path, "--drafter", "prompt-lookup", "--lookup-min", "2", "--lookup-max", "4")
    speculative = [e for e in engines if e.drafter is not None]
    assert speculative and all(isinstance(e.drafter, LookupDrafter) and e.drafter.settings == {
        "drafter": "prompt-lookup", "lookup_min": 2, "lookup_max": 4} for e in speculative)
    s = result["settings"]
    assert s["ours"]["drafter"] == "prompt-lookup" and not s["equal_gamma"]
    assert result["goals"]["T=0.0"]["speculative_at_least_hf_assisted_met"] is None
    ours = next(r for r in result["results"] if r["loop"] == "ours_speculative")
    assert ours["identical_to_hf_assisted"]                                      # lossless at T = 0 (float32)
    assert bench.describe_ours(s["ours"]) == "prompt-lookup, γ 2, n-grams of 2-4 tokens"


@pytest.mark.parametrize(("flags", "says"), [
    (["--dtype", "float8"], "--dtype 'float8' is not one of"),
    (["--task", "librispeech"], "use prompts or cnn_dailymail"),
    (["--task", "cnn_dailymail"], "--task cnn_dailymail reads --data"),
    (["--data", "no-such.jsonl"], "--data no-such.jsonl does not exist"),
    (["--draft-confidence", "1.5"], "--draft-confidence must be in [0, 1)"),
    (["--gamma-max", "2"], "--gamma-max applies to an adaptive draft length"),
    (["--draft-schedule", "heuristic", "--gamma-max", "2"], "--gamma-max must be >= --gamma (4)"),
    (["--draft-schedule", "sometimes"], "--draft-schedule 'sometimes' is not one of"),
    (["--draft-vocab", "1"], "--draft-vocab 1: give K >= 2"),
    (["--drafter", "prompt-lookup", "--lookup-min", "5", "--lookup-max", "2"],
     "need 1 <= --lookup-min <= --lookup-max"),
    (["--max-prompt-tokens", "0"], "--max-prompt-tokens must be >= 1"),
    (["--limit", "0"], "--limit must be >= 1"),
    (["--temperature", "0,hot"], "--temperature '0,hot'"),
    (["--target", "t"], "give both --target and --draft"),
])
def test_bad_flags_are_one_line_errors(flags, says, capsys):
    assert main(["bench", "engine", "--device", "cpu", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err, err


def test_a_chat_template_the_tokenizer_lacks_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    """Refused before either model loads: a bad flag costs no load, and the error is the command's only output."""
    from pipeline.benchmarks import engine as bench_engine

    target, draft = save_pair(tmp_path / "plain")
    loaded = []
    monkeypatch.setattr(bench_engine, "load_causal_lm", lambda *a, **k: loaded.append(a) or pytest.fail("loaded"))
    capsys.readouterr()                                         # saving the pair draws progress bars
    assert main(["bench", "engine", "--target", str(target), "--draft", str(draft), *QUICK, "--chat-template",
                 "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and not loaded, err
    assert "has no chat template: drop --chat-template" in err[0] and err[0].startswith("specsweep bench: error:")
    assert not (tmp_path / "x.json").exists()
