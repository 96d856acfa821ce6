"""The tuned schedule (pipeline/tuning/schedule.py): cells of batch size and prompt-length bucket, the robust choice
(median minus a spread penalty, the smaller γ within the noise, no speculation where nothing is surely faster), and
`specsweep tune --batch-sizes --context-buckets` end to end on the tiny pair."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_models import save_pair, write_articles

from pipeline.errors import SpecsweepError
from pipeline.measure import median_ci
from pipeline.result import RESULTS_VERSION, VERSION_KEY
from pipeline.rules import param_names
from pipeline.tuning.schedule import (
    Cell,
    build_schedule,
    cell_schedule,
    choose,
    describe_pick,
    parse_batch_sizes,
    parse_context_buckets,
    read_schedule,
    schedule_path,
    study_cells,
)


def fake_result(path: Path, *, gamma: int, ratios: list[float], sampler: str = "exact", schedule: str = "constant",
                confidence: float = 0.0, gamma_max: int | None = None, rouge: float = 0.5, base_rouge: float = 0.5,
                flagged: bool = False, batch_size: int = 1, temperature: float = 1.0, params: dict | None = None,
                draft: str = "models/draft") -> Path:
    """A results file as `specsweep run` writes one, with the fields the schedule reads: the per-repeat paired
    speedups (``ratios``) and their order-statistic interval, the quality against the AR baseline's."""
    ci = median_ci(ratios)
    config = {"task": "cnn_dailymail", "target": "models/target", "draft": draft, "sampler": sampler, "gamma": gamma,
              "temperature": temperature, "batch_size": batch_size, "dtype": "float32", "device": "cpu",
              "draft_schedule": schedule, "draft_confidence": confidence, "gamma_max": gamma_max, "preset": None,
              **{k: (params or {}).get(k) for k in param_names()}}
    result = {VERSION_KEY: RESULTS_VERSION, "config": config, "resolved": {"baseline_quality": {"rougeL": base_rouge}},
              "provenance": {}, "samples": [], "quality": {"rougeL": rouge},
              "metrics": {"speedup": ci.median, "speedup_ci_low": ci.low, "speedup_ci_high": ci.high,
                          "flagged": flagged, "acceptance_rate": 0.6, "tokens_per_second": 100.0 * ci.median,
                          "ar_tokens_per_second": 100.0,
                          "verify_steps": 10, "drafted_tokens": 10 * gamma, "mean_accepted_tokens": 2.0},
              "measurement": {"ratios": ratios, "speedup": ci.to_dict()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result))
    return path


def _cand(gamma, median, low, high, *, mad=0.0, adaptive=False, gamma_max=None):
    settings = {"gamma": gamma, "sampler": "exact", "params": {}, "draft_schedule": "heuristic" if adaptive else
                "constant", "draft_confidence": 0.0, "gamma_max": gamma_max, "temperature": 1.0}
    return {"settings": settings, "speedup": median, "mad": mad, "score": median - mad, "ci_low": low, "ci_high": high,
            "adaptive": adaptive}


NONE = _cand(0, 1.0, 1.0, 1.0)


def test_batch_sizes_and_context_buckets_parse_or_fail_in_one_line():
    assert parse_batch_sizes("16, 1,4,4") == [1, 4, 16]
    assert parse_context_buckets("128-512,0-128,512-") == [(0, 128), (128, 512), (512, None)]
    assert parse_batch_sizes(None) is None and parse_context_buckets(None) is None
    for bad in ("0,4", "a,b", ","):
        with pytest.raises(SpecsweepError, match="--batch-sizes"):
            parse_batch_sizes(bad)
    for bad in ("0-128,100-200", "128", "5-5", "-3-4", "0-,10-20"):
        with pytest.raises(SpecsweepError, match="--context-buckets") as e:
            parse_context_buckets(bad)
        assert "\n" not in str(e.value)
    cell = Cell(4, (128, None))
    assert cell.key == "b4-c128-" and Cell.from_dict(cell.to_dict()) == cell
    assert cell.holds(128) and not cell.holds(127) and Cell(1, (0, 128)).holds(127) and not Cell(1, (0, 128)).holds(128)
    assert schedule_path("results/tune/text-pareto.json") == Path("results/tune/text-schedule.json")
    assert schedule_path("results/tune/text/pareto.json") == Path("results/tune/text/schedule.json")


