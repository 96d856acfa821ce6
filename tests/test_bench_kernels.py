"""`specsweep bench kernels` without a GPU: its grid, the CUDA-graph timing protocol (against a stand-in for
torch.cuda), the choice and call of FlashInfer's functions (against stand-in modules), the goals, the table and
the JSON it writes as it goes. No timing here is a measurement: the GPU run is kernels/gpu_validate.sh."""

from __future__ import annotations

import itertools
import json
import sys
import types
from contextlib import contextmanager

import pytest
import torch

from pipeline.benchmarks import kernels as bench
from pipeline.cli import main

# ---- the grid ---------------------------------------------------------------------------------------------------


def test_full_grid_is_the_issues_grid_with_the_goal_configuration_first():
    configs = bench.configurations(**bench.FULL)
    grid = set(itertools.product((1, 8, 32, 128), (1, 3, 5, 8), (32_000, 128_256),
                                 ("bfloat16", "float32", "float16")))
    assert set(configs) == grid and len(configs) == len(grid) == 96  # the goal configuration is in the grid
    assert configs[0] == (1, 5, 128_256, "bfloat16")
    # whole dtypes one after another, bf16 first: a run cut short keeps complete dtypes
    assert [d for _, _, _, d in configs[1:]] == sorted([d for _, _, _, d in configs[1:]],
                                                       key=("bfloat16", "float32", "float16").index)


def test_quick_grid_and_an_extra_configuration_outside_the_grid():
    assert bench.configurations(**bench.QUICK) == [(1, 5, 128_256, "bfloat16"), (16, 5, 128_256, "bfloat16")]
    configs = bench.configurations((1,), (2,), (100,), ("float32",), extra=((4, 4, 64, "float16"),))
    assert configs == [(4, 4, 64, "float16"), (1, 2, 100, "float32")]


# ---- CUDA-graph timing, against a stand-in for torch.cuda -------------------------------------------------------

class FakeCuda:
    """Enough of torch.cuda for graph_times: streams, capture, replay, events on a simulated clock (a captured
    call costs ``call_ms`` per replay). Like torch.cuda.graph, a failed capture leaves the capture stream
    current and capture_end raises its own error."""

    def __init__(self, call_ms=0.5, fail_in_capture=False):
        self.current, self.capturing, self.clock_ms = "caller", False, 0.0
        self.call_ms, self.fail_in_capture = call_ms, fail_in_capture
        self.calls: list[tuple] = []      # (i, stream, capturing) per fn call
        self.replays: list[str] = []      # stream of each replay
        self.syncs = 0

    def fn(self, i):
        if self.capturing and self.fail_in_capture:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.calls.append((i, self.current, self.capturing))
        if self.capturing:
            self.captured_into.captured += 1

    # torch.cuda's API
    def current_stream(self):
        return FakeStream(self.current)

    def Stream(self):
        return FakeStream("side")

    def set_stream(self, stream):
        self.current = stream.name

    @contextmanager
    def stream(self, stream):
        previous, self.current = self.current, stream.name
        yield
        self.current = previous

    def synchronize(self):
        self.syncs += 1

    def CUDAGraph(self):
        self.captured_into = FakeGraph(self)
        return self.captured_into

    @contextmanager
    def graph(self, graph, stream):
        previous, self.current, self.capturing = self.current, stream.name, True
        try:
            yield
        except Exception as e:  # torch raises this from capture_end, in __exit__, with e as its context
            self.capturing = False
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture") from e
        self.capturing, self.current = False, previous

    def Event(self, enable_timing):
        assert enable_timing
        return FakeEvent(self)


class FakeStream:
    def __init__(self, name):
        self.name = name

    def wait_stream(self, other):
        pass


class FakeGraph:
    def __init__(self, cuda):
        self.cuda, self.captured = cuda, 0

    def replay(self):
        self.cuda.replays.append(self.cuda.current)
        self.cuda.clock_ms += self.captured * self.cuda.call_ms


class FakeEvent:
    def __init__(self, cuda):
        self.cuda = cuda

    def record(self):
        self.t = self.cuda.clock_ms

    def elapsed_time(self, end):
        return end.t - self.t


def test_graph_times_warms_up_on_the_side_stream_captures_rotating_calls_and_divides_replays_by_calls():
    cuda = FakeCuda(call_ms=0.5)
    per_call = bench.graph_times(cuda.fn, calls=6, replays=4, warmup=2, cuda=cuda)
    assert per_call == [pytest.approx(0.5e-3)] * 4  # each replay: 6 calls x 0.5 ms, / 6 calls, in seconds
    assert cuda.calls == [(0, "side", False), (1, "side", False)] + [(i, "side", True) for i in range(6)]
    assert cuda.replays == ["caller"] * 5  # one untimed replay, then 4 timed, on the caller's stream
    assert cuda.current == "caller" and cuda.syncs == 2  # before capture, and once after all timed replays


