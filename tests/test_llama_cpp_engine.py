"""`specsweep run --engine llama.cpp` (pipeline/decoding/llama_cpp/): llama.cpp's own speculative decoding through its
server, on a tiny Llama pair written here as GGUF files (tests/gguf_writer.py; the draft a noisy copy of the target,
one vocabulary). At T = 0 the draft model's and the n-gram drafter's tokens must equal llama.cpp alone's (γ = 0) on
the same prompts. Those tests need llama.cpp built (`python -m pipeline.decoding.llama_cpp.build`, about 15 minutes)
and skip with that reason where it is not; the bad-input tests (missing or wrong GGUF files, a missing build, the
settings it refuses) and the flag mapping run always."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from gguf_writer import tiny_llama, write_gguf
from tiny_models import PROMPTS, WORDS, build_bpe_tokenizer, write_prompts

from pipeline.cli import main
from pipeline.decoding.llama_cpp import build, server
from pipeline.decoding.llama_cpp.engine import Settings, request_body, server_args
from pipeline.quality import greedy_agreement
from pipeline.synthetic import noisy_copy


def _users_builds() -> Path:
    """The user's llama.cpp builds: the suite keeps $SPECSWEEP_CACHE_DIR in a temporary folder (conftest.py), so the
    build is looked for where `python -m pipeline.decoding.llama_cpp.build` puts it by default."""
    if os.environ.get(build.ENV_DIR):
        return Path(os.environ[build.ENV_DIR])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specsweep" / "llama.cpp"


BUILDS = _users_builds()
NOT_BUILT = (f"llama.cpp {build.VERSION} is not built in {BUILDS}: run `{build.BUILD_COMMAND}` once (about 15 "
             "minutes) to run these tests")


@pytest.fixture(autouse=True, scope="module")
def _builds_where_the_user_has_them():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(build.ENV_DIR, str(BUILDS))
        yield


@pytest.fixture(autouse=True)
def _no_server_left():
    yield
    assert server.live() == [], "a llama-server outlived its run"


def built() -> bool:
    return build.binary("llama-server", BUILDS / f"{build.VERSION}-{build.cpu_key()}").is_file()


needs_build = pytest.mark.skipif(not built(), reason=NOT_BUILT)


SCALE = 16
"""The tiny Llama's matrices times this: at its initial scale every prompt's greedy output is one token repeated,
which would make the token-for-token comparisons weak; at 16 its outputs wander (about 20 distinct tokens in 24)."""


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(target.gguf, draft.gguf, prompts.jsonl, the target in torch): the draft a noisy copy of the target."""
    root = tmp_path_factory.mktemp("llama_cpp")
    tokenizer = build_bpe_tokenizer(WORDS, 300)
    target = tiny_llama(tokenizer)
    with torch.no_grad():
        for weight in target.parameters():
            if weight.dim() == 2:
                weight.mul_(SCALE)
    write_gguf(target, tokenizer, root / "target.gguf")
    write_gguf(noisy_copy(target, 0.02, 1), tokenizer, root / "draft.gguf")
    return root / "target.gguf", root / "draft.gguf", write_prompts(root / "prompts.jsonl"), target


def args(target, data, out, *extra, draft=None):
    return ["run", "--engine", "llama.cpp", "--target", str(target), *(["--draft", str(draft)] if draft else []),
            "--data", str(data), "--temperature", "0", "--max-new-tokens", "24", "--repeats", "3",
            "--samples-per-repeat", "2", "--threads", "1", "--wandb-mode", "disabled", "--no-progress",
            "--out", str(out), *extra]


def one_line_error(code, err, *needles):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]


# --- always: bad input, refusals, the flag mapping ---------------------------------------------------------------

def test_a_missing_gguf_file_is_one_line(pair, tmp_path, capsys):
    _, _, data, _ = pair
    code = main(args(tmp_path / "nowhere.gguf", data, tmp_path / "r.json", "--gamma", "0"))
    one_line_error(code, capsys.readouterr().err, "--target", "no such GGUF file")
    assert not (tmp_path / "r.json").exists()