def test_within_the_noise_the_smaller_gamma_wins_and_no_speculation_is_a_legal_answer():
    g4 = _cand(4, 1.50, 1.35, 1.70)
    g2 = _cand(2, 1.42, 1.30, 1.55)            # its interval overlaps γ 4's: the measurement cannot tell them apart
    g6 = _cand(6, 1.10, 1.02, 1.20)
    chosen, tied = choose([NONE, g4, g2, g6])
    assert chosen is g2 and {id(c) for c in tied} == {id(g4), id(g2)}
    # the best candidate's interval reaches down to 1: nothing is surely faster than the target alone
    noisy = _cand(3, 1.30, 0.95, 1.60)
    chosen, tied = choose([NONE, noisy])
    assert chosen is NONE and len(tied) == 2
    # every candidate slower: no speculation
    assert choose([NONE, _cand(2, 0.8, 0.7, 0.9)])[0] is NONE


def test_the_spread_penalty_prefers_a_steady_setting_and_a_fixed_gamma_beats_an_adaptive_one_in_a_tie():
    steady = _cand(3, 1.40, 1.36, 1.44, mad=0.02)
    jumpy = _cand(2, 1.50, 1.05, 1.20, mad=0.30)   # higher median, wider spread; intervals disjoint from steady's
    assert choose([NONE, steady, jumpy])[0] is steady
    fixed = _cand(4, 1.40, 1.30, 1.50)
    adaptive = _cand(4, 1.45, 1.32, 1.55, adaptive=True, gamma_max=4)
    assert choose([NONE, fixed, adaptive])[0] is fixed
    wide = _cand(2, 1.45, 1.32, 1.55, adaptive=True, gamma_max=8)   # its ceiling, 8, is what it costs when wrong
    assert choose([NONE, fixed, wide])[0] is fixed


def test_a_cell_reads_its_trials_and_keeps_flagged_and_too_lossy_ones_out(tmp_path):
    trials = tmp_path / "trials"
    fake_result(trials / "00000.json", gamma=4, ratios=[1.4, 1.5, 1.45, 1.6, 1.42, 1.48])
    fake_result(trials / "00001.json", gamma=2, ratios=[1.30, 1.36, 1.41, 1.33, 1.38, 1.34])
    fake_result(trials / "00002.json", gamma=3, ratios=[1.9, 2.0, 2.1, 1.95, 2.05, 2.0], flagged=True)
    fake_result(trials / "00003.json", gamma=2, ratios=[2.1, 2.2, 2.15, 2.3, 2.2, 2.25], sampler="sigmoid",
                rouge=0.40, params={"alpha": 1.0, "beta": -20.0})       # 20 % quality loss: not a candidate
    fake_result(trials / "00004.json", gamma=2, ratios=[1.9, 1.95, 2.0, 1.92, 1.97, 2.01], sampler="typical",
                rouge=0.498, params={"epsilon": 0.09, "delta": 0.3})    # 0.4 % loss: a candidate, not standard
    fake_result(trials / "00005.json", gamma=2, ratios=[1.5, 1.55, 1.52, 1.6, 1.58, 1.57], schedule="heuristic",
                gamma_max=6)
    cell = cell_schedule(Cell(1), tmp_path)
    assert cell["trials"] == 6 and cell["unusable"] == 1 and cell["ineligible"] == 1
    assert [c["settings"]["gamma"] for c in cell["candidates"]] == [0, 4, 2, 2, 2]
    assert cell["choice"]["settings"]["sampler"] == "typical"
    # the heuristic scores best among the standard rules (1.56 [1.50, 1.60]), but γ 4's interval overlaps it and
    # the heuristic may draft up to 6 tokens a step: within the noise the smaller ceiling wins
    assert cell["standard"]["settings"]["gamma"] == 4 and not cell["standard"]["adaptive"]
    fixed = cell["standard_fixed"]
    assert fixed["settings"]["gamma"] == 2 and fixed["faster_than_target"]     # overlaps γ 4's interval: smaller γ
    assert fixed["within_noise"] == [1]                                        # γ 4 is within its noise
    assert "exact γ 2: speedup 1.35 [1.30, 1.41], faster than the target alone; 1 other" in describe_pick(fixed)


