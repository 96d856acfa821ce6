"""Paired measurement inside one run (pipeline/paired.py, pipeline/runner.py): what a run records, the thread
settings, the flags and their warning, and the contention test: the same run beside CPU-burning processes
gives a speedup that agrees with the quiet run's within their intervals, or is flagged."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from tiny_models import save_pair, write_prompts

from pipeline import measure, paired
from pipeline.config import RunConfig
from pipeline.env_info import LoadProbe, cpu_burners, default_threads, usable_cores
from pipeline.errors import SpecsweepError
from pipeline.runner import run
from pipeline.tuning.study import measured_run


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("paired")
    tp, dp = save_pair(root)
    data = write_prompts(root / "prompts.jsonl")
    cfg = RunConfig(target=str(tp), draft=str(dp), data=str(data), gamma=3, device="cpu", max_new_tokens=16,
                    wandb_mode="disabled", out=str(root / "run.json"))
    return root, cfg


def test_a_run_records_its_paired_measurement(pair):
    root, cfg = pair
    res = run(dataclasses.replace(cfg, repeats=4, samples_per_repeat=3, threads=1), progress=False)
    m, meas = res["metrics"], res["measurement"]
    spec, ar = meas["timings"]["speculative"], meas["timings"]["autoregressive"]
    assert meas["method"] == "paired" and meas["repeats"] == 4 and meas["samples_per_repeat"] == 3
    assert len(spec["seconds"]) == len(ar["seconds"]) == 4 and all(s > 0 for s in spec["seconds"] + ar["seconds"])
    # every repeat decodes the same 3 samples of at most 16 tokens with both loops
    assert all(0 < t <= 3 * 16 for t in spec["tokens"] + ar["tokens"])
    ratios = [(a / b) / (c / d) for a, b, c, d in zip(spec["tokens"], spec["seconds"], ar["tokens"], ar["seconds"])]
    assert meas["ratios"] == pytest.approx(ratios)
    assert m["speedup"] == pytest.approx(measure.median_ci(ratios).median) and m["speedup_paired"] is True
    assert m["speedup_ci_low"] <= m["speedup"] <= m["speedup_ci_high"]
    assert m["tokens_per_second"] == pytest.approx(measure.median_ci(
        [t / s for t, s in zip(spec["tokens"], spec["seconds"])]).median)
    assert m["flagged"] == bool(meas["flags"]) == meas["flagged"]
    assert meas["threads"]["intra_op"] == 1 and meas["threads"]["requested_intra_op"] == 1
    load = meas["load"]
    assert load["cores"] == usable_cores() and load["seconds"] > 0 and load["others_cpu_s"] >= 0
    assert load["start"]["loadavg"] is not None and load["end"]["gpu"] is None
    assert json.loads((root / "run.json").read_text())["measurement"]["ratios"] == meas["ratios"]
    # the per-forward costs come from the same repeats: c and r are ratios of the recorded phase times and calls
    sp, ap = spec["phases"], ar["phases"]
    assert sp["draft_forwards"] > 0 and ap["draft_forwards"] == 0 and ap["calls"]["target"] > 0
    t_draft = sp["time_s"]["draft"] / sp["draft_forwards"]
    t_ar, t_verify = (p["time_s"]["target"] / p["calls"]["target"] for p in (ap, sp))
    assert m["cost_ratio"] == pytest.approx(t_draft / t_ar)
    assert m["verify_cost_ratio"] == pytest.approx(t_verify / t_ar)
    assert m["predicted_speedup"] == pytest.approx(m["mean_accepted_tokens"] / (3 * m["cost_ratio"]
                                                                                  + m["verify_cost_ratio"]))
    assert meas["predicted_speedup"] == m["predicted_speedup"]
    # decoding alone: each repeat's tokens after the rows' first over its seconds after the prefill, paired
    assert spec["rows"] == ar["rows"] == [3] * 4
    assert all(0 < p < s for p, s in zip(ar["prefill_seconds"], ar["seconds"]))
    decode = [((a - 3) / (b - p)) / ((c - 3) / (d - q)) for a, b, p, c, d, q in zip(
        spec["tokens"], spec["seconds"], spec["prefill_seconds"], ar["tokens"], ar["seconds"], ar["prefill_seconds"])]
    assert m["decode_speedup"] == pytest.approx(measure.median_ci(decode).median)
    assert m["decode_speedup_ci_low"] <= m["decode_speedup"] <= m["decode_speedup_ci_high"]


def test_forward_costs_by_hand():
    def phases(draft_s, target_s, target_calls, draft_forwards):
        return {"phases": {"time_s": {"draft": draft_s, "target": target_s, "prefill": 9.0},
                           "calls": {"draft": 4, "target": target_calls, "prefill": 2},
                           "draft_forwards": draft_forwards}}

    costs = paired.forward_costs({paired.SPECULATIVE: phases(0.8, 3.0, 10, 40),        # 20 ms/draft, 300 ms/verify
                                  paired.AUTOREGRESSIVE: phases(0.0, 4.0, 20, 0)})     # 200 ms/target forward
    assert costs == pytest.approx({"draft_forward_s": 0.02, "target_forward_s": 0.2, "verify_forward_s": 0.3,
                                   "cost_ratio": 0.1, "verify_cost_ratio": 1.5})
    alone = paired.forward_costs({paired.AUTOREGRESSIVE: phases(0.0, 4.0, 20, 0)})      # a γ = 0 run
    assert alone["cost_ratio"] is None and alone["verify_cost_ratio"] is None and alone["target_forward_s"] == 0.2


def test_the_run_puts_torch_threads_back_and_a_baseline_gives_an_unpaired_speedup(pair):
    root, cfg = pair
    before = torch.get_num_threads()
    ar = run(dataclasses.replace(cfg, gamma=0, repeats=3, samples_per_repeat=2, out=str(root / "ar.json")),
             progress=False)
    assert torch.get_num_threads() == before
    assert ar["measurement"]["method"] == "repeated" and "speedup" not in ar["metrics"]
    assert ar["measurement"]["threads"]["intra_op"] == default_threads()
    res = run(dataclasses.replace(cfg, repeats=3, samples_per_repeat=2, baseline=str(root / "ar.json")),
              progress=False)
    m = res["metrics"]
    assert m["unpaired_speedup"] == pytest.approx(m["tokens_per_second"] / ar["metrics"]["tokens_per_second"])
    assert m["speedup"] != m["unpaired_speedup"]
    # the baseline's quality travels with the run, so scoring it later needs no baseline file
    assert res["resolved"]["baseline_quality"] == ar["quality"]


def test_a_flagged_run_says_why_on_stderr(pair, capsys):
    record = paired.summarize(
        {"speculative": {"seconds": [1.0, 4.0, 0.5], "tokens": [100, 100, 100]},
         "autoregressive": {"seconds": [2.0, 2.0, 2.0], "tokens": [100, 100, 100]}},
        predicted=1.8, load={"others_busy_cores": 1.4, "cores": 2}, threads={}, samples_per_repeat=4)
    assert record["flagged"] and record["flags"][0].startswith("spread:")
    assert paired.metrics_of(record)["flagged"] is True
    paired.warn_if_flagged(record, "out.json")
    err = capsys.readouterr().err
    assert "out.json: speed measurement flagged (other processes kept 1.4 of 2 cores busy): spread:" in err


def test_a_flagged_trial_is_remeasured_once_and_fails_with_the_reason_if_it_stays_flagged(pair):
    root, cfg = pair
    cfg = dataclasses.replace(cfg, out=str(root / "trial.json"))

    def fake(flags_per_call):
        calls = []

        def run_(config, progress=True):
            flags = flags_per_call[len(calls)]
            calls.append(config)
            return {"metrics": {"speedup": 1.5, "flagged": bool(flags)},
                    "measurement": {"flags": flags, "flagged": bool(flags)}}
        return run_, calls

    ok, calls = fake([[]])
    assert measured_run(cfg, ok, "trial 0")["measurement"].get("remeasured") is None and len(calls) == 1
    second, calls = fake([["spread: x"], []])
    result = measured_run(cfg, second, "trial 1")
    assert len(calls) == 2 and result["measurement"]["remeasured"] is True
    assert json.loads((root / "trial.json").read_text())["measurement"]["remeasured"] is True
    bad, calls = fake([["spread: x"], ["implausible: y"]])
    with pytest.raises(SpecsweepError, match=r"trial 2: speed measurement flagged twice \(implausible: y\)"):
        measured_run(cfg, bad, "trial 2")
    assert len(calls) == 2


def test_load_probe_sees_other_processes_cpu_time():
    probe = LoadProbe("cpu")
    with cpu_burners(1, seconds=30):
        import time

        time.sleep(1.5)
    record = probe.finish()
    # one process spinning for 1.5 s: about one core busy (less when the machine has fewer cores free)
    assert record["others_cpu_s"] > 0.5 and 0.3 < record["others_busy_cores"] <= usable_cores() + 0.5


def _spin(seconds: float) -> None:
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_load_probe_measures_how_long_this_process_waited_for_a_cpu():
    """Spinning alone, this process hardly waits; beside one spinning process per core, it waits for a CPU a
    large part of the time it is ready to run (Linux only: elsewhere the probe records None)."""
    import time

    quiet_probe, cpu_before = LoadProbe("cpu"), time.process_time()
    _spin(1.0)
    quiet, cpu = quiet_probe.finish()["runqueue_wait"], time.process_time() - cpu_before
    if quiet is None:
        pytest.skip("no scheduler statistics (/proc/self/task/*/schedstat) on this system")
    # the probe's on-CPU time is the kernel's CPU time for this process, however busy the machine is
    assert quiet["on_cpu_s"] == pytest.approx(cpu, abs=0.15)
    if cpu < 0.5 or quiet["wait_fraction"] > 0.25:
        pytest.skip(f"other processes kept this one off the CPU for {1 - cpu:.2f} s of a 1 s spin (it waited "
                    f"{quiet['wait_fraction']:.0%} of its ready time, e.g. beside another test worker): not a quiet "
                    "machine to compare with")
    with cpu_burners(usable_cores(), seconds=30):
        busy_probe = LoadProbe("cpu")
        _spin(1.5)
        busy = busy_probe.finish()["runqueue_wait"]
    assert busy["on_cpu_s"] > 0.2
    # n + 1 spinning threads on n cores: this one waits about 1 / (n + 1) of its ready time (alone: about 0)
    assert busy["wait_fraction"] > 1 / (2 * (usable_cores() + 1))
    assert quiet["wait_fraction"] < busy["wait_fraction"] / 2


def test_contended_run_agrees_with_the_quiet_one_within_intervals_or_is_flagged(pair):
    """The tiny pair measured alone and beside one CPU-burning process per usable core (bounded at 120 s, killed
    at the end): never an unflagged disagreement, such as the issue's 5x error.

    Contention need not widen the interval: it can slow both loops for the whole run and still move the ratio
    (CI once measured 0.72 [0.64, 1.07] beside the burners against 0.62 [0.55, 0.64] alone, neither interval
    wide), so the check that must catch it is the run-queue wait of the run's own threads."""
    root, cfg = pair
    cfg = dataclasses.replace(cfg, repeats=6, samples_per_repeat=4)
    quiet = run(dataclasses.replace(cfg, out=str(root / "quiet.json")), progress=False)
    with cpu_burners(usable_cores(), seconds=120):
        busy = run(dataclasses.replace(cfg, out=str(root / "busy.json")), progress=False)
    q, b = quiet["metrics"], busy["metrics"]
    load = busy["measurement"]["load"]
    # the burners really shared the CPU with the contended run ...
    assert load["others_busy_cores"] > 0.5
    # ... and the run saw it: every one of its threads competed with a burner for a core
    if load["runqueue_wait"] is not None:  # Linux with scheduler statistics (CI): the contention flag fires
        assert load["runqueue_wait"]["wait_fraction"] > measure.MAX_CPU_WAIT
        assert any(r.startswith("contended:") for r in busy["measurement"]["flags"]), busy["measurement"]["flags"]
    overlap = b["speedup_ci_low"] <= q["speedup_ci_high"] and q["speedup_ci_low"] <= b["speedup_ci_high"]
    assert overlap or b["flagged"], (
        f"contended speedup {b['speedup']:.2f} [{b['speedup_ci_low']:.2f}, {b['speedup_ci_high']:.2f}] disagrees "
        f"with the quiet {q['speedup']:.2f} [{q['speedup_ci_low']:.2f}, {q['speedup_ci_high']:.2f}] unflagged")


