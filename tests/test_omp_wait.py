"""OpenMP's wait policy: what the CLI sets before torch loads, and `python -m pipeline.benchmarks.omp_wait` on a
tiny model (speed itself is never asserted in tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pipeline.env_info import OMP_SPIN_COUNT, bounded_omp_wait


@pytest.mark.parametrize("given, expected", [
    ({}, {"GOMP_SPINCOUNT": str(OMP_SPIN_COUNT)}),
    ({"OMP_WAIT_POLICY": "PASSIVE"}, {"OMP_WAIT_POLICY": "PASSIVE"}),      # the user's policy stands
    ({"GOMP_SPINCOUNT": "5"}, {"GOMP_SPINCOUNT": "5"}),
])
def test_bounded_omp_wait_sets_a_spin_count_unless_the_user_set_a_policy(monkeypatch, given, expected):
    for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        monkeypatch.delenv(k, raising=False)
    for k, v in given.items():
        monkeypatch.setenv(k, v)
    bounded_omp_wait()
    assert {k: os.environ[k] for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in os.environ} == expected


def test_the_cli_sets_the_spin_count_before_torch_loads():
    """A fresh process: importing the CLI loads no torch, and its entry point sets the spin count first thing
    (libgomp reads the variable when torch loads it)."""
    code = ("import os, sys\nfrom pipeline import cli\ntorch_loaded = 'torch' in sys.modules\n"
            "try:\n    cli.main(['--version'])\nexcept SystemExit:\n    pass\n"
            "print(torch_loaded, os.environ.get('GOMP_SPINCOUNT'))")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.stdout.split()[-2:] == ["False", str(OMP_SPIN_COUNT)], done.stderr


@pytest.mark.slow
def test_omp_wait_times_each_policy_in_its_own_process_alone_and_beside_burners(tmp_path):
    from test_static_llama import build

    from pipeline.benchmarks.omp_wait import main

    build(num_attention_heads=4, num_key_value_heads=2).config.save_pretrained(tmp_path / "tiny")
    out = tmp_path / "w.json"
    main(["--model", str(tmp_path / "tiny"), "--quant", "none", "--dtype", "float32", "--policies",
          "passive,spin:1000,default", "--burners", "0,1", "--rounds", "2", "--calls", "2", "--context", "8",
          "--out", str(out)])
    result = json.loads(out.read_text())
    # each child ran with its own policy's variables and none of the parent's
    assert result["child_env"] == {"passive": {"OMP_WAIT_POLICY": "PASSIVE"}, "spin:1000": {"GOMP_SPINCOUNT": "1000"},
                                   "default": {}}
    assert [(r["burners"], r["policy"]) for r in result["results"]] == [
        (b, p) for b in (0, 1) for p in ("passive", "spin:1000", "default")]
    for r in result["results"]:
        assert len(r["rounds_ms"]) == 2 and all(t > 0 for t in r["rounds_ms"]) and r["cpu_ms_per_forward"] > 0
        assert r["speedup"]["ci_low"] <= r["speedup"]["median"] <= r["speedup"]["ci_high"]
        assert r["speedup_over"] == "passive"
    assert [r["ratios"] for r in result["results"] if r["policy"] == "passive"] == [[1.0, 1.0], [1.0, 1.0]]


def test_omp_wait_refuses_an_unknown_policy_in_one_line(capsys):
    from pipeline.benchmarks.omp_wait import main

    with pytest.raises(SystemExit) as e:
        main(["--policies", "passive,spin:lots"])
    assert e.value.code == 2
    assert "spin:N" in capsys.readouterr().err