def test_a_file_that_is_not_gguf_is_one_line(pair, tmp_path, capsys):
    target, _, data, _ = pair
    fake = tmp_path / "fake.gguf"
    fake.write_text("not a model")
    code = main(args(target, data, tmp_path / "r.json", "--gamma", "3", draft=fake))
    one_line_error(code, capsys.readouterr().err, "--draft", "is not a GGUF file")


def test_a_folder_without_one_gguf_is_one_line(pair, tmp_path, capsys):
    _, _, data, _ = pair
    code = main(args(tmp_path, data, tmp_path / "r.json", "--gamma", "0"))
    one_line_error(code, capsys.readouterr().err, "needs one .gguf file")


def test_a_missing_build_is_one_line(pair, tmp_path, capsys, monkeypatch):
    target, draft, data, _ = pair
    monkeypatch.setenv(build.ENV_DIR, str(tmp_path / "no-builds"))
    code = main(args(target, data, tmp_path / "r.json", "--gamma", "3", draft=draft))
    one_line_error(code, capsys.readouterr().err, f"llama.cpp {build.VERSION} is not built", build.BUILD_COMMAND)


def test_missing_tools_are_named_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(build.ENV_DIR, str(tmp_path / "no-builds"))
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    assert build.main(["--sdist", str(tmp_path / "none.tar.gz")]) == 2
    one_line_error(2, capsys.readouterr().err, "needs cmake, ninja, a C compiler", "apt-get install")
    assert not (tmp_path / "no-builds").exists()


@pytest.mark.parametrize("extra, needle", [
    (("--dtype", "bfloat16"), "--dtype auto or q8_0/f16/bf16 (GGUF types)"),
    (("--drafter", "suffix"), "--drafter suffix runs in our engine"),
    (("--sampler", "sigmoid", "--temperature", "1"), "--sampler exact"),
    (("--batch-size", "2"), "--batch-size 1"),
    (("--drafter", "prompt-lookup", "--gamma", "2"), "give --gamma >= 3"),
    (("--drafter", "prompt-lookup", "--draft-min", "1"), "apply to llama.cpp's draft model"),
    (("--draft-min", "5"), "--draft-min must be in [0, --gamma]"),
    (("--draft-p-min", "1.5"), "--draft-p-min must be a probability"),
])
def test_settings_it_cannot_run_are_refused_in_one_line(pair, tmp_path, capsys, extra, needle):
    target, draft, data, _ = pair
    code = main(args(target, data, tmp_path / "r.json", "--gamma", "4", *extra, draft=draft))
    one_line_error(code, capsys.readouterr().err, needle)


def test_its_knobs_are_refused_on_other_engines(pair, tmp_path, capsys):
    target, draft, data, _ = pair
    argv = args(target, data, tmp_path / "r.json", "--draft-p-min", "0.5", draft=draft)
    argv[argv.index("llama.cpp")] = "specsweep"
    one_line_error(main(argv), capsys.readouterr().err, "--draft-p-min set(s) llama.cpp's draft model")


def test_a_gguf_type_is_refused_on_other_engines(pair, tmp_path, capsys):
    target, draft, data, _ = pair
    argv = args(target, data, tmp_path / "r.json", "--dtype", "q8_0", draft=draft)
    argv[argv.index("llama.cpp")] = "specsweep"
    one_line_error(main(argv), capsys.readouterr().err, "--dtype q8_0 is a GGUF type, for --engine llama.cpp")


