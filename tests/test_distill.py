"""`specsweep distill` (pipeline/distill/).

The target of a tiny random GPT-2 pair, distilled for a fixed number of steps (deterministic) on
random word prompts, gives a draft whose T = 0 acceptance on the held-out prompts is at least 0.2 above the untrained
draft of the same shape (the same initialisation, before its first step); its folder loads with transformers and
`specsweep run --draft DIR` uses it; its curve and record are written, and nothing is left when it fails; bad
settings fail in one line with exit 2. With ``--draft-vocab K`` the draft is saved with its vocabulary map, and
`specsweep run` decodes with it (its reduced head) to the target's own greedy output (tests/test_vocab_map.py tests
the drafter itself).
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from tiny_models import WORDS, load_saved_pair, save_pair

from pipeline.cli import main
from pipeline.decoding.drafters.vocab_map import CONFIG_KEY, draft_vocab
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.distill.divergence import acceptance, divergence
from pipeline.distill.settings import DistillSettings
from pipeline.distill.student import build_student
from pipeline.models import load_causal_lm, load_tokenizer
from pipeline.samplers import get_sampler

EOS = 1
STEPS = 500
HOLDOUT = 16
NEW_TOKENS = 24
# the recipe's settings for the tiny target (one layer of its two, the target's first; random-word prompts, so the
# prompt positions are the most varied contexts and weigh as much as the continuations)
SETTINGS = ["--steps", str(STEPS), "--holdout", str(HOLDOUT), "--layers", "1", "--lr", "3e-3", "--prompt-weight", "1",
            "--max-new-tokens", str(NEW_TOKENS), "--threads", "1", "--no-progress"]


def _word_prompts(path, n: int, seed: int = 0):
    """A prompts-task JSONL of n random word sequences (3 to 10 words) in the tiny tokenizer's vocabulary."""
    rng = random.Random(seed)
    path.write_text("".join(json.dumps({"id": f"w{i}", "prompt": " ".join(rng.choice(WORDS) for _ in
                                                                       range(rng.randint(3, 10)))}) + "\n"
                            for i in range(n)))
    return path


@pytest.fixture(scope="module")
def distilled(tmp_path_factory):
    """(target folder, data, the distilled draft's folder): the tiny GPT-2 target distilled for STEPS steps."""
    root = tmp_path_factory.mktemp("distill")
    target, _ = save_pair(root, kind="gpt2")
    data = _word_prompts(root / "words.jsonl", 300)
    out = root / "distilled"
    assert main(["distill", "--target", str(target), "--data", str(data), "--out", str(out), *SETTINGS]) == 0
    return target, data, out


def _acceptance(target, draft, tok, prompts: list[str]) -> float:
    """Accepted over drafted tokens of greedy decoding at γ 4 (NEW_TOKENS per prompt, all prompts together)."""
    enc = tok(prompts, return_tensors="pt", padding=True)
    result = SpeculativeEngine(target, draft, get_sampler("greedy"), gamma=4, device="cpu", eos_token_ids=[EOS],
                               pad_token_id=0).generate(
        enc.input_ids, enc.attention_mask, NEW_TOKENS)
    return sum(s["accepted"] for s in result.row_stats) / sum(s["drafted"] for s in result.row_stats)


@pytest.mark.slow
def test_distilling_a_tiny_target_raises_its_held_out_acceptance(distilled):
    target_dir, data, out = distilled
    target, tok = load_causal_lm(str(target_dir), torch.float32, "cpu"), load_tokenizer(str(target_dir))
    settings = DistillSettings(target=str(target_dir), data=str(data), out=str(out.with_name("unused")), steps=STEPS,
                               layers=1)
    untrained = build_student(target, settings).eval()          # the distilled draft before its first step
    trained = load_causal_lm(str(out), torch.float32, "cpu")
    heldout = [json.loads(line) for line in (out / "heldout.jsonl").read_text().splitlines()]
    assert len(heldout) == HOLDOUT
    prompts = [r["prompt"] for r in heldout]
    before, after = _acceptance(target, untrained, tok, prompts), _acceptance(target, trained, tok, prompts)
    assert after >= before + 0.2, f"held-out acceptance {before:.3f} untrained -> {after:.3f} distilled"
    record = json.loads((out / "distill.json").read_text())
    assert record["training"]["steps"] == STEPS and record["data"]["heldout"] == HOLDOUT
    assert {r["id"] for r in heldout} == set(record["data"]["heldout_ids"])
    assert record["final"]["heldout"]["agreement"] > record["start"]["heldout"]["agreement"] + 0.2


def test_the_curve_and_record_are_written_and_nothing_else_is_left(distilled):
    _, _, out = distilled
    curve = json.loads((out / "curve.json").read_text())
    points = curve["points"]
    assert points[0]["step"] == 0 and points[0]["train_loss"] is None and points[-1]["step"] == STEPS
    assert len(points) == 11                                     # before the first step, then every tenth
    assert all(p["train_loss"] > 0 and 0 <= p["heldout"]["agreement"] <= 1 for p in points[1:])
    assert points[-1]["train_loss"] < points[1]["train_loss"]
    assert (out / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "distill.json").read_text())["final"] == points[-1]
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".")] == []   # no temporary folder


