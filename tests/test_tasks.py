"""pipeline/tasks/: the registry (names, fetchable tasks, quality metrics, an import without torch) and the
long-inputs rule, one for both tasks: an article too long for the target's positions and a clip longer than
Whisper's window are cut to fit, counted and recorded, or stop the run with one line under the "error" rule."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from tiny_models import PROMPTS, save_pair, write_articles

from pipeline.errors import SpecsweepError
from pipeline.objectives import QUALITY
from pipeline.synthetic import build_tokenizer, build_whisper_processor
from pipeline.tasks import FETCHABLE, LONG_INPUTS, TASK_NAMES, get_task, quality_metric
from pipeline.tasks.base import Cuts
from pipeline.tasks.cnn_dailymail import SUMMARY_CUE
from pipeline.tasks.text import DRAFT_RESERVE

HEAVY = ("torch", "numpy", "transformers", "datasets", "pyarrow", "soundfile", "scipy", "pandas")

# ------------------------------------------------------------------------------------------- registry


def test_registry_names_fetchable_tasks_and_metrics():
    assert TASK_NAMES == ("prompts", "cnn_dailymail", "librispeech", "spec_bench")
    assert FETCHABLE == ("cnn_dailymail", "librispeech", "spec_bench")
    assert LONG_INPUTS == ("truncate", "error")
    with pytest.raises(SpecsweepError, match=r"unknown task 'nope'.*prompts.*cnn_dailymail.*librispeech"):
        get_task("nope")
    rouge, wer = quality_metric("cnn_dailymail"), quality_metric("librispeech")
    assert (rouge.key, rouge.sign, rouge.display, rouge.error_rate) == ("rougeL", 1.0, "ROUGE-L", False)
    assert (wer.key, wer.sign, wer.display, wer.error_rate) == ("wer", -1.0, "WER", True)
    assert quality_metric("prompts") is None and quality_metric("nope") is None
    assert QUALITY == {"cnn_dailymail": ("rougeL", 1.0), "librispeech": ("wer", -1.0),
                       "spec_bench": ("token_agreement", 1.0)}


@pytest.mark.parametrize("name", TASK_NAMES)
def test_every_task_describes_itself(name):
    """What pipeline/data.py, the CLI and the report read from each task (a new task must set it all)."""
    task = get_task(name)
    assert task.name == name and task.display and task.source_hint
    assert task.columns[0] == "id" and task.source_fields
    if task.hub is not None:
        assert "id" in task.hub.columns and task.hub.repo_id and task.hub.config
    assert task.fetchable == (task.hub is not None or task.url is not None)
    if task.metric is not None:
        assert task.metric.sign in (1.0, -1.0) and task.metric.display


def test_the_registry_and_fetch_command_import_no_heavy_library():
    """The registry and the fetch command import no heavy library (the help texts as a whole: test_cli_help.py)."""
    code = ("import sys; import pipeline.tasks, pipeline.commands.fetch; "
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_prompts_task_reads_jsonl_only(tmp_path):
    from pipeline.data import load_task_data

    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a"}\n{"id": "x", "prompt": "b"}\n', encoding="utf-8")
    assert load_task_data("prompts", path) == [{"id": "line-1", "prompt": "a"}, {"id": "x", "prompt": "b"}]
    with pytest.raises(SpecsweepError, match=r"--task prompts reads a JSONL file"):
        load_task_data("prompts", tmp_path)


# ------------------------------------------------------------------------------------------- long inputs: text


def text_config(**kw):
    values = {"max_prompt_tokens": None, "chat_template": False, "max_new_tokens": 12, "gamma": 3,
              "long_inputs": "truncate"}
    return SimpleNamespace(**{**values, **kw})


def summaries(config, positions=64, tokenizer=None):
    tokenizer = tokenizer or build_tokenizer()
    target = SimpleNamespace(config=SimpleNamespace(n_positions=positions))
    return tokenizer, get_task("cnn_dailymail").encoder(target, tokenizer, None, config)


LONG = {"id": "long", "article": " ".join(["the storm hit the city"] * 20)}  # 100 tokens
SHORT = {"id": "short", "article": "water"}


def test_a_long_article_is_cut_to_fit_the_target_and_keeps_the_cue():
    tok, encode = summaries(text_config())
    inputs, cuts = encode([LONG, SHORT])
    L = inputs["input_ids"].shape[1]
    assert L + 12 + DRAFT_RESERVE + 2 == 64             # prompt + max_new_tokens + max(γ = 3, 8) + 2: all 64
    cue = tok(SUMMARY_CUE, add_special_tokens=False).input_ids
    assert inputs["input_ids"][0, -len(cue):].tolist() == cue and inputs["attention_mask"][0].all()
    kept = L - len(cue)
    assert cuts == Cuts(truncated=1, too_long=1, most=100 - kept, total=100 - kept)
    assert inputs["attention_mask"][1].sum() == 1 + len(cue)   # the short article is untouched
    assert encode.record(cuts) == {"prompts_truncated": 1, "long_inputs": {
        "rule": "truncate", "limit": 64, "unit": "tokens", "cut": 1, "most_cut": 100 - kept, "total_cut": 100 - kept}}
    assert "1 article(s) too long for the target's 64 positions" in encode.warning(cuts)


def test_runs_with_different_gamma_and_their_baseline_read_the_same_cut_articles():
    cut = {gamma: summaries(text_config(gamma=gamma))[1]([LONG])[0]["input_ids"].tolist()
           for gamma in range(DRAFT_RESERVE + 1)}
    assert all(ids == cut[0] for ids in cut.values())
    assert len(summaries(text_config(gamma=DRAFT_RESERVE + 4))[1]([LONG])[0]["input_ids"][0]) == len(cut[0][0]) - 4


def test_the_chat_wrapper_is_kept_whole_when_the_article_is_cut():
    tok = build_tokenizer()
    tok.chat_template = "{% for m in messages %}news {{ m['content'] }} report{% endfor %}"
    _, encode = summaries(text_config(chat_template=True), tokenizer=tok)
    inputs, cuts = encode([LONG])
    ids = inputs["input_ids"][0].tolist()
    assert len(ids) + 12 + 3 + 2 <= 64 and cuts.too_long == 1
    assert ids[0] == tok.convert_tokens_to_ids("news") and ids[-1] == tok.convert_tokens_to_ids("report")


def test_max_prompt_tokens_cuts_are_counted_apart_from_long_inputs():
    _, encode = summaries(text_config(max_prompt_tokens=20))
    _, cuts = encode([LONG, SHORT])
    assert cuts == Cuts(truncated=1, too_long=0, most=0, total=0)  # cut to --max-prompt-tokens: fits the target


def test_a_long_article_under_the_error_rule_stops_with_one_line():
    _, encode = summaries(text_config(long_inputs="error"))
    assert encode([SHORT])[1] == Cuts()
    with pytest.raises(SpecsweepError) as err:
        encode([SHORT, LONG])
    message = str(err.value)
    assert "\n" not in message and "'long'" in message and "64 positions" in message
    assert "--long-inputs truncate" in message


def test_no_room_for_any_article_is_an_error():
    _, encode = summaries(text_config(max_new_tokens=58))
    with pytest.raises(SpecsweepError, match=r"no room for an article.*lower --max-new-tokens"):
        encode([LONG])


# ------------------------------------------------------------------------------------------- long inputs: audio


def clips(rule):
    processor = build_whisper_processor(chunk_seconds=2)
    target = SimpleNamespace(generation_config=SimpleNamespace(is_multilingual=False))
    config = SimpleNamespace(long_inputs=rule)
    return get_task("librispeech").encoder(target, processor.tokenizer, processor, config)


def audio(seconds):
    return np.zeros(int(16_000 * seconds), dtype=np.float32)


def test_a_long_clip_is_cut_to_the_window_and_counted():
    encode = clips("truncate")
    inputs, cuts = encode([{"id": "a", "audio": audio(3.5)}, {"id": "b", "audio": audio(1.0)}])
    assert inputs["encoder_inputs"]["input_features"].shape[0] == 2
    assert cuts == Cuts(truncated=1, too_long=1, most=pytest.approx(1.5), total=pytest.approx(1.5))
    record = encode.record(cuts)
    assert record["audio_truncated"] == 1
    assert record["long_inputs"] == {"rule": "truncate", "limit": 2, "unit": "seconds", "cut": 1,
                                     "most_cut": pytest.approx(1.5), "total_cut": pytest.approx(1.5)}
    assert "cut to it" in encode.warning(cuts)


def test_a_long_clip_under_the_error_rule_stops_with_one_line():
    with pytest.raises(SpecsweepError) as err:
        clips("error")([{"id": "a", "audio": audio(3.5)}])
    message = str(err.value)
    assert "\n" not in message and "'a' is 3.5 s" in message and "--long-inputs truncate" in message


# ------------------------------------------------------------------------------------------- through a run


@pytest.fixture(scope="module")
def long_articles(tmp_path_factory):
    """The tiny pair (256 positions) and articles of 5 * 60 = 300 tokens and fewer."""
    root = tmp_path_factory.mktemp("long")
    tp, dp = save_pair(root)
    return root, tp, dp, write_articles(root / "long.jsonl", len(PROMPTS), 60)


def run_config(root, tp, dp, data, name, **kw):
    from pipeline.config import RunConfig

    return RunConfig(target=str(tp), draft=str(dp), data=str(data), task="cnn_dailymail", gamma=2,
                     max_new_tokens=8, temperature=0.0, sampler="greedy", device="cpu", repeats=3,
                     samples_per_repeat=2, out=str(root / name), **kw)


def test_a_run_cuts_articles_too_long_for_the_target_and_records_it(long_articles, capsys):
    from pipeline.runner import run

    root, tp, dp, data = long_articles
    tok = build_tokenizer()
    room = 256 - 8 - DRAFT_RESERVE - 2                             # max_new_tokens 8, γ 2 < the reserve
    lengths = [len(tok(p).input_ids) * 60 + 2 for p in PROMPTS]   # article tokens + the cue's
    too_long = sum(n > room for n in lengths)
    assert 0 < too_long < len(PROMPTS)
    res = run(run_config(root, tp, dp, data, "cut.json"), progress=False)
    assert all(s["prompt_tokens"] <= room for s in res["samples"])
    resolved = json.loads((root / "cut.json").read_text())["resolved"]
    assert resolved["prompts_truncated"] == too_long
    long_inputs = resolved["long_inputs"]
    assert (long_inputs["rule"], long_inputs["limit"], long_inputs["cut"]) == ("truncate", 256, too_long)
    assert long_inputs["most_cut"] == max(n - room for n in lengths)
    assert long_inputs["total_cut"] == sum(max(0, n - room) for n in lengths)
    err = capsys.readouterr().err
    assert err.count("too long for the target's 256 positions") == 1


def test_a_run_under_the_error_rule_stops_on_a_long_article(long_articles):
    from pipeline.runner import run

    root, tp, dp, data = long_articles
    config = run_config(root, tp, dp, data, "error.json")
    config.long_inputs = "error"   # RunConfig.long_inputs (the --long-inputs flag)
    with pytest.raises(SpecsweepError, match=r"too long for the target.*--long-inputs truncate"):
        run(config, progress=False)
    assert not (root / "error.json").exists()