def test_the_verify_cost_falls_back_to_the_quality_pass_when_the_timed_samples_end_in_their_first_step():
    from pipeline.runner import _theory

    costs = {"draft_forward_s": 0.02, "target_forward_s": 0.2, "verify_forward_s": None, "cost_ratio": 0.1,
             "verify_cost_ratio": None}
    metrics = {"iid_alpha": 0.8, "mean_accepted_tokens": 3.0, "target_time_s": 2.4, "target_forwards": 10}
    out = _theory(metrics, costs, 4)
    assert out["verify_forward_s"] == pytest.approx(0.24) and out["verify_cost_ratio"] == pytest.approx(1.2)
    assert out["predicted_speedup"] == pytest.approx(3.0 / (0.4 + 1.2))
    assert out["theoretical_speedup"] == pytest.approx((1 - 0.8 ** 5) / 0.2 / 1.4)
    none = _theory({**metrics, "target_forwards": 0}, costs, 4)    # no verify forward anywhere: no prediction
    assert none["verify_cost_ratio"] is None and none["predicted_speedup"] is None


def test_a_run_counts_its_own_servers_work_as_its_own():
    """A process registered as the run's own (an engine's server, env_info.count_as_own) is not other load: the
    same spinning child counts as other processes' CPU time until it is registered, and then as the run's."""
    import time

    from pipeline.env_info import OWN_PROCESSES, count_as_own

    with cpu_burners(1, seconds=30) as (child,):
        time.sleep(0.2)                                 # the child is spinning
        other = LoadProbe("cpu")
        time.sleep(1.0)
        as_other = other.finish()
        count_as_own(child.pid)
        try:
            own = LoadProbe("cpu")
            time.sleep(1.0)
            as_own = own.finish()
        finally:
            count_as_own(child.pid, own=False)
    assert child.pid not in OWN_PROCESSES
    # about one core moves from the others' column to the run's
    assert as_other["others_busy_cores"] - as_own["others_busy_cores"] > 0.5, (as_other, as_own)
    if as_own["runqueue_wait"] is not None:            # Linux with scheduler statistics: its threads are the run's
        assert as_own["runqueue_wait"]["on_cpu_s"] > 0.5
