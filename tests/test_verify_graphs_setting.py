"""`--verify-graphs auto|on|off` without a GPU: auto (the default) replays a kernel sampler's chain steps from CUDA
graphs only where they can be, so nothing changes on a CPU; on is refused where they cannot; a capture that fails under
auto falls back to eager steps with one note (the capture itself is GPU-only: tests/test_kernels_gpu.py fails one
for real; here it is made to fail)."""

from __future__ import annotations

import pytest
import torch
from cuda_on_cpu import CpuLauncher, KernelLibrary, build, compiler
from kernel_cases import make_inputs

from pipeline.cli import build_parser
from pipeline.commands.run import argv_of
from pipeline.config import RunConfig
from pipeline.errors import SpecsweepError
from pipeline.kernels import loader
from pipeline.samplers import cupy_backend
from pipeline.samplers.cuda_graphs import GraphedVerify
from pipeline.stack import graphs_apply

BASE = {"target": "t", "data": "d", "draft": "d"}


def parsed(*flags: str) -> str:
    args = build_parser().parse_args(["run", "--target", "t", "--data", "d", *flags])
    return args.verify_graphs


def test_the_flag_is_auto_by_default_on_alone_and_takes_a_value():
    assert parsed() == "auto"
    assert parsed("--verify-graphs") == "on"
    assert parsed("--verify-graphs", "off") == "off" and parsed("--verify-graphs=auto") == "auto"
    assert argv_of({"verify_graphs": "off"}) == ["--verify-graphs=off"]


def test_a_results_file_of_the_switch_era_reads_back():
    assert RunConfig.from_dict({**BASE, "verify_graphs": True}).verify_graphs == "on"
    assert RunConfig.from_dict({**BASE, "verify_graphs": False}).verify_graphs == "off"
    with pytest.raises(SpecsweepError, match="--verify-graphs 'sometimes' is not one of"):
        RunConfig.from_dict({**BASE, "verify_graphs": "sometimes"}).validate_decoding()


@pytest.mark.parametrize("settings,device,applies", [
    ({}, "cuda", False),                                               # the torch backend: nothing to replay
    ({"backend": "cupy"}, "cuda", True),
    ({"backend": "cupy"}, "cuda:1", True),
    ({"backend": "cupy"}, "cpu", False),                               # a CPU: CPU behaviour unchanged
    ({"backend": "cupy", "draft_tree": "2,2"}, "cuda", False),         # a tree step is not captured
    ({"backend": "cupy", "verify_graphs": "off"}, "cuda", False),
    ({"backend": "cupy", "verify_graphs": "on"}, "cuda", True),
])
def test_auto_replays_only_where_graphs_can_run(settings, device, applies):
    assert graphs_apply(RunConfig.from_dict({**BASE, **settings}), device) is applies


def test_on_is_refused_where_graphs_cannot_run_and_auto_is_not(tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"id": "a", "prompt": "x"}\n')
    RunConfig.from_dict({**BASE, "data": str(data), "device": "cpu", "backend": "cupy"}).validate()
    with pytest.raises(SpecsweepError, match="--verify-graphs replays the CUDA kernels' verify step"):
        RunConfig.from_dict({**BASE, "data": str(data), "device": "cpu", "verify_graphs": "on"}).validate()


@pytest.mark.skipif(compiler() is None, reason="no C++ compiler (g++ >= 11 or clang++): apt install g++")
def test_a_failed_capture_under_auto_verifies_eagerly_with_one_note(monkeypatch, capsys):
    samplers = cupy_backend.bind(CpuLauncher(KernelLibrary(build(loader.SOURCE_PATH, loader.NAME_EXPRESSIONS))))
    sampler = samplers["exact"](temperature=0.8)
    inputs = make_inputs(torch.device("cpu"), 3, 4, 2_000, 2_000, "float32", seed=5)

    def fails(*args):
        raise RuntimeError("operation not permitted when stream is capturing")

    graphed = GraphedVerify(sampler, fall_back=True)
    monkeypatch.setattr(graphed, "_capture", fails)
    for seed in (6, 7):
        got = graphed(*inputs, generator=torch.Generator().manual_seed(seed))
        got = (got.tokens.clone(), got.accepted.clone())
        want = samplers["exact"](temperature=0.8)(*inputs, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(got[0], want.tokens) and torch.equal(got[1], want.accepted)
    err = capsys.readouterr().err
    assert err.count("note: --verify-graphs auto: capturing the verify step at B = 3, γ = 4 failed") == 1
    assert len(err.strip().splitlines()) == 1 and graphed.graphs == 0
    strict = GraphedVerify(sampler)
    monkeypatch.setattr(strict, "_capture", fails)
    with pytest.raises(RuntimeError, match="not permitted"):
        strict(*inputs)