def test_the_run_settings_map_to_the_servers_flags(tmp_path):
    t, d = tmp_path / "t.gguf", tmp_path / "d.gguf"
    spec = server_args(Settings(t, d, "draft-simple", 5, draft_min=2, draft_p_min=0.5, threads=2, ctx_size=128))
    assert spec[spec.index("--spec-type") + 1] == "draft-simple"
    assert spec[spec.index("--spec-draft-model") + 1] == str(d)
    for flag, value in (("--spec-draft-n-max", "5"), ("--spec-draft-n-min", "2"), ("--spec-draft-p-min", "0.5"),
                        ("--threads", "2"), ("--spec-draft-threads", "2"), ("--ctx-size", "128"),
                        ("--parallel", "1"), ("--cache-ram", "0")):
        assert spec[spec.index(flag) + 1] == value, flag
    ngram = server_args(Settings(t, None, "ngram-simple", 6, ngram_size=2))
    assert ngram[ngram.index("--spec-type") + 1] == "ngram-simple"
    assert ngram[ngram.index("--spec-ngram-simple-size-n") + 1] == "2"
    assert ngram[ngram.index("--spec-ngram-simple-size-m") + 1] == "6"
    alone = server_args(Settings(t))
    assert not any(a.startswith("--spec") for a in alone)
    greedy, sampled = request_body([1, 2], 8, 0.0, 7, False), request_body([1, 2], 8, 0.7, 7, True)
    assert greedy["top_k"] == 1 and greedy["temperature"] == 0 and greedy["cache_prompt"] is False
    assert sampled["top_k"] == 0 and sampled["min_p"] == 0 and sampled["top_p"] == 1 and sampled["seed"] == 7
    assert sampled["ignore_eos"] is True and greedy["prompt"] == [1, 2] and greedy["return_tokens"] is True


# --- with the build: llama.cpp decodes ----------------------------------------------------------------------------

def _tokens(path: Path) -> dict[str, list[int]]:
    return {s["id"]: s["token_ids"] for s in json.loads(path.read_text())["samples"]}


@pytest.fixture(scope="module")
def alone(pair, tmp_path_factory):
    """The results of llama.cpp alone (γ = 0) on the prompts."""
    if not built():
        pytest.skip(NOT_BUILT)
    target, _, data, _ = pair
    out = tmp_path_factory.mktemp("alone") / "ar.json"
    assert main(args(target, data, out, "--gamma", "0")) == 0
    assert server.live() == []
    return json.loads(out.read_text())


@needs_build
def test_llama_cpp_alone_writes_a_results_file_with_transformers_greedy_tokens(pair, alone):
    """The same float32 weights decoded greedily by transformers give the same tokens until a near tie, which
    llama.cpp's and torch's sums in other orders may round apart (then the two go their own greedy ways)."""
    model, reference = pair[3], []
    for s in alone["samples"]:
        ids = torch.tensor([s["prompt_ids"]])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(s["token_ids"]),
                             do_sample=False, pad_token_id=0, eos_token_id=None)[0, ids.shape[1]:].tolist()
        reference.append({"id": s["id"], "token_ids": out})
    agreement = greedy_agreement(alone["samples"], reference)
    assert agreement["identical"] >= 3 and agreement["shared_prefix_share"] >= 0.75, agreement
    m, r = alone["metrics"], alone["resolved"]
    assert [s["id"] for s in alone["samples"]] == [f"p{i}" for i in range(len(PROMPTS))]
    assert all(1 <= s["new_tokens"] == len(s["token_ids"]) <= 24 for s in alone["samples"])
    assert m["tokens_per_second"] > 0 and m["target_forwards"] > 0 and m["acceptance_rate"] is None
    assert alone["config"]["engine"] == "llama.cpp" and alone["config"]["dtype"] == "auto"
    record = r["llama_cpp"]["autoregressive"]
    assert record["target"]["file_type"] == "F32" and record["spec_type"] is None
    assert record["source"] == f"{build.SDIST}=={build.VERSION}"


