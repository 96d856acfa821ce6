"""The spec_bench task (pipeline/tasks/spec_bench.py) and its per-category results (pipeline/categories.py,
pipeline/paired.py time_groups, analysis/spec_bench_view.py): the question file and its errors, fetching it from its
published location, category slicing, the two-turn conversation built from the model's own first answer, the
refusal of a target without a chat template, the per-category arithmetic checked by hand, and the report's table."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tiny_models import save_pair

from pipeline import paired
from pipeline.categories import agreement, by_category, question_mean_rates
from pipeline.cli import main
from pipeline.config import RunConfig
from pipeline.data import fetch, load_task_data
from pipeline.errors import SpecsweepError
from pipeline.synthetic import build_tokenizer
from pipeline.tasks import FETCHABLE, get_task
from pipeline.tasks.spec_bench import CATEGORIES, GROUP_NAMES, GROUPS, Conversations

TASK = get_task("spec_bench")
# a chat template in the tiny tokenizer's words: user turns after "news", answers after "report"
TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'user' %}news {{ m['content'] }} {% else %}report "
            "{{ m['content'] }} {% endif %}{% endfor %}{% if add_generation_prompt %}report{% endif %}")
QUESTIONS = [
    {"question_id": 81, "category": "writing", "turns": ["the storm was in the city", "a new report"]},
    {"question_id": 82, "category": "writing", "turns": ["police said the plane was", "the world team"]},
    {"question_id": 161, "category": "translation", "turns": ["water"]},
    {"question_id": 321, "category": "qa", "turns": ["the president of the world team said that"]},
    {"question_id": 322, "category": "qa", "turns": ["the game was not"], "reference": ["ignored"]},
]


def write_questions(path: Path, rows=QUESTIONS) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def one_line_error(fn, *args, **kwargs) -> str:
    with pytest.raises(SpecsweepError) as err:
        fn(*args, **kwargs)
    message = str(err.value)
    assert "\n" not in message
    return message


# ------------------------------------------------------------------------------------------- the question file


def test_the_task_is_registered_and_fetchable():
    assert "spec_bench" in FETCHABLE and TASK.url.endswith("/data/spec_bench/question.jsonl")
    assert "hemingkx/Spec-Bench/fd2c1cd" in TASK.url and TASK.hub is None
    assert TASK.metric.key == "token_agreement" and TASK.metric.sign == 1.0
    assert set(GROUP_NAMES) == {*GROUPS, "overall"} and sum(len(c) for c in GROUPS.values()) == len(CATEGORIES) == 13


def test_questions_load_one_record_each_with_their_turns(tmp_path):
    records = load_task_data("spec_bench", write_questions(tmp_path / "q.jsonl"))
    assert [r["id"] for r in records] == ["81", "82", "161", "321", "322"]
    assert records[0] == {"id": "81", "category": "writing", "turns": json.dumps(QUESTIONS[0]["turns"])}


@pytest.mark.parametrize("line, message", [
    ({"category": "qa", "turns": ["a"]}, "line 1: missing field 'question_id'"),
    ({"question_id": 1, "turns": ["a"]}, "line 1: missing field(s) 'category'"),
    ({"question_id": 1, "category": 3, "turns": ["a"]}, "field 'category' must be a string"),
    ({"question_id": 1, "category": " ", "turns": ["a"]}, "field 'category' is empty"),
    ({"question_id": 1, "category": "qa", "turns": "a"}, "field 'turns' must be a non-empty list"),
    ({"question_id": 1, "category": "qa", "turns": []}, "field 'turns' must be a non-empty list"),
    ({"question_id": 1, "category": "qa", "turns": ["a", 2]}, "field 'turns' must be a non-empty list"),
    ({"question_id": 1.5, "category": "qa", "turns": ["a"]}, "field 'question_id' must be an integer"),
    ({"question_id": True, "category": "qa", "turns": ["a"]}, "field 'question_id' must be an integer"),
])
def test_a_bad_question_line_is_one_line_naming_it(tmp_path, line, message):
    path = write_questions(tmp_path / "bad.jsonl", [line])
    assert message in one_line_error(load_task_data, "spec_bench", path)


def test_a_question_id_twice_and_an_empty_file_are_errors(tmp_path):
    path = write_questions(tmp_path / "twice.jsonl", [QUESTIONS[0], {**QUESTIONS[2], "question_id": 81}])
    assert "question_id '81' appears twice" in one_line_error(load_task_data, "spec_bench", path)
    (tmp_path / "empty.jsonl").write_text("\n")
    assert "no examples" in one_line_error(load_task_data, "spec_bench", tmp_path / "empty.jsonl")


def test_fetch_from_a_local_source_writes_parquet_that_loads_back(tmp_path, capsys):
    source = write_questions(tmp_path / "q.jsonl")
    out = tmp_path / "data"
    assert main(["fetch", "--task", "spec_bench", "--source", str(source), "--out", str(out), "--no-progress"]) == 0
    assert "5 of 5 examples" in capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["categories"] == {"writing": 2, "translation": 1, "qa": 2} and manifest["origin"]["kind"] == "local"
    assert load_task_data("spec_bench", out) == load_task_data("spec_bench", source)
    assert main(["fetch", "--task", "spec_bench", "--source", str(tmp_path / "none.jsonl"), "--out", str(out)]) == 2


@contextlib.contextmanager
def serving(folder: Path):
    """An HTTP server on 127.0.0.1 serving ``folder``; yields its base URL."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_fetch_downloads_the_published_file(tmp_path, monkeypatch):
    """The download path, with the published location pointed at a local server holding a file of the schema."""
    (tmp_path / "site").mkdir()
    source = write_questions(tmp_path / "site" / "question.jsonl")
    with serving(tmp_path / "site") as base:
        monkeypatch.setattr(TASK, "url", f"{base}/question.jsonl")
        manifest = fetch("spec_bench", tmp_path / "out", progress=False)
    assert manifest["origin"]["kind"] == "url" and manifest["origin"]["url"].endswith("/question.jsonl")
    assert manifest["origin"]["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert manifest["ids"] == ["81", "82", "161", "321", "322"]
    assert load_task_data("spec_bench", tmp_path / "out") == load_task_data("spec_bench", source)


def test_no_network_fails_at_once_in_one_line_naming_source(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(TASK, "url", "http://127.0.0.1:9/question.jsonl")
    assert main(["fetch", "--task", "spec_bench", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot download" in err and "--source PATH" in err
    assert not (tmp_path / "out").exists()


def test_the_real_question_file(fixtures_dir):
    records = load_task_data("spec_bench", fixtures_dir / "spec_bench" / "question.jsonl")
    counts = {c: sum(r["category"] == c for r in records) for c in CATEGORIES}
    assert len(records) == 480 and counts == {**{c: 10 for c in GROUPS["mt_bench"]},
                                             **{c: 80 for c in CATEGORIES[8:]}}
    units = TASK.decode_units(records)
    assert len(units) == 560 and sum(u["turn"] == 2 for u in units) == 80


# ------------------------------------------------------------------------------------------- category slicing


def test_categories_and_per_category_keep_the_first_n_of_each_in_order(tmp_path):
    path = write_questions(tmp_path / "q.jsonl")
    load = functools.partial(load_task_data, "spec_bench", path)
    assert [r["id"] for r in load(per_category=1)] == ["81", "161", "321"]
    assert [r["id"] for r in load(categories=["qa", "writing"])] == ["81", "82", "321", "322"]
    assert [r["id"] for r in load(categories=["qa"], per_category=1)] == ["321"]
    assert [r["id"] for r in load(per_category=5)] == ["81", "82", "161", "321", "322"]
    message = one_line_error(load, categories=["qa", "poetry"])
    assert "'poetry' not in the data" in message and "writing, translation, qa" in message
    # the same from a fetched folder (Parquet)
    fetch("spec_bench", tmp_path / "data", source=path, progress=False)
    assert [r["id"] for r in load_task_data("spec_bench", tmp_path / "data", per_category=1)] == ["81", "161", "321"]


def test_the_real_file_sliced_per_category(fixtures_dir):
    records = load_task_data("spec_bench", fixtures_dir / "spec_bench" / "question.jsonl", per_category=2)
    assert [r["category"] for r in records] == [c for c in CATEGORIES for _ in range(2)]
    assert [r["id"] for r in records[:2]] == ["81", "82"] and records[16]["id"] == "161"


def config(tmp_path, **kw) -> RunConfig:
    data = write_questions(tmp_path / "q.jsonl")
    values = {"target": "t", "data": str(data), "task": "spec_bench", "chat_template": True, "gamma": 0,
              "device": "cpu", **kw}
    return RunConfig(**values)


@pytest.mark.parametrize("settings, message", [
    ({"chat_template": False}, "add --chat-template"),
    ({"processes": 2}, "use --processes 1"),
    ({"per_category": 0}, "--per-category must be >= 1"),
    ({"categories": " , "}, "--categories is empty"),
    ({"task": "prompts", "categories": "qa"}, "--task prompts has none"),
    ({"task": "prompts", "per_category": 2}, "--task prompts has none"),
])
def test_settings_a_spec_bench_run_cannot_take_are_refused_before_anything_loads(tmp_path, settings, message):
    assert message in one_line_error(config(tmp_path, **settings).validate)


def test_spec_bench_decodes_greedily_unless_asked_otherwise(tmp_path):
    import argparse

    from pipeline.commands import run as run_command

    parser = argparse.ArgumentParser()
    run_command.add_arguments(parser)
    flags = ["--target", "t", "--data", str(write_questions(tmp_path / "q.jsonl"))]
    for extra, temperature in ((["--task", "spec_bench"], 0.0), (["--task", "spec_bench", "--temperature", "0.7"], 0.7),
                               (["--task", "cnn_dailymail"], 1.0)):
        values = {k: v for k, v in vars(parser.parse_args(flags + extra)).items()
                  if k not in run_command.DISPLAY_FLAGS}
        assert RunConfig.from_dict(values).temperature == temperature, extra
    assert config(tmp_path).temperature == 0.0 and config(tmp_path, temperature=1.0).temperature == 1.0


def test_a_study_of_spec_bench_at_t_above_0_is_refused_in_one_line(tmp_path, capsys):
    """At T > 0 the quality (agreement with the γ = 0 loop) is not defined: a study, whose objective it is, stops
    before any baseline or trial runs."""
    space = tmp_path / "space.yaml"
    space.write_text("gamma: {low: 1, high: 3}\nsampler: [exact]\nknown_good: {sampler: exact, gamma: 2}\n")
    args = ["tune", "--task", "spec_bench", "--chat-template", "--target", "t", "--draft", "d", "--data",
            str(write_questions(tmp_path / "q.jsonl")), "--device", "cpu", "--space", str(space), "--study-dir",
            str(tmp_path / "study"), "--n-trials", "1", "--wandb-mode", "disabled", "--no-progress"]
    assert main([*args, "--temperature", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "agreement with the γ = 0 loop's tokens" in err and "--temperature 0" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "study").exists()
    assert TASK.quality_error(0.0) is None and get_task("cnn_dailymail").quality_error(1.0) is None


def test_categories_are_a_comma_separated_setting(tmp_path):
    assert config(tmp_path, categories="writing, qa").categories_list() == ["writing", "qa"]
    assert config(tmp_path).categories_list() is None


# ------------------------------------------------------------------------------------------- units and turns


def units():
    return TASK.decode_units([{"id": str(q["question_id"]), "category": q["category"],
                               "turns": json.dumps(q["turns"])} for q in QUESTIONS])


def test_decode_units_put_every_first_turn_before_every_second():
    assert [u["id"] for u in units()] == ["81-t1", "82-t1", "161-t1", "321-t1", "322-t1", "81-t2", "82-t2"]
    second = units()[5]
    assert (second["question_id"], second["turn"], second["category"]) == ("81", 2, "writing")


@pytest.mark.parametrize("size", [1, 2, 3, 8])
def test_a_batch_never_holds_a_turn_and_the_turn_after_it(size):
    batches = TASK.batches(units(), size)
    assert [u["id"] for b in batches for u in b] == [u["id"] for u in units()]
    assert all(len(b) <= size and len({u["turn"] for u in b}) == 1 for b in batches)


def test_timing_groups_take_the_first_n_questions_of_each_category_with_every_turn():
    groups = TASK.timing_groups(units(), 1)
    assert {g: [u["id"] for u in us] for g, us in groups.items()} == {
        "writing": ["81-t1", "81-t2"], "translation": ["161-t1"], "qa": ["321-t1"]}
    assert [u["id"] for u in TASK.timing_groups(units(), 4)["writing"]] == ["81-t1", "82-t1", "81-t2", "82-t2"]


def chat_tokenizer():
    tok = build_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


def conversations(**kw):
    settings = {"long_inputs": "truncate", "target": "tiny", "max_new_tokens": 8, "gamma": 3, **kw}
    return Conversations(chat_tokenizer(), SimpleNamespace(**settings), 256)


def test_turn_two_is_the_template_over_turn_one_the_models_answer_and_turn_two():
    encode, tok = conversations(), chat_tokenizer()
    first, second = units()[0], units()[5]
    assert "before turn 1 was answered" in one_line_error(encode, [second])
    inputs, _ = encode([first])
    assert tok.decode(inputs["input_ids"][0]) == "news the storm was in the city report"
    encode.answered([first], ["  police said the game  "])   # stripped, as Spec-Bench keeps an answer
    inputs, cuts = encode([second])
    expected = tok.apply_chat_template([{"role": "user", "content": "the storm was in the city"},
                                        {"role": "assistant", "content": "police said the game"},
                                        {"role": "user", "content": "a new report"}], tokenize=False,
                                       add_generation_prompt=True)
    assert inputs["input_ids"][0].tolist() == tok(expected, add_special_tokens=False).input_ids
    assert tok.decode(inputs["input_ids"][0]) == ("news the storm was in the city report police said the game news a "
                                                  "new report report")
    assert cuts.truncated == 0


def test_a_long_last_turn_is_cut_from_the_middle_or_refused():
    long = {"id": "9-t1", "question_id": "9", "category": "rag", "turn": 1,
            "turns": [" ".join(["water"] * 100 + ["the", "storm", "was", "not", "new"])]}
    encode = conversations(max_new_tokens=200)   # room: 256 - 200 - max(3, 8) - 2 = 46 positions
    inputs, cuts = encode([long])
    text = build_tokenizer().decode(inputs["input_ids"][0])
    assert inputs["input_ids"].shape[1] <= 46 and cuts.too_long == 1
    assert text.startswith("news water") and text.endswith("the storm was not new report")  # start and end kept
    assert "cut from the middle" in encode.warning(cuts)
    message = one_line_error(conversations(max_new_tokens=200, long_inputs="error"), [long])
    assert "'9-t1' is too long" in message and "--long-inputs truncate" in message


# ------------------------------------------------------------------------------------------- through a run


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny pair whose target tokenizer has TEMPLATE, and the questions."""
    root = tmp_path_factory.mktemp("spec_bench")
    tp, dp = save_pair(root)
    tok = build_tokenizer()
    tok.chat_template = TEMPLATE
    tok.save_pretrained(tp)
    return root, tp, dp, write_questions(root / "q.jsonl")


def run_args(tiny, out, *extra):
    root, tp, dp, data = tiny
    return ["run", "--task", "spec_bench", "--target", str(tp), "--draft", str(dp), "--data", str(data),
            "--chat-template", "--device", "cpu", "--temperature", "0", "--sampler", "greedy", "--max-new-tokens",
            "6", "--repeats", "3", "--samples-per-repeat", "1", "--batch-size", "2", "--wandb-mode", "disabled",
            "--no-progress", "--out", str(root / out), *extra]


def test_a_run_builds_turn_two_from_its_own_answer_and_reports_per_category(tiny, capsys):
    root, tp, _, _ = tiny
    assert main(run_args(tiny, "sd.json", "--gamma", "3")) == 0
    assert "per group" in capsys.readouterr().out
    res = json.loads((root / "sd.json").read_text())
    samples = {s["id"]: s for s in res["samples"]}
    assert list(samples) == ["81-t1", "82-t1", "161-t1", "321-t1", "322-t1", "81-t2", "82-t2"]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tp)
    target = AutoModelForCausalLM.from_pretrained(tp).eval()
    for q in QUESTIONS[:2]:
        first, second = samples[f"{q['question_id']}-t1"], samples[f"{q['question_id']}-t2"]
        text = tok.apply_chat_template([{"role": "user", "content": q["turns"][0]},
                                        {"role": "assistant", "content": first["text"].strip()},
                                        {"role": "user", "content": q["turns"][1]}], tokenize=False,
                                       add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids
        assert second["prompt_tokens"] == ids.shape[1]
        with torch.no_grad():   # the target alone, greedy, on the conversation built from the run's own answer
            out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                                  eos_token_id=1, pad_token_id=0)
        assert second["token_ids"] == out[0, ids.shape[1]:].tolist()[: len(second["token_ids"])]
    m = res["metrics"]
    assert set(m["by_category"]) == {"writing", "translation", "qa"}
    assert set(m["by_group"]) == {"mt_bench", "translation", "qa", "overall"}
    writing = m["by_category"]["writing"]
    assert writing["samples"] == 4 and writing["questions"] == 2 and writing["timed_questions"] == 1
    turns = [samples[i] for i in ("81-t1", "82-t1", "81-t2", "82-t2")]
    assert writing["mean_accepted_tokens"] == pytest.approx(sum(s["new_tokens"] for s in turns)
                                                            / sum(s["verify_steps"] for s in turns))
    assert m["by_group"]["overall"]["new_tokens"] == m["new_tokens"]
    # greedy verification is lossless: every turn is the target's own (its conversation from its own answers)
    assert res["quality"]["identical_outputs"] == 1.0 and res["quality"]["token_agreement"] == 1.0
    assert res["resolved"]["ar_outputs"] == "a pass of the γ = 0 loop in this run"
    assert set(res["measurement"]["groups"]) == {"writing", "translation", "qa"}
    assert res["measurement"]["groups"]["writing"]["ids"] == ["81-t1", "81-t2"]
    for figures in m["by_group"].values():
        assert figures["speedup_ci_low"] <= figures["speedup"] <= figures["speedup_ci_high"]


def test_a_baseline_file_gives_the_ar_outputs_and_its_slice_must_match(tiny, capsys):
    root = tiny[0]
    assert main(run_args(tiny, "ar.json", "--gamma", "0", "--per-category", "1")) == 0
    base = json.loads((root / "ar.json").read_text())
    assert [s["id"] for s in base["samples"]] == ["81-t1", "161-t1", "321-t1", "81-t2"]
    assert base["metrics"]["by_group"]["overall"]["mean_accepted_tokens"] == 1.0
    assert "speedup" not in base["metrics"]["by_group"]["overall"]
    assert base["resolved"]["ar_outputs"] == "this run (γ = 0)" and base["quality"]["identical_outputs"] == 1.0
    assert main(run_args(tiny, "sd1.json", "--gamma", "3", "--per-category", "1", "--baseline",
                         str(root / "ar.json"))) == 0
    res = json.loads((root / "sd1.json").read_text())
    assert res["resolved"]["ar_outputs"] == str(root / "ar.json") and res["quality"]["identical_outputs"] == 1.0
    capsys.readouterr()
    assert main(run_args(tiny, "sd2.json", "--gamma", "3", "--baseline", str(root / "ar.json"))) == 2
    assert "differs from this run in ['per_category']" in capsys.readouterr().err


def test_a_target_without_a_chat_template_is_refused_before_the_models_load(tmp_path, monkeypatch, capsys):
    tp, dp = save_pair(tmp_path)   # the tiny tokenizer has no chat template
    import pipeline.stack

    monkeypatch.setattr(pipeline.stack, "load_pair", lambda *a, **k: pytest.fail("the models were loaded"))
    args = ["run", "--task", "spec_bench", "--target", str(tp), "--draft", str(dp), "--data",
            str(write_questions(tmp_path / "q.jsonl")), "--chat-template", "--device", "cpu", "--no-progress",
            "--wandb-mode", "disabled", "--out", str(tmp_path / "r.json")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs a target with a chat template" in err and str(tp) in err
    assert main([a for a in args if a != "--chat-template"]) == 2
    assert "add --chat-template" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


# ------------------------------------------------------------------------------------------- the arithmetic


def test_agreement_by_hand():
    quality, per = agreement([[1, 2, 3], [1, 2, 9, 4], [5]], [[1, 2, 3], [1, 2, 3], [6, 7]])
    assert [q["identical"] for q in per] == [1.0, 0.0, 0.0]
    assert [q["first_divergence"] for q in per] == [None, 2, 0]
    assert [q["matched_tokens"] for q in per] == [3, 2, 0] and [q["compared_tokens"] for q in per] == [3, 4, 2]
    assert quality == {"identical_outputs": pytest.approx(1 / 3), "token_agreement": pytest.approx(5 / 9),
                       "prefix_agreement": pytest.approx(5 / 8), "units": 3}


def timing(ids, spec_seconds, ar_seconds, tokens):
    """A time_groups by_group record: per repeat the seconds of each unit, the same tokens in every repeat."""
    return {"ids": ids,
            "speculative": {"unit_seconds": spec_seconds, "unit_tokens": [tokens] * len(spec_seconds)},
            "autoregressive": {"unit_seconds": ar_seconds, "unit_tokens": [tokens] * len(ar_seconds)}}


def test_per_category_figures_by_hand():
    us = [{"id": "1-t1", "question_id": "1", "category": "writing"},
          {"id": "2-t1", "question_id": "2", "category": "qa"},
          {"id": "3-t1", "question_id": "3", "category": "qa"},
          {"id": "1-t2", "question_id": "1", "category": "writing"}]
    samples = [{"new_tokens": 10, "verify_steps": 4, "accepted": 6, "drafted": 12},
               {"new_tokens": 8, "verify_steps": 8, "accepted": 0, "drafted": 16},
               {"new_tokens": 6, "verify_steps": 2, "accepted": 4, "drafted": 6},
               {"new_tokens": 12, "verify_steps": 3, "accepted": 9, "drafted": 12}]
    _, per = agreement([[1, 2], [3], [4, 4], [5, 6, 7]], [[1, 2], [3], [4, 5], [5, 6, 7]])
    for s, q in zip(samples, per):
        s["quality"] = q
    # writing: question 1's two turns (10 + 12 tokens); qa: questions 2 (8 tokens) and 3 (6 tokens); three repeats
    timings = {"writing": timing(["1-t1", "1-t2"], [[1.0, 1.0], [1.0, 1.2], [2.0, 2.0]],
                                 [[2.0, 2.0], [2.2, 2.2], [2.0, 2.4]], [10, 12]),
               "qa": timing(["2-t1", "3-t1"], [[1.0, 1.0], [2.0, 1.0], [1.0, 0.5]],
                            [[2.0, 1.0], [2.0, 2.0], [1.0, 1.0]], [8, 6])}
    out = by_category(us, samples, timings, {"mt_bench": ("writing",), "qa": ("qa",), "rag": ("rag",)})
    assert set(out["by_group"]) == {"mt_bench", "qa", "overall"}   # no rag question ran
    w, q, overall = out["by_category"]["writing"], out["by_category"]["qa"], out["by_group"]["overall"]
    assert (w["questions"], w["samples"], w["new_tokens"], w["verify_steps"]) == (1, 2, 22, 7)
    assert w["mean_accepted_tokens"] == pytest.approx(22 / 7) and w["acceptance_rate"] == pytest.approx(15 / 24)
    assert q["mean_accepted_tokens"] == pytest.approx(14 / 10) and q["acceptance_rate"] == pytest.approx(4 / 22)
    assert w["identical_outputs"] == 1.0 and q["identical_outputs"] == 0.5
    assert q["token_agreement"] == pytest.approx(2 / 3) and q["prefix_agreement"] == pytest.approx(2 / 3)
    # writing, per repeat: 22 tokens / its seconds, speculative over AR: 11/5.5 = 2, 10/(22/4.4) = 2, 5.5/(22/4.4) = 1.1
    assert w["speedup"] == pytest.approx(2.0) and (w["speedup_ci_low"], w["speedup_ci_high"]) == pytest.approx((1.1, 2))
    assert w["tokens_per_second"] == pytest.approx(10.0) and w["ar_tokens_per_second"] == pytest.approx(5.0)
    # qa, per repeat the mean of the two questions' rates: spec (8 + 6) / 2 = 7, (4 + 6) / 2 = 5, (8 + 12) / 2 = 10;
    # AR (4 + 6) / 2 = 5, (4 + 3) / 2 = 3.5, (8 + 6) / 2 = 7: ratios 1.4, 10/7, 10/7
    assert q["speedup"] == pytest.approx(10 / 7) and q["speedup_ci_low"] == pytest.approx(1.4)
    assert question_mean_rates([timings["qa"]], "speculative", {u["id"]: u["question_id"] for u in us}) == \
        pytest.approx([7.0, 5.0, 10.0])
    # overall: the mean over all three questions: spec (11 + 8 + 6) / 3, (10 + 4 + 6) / 3, (5.5 + 8 + 12) / 3;
    # AR (5.5 + 4 + 6) / 3, (5 + 4 + 3) / 3, (5 + 8 + 6) / 3
    ratios = sorted([25 / 15.5, 20 / 12, 25.5 / 19])
    assert overall["speedup"] == pytest.approx(ratios[1])
    assert (overall["speedup_ci_low"], overall["speedup_ci_high"]) == pytest.approx((ratios[0], ratios[2]))
    assert overall["questions"] == 3 and overall["timed_questions"] == 3 and overall["new_tokens"] == 36
    assert out["by_group"]["mt_bench"] == {**w, "categories": ["writing"]}


def test_time_groups_pairs_each_category_back_to_back_and_sums_them():
    calls = []

    class Loop:
        def __init__(self, name, seconds):
            self.name, self.seconds = name, seconds

        def generate(self, input_ids, attention_mask, max_new_tokens, generator, encoder_inputs=None):
            calls.append((self.name, int(input_ids[0, 0])))
            rows = input_ids.shape[0]
            return SimpleNamespace(wall_time_s=self.seconds * rows, row_stats=[{"new_tokens": 4}] * rows,
                                   phase_time_s={"target": 0.1}, phase_calls={"target": 1}, extra={})

    def batch(marker, rows=1):
        ids = torch.full((rows, 2), marker)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    loops = {"speculative": Loop("A", 1.0), "autoregressive": Loop("B", 2.0)}
    groups = {"writing": [(["1-t1", "2-t1"], batch(1, 2)), (["1-t2"], batch(2))], "qa": [(["3-t1"], batch(3))]}
    timings, by_group = paired.time_groups(loops, groups, 4, 2, 0, "cpu", progress=False)
    assert calls == [("A", 1), ("A", 2), ("B", 1), ("B", 2), ("A", 3), ("B", 3),       # repeat 0: A then B
                     ("B", 1), ("B", 2), ("A", 1), ("A", 2), ("B", 3), ("A", 3)]       # repeat 1: B then A
    writing = by_group["writing"]
    assert writing["ids"] == ["1-t1", "2-t1", "1-t2"]
    assert writing["speculative"]["unit_seconds"] == [[2.0, 2.0, 1.0]] * 2   # a unit's seconds are its batch's
    assert writing["autoregressive"]["seconds"] == [6.0, 6.0] and writing["speculative"]["tokens"] == [12, 12]
    assert timings["speculative"]["seconds"] == [4.0, 4.0] and timings["autoregressive"]["tokens"] == [16, 16]
    assert timings["speculative"]["phases"]["calls"]["target"] == 6


# ------------------------------------------------------------------------------------------- the report


def synthetic_result(path: Path, groups=tuple(GROUPS), flagged=False) -> Path:
    """A spec_bench results file whose group figures are made up: speedup 1.5 + 0.1 i, 2 + 0.1 i tokens/step."""
    from pipeline.result import make_result, write_result

    figures = {g: {"categories": list(GROUPS.get(g, CATEGORIES)), "questions": 8, "samples": 8,
                   "mean_accepted_tokens": 2.0 + 0.1 * i, "speedup": 1.5 + 0.1 * i,
                   "speedup_ci_low": 1.4 + 0.1 * i, "speedup_ci_high": 1.6 + 0.1 * i, "identical_outputs": 1.0,
                   "token_agreement": 1.0, "prefix_agreement": 1.0}
               for i, g in enumerate((*groups, "overall"))}
    config = {"task": "spec_bench", "target": "lmsys/vicuna-7b-v1.3", "draft": "double7/vicuna-68m",
              "drafter": "model", "sampler": "greedy", "gamma": 4, "temperature": 0.0, "dtype": "float16"}
    metrics = {"speedup": 1.6, "speedup_ci_low": 1.5, "speedup_ci_high": 1.7, "speedup_paired": True,
               "flagged": flagged, "tokens_per_second": 60.0, "acceptance_rate": 0.5, "mean_accepted_tokens": 2.6,
               "by_group": figures, "by_category": {"writing": figures.get("mt_bench", {})}}
    write_result(path, make_result(config, {"device": "cuda:0", "ar_outputs": "a pass of the γ = 0 loop in this run"},
                                   {"date": "2026-11-25", "device": {"gpu": "NVIDIA H100"}}, metrics,
                                   {"flags": []}, {"token_agreement": 1.0, "identical_outputs": 1.0}, []))
    return path


def test_report_of_one_results_file_has_the_leaderboard_table_with_all_six_groups(tmp_path, capsys):
    path = synthetic_result(tmp_path / "sb.json")
    out = tmp_path / "reports"
    assert main(["report", "--runs", str(path), "--out", str(out), "--tune", str(tmp_path / "none"), "--kernels",
                 str(tmp_path / "none"), "--bench", str(tmp_path / "none")]) == 0
    md = (out / "report.md").read_text()
    section = md[md.index("## Spec-Bench"):]
    header = next(line for line in section.splitlines() if line.startswith("| target"))
    assert header.split(" | ")[4:11] == [GROUP_NAMES[g] for g in (*GROUPS, "overall")]
    row = next(line for line in section.splitlines() if line.startswith("| lmsys/vicuna-7b-v1.3"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:4] == ["lmsys/vicuna-7b-v1.3", "double7/vicuna-68m", "greedy", "4"]
    assert cells[4] == "1.50x [1.40, 1.60], 2.00" and cells[9] == "2.00x [1.90, 2.10], 2.50"
    assert cells[10] == "2.10x [2.00, 2.20], 2.60"   # overall
    assert "identical outputs" in section and "100%" in section
    assert (out / "figures" / "spec-bench-groups.png").stat().st_size > 0
    assert "figures/spec-bench-groups.png" in (out / "report.html").read_text()


def test_a_slice_leaves_its_missing_groups_empty_and_says_so(tmp_path):
    from pipeline.analysis.spec_bench_view import section
    from pipeline.results_table import load_runs

    synthetic_result(tmp_path / "sb.json", groups=("mt_bench", "qa"), flagged=True)
    blocks = section(load_runs(tmp_path / "sb.json"))
    table = blocks[2]
    assert table.rows[0][5] is None and table.rows[0][4] == "1.50x [1.40, 1.60], 2.00"
    assert table.rows[0][7] == "1.60x [1.50, 1.70], 2.10"   # QA
    text = " ".join(b.text for b in blocks if hasattr(b, "text"))
    assert "No question of" in text and "Translation" in text and "marked" in text
    assert section(load_runs(tmp_path / "sb.json").assign(task="prompts")) == []
