"""`specsweep export` (pipeline/tuning/export.py): the chosen setting as transformers', vLLM's and TensorRT-LLM's
configuration and as our own settings JSON.

The transformers export is loaded with ``GenerationConfig`` and drives assisted generation of the tiny pair. The vLLM
and TensorRT-LLM exports are held to those tools' documented schemas, written out below from their documentation and
validators (neither package is installed): vLLM's ``SpeculativeConfig`` (method "draft_model", ``model``,
``num_speculative_tokens``, and the Dynamic Speculative Decoding schedule ``num_speculative_tokens_per_batch_size``
of vLLM 0.24, vllm/v1/spec_decode/dynamic/utils.py), and TensorRT-LLM's ``DraftTargetDecodingConfig`` with
``DecodingBaseConfig.draft_len_schedule`` (tensorrt_llm/llmapi/llm_args.py: keys are batch-size upper bounds, the
smallest key's value equals max_draft_len, none exceeds it, batch sizes above the largest key draft 0).
"""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from test_schedule import fake_result
from tiny_models import PROMPTS, save_pair

from pipeline import stack
from pipeline.cli import main
from pipeline.config import RunConfig
from pipeline.errors import SpecsweepError
from pipeline.settings_file import load_settings
from pipeline.tuning.export import export, load_source
from pipeline.tuning.schedule import Cell, build_schedule

# ---- the documented schemas ------------------------------------------------------------------------------------

VLLM_KEYS = {"method", "model", "num_speculative_tokens", "num_speculative_tokens_per_batch_size"}


def check_vllm(config: dict) -> None:
    """vLLM's SpeculativeConfig for a draft model, and its per-batch-size schedule's validator."""
    assert set(config) <= VLLM_KEYS, set(config) - VLLM_KEYS
    assert config["method"] == "draft_model" and isinstance(config["model"], str) and config["model"]
    assert isinstance(config["num_speculative_tokens"], int) and config["num_speculative_tokens"] > 0
    schedule = config.get("num_speculative_tokens_per_batch_size")
    if schedule is None:
        return
    assert isinstance(schedule, list) and schedule
    previous_end = 0
    for entry in schedule:
        assert isinstance(entry, list) and len(entry) == 3 and all(isinstance(v, int) for v in entry)
        start, end, k = entry
        assert 0 < start <= end and k >= 0
        assert start > previous_end            # sorted, non-overlapping inclusive ranges
        previous_end = end
    assert schedule[0][0] == 1                 # every batch size has a defined K


def vllm_k(config: dict, batch_size: int) -> int:
    """vLLM's lookup: the range holding the batch size; gaps and the tail carry the previous range's K; capped at
    num_speculative_tokens."""
    k = config["num_speculative_tokens"]
    for start, end, value in config.get("num_speculative_tokens_per_batch_size") or []:
        if start <= batch_size:
            k = value
        if batch_size <= end:
            break
    return min(k, config["num_speculative_tokens"])


def check_trtllm(options: dict) -> None:
    """TensorRT-LLM's LLM API options with a Draft_Target speculative_config."""
    config = options["speculative_config"]
    assert set(config) <= {"decoding_type", "max_draft_len", "speculative_model", "draft_len_schedule"}
    assert config["decoding_type"] == "Draft_Target"
    assert isinstance(config["max_draft_len"], int) and config["max_draft_len"] > 0
    assert isinstance(config["speculative_model"], str) and config["speculative_model"]
    schedule = config.get("draft_len_schedule")
    if schedule is None:
        return
    assert schedule and all(isinstance(b, int) and b >= 1 and isinstance(k, int) and k >= 0
                            for b, k in schedule.items())
    assert schedule[min(schedule)] == config["max_draft_len"]
    assert all(k <= config["max_draft_len"] for k in schedule.values())


def trtllm_k(config: dict, batch_size: int) -> int:
    schedule = config.get("draft_len_schedule")
    if schedule is None:
        return config["max_draft_len"]
    return next((schedule[b] for b in sorted(schedule) if batch_size <= b), 0)


# ---- schedules to export ---------------------------------------------------------------------------------------

STEADY = [1.0, 1.02, 1.04, 1.01, 1.03, 1.02]