@needs_build
def test_a_draft_model_gives_llama_cpp_alones_tokens(pair, alone, tmp_path, capsys):
    target, draft, data, _ = pair
    out = tmp_path / "draft.json"
    assert main(args(target, data, out, "--gamma", "3", draft=draft)) == 0
    res = json.loads(out.read_text())
    assert _tokens(out) == {s["id"]: s["token_ids"] for s in alone["samples"]}
    m = res["metrics"]
    assert m["drafted_tokens"] > 0 and 0 < m["accepted_tokens"] <= m["drafted_tokens"]
    assert m["acceptance_rate"] == pytest.approx(m["accepted_tokens"] / m["drafted_tokens"])
    assert m["mean_accepted_tokens"] > 1 and m["speedup"] > 0 and m["speedup_paired"]
    assert m["greedy_agreement"]["identical"] == m["greedy_agreement"]["samples"]
    record = res["resolved"]["llama_cpp"]["speculative"]
    assert record["spec_type"] == "draft-simple" and record["draft_max"] == 3
    assert record["draft_min"] == 0 and record["draft_p_min"] == 0.0 and record["draft"]["file_type"] == "F32"
    assert res["resolved"]["llama_cpp"]["autoregressive"]["spec_type"] is None
    assert "paired speedup" in capsys.readouterr().out


@needs_build
def test_the_ngram_drafter_gives_llama_cpp_alones_tokens(pair, alone, tmp_path):
    target, _, data, _ = pair
    out = tmp_path / "ngram.json"
    # llama.cpp's ngram-simple takes the latest earlier match of the last n tokens, and drops a draft shorter than
    # n: in the tiny target's runs of one repeated token the latest match is the token before, so only n = 1 drafts
    assert main(args(target, data, out, "--gamma", "4", "--drafter", "prompt-lookup", "--lookup-max", "1")) == 0
    res = json.loads(out.read_text())
    assert _tokens(out) == {s["id"]: s["token_ids"] for s in alone["samples"]}
    record = res["resolved"]["llama_cpp"]["speculative"]
    assert record["spec_type"] == "ngram-simple" and record["ngram_size"] == 1
    m = res["metrics"]
    assert 0 < m["accepted_tokens"] <= m["drafted_tokens"], "the tiny target repeats itself: the n-gram drafter drafts"


@needs_build
def test_sampling_is_seeded(pair, tmp_path):
    target, draft, data, _ = pair
    runs = [tmp_path / f"t1-{i}.json" for i in range(2)]
    for out in runs:
        assert main(args(target, data, out, "--gamma", "3", "--temperature", "1", "--seed", "3", draft=draft)) == 0
    assert _tokens(runs[0]) == _tokens(runs[1])


@needs_build
def test_a_server_that_cannot_start_is_one_line_and_leaves_nothing(tmp_path):
    bad = server.LlamaServer(build.binary("llama-server"), ["--model", str(tmp_path / "none.gguf")])
    with pytest.raises(Exception) as info:
        bad.start(timeout=120)
    assert "exited with code" in str(info.value) and "\n" not in str(info.value)
    assert server.live() == [] and bad.process is None


@needs_build
def test_dtype_q8_0_runs_both_files_requantised_once_and_keeps_the_tokens_of_its_own_target_alone(pair, tmp_path):
    """--dtype q8_0: llama-quantize writes the target and the draft as Q8_0 into the cache once; the speculative loop
    emits the Q8_0 target alone's tokens (its paired γ = 0 loop), and the results say which files ran."""
    from pipeline.decoding.llama_cpp.gguf_files import describe
    from pipeline.decoding.llama_cpp.quantize import cache_path, requantized

    target, draft, data, _ = pair
    out = tmp_path / "q8.json"
    assert main(args(target, data, out, "--gamma", "3", "--dtype", "q8_0", draft=draft)) == 0
    res = json.loads(out.read_text())
    assert res["config"]["dtype"] == "q8_0"
    agreement = res["metrics"]["greedy_agreement"]
    assert agreement["identical"] == agreement["samples"] >= 2, agreement      # the paired timed samples
    loops = res["resolved"]["llama_cpp"]
    for loop in ("speculative", "autoregressive"):
        assert loops[loop]["target"]["file_type"] == "MOSTLY_Q8_0"
        assert loops[loop]["target"]["path"] == str(cache_path(target, "q8_0"))
    assert loops["speculative"]["draft"]["file_type"] == "MOSTLY_Q8_0"
    made = cache_path(target, "q8_0")
    before = made.stat().st_mtime_ns
    assert requantized(target, "q8_0") == made and made.stat().st_mtime_ns == before     # made once, then reused
    assert describe(made)["bytes"] < describe(target)["bytes"]                         # F32 -> Q8_0 is smaller
    assert requantized(target, "auto") == target