def test_one_rules_choice_ranks_its_own_trials_only_and_says_when_none_is_within_the_loss(tmp_path):
    trials = tmp_path / "trials"
    fake_result(trials / "00000.json", gamma=4, ratios=[2.4, 2.5, 2.45, 2.6, 2.42, 2.48])          # exact: faster
    fake_result(trials / "00001.json", gamma=4, ratios=[1.30, 1.36, 1.41, 1.33, 1.38, 1.34], sampler="sigmoid",
                rouge=0.49, params={"alpha": 2.0, "beta": -10.0})        # 2 % loss
    fake_result(trials / "00002.json", gamma=4, ratios=[1.02, 0.96, 1.05, 0.99, 1.01, 0.98], sampler="sigmoid",
                rouge=0.5, params={"alpha": 0.5, "beta": -25.0})          # no loss, no faster than the target alone
    fake_result(trials / "00003.json", gamma=4, ratios=[2.9, 3.0, 2.95, 3.1, 3.05, 2.98], sampler="sigmoid",
                rouge=0.3, params={"alpha": 4.0, "beta": 0.0})            # fastest, 40 % loss
    every = cell_schedule(Cell(1), tmp_path, max_quality_loss=0.05)
    assert every["choice"]["settings"]["sampler"] == "exact"
    cell = cell_schedule(Cell(1), tmp_path, max_quality_loss=0.05, rule="sigmoid")
    # the target alone is no candidate: the choice is a sigmoid setting even where one is not surely faster
    assert [c["settings"]["sampler"] for c in cell["candidates"]] == ["sigmoid", "sigmoid"]
    assert cell["ineligible"] == 1 and cell["unusable"] == 0 and cell["other_rules"] == 1   # the exact trial
    assert cell["choice"]["settings"]["params"] == {"alpha": 2.0, "beta": -10.0}
    assert cell["standard"] is None and cell["standard_fixed"] is None
    schedule = build_schedule([(Cell(1), tmp_path)], study="s", max_quality_loss=0.05, rule="sigmoid")
    assert schedule["rule_only"] == "sigmoid"
    strict = cell_schedule(Cell(1), tmp_path, max_quality_loss=0.01, rule="sigmoid")
    assert strict["choice"]["settings"]["params"] == {"alpha": 0.5, "beta": -25.0}
    with pytest.raises(SpecsweepError, match=r"no typical trial is within quality loss 0\.05 .*0 usable") as e:
        cell_schedule(Cell(1), tmp_path, max_quality_loss=0.05, rule="typical")
    assert "\n" not in str(e.value)


def test_a_study_folder_yields_its_cells_and_a_schedule_file_round_trips(tmp_path):
    fake_result(tmp_path / "trials" / "00000.json", gamma=3, ratios=[1.2, 1.3, 1.25, 1.28, 1.22, 1.27])
    cell_dir = tmp_path / "cells" / "b8"
    fake_result(cell_dir / "trials" / "00000.json", gamma=1, ratios=[0.8, 0.85, 0.9, 0.82, 0.88, 0.86],
                batch_size=8)
    (cell_dir / "cell.json").write_text(json.dumps({"batch_size": 8, "context": None}))
    cells = study_cells(tmp_path)
    assert [c.batch_size for c, _ in cells] == [1, 8]
    schedule = build_schedule(cells, study="s")
    assert [c["choice"]["settings"]["gamma"] for c in schedule["cells"]] == [3, 0]
    assert schedule["draft"] == "models/draft" and schedule["task"] == "cnn_dailymail"
    path = tmp_path / "s-schedule.json"
    path.write_text(json.dumps(schedule))
    assert read_schedule(path)["cells"][1]["batch_size"] == 8
    with pytest.raises(SpecsweepError, match="not a schedule"):
        read_schedule(cell_dir / "cell.json")
    with pytest.raises(SpecsweepError, match="no trials found"):
        study_cells(tmp_path / "cells")


