"""`specsweep bench host` without a GPU: its counters (dispatches, Python memory, launches), the interleaved timing, and
a smoke run of the command that writes its JSON. No timing here is asserted: speed is judged in the benchmark."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline.benchmarks import host
from pipeline.cli import main


def test_count_dispatches_counts_each_aten_op_of_one_warm_call():
    calls = []

    def fn():
        calls.append(1)
        x = torch.empty(3) if len(calls) > 2 else torch.zeros(3)   # the warm-up calls make something else
        return x.add_(1)[1:]

    ops = host.count_dispatches(fn, warmup=2)
    assert len(calls) == 3
    assert ops == {"aten.empty.memory_format": 1, "aten.add_.Tensor": 1, "aten.slice.Tensor": 1}


def test_python_bytes_sees_what_a_call_keeps():
    kept = []
    assert host.python_bytes(lambda: kept.append(bytearray(1000)), calls=50)["retained"] >= 1000
    assert host.python_bytes(lambda: bytearray(1000), calls=50)["retained"] < 100   # freed at once


def test_time_interleaved_gives_every_function_its_blocks_in_rotating_order():
    order = []
    fns = {name: (lambda n=name: order.append(n)) for name in "abc"}
    times = host.time_interleaved(fns, repeats=4, calls=2, cuda=False, warmup=0)
    assert {k: len(v) for k, v in times.items()} == {"a": 4, "b": 4, "c": 4}
    blocks = order[::2]                                  # one entry per block of 2 calls
    assert blocks == list("abc" "bca" "cab" "abc")


def test_skip_launcher_records_the_launches_of_each_sampler():
    launcher = host.SkipLauncher()
    calls = host.sampler_calls(host.cupy_backend.bind(launcher), (2, 3, 5_000, "float32"), torch.device("cpu"))
    launched = {}
    for name, fn in calls.items():
        launcher.launches.clear()
        fn()
        launched[name] = dict(launcher.launches)
    assert launched == {"exact": {"exact_partials": 1, "sample_exact": 1}, "sigmoid": {"sample_sigmoid": 1},
                        "greedy": {"greedy_verify": 1}, "tree": {"tree_verify_partials": 1, "tree_verify": 1}}


@pytest.mark.slow
def test_bench_host_writes_a_row_per_sampler_with_intervals_and_counts(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(host, "QUICK", ((1, 2, 3_000, "bfloat16"),))
    out = tmp_path / "host.json"
    assert main(["bench", "host", "--device", "cpu", "--quick", "--repeats", "3", "--calls", "5",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["benchmark"] == "host" and result["complete"] and result["load"]["seconds"] > 0
    assert result["provenance"]["device"]["device"] == "cpu" and "date" in result["provenance"]
    assert "not GPU launch times" in result["settings"]["launcher"]
    rows = {r["sampler"]: r for r in result["results"]}
    assert set(rows) == {"exact", "sigmoid", "greedy", "tree"}
    assert rows["tree"]["gamma"] == 10 and rows["tree"]["tree"] == host.TREE
    for r in rows.values():
        assert len(r["times_us"]) == 3 and r["host_us"]["ci_low"] <= r["host_us"]["median"] <= r["host_us"]["ci_high"]
        assert r["dispatches"] == sum(r["dispatch_ops"].values()) and r["launches"] in (1, 2)
    assert "host µs [95 %]" in capsys.readouterr().out


@pytest.mark.parametrize("flag", ["--repeats", "--calls"])
def test_bench_host_refuses_a_count_below_one_in_one_line(flag, capsys):
    assert main(["bench", "host", "--device", "cpu", flag, "0"]) == 2
    err = capsys.readouterr().err
    assert "--repeats and --calls must be >= 1" in err and len(err.strip().splitlines()) == 1