def test_the_search_space_searches_the_floor_and_minimum_of_a_draft_model_only(tmp_path):
    """sweeps/optuna_space.llama-cpp.yaml's knobs: sampled in a draft model's trials (the minimum at most γ), absent
    from prompt lookup's, absent from the record of a space without them (a study made before continues), and the
    settings they give are a valid llama.cpp run; a floor outside [0, 1] is one line."""
    import optuna

    from pipeline.config import RunConfig
    from pipeline.errors import SpecsweepError
    from pipeline.tuning.space import SearchSpace

    space = SearchSpace.load(Path(__file__).parents[1] / "sweeps" / "optuna_space.llama-cpp.yaml")
    fixed = {"gamma": 2, "sampler": "exact", "dtype": "auto", "drafter": "model"}
    params = space.suggest(optuna.trial.FixedTrial({**fixed, "draft_p_min": 0.6, "draft_min": 2}))
    assert params["draft_p_min"] == 0.6 and params["draft_min"] == 2
    RunConfig.from_dict({"engine": "llama.cpp", "target": "t.gguf", "draft": "d.gguf", "data": str(tmp_path),
                         **params}).validate_decoding()
    study = optuna.create_study()
    for _ in range(6):                                  # sampled: the minimum never above the trial's γ
        trial = study.ask()
        got = space.suggest(trial)
        if got["drafter"] == "model":
            assert 0 <= got["draft_min"] <= got["gamma"] and 0.0 <= got["draft_p_min"] <= 0.9
        study.tell(trial, 1.0)
    lookup = space.suggest(optuna.trial.FixedTrial({**fixed, "drafter": "prompt-lookup", "gamma": 4,
                                                    "lookup_max": 3}))
    assert "draft_p_min" not in lookup and "draft_min" not in lookup
    assert {"draft_p_min", "draft_min"} <= set(space.recorded())
    assert "draft_p_min" not in SearchSpace().recorded()
    bad = tmp_path / "space.yaml"
    bad.write_text("draft_p_min: {low: 0.5, high: 1.5}\n")
    with pytest.raises(SpecsweepError, match="draft_p_min needs 0 <= low <= high <= 1"):
        SearchSpace.load(bad)


def test_a_llama_cpp_study_reads_no_torch_model_for_its_pair(tmp_path, monkeypatch):
    """A llama.cpp study of a registry pair searches its space as it is: it loads no transformers tokenizer (which
    would download and convert the pair's torch folders, 9.6 GB for the Qwen pair, that llama.cpp never reads)."""
    import pipeline.tuning.space as space_module
    from pipeline.config import RunConfig
    from pipeline.tuning.space import SearchSpace, space_for_pair

    def no_tokenizer(name):
        raise AssertionError(f"loaded the tokenizer of {name}")

    monkeypatch.setattr(space_module, "load_tokenizer", no_tokenizer)
    space = SearchSpace.load(Path(__file__).parents[1] / "sweeps" / "optuna_space.llama-cpp.yaml")
    base = RunConfig.from_dict({"engine": "llama.cpp", "target": "qwen2.5-coder-1.5b-instruct",
                                "draft": "qwen2.5-coder-0.5b-instruct", "data": str(tmp_path)})
    assert space_for_pair(space, base) is space
    with pytest.raises(AssertionError, match="loaded the tokenizer"):       # our engine does read it
        space_for_pair(space, RunConfig.from_dict({"target": "t", "draft": "d", "data": str(tmp_path)}))
