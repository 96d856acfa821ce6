"""`specsweep run` end to end on tiny models, the hf engine, and bad input (one line, exit code 2)."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import PROMPTS, save_pair, write_articles, write_prompts

from pipeline.cli import main
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.decoding.hf_engine import HFEngine, hf_verify_step
from pipeline.models import load_causal_lm, load_tokenizer
from pipeline.samplers import get_sampler


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    tp, dp = save_pair(root)
    data = write_prompts(root / "prompts.jsonl")
    articles = root / "articles.jsonl"
    write_articles(articles, len(PROMPTS), 12)
    return root, tp, dp, data, articles


def base_args(tp, dp, data, out, *extra, device="cpu"):
    return ["run", "--target", str(tp), "--draft", str(dp), "--data", str(data), "--device", device,
            "--max-new-tokens", "12", "--no-progress", "--out", str(out), *extra]


_GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
DEVICES = ["cpu", pytest.param("cuda", marks=_GPU)]


@pytest.mark.parametrize("device", DEVICES)
def test_run_writes_results_with_speedup_against_the_ar_baseline(setup, capsys, device):
    root, tp, dp, data, _ = setup
    ar_path, sd_path = root / f"ar-{device}.json", root / f"sd-{device}.json"
    assert main(base_args(tp, dp, data, ar_path, "--gamma", "0", device=device)) == 0
    assert main(base_args(tp, dp, data, sd_path, "--gamma", "3", "--baseline", str(ar_path), device=device)) == 0
    res = json.loads(sd_path.read_text())
    m = res["metrics"]
    for key in ("tokens_per_second", "acceptance_rate", "mean_accepted_tokens", "speedup", "theoretical_speedup",
                "draft_time_s", "target_time_s", "verify_time_s", "peak_memory_mb", "cost_ratio"):
        assert m[key] is not None and m[key] > 0, key
    assert res["provenance"]["device"]["device"] == device
    if device == "cuda":  # the GPU is recorded, and peak memory is the CUDA allocator's
        assert res["provenance"]["device"]["gpu"] and m["peak_memory_mb"] < 2048
    ar = json.loads(ar_path.read_text())
    # the speedup is paired inside the run (tests/test_paired.py); the one against --baseline is kept, unpaired
    assert m["unpaired_speedup"] == pytest.approx(m["tokens_per_second"] / ar["metrics"]["tokens_per_second"])
    assert m["speedup_paired"] and m["speedup_ci_low"] <= m["speedup"] <= m["speedup_ci_high"]
    assert res["config"]["gamma"] == 3 and res["config"]["sampler"] == "exact"
    assert res["provenance"]["versions"]["torch"].startswith("2.")
    tok = load_tokenizer(str(tp))
    assert [s["id"] for s in res["samples"]] == [f"p{i}" for i in range(len(PROMPTS))]
    for s in res["samples"]:
        assert 1 <= len(s["token_ids"]) <= 12 and s["new_tokens"] == len(s["token_ids"])
        assert s["text"] == tok.decode(s["token_ids"], skip_special_tokens=True)
    assert m["new_tokens"] == sum(s["new_tokens"] for s in res["samples"])
    assert m["acceptance_rate"] == pytest.approx(m["accepted_tokens"] / m["drafted_tokens"])
    assert "paired speedup" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_verify_graphs_give_the_same_tokens_through_the_cli(setup, capsys):
    """--verify-graphs replays the cupy kernels' verify step from CUDA graphs, by default (auto) and when asked
    (on, the flag alone): the same tokens as eager steps (off), and no note of a failed capture."""
    root, tp, dp, data, _ = setup
    tokens = []
    for extra, recorded in (((), "auto"), (("--verify-graphs",), "on"), (("--verify-graphs", "off"), "off")):
        out = root / f"graphs-{recorded}.json"
        assert main(base_args(tp, dp, data, out, "--backend", "cupy", "--batch-size", "2", *extra, device="cuda")) == 0
        res = json.loads(out.read_text())
        assert res["config"]["verify_graphs"] == recorded
        tokens.append([s["token_ids"] for s in res["samples"]])
    assert tokens[0] == tokens[1] == tokens[2]
    assert "--verify-graphs auto: capturing" not in capsys.readouterr().err


def test_same_seed_same_tokens_through_the_cli(setup):
    root, tp, dp, data, _ = setup
    runs = []
    for seed, name in ((7, "a"), (7, "b"), (8, "c")):
        out = root / f"seed_{name}.json"
        assert main(base_args(tp, dp, data, out, "--seed", str(seed), "--batch-size", "2")) == 0
        runs.append([s["token_ids"] for s in json.loads(out.read_text())["samples"]])
    assert runs[0] == runs[1] != runs[2]


def test_cnn_dailymail_task_scores_rouge_and_records_truncation(setup):
    root, tp, dp, _, articles = setup
    out = root / "cnn.json"
    assert main(base_args(tp, dp, articles, out, "--task", "cnn_dailymail", "--max-prompt-tokens", "40",
                          "--temperature", "0", "--sampler", "greedy")) == 0
    res = json.loads(out.read_text())
    assert set(res["quality"]) >= {"rouge1", "rouge2", "rougeL", "rougeLsum"}
    assert res["resolved"]["prompts_truncated"] == sum(len(" ".join([p] * 12).split()) > 36 for p in PROMPTS)
    assert all(0 <= s["quality"]["rougeL"] <= 1 and s["reference"] for s in res["samples"])


def test_hf_engine_through_the_cli(setup):
    root, tp, dp, data, _ = setup
    out = root / "hf.json"
    assert main(base_args(tp, dp, data, out, "--engine", "hf", "--gamma", "3", "--sampler", "sigmoid")) == 0
    m = json.loads(out.read_text())["metrics"]
    assert m["drafted_tokens"] > 0 and 0 <= m["acceptance_rate"] <= 1 and m["verify_time_s"] > 0


@pytest.mark.slow
def test_a_grid_runs_every_combination_in_one_process_with_the_tokens_of_single_runs(setup, tmp_path):
    _, tp, dp, data, _ = setup
    single = tmp_path / "single.json"
    assert main(base_args(tp, dp, data, single, "--sampler", "greedy", "--gamma", "2")) == 0
    grid = str(tmp_path / "grid" / "{sampler}-{backend}-g{gamma}-{dtype}.json")
    assert main(base_args(tp, dp, data, grid, "--sampler", "exact,greedy", "--gamma", "1,2")) == 0
    written = sorted(p.name for p in (tmp_path / "grid").iterdir())
    assert written == [f"{s}-torch-g{g}-float32.json" for s in ("exact", "greedy") for g in (1, 2)]
    ours = json.loads((tmp_path / "grid" / "greedy-torch-g2-float32.json").read_text())
    theirs = json.loads(single.read_text())
    assert (ours["config"]["sampler"], ours["config"]["gamma"]) == ("greedy", 2)
    assert [s["token_ids"] for s in ours["samples"]] == [s["token_ids"] for s in theirs["samples"]]


@pytest.mark.parametrize("extra,out,message", [
    (["--gamma", "1,2"], "g.json", "--gamma lists several values: --out must name {gamma}"),
    (["--gamma", "1,x"], "g{gamma}.json", "--gamma 'x': expected int values"),
    (["--sampler", "exact,nope"], "{sampler}.json", "--sampler 'nope' is not one of"),
])
def test_a_bad_grid_fails_before_any_run_with_one_line(setup, capsys, tmp_path, extra, out, message):
    _, tp, dp, data, _ = setup
    assert main(base_args(tp, dp, data, tmp_path / out, *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not list(tmp_path.iterdir())  # the good points of the grid did not run either


@pytest.mark.parametrize("extra,message", [
    (["--gamma", "-1"], "--gamma must be >= 0"),
    (["--temperature", "-0.5"], "--temperature must be >= 0"),
    (["--sampler", "hf", "--temperature", "0"], "use --sampler greedy"),
    (["--backend", "cupy"], "cupy"),
    (["--alpha", "2"], "--alpha do(es) not apply to --sampler exact (it takes no parameters)"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--verify-graphs"], "--verify-graphs replays the CUDA kernels' verify step"),
    (["--repeats", "2"], "--repeats must be >= 3"),
    (["--samples-per-repeat", "0"], "--samples-per-repeat must be >= 1"),
    (["--threads", "0"], "--threads must be >= 1"),
    (["--max-spread", "0"], "--max-spread must be > 0"),
    (["--interop-threads", "0"], "--interop-threads must be >= 1"),
])
def test_bad_settings_are_one_line_errors_with_exit_code_2(setup, capsys, extra, message):
    root, tp, dp, data, _ = setup
    assert main(base_args(tp, dp, data, root / "bad.json", *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_bad_paths_and_data(setup, capsys, tmp_path):
    root, tp, dp, data, _ = setup
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    no_prompt = tmp_path / "noprompt.jsonl"
    no_prompt.write_text('{"id": "x", "text": "hi"}\n')
    cases = [
        (["--target", str(tmp_path / "missing")], "does not exist"),
        (["--data", str(empty)], "empty data file"),
        (["--data", str(no_prompt)], "line 1: missing field(s) 'prompt'"),
        (["--data", str(tmp_path / "nope.jsonl")], "--data"),
    ]
    for extra, message in cases:
        args = base_args(tp, dp, data, root / "bad.json")
        for flag, value in zip(extra[::2], extra[1::2]):
            args[args.index(flag) + 1] = value
        assert main(args) == 2, extra
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err


def test_unknown_sampler_is_rejected_with_the_registrys_names(setup, capsys):
    root, tp, dp, data, _ = setup
    assert main(base_args(tp, dp, data, root / "bad.json", "--sampler", "nope")) == 2
    err = capsys.readouterr().err.strip()
    assert "--sampler 'nope' is not one of ['exact', 'block', 'sigmoid'" in err and len(err.splitlines()) == 1


def test_half_precision_on_a_cpu_without_support_is_refused(setup, capsys, monkeypatch):
    root, tp, dp, data, _ = setup

    def no_half(*a, **k):
        raise RuntimeError('"LayerNormKernelImpl" not implemented for \'Half\'')

    monkeypatch.setattr(torch.nn.functional, "layer_norm", no_half)
    assert main(base_args(tp, dp, data, root / "bad.json", "--dtype", "float16")) == 2
    assert "torch.float16 is not supported on this CPU" in capsys.readouterr().err


def test_a_failed_run_leaves_earlier_results_untouched(setup):
    root, tp, dp, data, _ = setup
    out = root / "keep.json"
    assert main(base_args(tp, dp, data, out, "--gamma", "2")) == 0
    before = out.read_bytes()
    assert main(base_args(tp, dp, data, out, "--gamma", "2", "--baseline", str(out))) == 2  # γ=2 is no baseline
    assert out.read_bytes() == before
    assert not list(root.glob(".keep.json.*"))


# ---- the hf engine -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module", params=DEVICES)
def models(setup, request):
    """(target, draft, tokenizer, device): the hf engine tests run on the CPU and, where there is one, a GPU."""
    _, tp, dp, _, _ = setup
    tok = load_tokenizer(str(tp))
    device = request.param
    return (load_causal_lm(str(tp), torch.float32, device), load_causal_lm(str(dp), torch.float32, device), tok,
            device)


def test_hf_engine_restores_hfs_function_after_the_call_and_after_an_error(models):
    from transformers.generation import utils as hf_utils

    target, draft, tok, dev = models
    original = hf_utils._speculative_sampling
    enc = tok(PROMPTS[:2], return_tensors="pt", padding=True)
    engine = HFEngine(target, draft, get_sampler("exact"), 3, 1.0, dev, [1], 0)
    engine.generate(enc.input_ids, enc.attention_mask, 8, torch.Generator(dev).manual_seed(0))
    assert hf_utils._speculative_sampling is original

    class Boom(RuntimeError):
        pass

    def failing(*args, **kwargs):
        raise Boom("sampler failed")

    broken = get_sampler("exact")
    broken.verify_checked = failing
    with pytest.raises(Boom):
        HFEngine(target, draft, broken, 3, 1.0, dev, [1], 0).generate(enc.input_ids, enc.attention_mask, 8)
    assert hf_utils._speculative_sampling is original
    with pytest.raises(Boom), hf_verify_step(broken, None, {}):
        assert hf_utils._speculative_sampling is not original
        hf_utils._speculative_sampling(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 2, 5), 2,
                                       torch.zeros(1, 3, 5))
    assert hf_utils._speculative_sampling is original


def test_only_device_auto_with_several_gpus_spreads_and_only_the_target(setup, monkeypatch):
    """--device auto on a machine with several GPUs loads the target with device_map="auto"; --device cuda keeps
    both models on one GPU, and the draft is never spread (it and the inputs stay on the first GPU)."""
    from pipeline import models, stack
    from pipeline.config import RunConfig
    from pipeline.tasks import get_task

    _, tp, dp, data, _ = setup
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    loaded = []
    monkeypatch.setattr(stack, "load_causal_lm",
                        lambda name, dtype, device, spread=False: loaded.append((name, spread)) or object())
    for requested, target_spread in (("auto", True), ("cuda", False), ("cpu", False)):
        loaded.clear()
        cfg = RunConfig(target=str(tp), draft=str(dp), data=str(data), device=requested, gamma=2)
        stack.load_pair(cfg, get_task("prompts"), torch.float32, "cpu")
        assert loaded == [(str(tp), target_spread), (str(dp), False)], requested
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert not models.spreads_target("auto")


def test_hf_engine_shim_follows_older_releases_is_done_candidate():
    """transformers up to about 5.17 calls the verify step with a fifth argument, is_done_candidate (the last
    draft ends the sequence), and then expects no token after the drafts: with every draft accepted, HF's own
    function reports γ - 1 matches and returns the γ drafts. The shim does the same with our sampler."""
    from transformers.generation import utils as hf_utils

    gamma, V = 3, 7
    target_logits = torch.randn(1, gamma + 1, V, generator=torch.Generator().manual_seed(0))
    drafts = target_logits[:, :gamma].argmax(-1)                  # greedy accepts them all
    ids = torch.cat([torch.tensor([[5, 6]]), drafts], dim=1)     # prompt + candidates, as HF passes them
    draft_logits = torch.randn(1, gamma, V)
    for is_done, want_n, want_tokens in ((False, gamma, None), (True, gamma - 1, drafts)):
        stats = {}
        with hf_verify_step(get_sampler("greedy"), None, stats):
            valid, n = hf_utils._speculative_sampling(ids, draft_logits, gamma, target_logits, is_done)
        assert int(n) == want_n and stats["accepted"] == gamma
        if want_tokens is None:  # the drafts and the bonus token
            assert valid.shape == (1, gamma + 1) and valid[0, :gamma].tolist() == drafts[0].tolist()
            assert int(valid[0, gamma]) == int(target_logits[0, gamma].argmax())
        else:
            assert valid.tolist() == want_tokens.tolist()


def test_hf_engine_greedy_equals_our_engine_and_the_target(models):
    target, draft, tok, dev = models
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    hf = HFEngine(target, draft, get_sampler("greedy"), 4, 0.0, dev, [1], 0).generate(
        enc.input_ids, enc.attention_mask, 16)
    ours = SpeculativeEngine(target, draft, get_sampler("greedy"), gamma=4, device=dev, eos_token_ids=[1],
                             pad_token_id=0).generate(
        enc.input_ids, enc.attention_mask, 16)
    assert hf.tokens == ours.tokens
    assert sum(r["accepted"] for r in hf.row_stats) > 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_hf_engine_drafts_exactly_gamma_tokens_per_step(models, temperature):
    """transformers 5 reads the draft schedule from the assistant's generation config (its default: up to 20
    tokens, cut short by a confidence threshold), not from generate's kwargs. Every HF step must draft γ, as
    ours does, or the two loops are not compared at equal γ; the draft's config is put back afterwards."""
    target, draft, tok, dev = models
    before = draft.generation_config.to_dict()
    gamma, max_new = 2, 24
    sampler = get_sampler("exact" if temperature else "greedy")
    enc = tok(PROMPTS[:2], return_tensors="pt", padding=True)
    res = HFEngine(target, draft, sampler, gamma, temperature, dev, [], 0).generate(
        enc.input_ids, enc.attention_mask, max_new, torch.Generator(dev).manual_seed(0))
    for row in res.row_stats:
        assert row["new_tokens"] == max_new
        # γ per step, fewer only where the step would pass max_new_tokens (at most the last γ steps)
        assert gamma * (row["verify_steps"] - gamma) <= row["drafted"] <= gamma * row["verify_steps"], row
    assert res.extra["draft_forwards"] == sum(r["drafted"] for r in res.row_stats)
    assert draft.generation_config.to_dict() == before


def test_cnn_dailymail_runs_on_the_real_fixture_articles(setup, fixtures_dir):
    """Three of the 80 real CNN/DailyMail articles through the task end to end (the tiny model's ROUGE means
    nothing; every article must be read, prompted, truncated to the budget, decoded and scored)."""
    root, tp, dp, _, _ = setup
    out = root / "fixtures.json"
    source = fixtures_dir / "cnn_dailymail" / "test.jsonl"
    assert main(base_args(tp, dp, source, out, "--task", "cnn_dailymail", "--limit", "3", "--max-prompt-tokens",
                          "120", "--gamma", "2")) == 0
    res = json.loads(out.read_text())
    assert len(res["samples"]) == 3 and res["resolved"]["prompts_truncated"] == 3  # every article is > 120 tokens
    assert all(s["reference"] and 0 <= s["quality"]["rougeL"] <= 1 for s in res["samples"])
    assert 0 <= res["quality"]["rougeL"] <= 1 and 0 <= res["quality"]["rougeLsum"] <= 1
