"""Data-parallel runs (pipeline/distributed.py): sharding and merging, and `specsweep run --processes 2` on the CPU
(gloo) giving the tokens and quality of one process, in one results file; a failing rank fails the run in one line."""

from __future__ import annotations

import json

import pytest
from tiny_models import PROMPTS, save_pair, write_articles

from pipeline import distributed
from pipeline.cli import main
from pipeline.commands import run as run_command
from pipeline.config import RunConfig
from pipeline.errors import SpecsweepError
from pipeline.runner import run
from pipeline.tasks.base import Cuts


@pytest.mark.parametrize("n_items, size", [(5, 2), (7, 3), (4, 4), (9, 1)])
def test_shards_are_deterministic_disjoint_and_unshard_to_the_original_order(n_items, size):
    items = [f"x{i}" for i in range(n_items)]
    shares = [distributed.World(rank, size, rank).shard(items) for rank in range(size)]
    assert shares[0][0] == "x0" and sorted(x for share in shares for x in share) == sorted(items)
    assert distributed.unshard(shares) == items


def test_totals_merge_exactly_counts_summed_and_the_wall_time_of_the_slowest_rank():
    def part(wall, hist, calls, cut):
        return {"wall": wall, "draft_forwards": calls * 3, "peak": 100.0 * wall, "phase_time": {"target": wall / 2},
                "phase_calls": {"target": calls}, "hist": hist, "cuts": cut,
                "token_classes": {"token": {"word": {"offered": calls, "accepted": 1}}},
                "drafter_counts": {"row_steps": calls, "lookup_histogram": hist[: calls - 2]}}

    merged = distributed.merge_totals([part(2.0, [1, 2, 3], 4, Cuts(1, 1, 5, 5)), part(3.0, [0, 5, 1], 6, Cuts())])
    assert merged["wall"] == 3.0 and merged["rank_wall"] == [2.0, 3.0] and merged["peak"] == 300.0
    assert merged["hist"] == [1, 7, 4] and merged["draft_forwards"] == 30
    assert merged["phase_time"] == {"target": 2.5} and merged["phase_calls"] == {"target": 10}
    assert merged["token_classes"] == {"token": {"word": {"offered": 10, "accepted": 2}}}
    assert merged["cuts"] == Cuts(1, 1, 5, 5)
    assert merged["drafter_counts"] == {"row_steps": 10, "lookup_histogram": [1, 7, 1]}     # lists: element-wise


def test_the_processes_get_the_settings_of_the_command_line():
    parser = __import__("argparse").ArgumentParser()
    run_command.add_arguments(parser)
    argv = ["--target", "t", "--data", "d", "--sampler", "sigmoid,exact", "--alpha", "0.5", "--gamma", "2",
            "--no-static-cache", "--ignore-eos", "--processes", "2", "--out", "r/{sampler}.json", "--limit", "3"]
    parsed = vars(parser.parse_args(argv))
    values = {k: v for k, v in parsed.items() if k not in run_command.DISPLAY_FLAGS}
    again = vars(parser.parse_args(run_command.argv_of(values, no_progress=True)))
    assert again == {**parsed, "no_progress": True}


def test_processes_need_their_processes_started_and_at_least_one(tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text('{"id": "a", "prompt": "water"}\n')
    with pytest.raises(SpecsweepError, match="accelerate launch"):
        run(RunConfig(target="t", data=str(data), gamma=0, processes=2, device="cpu"))
    with pytest.raises(SpecsweepError, match="--processes must be >= 1"):
        RunConfig(target="t", data=str(data), gamma=0, processes=0).validate()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    tp, dp = save_pair(root)
    articles = write_articles(root / "articles.jsonl", len(PROMPTS), 3)
    return root, tp, dp, articles


def _args(setup, out, *extra):
    _, tp, dp, articles = setup
    return ["run", "--target", str(tp), "--draft", str(dp), "--data", str(articles), "--task", "cnn_dailymail",
            "--device", "cpu", "--gamma", "3", "--max-new-tokens", "10", "--repeats", "3", "--samples-per-repeat",
            "1", "--no-progress", "--out", str(out), *extra]


@pytest.mark.slow
def test_two_processes_give_the_tokens_and_quality_of_one_in_one_results_file(setup, capsys):
    root = setup[0]
    one, two = root / "one.json", root / "two.json"
    assert main(_args(setup, one, "--seed-per-example", "--batch-size", "2")) == 0
    assert main(_args(setup, two, "--processes", "2", "--batch-size", "2")) == 0
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    assert [s["id"] for s in b["samples"]] == [f"a{i}" for i in range(len(PROMPTS))]
    assert [s["token_ids"] for s in b["samples"]] == [s["token_ids"] for s in a["samples"]]
    assert b["quality"] == a["quality"] and "rougeL" in b["quality"]
    assert [s["quality"] for s in b["samples"]] == [s["quality"] for s in a["samples"]]
    assert set(b) == set(a) and set(b["metrics"]) == set(a["metrics"])
    for key in ("new_tokens", "accepted_tokens", "drafted_tokens", "verify_steps", "accepted_histogram",
                "token_class_acceptance", "acceptance_rate"):
        assert b["metrics"][key] == a["metrics"][key], key
    assert (a["resolved"]["processes"], b["resolved"]["processes"]) == (1, 2)
    assert a["resolved"]["seed_per_example"] and b["resolved"]["seed_per_example"]
    walls = b["resolved"]["rank_wall_time_s"]
    assert len(walls) == 2 and b["metrics"]["wall_time_s"] == max(walls)
    assert b["metrics"]["pass_tokens_per_second"] == pytest.approx(b["metrics"]["new_tokens"] / max(walls))
    assert b["resolved"]["speed_measured_on"] == "rank 0 (cpu)" and b["metrics"]["speedup"] > 0


@pytest.mark.slow
def test_with_an_adaptive_draft_length_two_processes_give_the_tokens_of_one_example_at_a_time(setup):
    """An adaptive draft length in batches of 3 over two processes: each row drafts its own length, is verified with
    it and draws only its own uniforms, so every example decodes as it does alone (batch size 1, one process)."""
    root = setup[0]
    alone, two = root / "adaptive-alone.json", root / "adaptive-two.json"
    adaptive = ("--draft-schedule", "heuristic", "--draft-confidence", "0.5", "--gamma-max", "6")
    assert main(_args(setup, alone, "--seed-per-example", "--batch-size", "1", *adaptive)) == 0
    assert main(_args(setup, two, "--processes", "2", "--batch-size", "3", *adaptive)) == 0
    a, b = json.loads(alone.read_text()), json.loads(two.read_text())
    assert [s["token_ids"] for s in b["samples"]] == [s["token_ids"] for s in a["samples"]]
    for key in ("new_tokens", "accepted_tokens", "drafted_tokens", "verify_steps"):
        assert b["metrics"][key] == a["metrics"][key], key


@pytest.mark.slow
def test_a_failing_rank_fails_the_run_in_one_line_and_keeps_the_earlier_results(setup, capsys):
    root = setup[0]
    long_articles = root / "long.jsonl"
    rows = [{"id": f"a{i}", "article": " ".join([p] * (60 if i == 1 else 3)), "highlights": p}
            for i, p in enumerate(PROMPTS)]
    long_articles.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = root / "kept.json"
    out.write_text('{"earlier": true}')
    args = _args(setup, out, "--processes", "2", "--long-inputs", "error")
    args[args.index("--data") + 1] = str(long_articles)
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("specsweep run: error: rank 1 of 2 failed on example 'a1': article 'a1' is too long")
    assert out.read_text() == '{"earlier": true}'
