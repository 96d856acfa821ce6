"""`--sampler synthetic` (pipeline/samplers/synthetic.py): each draft position accepted at a set conditional rate, for
speed measurements at real shapes with random weights. The sampler contract, the measured rates against the given
ones (in the sampler, and through `specsweep run` on a tiny pair), the rates from a results JSON, bad input (one line,
exit code 2), and the speed-only marking of its results."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from sync_detector import assert_no_host_sync
from tiny_models import PROMPTS, save_pair

from pipeline.analysis.recommend import with_speed_reference
from pipeline.cli import main
from pipeline.config import RunConfig, read_synthetic_rates
from pipeline.errors import SamplerInputError, SpecsweepError
from pipeline.report import summary_markdown
from pipeline.results_table import result_row
from pipeline.rules import RULES, SPEED_ONLY_NOTE, is_lossless, is_speed_only, tunable
from pipeline.samplers import get_sampler
from pipeline.samplers.synthetic import SyntheticSampler

TOLERANCE = 0.02   # the measured conditional rate of each position, against the given one


def conditional_rates(accepted: torch.Tensor, gamma: int, lengths: torch.Tensor | None = None) -> list[float]:
    """P(accepted > i | accepted >= i) per position i < γ over the rows whose draft reaches i (lengths > i)."""
    drafted = torch.full_like(accepted, gamma) if lengths is None else lengths
    rates = []
    for i in range(gamma):
        reached = (accepted >= i) & (drafted > i)
        rates.append(float(((accepted > i) & reached).sum()) / max(int(reached.sum()), 1))
    return rates


def inputs(B=6, gamma=4, V=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    tl = torch.randn(B, gamma + 1, V, generator=g)
    dl = torch.randn(B, gamma, V, generator=g)
    dt = torch.randint(0, V, (B, gamma), generator=g)
    return dt, dl, tl


# ---- the registry ------------------------------------------------------------------------------------------------

def test_the_registry_marks_it_speed_only_never_lossless_and_not_tunable():
    rule = RULES["synthetic"]
    assert rule.lossless == "never" and not is_lossless("synthetic", 0.0) and not is_lossless("synthetic", 1.0)
    assert rule.speed_only and is_speed_only("synthetic") and not is_speed_only("exact") and not is_speed_only("nope")
    assert "synthetic" not in tunable() and not rule.tunable
    assert rule.takes_deterministic_drafts(1.0) and rule.takes_deterministic_drafts(0.0)
    assert rule.param_names == ("synthetic_acceptance",) and rule.defaults() == {"synthetic_acceptance": 0.8}


def test_the_flag_reads_synthetic_acceptance_in_both_spellings():
    import argparse

    from pipeline.commands import run as run_command

    parser = argparse.ArgumentParser()
    run_command.add_arguments(parser)
    for flag in ("--synthetic-acceptance", "--synthetic_acceptance"):
        values = vars(parser.parse_args(["--target", "t", "--data", "d", "--sampler", "synthetic", flag, "0.6",
                                         "--synthetic-rates", "0.9,0.8"]))
        cfg = RunConfig.from_dict({k: v for k, v in values.items() if k not in run_command.DISPLAY_FLAGS})
        assert cfg.rule_params == {"synthetic_acceptance": 0.6} and cfg.synthetic_rates == "0.9,0.8"


# ---- the sampler contract ----------------------------------------------------------------------------------------

def test_shapes_tokens_and_the_emitted_argmax():
    dt, dl, tl = inputs(B=64, gamma=4)
    res = get_sampler("synthetic", synthetic_acceptance=0.6)(dt, dl, tl, generator=torch.Generator().manual_seed(0))
    assert res.accepted.shape == (64,) and res.accepted.dtype == torch.int64
    assert res.tokens.shape == (64, 5) and res.tokens.dtype == torch.int64
    argmax = tl.argmax(-1)
    for b in range(64):
        n = int(res.accepted[b])
        assert 0 <= n <= 4
        assert res.tokens[b, :n].tolist() == dt[b, :n].tolist()
        assert int(res.tokens[b, n]) == int(argmax[b, n])       # the target's argmax at position n, bonus included
        assert (res.tokens[b, n + 1:] == -1).all()
    assert bool(res.draft_ok.all() and res.target_ok.all())
    assert set(res.accepted.tolist()) > {0, 4}                   # the rows accept and reject


def test_per_row_lengths_are_respected():
    dt, dl, tl = inputs(B=4000, gamma=5, seed=1)
    lengths = torch.randint(0, 6, (4000,), generator=torch.Generator().manual_seed(2))
    res = get_sampler("synthetic", synthetic_acceptance=0.9)(dt, None, tl, generator=torch.Generator().manual_seed(3),
                                                             lengths=lengths)
    assert bool((res.accepted <= lengths).all()) and bool((res.accepted == lengths).any())
    full = res.accepted == lengths                # a row that accepted its whole draft: the argmax at its length
    emitted = res.tokens.gather(1, res.accepted[:, None]).squeeze(1)
    assert torch.equal(emitted[full], tl.argmax(-1).gather(1, lengths[:, None]).squeeze(1)[full])
    # rate 1 accepts each row's whole draft, rate 0 none
    for rate, want in ((1.0, lengths), (0.0, torch.zeros_like(lengths))):
        got = get_sampler("synthetic", synthetic_acceptance=rate)(dt, dl, tl, generator=torch.Generator(),
                                                                  lengths=lengths)
        assert torch.equal(got.accepted, want)


def test_a_seeded_generator_repeats_the_tokens_and_another_seed_does_not():
    dt, dl, tl = inputs(B=32, gamma=4, seed=4)
    s = get_sampler("synthetic", rates=[0.9, 0.5])

    def run(seed):
        g = torch.Generator().manual_seed(seed)
        return [s(dt, dl, tl, generator=g).tokens for _ in range(5)]

    a, b, c = run(1), run(1), run(2)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))
    # the decisions read only the step's uniforms: draft logits or none (a deterministic draft), the same tokens
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(s(dt, dl, tl, generator=g1).tokens, s(dt, None, tl, generator=g2).tokens)


def test_it_uses_the_contracts_one_uniform_draw_per_step():
    """Column i < γ of the step's uniforms decides position i: the accepted count is the first column at or above its
    rate."""
    B, gamma = 500, 4
    dt, dl, tl = inputs(B=B, gamma=gamma, seed=6)
    rates = torch.tensor([0.9, 0.7, 0.5, 0.3])
    res = get_sampler("synthetic", rates=rates.tolist())(dt, dl, tl, generator=torch.Generator().manual_seed(7))
    u = torch.rand((B, gamma + 1), generator=torch.Generator().manual_seed(7))
    assert torch.equal(res.accepted, (u[:, :gamma] < rates).long().cumprod(1).sum(1))


def test_it_never_syncs_with_the_host():
    dt, dl, tl = inputs(B=3, gamma=4)
    s = get_sampler("synthetic", rates=[0.9, 0.8])
    assert_no_host_sync(s, dt, dl, tl, generator=torch.Generator().manual_seed(0))
    assert_no_host_sync(lambda: s(dt, None, tl, generator=torch.Generator(), lengths=torch.tensor([0, 2, 4])))


@pytest.mark.parametrize("kwargs,message", [
    ({"synthetic_acceptance": 1.5}, "synthetic acceptance (--synthetic-acceptance) must be a probability in [0, 1]"),
    ({"synthetic_acceptance": float("nan")}, "must be a probability in [0, 1]"),
    ({"rates": [0.9, -0.1]}, "each synthetic rate (--synthetic-rates) must be a probability in [0, 1]; got -0.1"),
    ({"rates": []}, "must list at least one rate"),
])
def test_bad_rates_are_refused_by_the_sampler(kwargs, message):
    with pytest.raises(SamplerInputError) as e:
        get_sampler("synthetic", **kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


# ---- the measured rates: many rows at once -----------------------------------------------------------------------

# 200 000 rows: the deepest position checked is reached by at least 200 000 * 0.9 * 0.8 * 0.7 = 100 800 rows (per-row
# lengths: a sixth of them drafted that far), so a rate's binomial standard deviation is at most sqrt(0.25 / 16 800)
# = 0.004 and ±0.02 is more than 5 of them.
ROWS = 200_000


@pytest.mark.parametrize("kwargs,want", [
    ({"synthetic_acceptance": 0.8}, [0.8] * 5),
    ({"rates": [0.9, 0.8, 0.7]}, [0.9, 0.8, 0.7, 0.7, 0.7]),       # past the list: its last rate
])
@pytest.mark.parametrize("per_row", [False, True])
def test_the_measured_conditional_rates_are_the_given_ones(kwargs, want, per_row):
    gamma = 5
    dt = torch.zeros(ROWS, gamma, dtype=torch.int64)
    tl = torch.zeros(ROWS, gamma + 1, 2)
    lengths = torch.randint(0, gamma + 1, (ROWS,), generator=torch.Generator().manual_seed(8)) if per_row else None
    sampler = get_sampler("synthetic", **kwargs)
    assert sampler.rates_for(gamma) == pytest.approx(want)
    res = sampler(dt, None, tl, generator=torch.Generator().manual_seed(9), lengths=lengths)
    assert conditional_rates(res.accepted, gamma, lengths) == pytest.approx(want, abs=TOLERANCE)


# ---- rates from a results file -----------------------------------------------------------------------------------

def result_json(path, position_acceptance, **extra):
    path.write_text(json.dumps({"specsweep_results": 1, "config": {}, "metrics": {
        "position_acceptance": position_acceptance, **extra}}))
    return path


def test_rates_come_from_a_results_files_position_acceptance(tmp_path):
    assert read_synthetic_rates("0.9, 0.8,0.7") == [0.9, 0.8, 0.7]
    # None past the positions its steps reached: left out, so those positions reuse the last known rate
    path = result_json(tmp_path / "real.json", [0.9, 0.5, None, None])
    assert read_synthetic_rates(str(path)) == [0.9, 0.5]
    cfg = RunConfig(target="t", data="d", sampler="synthetic", synthetic_rates=str(path))
    assert cfg.sampler_params()["rates"] == [0.9, 0.5]
    assert SyntheticSampler(rates=cfg.synthetic_rate_list()).rates_for(4) == [0.9, 0.5, 0.5, 0.5]


@pytest.mark.parametrize("kind,message", [
    ("missing", "neither a comma-separated list of rates nor an existing file"),
    ("not_json", "not readable JSON"),
    ("other_json", "has no metrics.position_acceptance"),
    ("no_rates", "has no metrics.position_acceptance"),
    ("all_none", "metrics.position_acceptance has no rate"),
    ("out_of_range", "each rate must be a probability in [0, 1]; got 1.2"),
])
def test_a_bad_rates_file_is_one_line(tmp_path, kind, message):
    path = tmp_path / f"{kind}.json"
    if kind == "not_json":
        path.write_text("{not json")
    elif kind == "other_json":
        path.write_text(json.dumps({"benchmark": "samplers"}))
    elif kind == "no_rates":
        result_json(path, None)
    elif kind == "all_none":
        result_json(path, [None, None])
    elif kind == "out_of_range":
        result_json(path, [1.2])
    with pytest.raises(SpecsweepError) as e:
        read_synthetic_rates(str(path))
    assert message in str(e.value) and "\n" not in str(e.value)
    assert "--synthetic-rates" in str(e.value)


# ---- through `specsweep run` -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic")
    tp, dp = save_pair(root)
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{i}", "prompt": PROMPTS[i % len(PROMPTS)]}) + "\n"
                            for i in range(N_PROMPTS)))
    return root, tp, dp, data


# How many tokens the runs need. A full-γ step's position i is reached by n_i = n_0 * P_0 ... P_{i-1} of the n_0
# steps, and its measured rate has the binomial standard deviation sqrt(P_i (1 - P_i) / n_i). For ±0.02 to be 4 of
# them: n_i >= 16 * P_i (1 - P_i) / 0.02^2 = 40 000 P_i (1 - P_i).
#   rates 0.9, 0.8, 0.7 at γ 3: n_2 >= 8 400 of n_0 * 0.72, so n_0 >= 11 700 steps; a step emits 1 + 0.9 + 0.72 + 0.504
#     = 3.12 tokens: 36 500 tokens.
#   0.8 at every position, γ 3: n_2 >= 6 400 of n_0 * 0.64, so n_0 >= 10 000 steps of 2.95 tokens: 29 500 tokens.
#   the first run's measured rates from its file at γ 4 (position 3 reuses position 2's): n_3 >= 8 400 of n_0 * 0.51,
#     so n_0 >= 16 500 steps of 3.49 tokens: 57 500 tokens.
# Each prompt decodes its --max-new-tokens (--ignore-eos): 192 prompts x 200 tokens = 38 400 for the first two runs,
# 192 x 232 = 44 500 for the third (12 800 steps: ±0.02 is 3.6 standard deviations at position 3, more than 4 at the
# others). The three runs (one batch each) take about 20 s of CPU time: 26 s of wall time on the
# 2-core machine, up to 40 s while another process kept a core busy.
N_PROMPTS = 192


def run_synthetic(pair, out, *extra, tokens=200):
    root, tp, dp, data = pair
    return main(["run", "--target", str(tp), "--draft", str(dp), "--data", str(data), "--device", "cpu",
                 "--no-progress", "--sampler", "synthetic", "--temperature", "0", "--max-new-tokens", str(tokens),
                 "--ignore-eos", "--batch-size", str(N_PROMPTS), "--repeats", "3", "--samples-per-repeat", "1",
                 "--wandb-mode", "disabled", "--out", str(root / out), *extra])


@pytest.mark.slow
def test_a_run_decodes_at_the_given_rates_and_is_marked_speed_only(pair, capsys):
    root = pair[0]
    for out, extra, want in (("per-position.json", ("--synthetic-rates", "0.9,0.8,0.7", "--gamma", "3"),
                              [0.9, 0.8, 0.7]),
                             ("constant.json", ("--synthetic-acceptance", "0.8", "--gamma", "3"), [0.8] * 3)):
        assert run_synthetic(pair, out, *extra) == 0
        res = json.loads((root / out).read_text())
        m = res["metrics"]
        assert m["new_tokens"] == N_PROMPTS * 200 and sum(m["accepted_histogram"]) > 10_000
        assert m["position_acceptance"] == pytest.approx(want, abs=TOLERANCE), out
        assert res["resolved"]["speed_only"]["rates"] == pytest.approx(want)
        assert res["resolved"]["speed_only"]["note"] == SPEED_ONLY_NOTE
        assert SPEED_ONLY_NOTE in capsys.readouterr().out      # the run's line says so, and shows no quality
    # the rates a run measured, read from its results file: the random pair then decodes with its tokens per step;
    # at γ 4 the position past the file's list reuses its last rate
    measured = json.loads((root / "per-position.json").read_text())["metrics"]["position_acceptance"]
    assert run_synthetic(pair, "from-file.json", "--synthetic-rates", str(root / "per-position.json"), "--gamma", "4",
                         tokens=232) == 0
    res = json.loads((root / "from-file.json").read_text())
    want = [*measured, measured[-1]]
    assert res["resolved"]["speed_only"] == {"note": SPEED_ONLY_NOTE, "rates": want,
                                             "rates_from": str(root / "per-position.json")}
    assert res["metrics"]["position_acceptance"] == pytest.approx(want, abs=TOLERANCE)
    assert res["config"]["synthetic_rates"] == str(root / "per-position.json")


def test_the_runs_table_and_summary_leave_its_quality_out():
    """A synthetic run's scores are no claim: the runs table (which the report reads) has no quality for it, so it
    is never ranked or recommended by quality, and the summary says why."""
    res = {"config": {"task": "cnn_dailymail", "sampler": "synthetic", "gamma": 3, "synthetic_acceptance": 0.8},
           "metrics": {"speedup": 2.0}, "quality": {"rougeL": 0.3}, "resolved": {}}
    row = result_row(res, "s.json")
    assert row["speed_only"] is True and row["quality"] is None and row["tradeoff"] is None and "rougeL" not in row
    exact = result_row({**res, "config": {**res["config"], "sampler": "exact"}}, "e.json")
    assert exact["speed_only"] is False and exact["rougeL"] == 0.3
    summary = summary_markdown(with_speed_reference(pd.DataFrame([row, exact])))
    assert SPEED_ONLY_NOTE in summary
    assert SPEED_ONLY_NOTE not in summary_markdown(with_speed_reference(pd.DataFrame([exact])))


@pytest.mark.parametrize("extra,message", [
    (["--synthetic-acceptance", "1.5"], "--synthetic-acceptance must be a probability in [0, 1]; got 1.5"),
    (["--synthetic-rates", "0.9,1.2"], "--synthetic-rates: each rate must be a probability in [0, 1]; got 1.2"),
    (["--synthetic-rates", "missing.json"], "neither a comma-separated list of rates nor an existing file"),
    (["--synthetic-rates", "{bad}"], "not readable JSON"),
    (["--synthetic-rates", "{other}"], "has no metrics.position_acceptance"),
    (["--synthetic-rates", "0.9", "--synthetic-acceptance", "0.5"], "not both"),
    (["--engine", "hf", "--batch-size", "1"], "--sampler synthetic runs in our engine"),
    (["--sampler", "exact", "--synthetic-rates", "0.9"], "--synthetic-rates applies to --sampler synthetic"),
    (["--sampler", "exact", "--synthetic-acceptance", "0.9"], "--synthetic_acceptance do(es) not apply"),
])
def test_bad_input_is_one_line_with_exit_code_2(pair, capsys, tmp_path, extra, message):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "other.json").write_text(json.dumps({"specsweep_results": 1, "metrics": {}}))
    extra = [x.format(bad=tmp_path / "bad.json", other=tmp_path / "other.json") if x.startswith("{") else x
             for x in extra]
    out = tmp_path / "never.json"
    assert run_synthetic(pair, out, *extra) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not out.exists()