@pytest.mark.slow
def test_tune_with_batch_sizes_and_context_buckets_writes_a_study_per_cell_and_the_schedule(tmp_path):
    """Two batch sizes x two prompt-length buckets: four studies of one trial each (the known-good point), each cell
    on its own prompts and with its own AR baseline, and the schedule next to the front."""
    from pipeline.cli import main

    tp, dp = save_pair(tmp_path / "models")
    data = write_articles(tmp_path / "articles.jsonl", 5, 4)   # articles of 4, 12, 20, 20 and 52 words
    space = tmp_path / "space.yaml"
    space.write_text("gamma: {low: 1, high: 3}\nsampler: [exact]\nknown_good: {sampler: exact, gamma: 2}\n"
                     "draft: [fixed, heuristic, confidence]\n")
    out = tmp_path / "tune" / "text-pareto.json"
    args = ["tune", "--target", str(tp), "--draft", str(dp), "--data", str(data), "--task", "cnn_dailymail",
            "--device", "cpu", "--max-new-tokens", "6", "--no-progress", "--wandb-mode", "disabled", "--max-spread",
            "1e9", "--max-cpu-wait", "1", "--repeats", "3", "--samples-per-repeat", "2", "--space", str(space),
            "--study-dir", str(tmp_path / "tune" / "text"), "--n-trials", "1", "--out", str(out),
            "--batch-sizes", "1,2", "--context-buckets", "0-16,16-"]
    assert main(args) == 0
    schedule = read_schedule(tmp_path / "tune" / "text-schedule.json")
    assert [(c["batch_size"], tuple(c["context"])) for c in schedule["cells"]] == \
        [(1, (0, 16)), (1, (16, None)), (2, (0, 16)), (2, (16, None))]
    for cell in schedule["cells"]:
        folder = Path(cell["folder"])
        assert (folder / "baseline-float32.json").is_file()
        trial = json.loads(next((folder / "trials").glob("*.json")).read_text())
        assert trial["config"]["batch_size"] == cell["batch_size"]
        assert trial["config"]["data"] == str(folder / "prompts.jsonl")
        lengths = [len(json.loads(line)["article"].split()) for line in (folder / "prompts.jsonl").open()]
        assert lengths and all((n < 16) == (cell["context"][0] == 0) for n in lengths)
        assert cell["choice"]["settings"]["gamma"] in (0, 2)
    front = json.loads(out.read_text())
    assert front["best_trials"] == [] and len(front["cells"]) == 4
    assert main([*args[:-4], "--context-buckets", "900-"]) == 2    # a bucket no prompt falls in: one line, exit 2


def test_the_report_section_shows_each_cells_choice_its_candidates_and_fixed_against_adaptive(tmp_path):
    import pandas as pd

    from pipeline.analysis import schedule_view
    from pipeline.analysis.document import to_markdown
    from pipeline.tuning.schedule import write_schedule

    study = tmp_path / "tune" / "text"
    fake_result(study / "trials" / "00000.json", gamma=4, ratios=[1.50, 1.55, 1.52, 1.58, 1.51, 1.56])
    fake_result(study / "trials" / "00001.json", gamma=2, ratios=[1.20, 1.22, 1.21, 1.25, 1.23, 1.24],
                schedule="heuristic", gamma_max=6)
    write_schedule(tmp_path / "tune" / "text-schedule.json", build_schedule([(Cell(1), study)], study="toy-text"))
    table = pd.DataFrame([{"run": "toy-text#0", "kind": "trial", "source": str(study / "trials" / "00000.json")}])
    text = to_markdown(schedule_view.section(table))
    assert "## Schedules" in text and "(study toy-text)" in text
    assert "| batch 1 | exact γ 4 | 1.54 [1.50, 1.58] | interval above 1: faster than the target alone" in text
    assert "exact γ 2 heuristic (≤ 6) | 1.23 [1.20, 1.25]" in text and "fixed faster (intervals disjoint)" in text
    assert text.count("| batch 1 |") == 5        # the choice, fixed against adaptive, and the three candidates
    assert schedule_view.section(pd.DataFrame([{"run": "r", "kind": "run", "source": str(tmp_path / "x.json")}])) == []