def _study(tmp_path, cells: dict[int, list[dict]], draft: str = "models/draft") -> dict:
    """A schedule of the given cells: {batch size: [fake_result kwargs, ...]}."""
    folders = []
    for batch, trials in cells.items():
        folder = tmp_path / f"b{batch}"
        for i, kwargs in enumerate(trials):
            fake_result(folder / "trials" / f"{i:05d}.json", batch_size=batch, draft=draft, **kwargs)
        folders.append((Cell(batch), folder))
    return build_schedule(folders, study="s")


def _speedup(x: float) -> list[float]:
    return [x * r for r in STEADY]


def test_vllm_and_trtllm_exports_follow_their_schemas_and_the_measured_schedule(tmp_path):
    schedule = _study(tmp_path, {1: [{"gamma": 4, "ratios": _speedup(1.8)}, {"gamma": 2, "ratios": _speedup(1.3)}],
                                 4: [{"gamma": 2, "ratios": _speedup(1.4)}, {"gamma": 4, "ratios": _speedup(1.1)}],
                                 16: [{"gamma": 2, "ratios": _speedup(0.8)}]})
    path, notes = export(schedule, "vllm", tmp_path / "vllm.json")
    config = json.loads(path.read_text())
    check_vllm(config)
    assert config["num_speculative_tokens"] == 4 and config["model"] == "models/draft"
    assert [vllm_k(config, b) for b in (1, 2, 4, 5, 16, 64)] == [4, 2, 2, 0, 0, 0]
    path, notes = export(schedule, "vllm", tmp_path / "old.json", batch_schedule=False)
    old = json.loads(path.read_text())
    check_vllm(old)
    assert "num_speculative_tokens_per_batch_size" not in old and old["num_speculative_tokens"] == 4 and notes

    path, notes = export(schedule, "trtllm", tmp_path / "trtllm.yaml")
    options = yaml.safe_load(path.read_text())
    check_trtllm(options)
    config = options["speculative_config"]
    assert config["max_draft_len"] == 4 and config["speculative_model"] == "models/draft"
    assert [trtllm_k(config, b) for b in (1, 2, 4, 5, 16, 64)] == [4, 2, 2, 0, 0, 0]


def test_trtllm_export_lowers_a_larger_gamma_at_a_larger_batch_and_can_extend_the_last(tmp_path):
    schedule = _study(tmp_path, {1: [{"gamma": 2, "ratios": _speedup(1.5)}],
                                 8: [{"gamma": 3, "ratios": _speedup(1.2)}]})
    path, notes = export(schedule, "trtllm", tmp_path / "t.yaml", max_batch_size=64)
    options = yaml.safe_load(path.read_text())
    check_trtllm(options)
    assert options["speculative_config"]["draft_len_schedule"] == {64: 2} and any("lowered" in n for n in notes)


def test_adaptive_and_lossy_picks_only_go_where_the_tool_has_them(tmp_path):
    schedule = _study(tmp_path, {1: [{"gamma": 2, "ratios": _speedup(1.6), "schedule": "heuristic", "gamma_max": 2},
                                     {"gamma": 3, "ratios": _speedup(1.2)},
                                     {"gamma": 2, "ratios": _speedup(2.5), "sampler": "typical", "rouge": 0.499,
                                      "params": {"epsilon": 0.09, "delta": 0.3}}]})
    cell = schedule["cells"][0]
    assert cell["choice"]["settings"]["sampler"] == "typical"
    assert cell["standard"]["adaptive"] and not cell["standard_fixed"]["adaptive"]
    path, _ = export(schedule, "vllm", tmp_path / "v.json")                       # standard_fixed: exact γ 3
    assert json.loads(path.read_text())["num_speculative_tokens"] == 3
    with pytest.raises(SpecsweepError, match=r"no adaptive draft length.*--pick standard_fixed"):
        export(schedule, "vllm", tmp_path / "v2.json", pick="standard")
    with pytest.raises(SpecsweepError, match="not standard speculative sampling"):
        export(schedule, "trtllm", tmp_path / "t.yaml", pick="choice")
    path, _ = export(schedule, "json", tmp_path / "ours.json")
    assert json.loads(path.read_text())["entries"][0]["settings"]["sampler"] == "typical"