def test_a_failed_capture_raises_and_restores_the_callers_stream():
    cuda = FakeCuda(fail_in_capture=True)
    with pytest.raises(RuntimeError, match="previous error during capture"):
        bench.graph_times(cuda.fn, calls=4, replays=2, cuda=cuda)
    assert cuda.current == "caller" and cuda.replays == []


def _fake_eager(monkeypatch, times):
    """time_calls stand-in: the eager part of Timing.measure returns ``times``."""
    seen = {}

    def time_calls(fn, device, repeats, warmup):
        seen.update(device=device, repeats=repeats, warmup=warmup)
        return times[:repeats]

    monkeypatch.setattr(bench, "time_calls", time_calls)
    return seen


def test_measure_reports_eager_and_graph_times(monkeypatch):
    seen = _fake_eager(monkeypatch, [3e-6, 1e-6, 2e-6])
    cuda = FakeCuda(call_ms=0.25)
    row = bench.Timing(repeats=3, graph_calls=4, graph_replays=3, cuda=cuda).measure(cuda.fn, cuda.fn)
    assert seen == {"device": "cuda", "repeats": 3, "warmup": bench.EAGER_WARMUP}
    assert row["median_s"] == 2e-6 and row["times_s"] == [3e-6, 1e-6, 2e-6]
    assert row["graph_s"] == pytest.approx(0.25e-3) and len(row["graph_times_s"]) == 3
    assert "graph_error" not in row


def test_measure_records_why_there_is_no_graph_time(monkeypatch):
    _fake_eager(monkeypatch, [1e-6] * 5)
    failing = FakeCuda(fail_in_capture=True)
    row = bench.Timing(repeats=5, cuda=failing).measure(failing.fn, failing.fn)
    assert row["graph_s"] is None and row["graph_times_s"] is None and row["median_s"] == 1e-6
    # both the error that broke the capture and the one capture_end raised after it
    assert "previous error during capture" in row["graph_error"]
    assert "operation not permitted when stream is capturing" in row["graph_error"]
    assert failing.syncs >= 1  # synchronised after the failure, so a sticky CUDA error would surface there
    row = bench.Timing(repeats=2, cuda=FakeCuda()).measure(lambda i: None, None, no_graph=bench.HF_NO_GRAPH)
    assert row["graph_s"] is None and row["graph_error"] == bench.HF_NO_GRAPH and len(row["times_s"]) == 2


# ---- FlashInfer: which functions, called how --------------------------------------------------------------------

def _install_flashinfer(monkeypatch, softmax=True, seed_offset=True):
    """Stand-in flashinfer and flashinfer.sampling modules; the calls they get are recorded in ``calls``."""
    calls = {"softmax": [], "chain": []}

    def fake_softmax(logits, temperature=None, enable_pdl=None):
        calls["softmax"].append({"shape": tuple(logits.shape), "temperature": temperature})
        return torch.softmax(logits.float() / temperature, dim=-1)

    if seed_offset:
        def chain(draft_probs, draft_token_ids, target_probs, maybe_output_accepted_token_num=None,
                  maybe_output_emitted_draft_token_num=None, deterministic=True, generator=None, seed=None,
                  offset=None):
            calls["chain"].append(dict(locals()))
            return "tokens", "accepted", "emitted"
    else:
        def chain(draft_probs, draft_token_ids, target_probs, maybe_output_accepted_token_num=None,
                  maybe_output_emitted_draft_token_num=None, deterministic=True, generator=None):
            calls["chain"].append(dict(locals()))
            return "tokens", "accepted", "emitted"

    root = types.ModuleType("flashinfer")
    root.__version__ = "0.0.test"
    sampling = types.ModuleType("flashinfer.sampling")
    sampling.chain_speculative_sampling = chain
    if softmax:
        sampling.softmax = fake_softmax
    root.sampling = sampling
    monkeypatch.setitem(sys.modules, "flashinfer", root)
    monkeypatch.setitem(sys.modules, "flashinfer.sampling", sampling)
    return calls