def test_the_draft_folder_loads_with_transformers_and_run_uses_it(distilled, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target_dir, _, out = distilled
    model, tok = AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    assert model.config.num_hidden_layers == 1 and tok.get_vocab() == load_tokenizer(str(target_dir)).get_vocab()
    assert getattr(model.config, CONFIG_KEY, None) is None                # the whole vocabulary: no map
    results = tmp_path / "run.json"
    assert main(["run", "--target", str(target_dir), "--draft", str(out), "--data", str(out / "heldout.jsonl"),
                 "--gamma", "4", "--temperature", "0", "--max-new-tokens", "12", "--repeats", "3",
                 "--samples-per-repeat", "4", "--threads", "1", "--no-progress", "--out", str(results)]) == 0
    result = json.loads(results.read_text())
    assert result["config"]["draft"] == str(out) and result["resolved"]["drafter"] == {"drafter": "model"}
    assert result["metrics"]["acceptance_rate"] > 0.2


def test_a_failed_distillation_leaves_nothing(tmp_path, monkeypatch):
    import pipeline.distill.recipe as recipe

    target, _ = save_pair(tmp_path / "pair", kind="gpt2")

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(recipe, "save_draft", broken)                   # fails after training, inside the folder
    with pytest.raises(RuntimeError, match="disk full"):
        main(["distill", "--target", str(target), "--data", str(_word_prompts(tmp_path / "w.jsonl", 12)),
              "--out", str(tmp_path / "draft"), "--steps", "2", "--holdout", "2", "--layers", "1", "--threads", "1",
              "--no-progress"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pair", "w.jsonl"]


@pytest.mark.parametrize("extra,words", [
    (["--time-budget", "-5"], "--time-budget must be a positive number"),
    (["--steps", "3", "--time-budget", "60"], "give one budget"),
    ([], "give one budget"),
    (["--steps", "3", "--divergence", "js"], "unknown divergence 'js'"),
    (["--steps", "3", "--task", "spec_bench"], "--task spec_bench is not distilled"),
    (["--steps", "3", "--draft-vocab", "1"], "--draft-vocab K must be >= 2"),
    (["--steps", "3", "--draft-vocab", "100000"], "more than the target's"),
    (["--steps", "3", "--init-layers", "0,7"], "--init-layers must name 1 target layers"),
    (["--steps", "3", "--layers", "3"], "--layers 3 is more than the target's 2"),
    (["--steps", "3", "--width", "48"], "drop --width or use --init fresh"),
    (["--steps", "3", "--holdout", "50"], "leaves no training record"),
    (["--steps", "3", "--chat-template"], "the target's tokenizer has no chat template"),
])
def test_bad_settings_fail_in_one_line(tmp_path, capsys, extra, words):
    target, _ = save_pair(tmp_path / "pair", kind="gpt2")
    out = tmp_path / "draft"
    argv = ["distill", "--target", str(target), "--data", str(_word_prompts(tmp_path / "w.jsonl", 12)),
            "--out", str(out), "--layers", "1", "--threads", "1", "--no-progress", *extra]
    capsys.readouterr()                                                # the pair's saving, not the command's
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specsweep distill: error: ") and words in err and "\n" not in err, err
    assert not out.exists()


def test_a_target_without_a_tokenizer_fails_in_one_line(tmp_path, capsys):
    model = load_saved_pair(tmp_path / "pair", kind="gpt2")[0]
    model.save_pretrained(tmp_path / "bare")                          # weights only, no tokenizer
    capsys.readouterr()
    assert main(["distill", "--target", str(tmp_path / "bare"), "--data", str(_word_prompts(tmp_path / "w.jsonl", 8)),
                 "--out", str(tmp_path / "draft"), "--steps", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "has no tokenizer" in err and "\n" not in err and not (tmp_path / "draft").exists()


def test_the_divergences_vanish_on_equal_laws_and_tv_is_one_minus_acceptance():
    g = torch.Generator().manual_seed(0)
    V = 12
    target, draft = torch.randn(5, V, generator=g) * 2, torch.randn(5, V, generator=g) * 2
    logp = torch.log_softmax(target, -1)
    top_logp, top_ids = logp.topk(V)                                   # k = V: the binned laws are the laws
    t2d = torch.arange(V)
    for name in ("fkl", "rkl", "tv"):
        assert divergence(name, target, top_ids, top_logp, t2d).abs().max() < 1e-5
    p, q = logp.exp(), torch.softmax(draft, -1)
    assert torch.allclose(divergence("fkl", draft, top_ids, top_logp, t2d), (p * (p.log() - q.log())).sum(-1),
                          atol=1e-5)
    assert torch.allclose(divergence("rkl", draft, top_ids, top_logp, t2d), (q * (q.log() - p.log())).sum(-1),
                          atol=1e-5)
    assert torch.allclose(divergence("tv", draft, top_ids, top_logp, t2d),
                          1 - acceptance(draft, top_ids, top_logp, t2d), atol=1e-5)


def test_a_distilled_reduced_vocabulary_is_saved_with_the_draft_and_run_uses_it(tmp_path):
    target, _ = save_pair(tmp_path / "pair", kind="llama")
    data = _word_prompts(tmp_path / "w.jsonl", 40)
    out = tmp_path / "draft"
    assert main(["distill", "--target", str(target), "--data", str(data), "--out", str(out), "--steps", "20",
                 "--holdout", "4", "--layers", "1", "--draft-vocab", "40", "--threads", "1", "--no-progress"]) == 0
    ids = draft_vocab(load_causal_lm(str(out), torch.float32, "cpu"))
    assert len(ids) == 40 and EOS in ids and ids == sorted(ids)
    record = json.loads((out / "distill.json").read_text())
    assert record["draft"]["vocab"] == 40 and 0 < record["draft"]["heldout_continuation_coverage"] <= 1
    tokens = {}
    for gamma in (0, 3):
        results = tmp_path / f"run{gamma}.json"
        assert main(["run", "--target", str(target), "--draft", str(out), "--data", str(out / "heldout.jsonl"),
                     "--gamma", str(gamma), "--temperature", "0", "--max-new-tokens", "10", "--repeats", "3",
                     "--samples-per-repeat", "4", "--threads", "1", "--no-progress", "--out", str(results)]) == 0
        result = json.loads(results.read_text())
        tokens[gamma] = {s["id"]: s["token_ids"] for s in result["samples"]}
    assert result["resolved"]["drafter"] == {"drafter": "model", "draft_vocab": 40}
    assert result["metrics"]["drafted_tokens"] > 0 and tokens[3] == tokens[0]


def test_the_teacher_and_on_policy_laws_are_the_targets_own(tmp_path):
    """The target's top-k law kept along each sequence (its continuation of left-padded prompts, with one KV cache;
    and after the draft's own samples) is the law of a plain forward over that sequence alone."""
    from pipeline.distill.on_policy import on_policy_batch
    from pipeline.distill.student import Vocabulary
    from pipeline.distill.teacher import teacher_pass

    target, draft, tok = load_saved_pair(tmp_path, kind="llama")
    prompts = [tok(p).input_ids for p in ("the storm hit the city", "water", "a new report said")]
    seqs = teacher_pass(target, prompts, [EOS], 0, 6, 0.0, 5, 0, progress=False)
    V = target.get_output_embeddings().weight.shape[0]
    sampled = on_policy_batch(draft, target, Vocabulary.full(V), seqs, 4, [EOS], 0, 5, torch.Generator().manual_seed(0))
    assert [s.source for s in sampled] == ["draft"] * 3 and all(s.continuation.all() for s in sampled)
    for s in seqs + sampled:
        with torch.no_grad():
            logp = torch.log_softmax(target(s.ids[None]).logits[0].float(), -1)[s.positions]
        values, ids = logp.topk(5)
        assert torch.equal(s.top_ids, ids) and torch.allclose(s.top_logp, values, atol=1e-4)
    assert [s.ids[: s.prompt].tolist() for s in seqs] == prompts and all(len(s.ids) > s.prompt for s in seqs)


def test_on_policy_steps_run_and_are_recorded(tmp_path):
    target, _ = save_pair(tmp_path / "pair", kind="gpt2")
    out = tmp_path / "draft"
    assert main(["distill", "--target", str(target), "--data", str(_word_prompts(tmp_path / "w.jsonl", 12)),
                 "--out", str(out), "--steps", "8", "--holdout", "2", "--layers", "1", "--on-policy", "1",
                 "--divergence", "tv", "--threads", "1", "--no-progress"]) == 0
    training = json.loads((out / "distill.json").read_text())["training"]
    assert training["on_policy_steps"] == 6 and training["on_policy_seconds"] > 0     # after the first quarter


def test_excluded_records_are_never_used(tmp_path):
    target, _ = save_pair(tmp_path / "pair", kind="gpt2")
    data = _word_prompts(tmp_path / "w.jsonl", 12)
    lines = data.read_text().splitlines()
    (tmp_path / "measured.jsonl").write_text("\n".join(lines[:3]) + "\n")        # w0, w1, w2: what run measures
    out = tmp_path / "draft"
    assert main(["distill", "--target", str(target), "--data", str(data), "--out", str(out), "--steps", "2",
                 "--holdout", "3", "--layers", "1", "--exclude", str(tmp_path / "measured.jsonl"), "--threads", "1",
                 "--no-progress"]) == 0
    record = json.loads((out / "distill.json").read_text())["data"]
    assert (record["records"], record["excluded"], record["train"], record["heldout"]) == (9, 3, 6, 3)
    assert not {"w0", "w1", "w2"} & set(record["heldout_ids"])