def test_no_speculation_is_exported_where_a_tool_can_say_it_and_refused_where_it_cannot(tmp_path):
    schedule = _study(tmp_path, {1: [{"gamma": 2, "ratios": _speedup(0.7)}]})
    assert schedule["cells"][0]["choice"]["settings"]["gamma"] == 0
    for fmt, words in (("hf", "generate without assistant_model"), ("vllm", "serve without"),
                       ("trtllm", "serve without speculative_config")):
        with pytest.raises(SpecsweepError, match=words) as e:
            export(schedule, fmt, tmp_path / f"x.{fmt}")
        assert "\n" not in str(e.value)
        assert not (tmp_path / f"x.{fmt}").exists()
    path, _ = export(schedule, "json", tmp_path / "ours.json")
    assert json.loads(path.read_text())["entries"][0]["settings"]["gamma"] == 0


def test_our_json_is_read_back_by_run_settings_per_batch_size(tmp_path):
    schedule = _study(tmp_path, {1: [{"gamma": 4, "ratios": _speedup(1.8)}],
                                 8: [{"gamma": 2, "ratios": _speedup(1.3), "schedule": "heuristic", "gamma_max": 5}]})
    path, _ = export(schedule, "json", tmp_path / "ours.json")
    data = tmp_path / "p.jsonl"
    data.write_text('{"id": "a", "prompt": "the storm"}\n')
    base = {"target": "models/target", "data": str(data), "from_config": str(path)}
    one = RunConfig.from_dict(base).validate()
    assert (one.gamma, one.draft, one.draft_schedule) == (4, "models/draft", "constant")
    four = RunConfig.from_dict({**base, "batch_size": 4}).validate()      # the next measured size up: 8
    assert (four.gamma, four.draft_schedule, four.gamma_max) == (2, "heuristic", 5)
    assert RunConfig.from_dict({**base, "batch_size": 64}).gamma == 2     # beyond the largest: the largest
    assert RunConfig.from_dict({**base, "gamma": 4}).gamma == 4           # the flag's default: the file's value
    with pytest.raises(SpecsweepError, match="--gamma 3 disagrees with --from-config") as e:
        RunConfig.from_dict({**base, "gamma": 3})
    assert "\n" not in str(e.value)
    assert load_settings(path).entry(2)["batch_size"] == 8
    with pytest.raises(SpecsweepError, match="not a settings file"):
        load_settings(tmp_path / "b1" / "trials" / "00000.json")