def test_flashinfer_softmax_is_used_where_the_installed_version_has_it(monkeypatch):
    _install_flashinfer(monkeypatch)
    api, info = bench.flashinfer_api()
    assert api.softmax is not None and info["softmax_impl"] == "flashinfer.sampling.softmax"
    assert info["available"] and info["version"] == "0.0.test" and "temperature" in info["softmax_params"]
    assert api.takes("seed", "offset") and info["graph_rng"].startswith("seed/offset")
    assert info["chain_params"][:3] == ["draft_probs", "draft_token_ids", "target_probs"]


def test_torch_softmax_where_flashinfer_has_none_and_no_rng_tensors_where_it_takes_none(monkeypatch):
    _install_flashinfer(monkeypatch, softmax=False, seed_offset=False)
    api, info = bench.flashinfer_api()
    assert api.softmax is None and info["softmax_impl"] == "torch.softmax" and info["softmax_params"] is None
    assert not api.takes("seed", "offset") and info["graph_rng"].startswith("none")


def test_flashinfer_absent_is_recorded_not_raised(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import raises ModuleNotFoundError
    api, info = bench.flashinfer_api()
    assert api is None and info["available"] is False and info["reason"].startswith("ModuleNotFoundError")


def _logits(B=2, gamma=3, V=50, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(0)
    tl = (torch.randn(B, gamma + 1, V, generator=g) * 3).to(dtype)
    dl = (torch.randn(B, gamma, V, generator=g) * 3).to(dtype)
    dt = torch.randint(0, V, (B, gamma), generator=g, dtype=torch.int32)
    return dt, dl, tl


@pytest.mark.parametrize("has_softmax", [True, False])
def test_flashinfer_verify_passes_fp32_probabilities_of_the_tempered_logits(monkeypatch, has_softmax):
    calls = _install_flashinfer(monkeypatch, softmax=has_softmax)
    api, _ = bench.flashinfer_api()
    dt, dl, tl = _logits()
    counters = (torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32))
    rng = (torch.tensor([7]), torch.tensor([0]))
    assert bench.flashinfer_verify(api, dt, dl, tl, 0.7, counters, rng) == ("tokens", "accepted", "emitted")
    if has_softmax:  # FlashInfer's softmax takes 2-d logits: [B*γ, V] and [B*(γ+1), V]
        assert calls["softmax"] == [{"shape": (6, 50), "temperature": 0.7}, {"shape": (8, 50), "temperature": 0.7}]
    (call,) = calls["chain"]
    for name, logits in (("draft_probs", dl), ("target_probs", tl)):
        probs = call[name]
        assert probs.dtype == torch.float32 and probs.shape == logits.shape
        torch.testing.assert_close(probs, torch.softmax(logits.float() / 0.7, dim=-1))
    assert call["draft_token_ids"] is dt
    assert call["maybe_output_accepted_token_num"] is counters[0]
    assert call["maybe_output_emitted_draft_token_num"] is counters[1]
    assert call["seed"] is rng[0] and call["offset"] is rng[1]


def test_flashinfer_verify_eager_leaves_counters_and_rng_to_flashinfer(monkeypatch):
    calls = _install_flashinfer(monkeypatch)
    api, _ = bench.flashinfer_api()
    bench.flashinfer_verify(api, *_logits(), 1.0)
    (call,) = calls["chain"]
    assert call["seed"] is None and call["offset"] is None and call["maybe_output_accepted_token_num"] is None


# ---- goals ------------------------------------------------------------------------------------------------------

GOAL = (1, 5, 128_256, "bfloat16")
OTHER = (8, 5, 128_256, "bfloat16")


def _row(impl, sampler, cfg, eager, graph=None, floor=None, floor_graph=None):
    B, gamma, V, dtype = cfg
    row = {"B": B, "gamma": gamma, "V": V, "dtype": dtype, "impl": impl, "sampler": sampler,
           "median_s": eager, "graph_s": graph}
    if floor is not None:
        row.update(floor_s=floor, floor_graph_s=floor_graph)
    return row


def test_goals_use_graph_times_where_both_sides_have_them_and_eager_otherwise():
    rows = [_row("cupy", "exact", GOAL, eager=10.0, graph=2.0, floor=4.0, floor_graph=1.5),
            _row("cupy", "sigmoid", GOAL, eager=9.0, graph=2.5),             # slower than exact on graph only
            _row("hf", "exact", GOAL, eager=150.0),                         # HF: eager only
            _row("flashinfer+softmax", "exact", GOAL, eager=8.0, graph=3.0),  # loses to us on graph only
            _row("cupy", "exact", OTHER, eager=10.0, graph=2.0, floor=4.0, floor_graph=1.5),
            _row("flashinfer+softmax", "exact", OTHER, eager=12.0)]         # no graph time: eager for both
    g = bench.goals(rows)
    assert g["b1_speedup_over_hf"] == 15.0 and g["b1_20x_faster_than_hf"] is False  # 150 / 10: eager vs eager
    assert g["b1_over_floor"] == 1.33 and g["b1_within_2x_of_floor"] is True       # graph: 2.0 / 1.5
    assert g["faster_than_flashinfer_every_b"] is True and g["flashinfer_losses"] == []
    assert g["sigmoid_at_least_as_fast_as_exact"] is False and g["sigmoid_slower_configs"] == [list(GOAL)]
    assert g["basis"] == {"b1_hf": "eager", "b1_floor": "graph", "flashinfer": {"graph": 1, "eager": 1},
                          "sigmoid": {"graph": 1}}
    eager = g["eager"]
    assert eager["b1_over_floor"] == 2.5 and eager["b1_within_2x_of_floor"] is False
    assert eager["faster_than_flashinfer_every_b"] is False and eager["flashinfer_losses"] == [list(GOAL)]
    assert eager["sigmoid_at_least_as_fast_as_exact"] is True
    assert eager["basis"]["flashinfer"] == {"eager": 2}


def test_goals_are_none_where_their_inputs_were_not_measured():
    g = bench.goals([_row("cupy", "greedy", GOAL, eager=1.0, graph=1.0)])
    for key in ("b1_20x_faster_than_hf", "b1_within_2x_of_floor", "faster_than_flashinfer_every_b",
                "sigmoid_at_least_as_fast_as_exact"):
        assert g[key] is None and g["eager"][key] is None
    assert g["config"] == bench.GOAL_CONFIG


# ---- the table and the JSON -------------------------------------------------------------------------------------

def test_table_shows_graph_and_eager_columns_and_a_dash_where_there_is_no_time():
    rows = [_row("cupy", "exact", GOAL, eager=12e-6, graph=7e-6, floor=5e-6, floor_graph=2e-6),
            _row("hf", "exact", GOAL, eager=900e-6)]
    lines, columns = bench.table(rows)
    assert columns[:6] == ["B", "γ", "V", "dtype", "exact g", "exact e"] and columns[-2:] == ["flashinfer g",
                                                                                              "flashinfer e"]
    (line,) = lines
    assert set(line) == set(columns)
    assert (line["exact g"], line["exact e"], line["floor g"], line["floor e"]) == ("7.0", "12.0", "2.0", "5.0")
    assert (line["hf g"], line["hf e"], line["flashinfer e"]) == ("-", "900.0", "-")


def _stub_run(monkeypatch, out, clock_step):
    """run() with its GPU parts stubbed: each configuration yields one cupy exact row; the clock advances
    ``clock_step`` seconds per reading. Returns (what the JSON ``out`` held as each configuration began, the
    clock)."""
    seen_on_disk: list = []
    clock = itertools.count(0, clock_step)
    monkeypatch.setattr(bench, "_require_gpu", lambda: None)
    monkeypatch.setattr(bench, "_prepare_kernels", lambda: None)
    monkeypatch.setattr(bench, "_cupy_info", lambda: {"version": "stub"})
    monkeypatch.setattr(bench, "measure_floor", lambda timing: {"empty_launch_s": 1.0})
    monkeypatch.setattr(bench, "flashinfer_api", lambda: (None, {"available": False, "reason": "stub"}))

    def bench_config(B, gamma, V, dtype, seed, timing, temperature, floor, hf_fn, fi_api, fi_info):
        seen_on_disk.append(json.loads(out.read_text())["results"] if out.exists() else None)
        return [_row("cupy", "exact", (B, gamma, V, dtype), eager=1.0, graph=0.5, floor=0.1, floor_graph=0.1)]

    monkeypatch.setattr(bench, "_bench_config", bench_config)
    return seen_on_disk, (lambda: next(clock))


def test_run_writes_the_json_after_every_configuration(tmp_path, monkeypatch):
    out = tmp_path / "k.json"
    seen, clock = _stub_run(monkeypatch, out, clock_step=0)
    result = bench.run(batches=(1, 2), gammas=(5,), vocabs=(128_256,), dtypes=("bfloat16",), extra=(), out=out,
                       repeats=3, progress=lambda _: None, clock=clock)
    assert seen[0] is None and [(r["B"]) for r in seen[1]] == [1]  # config 2 began with config 1 on disk
    on_disk = json.loads(out.read_text())
    assert on_disk["complete"] is True and "stopped" not in on_disk and len(on_disk["results"]) == 2
    assert on_disk["settings"]["graph_calls"] == bench.GRAPH_CALLS and on_disk["flashinfer"]["available"] is False
    assert on_disk["goals"]["timing"] == bench.GOALS_TIMING and result["results"] == on_disk["results"]


@pytest.mark.parametrize("max_seconds, ran", [(150, [1, 2]), (1e-9, [1])])
def test_run_stops_starting_configurations_when_its_time_is_spent(tmp_path, monkeypatch, max_seconds, ran):
    out = tmp_path / "k.json"
    _, clock = _stub_run(monkeypatch, out, clock_step=100)  # start 0; before configurations 2, 3: 100, 200
    bench.run(batches=(1, 2, 3), gammas=(5,), vocabs=(128_256,), dtypes=("bfloat16",), extra=(), out=out,
              max_seconds=max_seconds, progress=lambda _: None, clock=clock)
    on_disk = json.loads(out.read_text())
    assert on_disk["complete"] is False and [r["B"] for r in on_disk["results"]] == ran  # the first always runs
    assert on_disk["stopped"]["configs_not_run"] == [[B, 5, 128_256, "bfloat16"] for B in (1, 2, 3) if B not in ran]


def test_trees_run_after_the_first_configuration_and_are_listed_when_not_run(tmp_path, monkeypatch):
    """Tree jobs (B, shape) come right after the goal configuration, so a run its time budget cuts short still has
    them; the ones not run are listed apart from the chain configurations."""
    out = tmp_path / "k.json"
    _, clock = _stub_run(monkeypatch, out, clock_step=100)
    ran = []

    def bench_tree(B, shape, seed, timing, temperature):
        ran.append((B, shape))
        return [{**_row("cupy", "tree_verify", (B, 10, bench.TREE_VOCAB, bench.TREE_DTYPE), eager=1.0), "tree": shape,
                 "rule": "with-replacement"}]

    monkeypatch.setattr(bench, "_bench_tree", bench_tree)
    bench.run(batches=(1, 2), gammas=(5,), vocabs=(128_256,), dtypes=("bfloat16",), extra=(), out=out,
              max_seconds=150, progress=lambda _: None, clock=clock, trees=("2,2,1",), tree_batches=(1, 8))
    on_disk = json.loads(out.read_text())
    assert ran == [(1, "2,2,1")] and [r.get("tree") for r in on_disk["results"]] == [None, "2,2,1"]
    assert on_disk["stopped"]["trees_not_run"] == [[8, "2,2,1"]]
    assert on_disk["stopped"]["configs_not_run"] == [[2, 5, 128_256, "bfloat16"]]
    assert on_disk["settings"]["trees"]["shapes"] == ["2,2,1"]


def test_tree_rows_have_their_own_table():
    cfg = (1, 10, bench.TREE_VOCAB, bench.TREE_DTYPE)
    rows = [_row("cupy", "exact", GOAL, eager=12e-6, graph=7e-6, floor=5e-6, floor_graph=2e-6),
            {**_row("cupy", "tree_verify", cfg, eager=30e-6, graph=20e-6), "tree": "2,2,1", "rule": "with-replacement"},
            {**_row("torch", "tree_verify", cfg, eager=900e-6), "tree": "2,2,1", "rule": "with-replacement"}]
    assert len(bench.table(rows)[0]) == 1                     # the chain table leaves the tree rows out
    (line,), columns = bench.tree_table(rows)
    assert set(line) == set(columns) and (line["tree"], line["N"]) == ("2,2,1", 10)
    assert (line["with g"], line["with e"], line["without e"], line["torch e"]) == ("20.0", "30.0", "-", "900.0")


@pytest.mark.parametrize("flag", [["--graph-calls", "0"], ["--graph-replays", "0"], ["--max-seconds", "-1"]])
def test_bench_kernels_rejects_bad_timing_flags_before_looking_for_a_gpu(flag, capsys):
    assert main(["bench", "kernels", *flag]) == 2
    assert "must be >= 1" in capsys.readouterr().err


def test_bench_kernels_without_the_cupy_backend_is_one_line(monkeypatch, capsys):
    from pipeline.samplers import cupy_backend

    monkeypatch.setattr(cupy_backend, "available", lambda: False)
    monkeypatch.setattr(cupy_backend, "unavailable_reason", lambda: "no CUDA device")
    assert main(["bench", "kernels", "--quick"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "specsweep bench: error: bench kernels needs the cupy backend: no CUDA device", err