def test_the_cli_exports_from_a_study_folder_and_reports_bad_input_in_one_line(tmp_path, capsys):
    fake_result(tmp_path / "study" / "trials" / "00000.json", gamma=3, ratios=_speedup(1.5))
    out = tmp_path / "v.json"
    assert main(["export", "--from", str(tmp_path / "study"), "--format", "vllm", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["num_speculative_tokens"] == 3
    for args in (["--from", str(tmp_path / "missing"), "--format", "json"],
                 ["--from", str(tmp_path / "study"), "--format", "json", "--context-bucket", "0-128"],
                 ["--from", str(tmp_path / "study"), "--format", "vllm", "--out", str(tmp_path)]):
        assert main(["export", "--out", str(tmp_path / "x.json"), *args]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("specsweep export: error:") and "\n" not in err


def test_the_cli_exports_one_rules_choice_from_a_study_and_refuses_it_elsewhere(tmp_path, capsys):
    study = tmp_path / "study" / "trials"
    fake_result(study / "00000.json", gamma=4, ratios=_speedup(2.0))
    fake_result(study / "00001.json", gamma=4, ratios=_speedup(1.2), sampler="sigmoid", rouge=0.49,
                params={"alpha": 2.0, "beta": -10.0})
    out = tmp_path / "s.json"
    args = ["export", "--from", str(tmp_path / "study"), "--format", "json", "--out", str(out)]
    assert main([*args, "--sampler", "sigmoid", "--max-quality-loss", "0.05"]) == 0
    settings = json.loads(out.read_text())["entries"][0]["settings"]
    assert settings["sampler"] == "sigmoid" and settings["params"] == {"alpha": 2.0, "beta": -10.0}
    assert main(args) == 0 and json.loads(out.read_text())["entries"][0]["settings"]["sampler"] == "exact"
    schedule = tmp_path / "schedule.json"
    schedule.write_text(json.dumps(build_schedule([(Cell(1), tmp_path / "study")], study="s")))
    for bad in ([*args, "--sampler", "sigmoid"],                       # 2 % loss: over the default 1 %
                ["export", "--from", str(schedule), "--format", "json", "--out", str(out), "--sampler", "sigmoid"]):
        assert main(bad) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("specsweep export: error:") and "\n" not in err and "sigmoid" in err


def test_the_report_recommendation_exports_its_lossless_choice(tmp_path):
    import pandas as pd

    source = fake_result(tmp_path / "runs" / "exact.json", gamma=3, ratios=_speedup(1.4), schedule="constant")
    rows = [{"run": "ar", "kind": "baseline", "task": "cnn_dailymail", "target": "models/target",
             "draft": "models/draft", "dtype": "float32", "rougeL": 0.5, "source": "ar.json"},
            {"run": "exact", "kind": "run", "task": "cnn_dailymail", "target": "models/target", "draft": "models/draft",
             "dtype": "float32", "sampler": "exact", "temperature": 1.0, "gamma": 3, "speedup": 1.42,
             "speedup_ci_low": 1.4, "speedup_ci_high": 1.46, "rougeL": 0.5, "quality": 0.5, "flagged": False,
             "source": str(source)}]
    (tmp_path / "report").mkdir()
    pd.DataFrame(rows).to_csv(tmp_path / "report" / "results.csv", index=False)
    schedule = load_source(tmp_path / "report")
    path, _ = export(schedule, "trtllm", tmp_path / "t.yaml")
    options = yaml.safe_load(path.read_text())
    check_trtllm(options)
    assert options["speculative_config"]["max_draft_len"] == 3


@pytest.mark.parametrize("draft_schedule,confidence", [("constant", 0.0), ("heuristic", 0.3)])
def test_the_hf_export_loads_in_transformers_and_drives_assisted_generation(tmp_path, draft_schedule, confidence):
    """The exported generation_config.json, loaded with GenerationConfig as the assistant's config: assisted
    generation of the tiny pair drafts as it says (at most num_assistant_tokens per call with the constant
    schedule; more after full acceptances with the heuristic one) and, being greedy, equals the target's own
    greedy decoding."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tp, dp = save_pair(tmp_path / "pair")
    schedule = _study(tmp_path, {1: [{"gamma": 2, "ratios": _speedup(1.5), "schedule": draft_schedule,
                                      "confidence": confidence, "gamma_max": 6 if draft_schedule == "heuristic"
                                      else None}]}, draft=str(dp))
    path, _ = export(schedule, "hf", tmp_path / "hf")
    loaded = GenerationConfig.from_pretrained(str(path.parent))
    assert loaded.num_assistant_tokens == 2
    assert loaded.num_assistant_tokens_schedule == {"constant": "constant", "heuristic": "heuristic_transient"}[
        draft_schedule]
    assert loaded.assistant_confidence_threshold == pytest.approx(confidence)

    tok = AutoTokenizer.from_pretrained(str(tp))
    target, draft = AutoModelForCausalLM.from_pretrained(str(tp)), AutoModelForCausalLM.from_pretrained(str(dp))
    draft.generation_config = loaded
    asked = []
    real_generate = draft.generate

    def recording_generate(*args, **kwargs):
        asked.append(kwargs["max_new_tokens"])
        return real_generate(*args, **kwargs)

    draft.generate = recording_generate
    enc = tok(PROMPTS[0], return_tensors="pt")
    settings = GenerationConfig(max_new_tokens=20, do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        assisted = target.generate(**enc, assistant_model=draft, generation_config=settings)
        alone = target.generate(**enc, generation_config=settings)
    assert assisted.tolist() == alone.tolist()
    assert asked and asked[0] == 2
    if draft_schedule == "constant":
        assert max(asked) <= 2
    else:
        assert max(asked) > 2


def test_specsweep_run_reads_the_json_back(tmp_path):
    """`specsweep run --from-config`: the run at batch size 4 uses the entry measured at batch size 4 (and records
    where its settings came from); a flag that contradicts the file stops the run with one line."""
    from tiny_models import write_prompts

    tp, dp = save_pair(tmp_path / "pair")
    schedule = _study(tmp_path, {1: [{"gamma": 3, "ratios": _speedup(1.5), "schedule": "heuristic", "gamma_max": 5}],
                                 4: [{"gamma": 2, "ratios": _speedup(1.2)}]}, draft=str(dp))
    settings, _ = export(schedule, "json", tmp_path / "settings.json")
    data = write_prompts(tmp_path / "p.jsonl")
    args = ["run", "--target", str(tp), "--data", str(data), "--task", "prompts", "--device", "cpu",
            "--max-new-tokens", "8", "--repeats", "3", "--samples-per-repeat", "4", "--no-progress",
            "--wandb-mode", "disabled", "--max-cpu-wait", "1", "--max-spread", "1e9", "--from-config", str(settings)]
    assert main([*args, "--batch-size", "4", "--out", str(tmp_path / "r4.json")]) == 0
    config = json.loads((tmp_path / "r4.json").read_text())["config"]
    assert (config["gamma"], config["draft"], config["draft_schedule"]) == (2, str(dp), "constant")
    assert config["from_config"] == str(settings)
    assert main([*args, "--gamma", "5", "--out", str(tmp_path / "x.json")]) == 2
    assert not (tmp_path / "x.json").exists()


# ---- token trees -----------------------------------------------------------------------------------------------

def _tree_study(tmp_path, tree: str = "2,2,1", children: str = "top-k", drafter: dict | None = None,
                parents: list[int] | None = None) -> dict:
    """A one-cell schedule whose only trial drafts a token tree (γ its node count) with ``drafter``'s settings;
    ``parents``: the tree the run recorded it ran (resolved.tree_parents)."""
    path = fake_result(tmp_path / "tree" / "trials" / "00000.json", gamma=10, ratios=_speedup(1.6))
    result = json.loads(path.read_text())
    result["config"].update(draft_tree=tree, tree_children=children, **(drafter or {}))
    if parents is not None:
        result["resolved"]["tree_parents"] = parents
    path.write_text(json.dumps(result))
    return build_schedule([(Cell(1), tmp_path / "tree")], study="s")


def test_a_tree_travels_through_our_json_and_back_into_a_run(tmp_path):
    schedule = _tree_study(tmp_path)
    settings = schedule["cells"][0]["choice"]["settings"]
    assert (settings["draft_tree"], settings["tree_children"], settings["gamma"]) == ("2,2,1", "top-k", 10)
    path, notes = export(schedule, "json", tmp_path / "ours.json")
    assert notes == [] and json.loads(path.read_text())["entries"][0]["settings"]["draft_tree"] == "2,2,1"
    data = tmp_path / "p.jsonl"
    data.write_text('{"id": "a", "prompt": "the storm"}\n')
    config = RunConfig.from_dict({"target": "models/target", "data": str(data), "from_config": str(path)}).validate()
    assert (config.draft_tree, config.tree_children, config.gamma) == ("2,2,1", "top-k", 10)
    with pytest.raises(SpecsweepError, match="--draft-tree 3,1,1 disagrees with --from-config"):
        RunConfig.from_dict({"target": "t", "data": str(data), "from_config": str(path), "draft_tree": "3,1,1"})


# the tree a best:10 run planned from its profile and ran (breadth-first, -1 the root): 5 deep
PLANNED = [-1, -1, 0, 0, 1, 2, 3, 5, 7, 7]


def test_a_planned_tree_exports_as_the_tree_it_ran_and_runs_without_its_profile(tmp_path):
    """best:N names a tree only together with --tree-profile files a deployment lacks: the export writes the
    parents list the run recorded, and --from-config runs that tree."""
    schedule = _tree_study(tmp_path, "best:10", parents=PLANNED)
    settings = schedule["cells"][0]["choice"]["settings"]
    assert settings["draft_tree"] == "parents:" + ",".join(map(str, PLANNED)) and settings["gamma"] == 10
    path, _ = export(schedule, "json", tmp_path / "ours.json")
    data = tmp_path / "p.jsonl"
    data.write_text('{"id": "a", "prompt": "the storm"}\n')
    config = RunConfig.from_dict({"target": "models/target", "data": str(data), "from_config": str(path)}).validate()
    assert config.tree_profile is None and list(stack.run_tree(config).parents) == PLANNED
    _, notes = export(schedule, "vllm", tmp_path / "v.json", tree_as_chain=True)
    assert any("chain of its depth, γ 5," in n for n in notes)                  # PLANNED is 5 deep
    assert json.loads((tmp_path / "v.json").read_text())["num_speculative_tokens"] == 5


def test_a_planned_tree_whose_run_recorded_no_tree_is_one_line(tmp_path):
    with pytest.raises(SpecsweepError, match=r"recorded no resolved\.tree_parents") as e:
        _tree_study(tmp_path, "best:10")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("fmt", ["hf", "vllm", "trtllm"])
def test_a_tree_is_refused_where_a_tool_drafts_chains_or_exported_as_the_chain_of_its_depth(tmp_path, fmt):
    schedule = _tree_study(tmp_path)
    out = tmp_path / ("hf" if fmt == "hf" else f"x.{fmt}")
    with pytest.raises(SpecsweepError, match="drafts chains, not token trees") as e:
        export(schedule, fmt, out)
    assert "\n" not in str(e.value) and "--tree-as-chain" in str(e.value) and not out.exists()
    path, notes = export(schedule, fmt, out, tree_as_chain=True)
    assert any("chain of its depth, γ 3, which was not measured" in n for n in notes)
    text = path.read_text()
    if fmt == "vllm":
        check_vllm(json.loads(text))
        assert json.loads(text)["num_speculative_tokens"] == 3
    elif fmt == "trtllm":
        check_trtllm(yaml.safe_load(text))
        assert yaml.safe_load(text)["speculative_config"]["max_draft_len"] == 3
    else:
        assert json.loads(text)["num_assistant_tokens"] == 3


def test_a_lookup_tree_exports_as_its_chain_on_request_and_the_cli_says_so(tmp_path, capsys):
    lookup = {"drafter": "prompt-lookup", "draft": None, "lookup_min": 1, "lookup_max": 3}
    _tree_study(tmp_path, "3,2,1", drafter=lookup)
    out = tmp_path / "v.json"
    args = ["export", "--from", str(tmp_path / "tree"), "--format", "vllm", "--out", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "drafts chains, not token trees" in err and len(err.splitlines()) == 1
    assert main([*args, "--tree-as-chain"]) == 0
    assert "not measured" in capsys.readouterr().out
    assert json.loads(out.read_text()) == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                                           "prompt_lookup_max": 3}


def test_a_report_with_recommendations_at_two_temperatures_is_refused_in_one_line(tmp_path):
    """A report recommends per decoding temperature; a settings file holds one: exporting a report whose pair ran
    greedy and sampled would have to pick one silently, so it is a one-line error."""
    import pandas as pd

    runs = []
    for name, temperature in (("greedy", 0.0), ("exact", 1.0)):
        source = fake_result(tmp_path / "runs" / f"{name}.json", gamma=3, ratios=_speedup(1.4), schedule="constant")
        runs.append({"run": name, "kind": "run", "task": "cnn_dailymail", "target": "models/target",
                     "draft": "models/draft", "dtype": "float32", "sampler": name, "temperature": temperature,
                     "gamma": 3, "speedup": 1.42, "speedup_ci_low": 1.4, "speedup_ci_high": 1.46, "rougeL": 0.5,
                     "quality": 0.5, "flagged": False, "source": str(source)})
    (tmp_path / "report").mkdir()
    pd.DataFrame(runs).to_csv(tmp_path / "report" / "results.csv", index=False)
    with pytest.raises(SpecsweepError, match=r"recommends settings for 2 pairs or temperatures \(models/target, "
                                             r"models/draft, T = 0; models/target, models/draft, T = 1\)") as e:
        load_source(tmp_path / "report")
    assert "\n" not in str(e.value)
    # a table from before the temperature column: the pairs are named, their temperature as unknown (not "nan")
    table = pd.DataFrame(runs).drop(columns="temperature")
    table.loc[1, "draft"] = "models/draft2"
    table["sampler"] = "exact"              # lossless at any temperature, so both pairs are recommended
    table.to_csv(tmp_path / "report" / "results.csv", index=False)
    with pytest.raises(SpecsweepError, match=r"\(models/target, models/draft, T unknown; models/target, "
                                             r"models/draft2, T unknown\)"):
        load_source(tmp_path / "report")
