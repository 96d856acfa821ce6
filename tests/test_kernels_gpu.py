"""The cupy kernels against the torch reference on a GPU (skips without CUDA).

The shared cases and agreement rule of tests/kernel_cases.py (also run on the CPU runtime in every CI run), plus
what only a GPU can show: half precision against fp32 at full size, no host sync, and the verify step captured
and replayed in CUDA graphs (growing B, two streams). Deterministic drafts (draft logits None): the shared cases,
plus no host sync, graph replay, and the deterministic mode against one-hot logits at full size. Token trees
(tree_verify): the cases of tests/tree_kernel_cases.py (rows with smaller trees among them), and no host sync.
"""

from __future__ import annotations

import pytest
import torch
from kernel_cases import (
    KernelBackend,
    KernelCases,
    deterministic_inputs,
    length_inputs,
    make_inputs,
    one_hot_logits,
)
from tree_kernel_cases import TreeKernelCases, real_masks, tree_inputs

from pipeline.samplers import cupy_backend
from pipeline.tree_shape import TokenTree

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cupy_backend.available(), reason=f"cupy backend: {cupy_backend.unavailable_reason()}"),
]

CUDA = torch.device("cuda")


@pytest.fixture
def gpu() -> KernelBackend:
    return KernelBackend(cupy_backend.SAMPLERS, CUDA)


class TestKernelsOnGpu(KernelCases):
    @pytest.fixture
    def kb(self, gpu) -> KernelBackend:
        return gpu


class TestTreeVerifyOnGpu(TreeKernelCases):
    @pytest.fixture
    def kb(self, gpu) -> KernelBackend:
        return gpu


def test_tree_verify_makes_no_host_sync():
    """tree_verify at T = 1 (with and without replacement, deterministic children) and at T = 0, bf16, V = 128256,
    with and without rows of smaller trees (``real``): no host sync once the tree's table is on the device (made at
    the first call)."""
    tree = TokenTree.from_widths("3,2,1")
    real = real_masks(tree, 16, CUDA, seed=15)
    runs = []
    for mode, temperature in (("with", 1.0), ("without", 1.0), ("top", 1.0), ("with", 0.0)):
        inputs = tree_inputs(CUDA, tree, 16, 128_256, 128_256, "bfloat16", mode, seed=13)
        verifier = cupy_backend.ExactSampler().tree_verifier(temperature, mode != "without")
        runs.append((verifier, inputs))
        verifier(tree, *inputs, generator=torch.Generator(device="cuda").manual_seed(0))   # warm up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for verifier, inputs in runs:
            for mask in (None, real):
                verifier(tree, *inputs, generator=torch.Generator(device="cuda").manual_seed(14), real=mask)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _run(sampler, inputs, seed, lengths=None):
    return sampler(*inputs, generator=torch.Generator(device="cuda").manual_seed(seed), lengths=lengths)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["exact", "sigmoid"])
def test_half_precision_within_tolerance_of_fp32(dtype, name):
    """The same logit values as fp16/bf16 and as fp32 (exact upcast): only the summation grouping differs, so at
    least 99% of rows must be identical."""
    dt, dl, tl = make_inputs(CUDA, 64, 8, 128_256, 128_256, dtype, seed=4)
    sampler = cupy_backend.SAMPLERS[name](temperature=1.0)
    half = _run(sampler, (dt, dl, tl), seed=5)
    full = _run(sampler, (dt, dl.float(), tl.float()), seed=5)
    same = (half.tokens == full.tokens).all(1)
    assert same.float().mean().item() >= 0.99, f"{(~same).sum().item()} of 64 rows differ"


def test_no_host_sync_and_reproducible():
    inputs = make_inputs(CUDA, 16, 5, 32_000, 32_000, "bfloat16", seed=7)
    samplers = [cupy_backend.SAMPLERS[n]() for n in ("exact", "sigmoid", "greedy")]
    for s in samplers:                        # warm up: compile / load the module outside the checked region
        _run(s, inputs, 0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        # a sampler's next call with the same signature rewrites its result tensors: keep copies of the first
        first = [(r.tokens.clone(), r.accepted.clone()) for r in (_run(s, inputs, 8) for s in samplers)]
        second = [_run(s, inputs, 8) for s in samplers]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for (tokens, accepted), b in zip(first, second):
        assert torch.equal(tokens, b.tokens) and torch.equal(accepted, b.accepted)


def test_no_host_sync_with_per_row_lengths():
    """Per-row lengths are checked on their metadata and clamped on the device: still no host sync."""
    inputs, lengths = length_inputs(CUDA, 16, 5, 32_000, 32_000, "bfloat16", seed=9)
    samplers = [cupy_backend.SAMPLERS[n]() for n in ("exact", "sigmoid", "greedy")]
    for s in samplers:
        _run(s, inputs, 0, lengths)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for s in samplers:
            _run(s, inputs, 10, lengths)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_no_host_sync_with_a_deterministic_draft():
    dt, _, tl = deterministic_inputs(CUDA, 16, 5, 32_000, "bfloat16", seed=11)
    lengths = torch.tensor([0, 5, 3, 2] * 4, device="cuda")
    samplers = [cupy_backend.SAMPLERS["exact"](), cupy_backend.SAMPLERS["greedy"](),
                cupy_backend.SAMPLERS["sigmoid"](temperature=0.0)]
    for s in samplers:
        _run(s, (dt, None, tl), 0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for s in samplers:
            _run(s, (dt, None, tl), 12)
            _run(s, (dt, None, tl), 13, lengths)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_deterministic_draft_is_one_hot_logits_at_full_size(dtype):
    """B = 64, γ = 8, V = 128256: the deterministic mode and one-hot logits of the same dtype give the same tokens,
    counts and flags (the same weights, summed in the same order: explicit-rounding subtractions, no contraction)."""
    dt, _, tl = deterministic_inputs(CUDA, 64, 8, 128_256, dtype, seed=14)
    sampler = cupy_backend.SAMPLERS["exact"](temperature=0.9)
    got = _run(sampler, (dt, None, tl), 15)
    want = _run(sampler, (dt, one_hot_logits(dt, tl.shape[2], tl.dtype), tl), 15)
    assert _same(got, want), f"{(~(got.tokens == want.tokens).all(1)).sum().item()} of 64 rows differ"
    assert bool((got.accepted == 0).any()) and bool((got.accepted > 0).any())


# ---- CUDA graphs --------------------------------------------------------------------------------------------

def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in ((a.tokens, b.tokens), (a.accepted, b.accepted),
                                              (a.draft_ok, b.draft_ok), (a.target_ok, b.target_ok)))


@pytest.mark.parametrize("name", ["exact", "sigmoid", "greedy"])
def test_replayed_steps_emit_what_eager_steps_emit(name):
    """GraphedVerify: three steps of one signature (one capture, replays with new inputs) and one of another
    signature, each identical to the eager step with the same generator state."""
    from pipeline.samplers.cuda_graphs import GraphedVerify

    sampler = cupy_backend.SAMPLERS[name](temperature=0.0 if name == "greedy" else 0.8)
    graphed = GraphedVerify(sampler)
    shapes = [(4, 5, 32_000, "bfloat16")] * 3 + [(9, 2, 51_865, "float16")]
    for i, (B, gamma, V, dtype) in enumerate(shapes):
        inputs = make_inputs(CUDA, B, gamma, V, V, dtype, seed=40 + i)
        eager = _run(sampler, inputs, 50 + i)
        replayed = graphed(*inputs, generator=torch.Generator(device="cuda").manual_seed(50 + i))
        assert _same(eager, replayed), f"step {i}"
    assert graphed.graphs == 2


@pytest.mark.parametrize("name", ["exact", "sigmoid", "greedy"])
def test_replayed_steps_with_lengths_emit_what_eager_steps_emit(name):
    """GraphedVerify with per-row draft lengths: other lengths each step replay one graph (its static lengths buffer);
    the same signature without lengths is another graph. Each step identical to the eager step."""
    from pipeline.samplers.cuda_graphs import GraphedVerify

    sampler = cupy_backend.SAMPLERS[name](temperature=0.0 if name == "greedy" else 0.8)
    graphed = GraphedVerify(sampler)
    for i in range(3):
        inputs, lengths = length_inputs(CUDA, 6, 5, 32_000, 32_000, "bfloat16", seed=80 + i)
        eager = _run(sampler, inputs, 90 + i, lengths)
        replayed = graphed(*inputs, generator=torch.Generator(device="cuda").manual_seed(90 + i), lengths=lengths)
        assert _same(eager, replayed), f"step {i}"
    inputs = make_inputs(CUDA, 6, 5, 32_000, 32_000, "bfloat16", seed=83)
    assert _same(_run(sampler, inputs, 93), graphed(*inputs, generator=torch.Generator(device="cuda").manual_seed(93)))
    assert graphed.graphs == 2


@pytest.mark.parametrize("name", ["exact", "greedy"])
def test_replayed_deterministic_steps_emit_what_eager_steps_emit(name):
    """GraphedVerify with draft logits None: its own signature (no draft buffer), replayed with new tokens and target
    logits, each step identical to the eager deterministic step; a step with logits of the same shapes is another
    graph; sigmoid at T > 0 is refused before anything is captured."""
    from pipeline.errors import SamplerInputError
    from pipeline.samplers.cuda_graphs import GraphedVerify

    sampler = cupy_backend.SAMPLERS[name](temperature=0.0 if name == "greedy" else 0.8)
    graphed = GraphedVerify(sampler)
    for i in range(3):
        dt, _, tl = deterministic_inputs(CUDA, 6, 5, 32_000, "bfloat16", seed=30 + i)
        lengths = torch.tensor([5, 0, 2, 5, 3, 1], device="cuda") if i == 2 else None
        eager = _run(sampler, (dt, None, tl), 35 + i, lengths)
        replayed = graphed(dt, None, tl, generator=torch.Generator(device="cuda").manual_seed(35 + i), lengths=lengths)
        assert _same(eager, replayed), f"step {i}"
    inputs = make_inputs(CUDA, 6, 5, 32_000, 32_000, "bfloat16", seed=38)
    assert _same(_run(sampler, inputs, 39), graphed(*inputs, generator=torch.Generator(device="cuda").manual_seed(39)))
    assert graphed.graphs == 3
    refused = GraphedVerify(cupy_backend.SAMPLERS["sigmoid"](temperature=1.0))
    with pytest.raises(SamplerInputError, match="cannot verify a deterministic draft"):
        refused(dt, None, tl)
    assert refused.graphs == 0


def test_a_graph_replays_after_its_workspace_grew():
    """Capture at B = 4 on a stream, then an eager step at B = 64 on the same stream grows its workspace (new
    buffers), then replay: the graph still uses the buffers it captured, which were kept, and is still right."""
    sampler = cupy_backend.SAMPLERS["exact"](temperature=1.0)
    sampler.prepare(CUDA)
    small = make_inputs(CUDA, 4, 4, 32_000, 32_000, "bfloat16", seed=60)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        sampler(*small)                                        # warm-up: the stream's workspace at B = 4
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        captured = sampler(*small)                             # the default CUDA generator: graph-safe
    with torch.cuda.stream(stream):
        sampler(*make_inputs(CUDA, 64, 4, 32_000, 32_000, "bfloat16", seed=61))   # grows the workspace
    torch.cuda.current_stream().wait_stream(stream)
    for seed in (62, 63):
        torch.cuda.manual_seed(seed)
        graph.replay()
        torch.cuda.manual_seed(seed)
        assert _same(captured, sampler(*small)), f"replay with seed {seed}"


def test_a_failed_capture_falls_back_to_eager_steps_with_one_note(capsys, monkeypatch):
    """--verify-graphs auto: a step that cannot be captured (here one that syncs with the host inside the capture)
    is verified eagerly, the same tokens, with one line on stderr for its signature; the caller's stream is current
    again; without fall_back the capture's error propagates."""
    from pipeline.samplers.cuda_graphs import GraphedVerify

    def syncing(graphed):
        step = graphed._step

        def run(*args):
            if torch.cuda.is_current_stream_capturing():
                torch.cuda.synchronize()                       # forbidden while capturing
            return step(*args)
        monkeypatch.setattr(graphed, "_step", run)
        return graphed

    sampler = cupy_backend.SAMPLERS["exact"](temperature=0.8)
    graphed = syncing(GraphedVerify(sampler, fall_back=True))
    inputs = make_inputs(CUDA, 4, 5, 32_000, 32_000, "bfloat16", seed=95)
    for seed in (96, 97):
        want = _run(sampler, inputs, seed)
        want = type(want)(*(t.clone() for t in (want.accepted, want.tokens, want.draft_ok, want.target_ok)))
        assert _same(want, graphed(*inputs, generator=torch.Generator(device="cuda").manual_seed(seed)))
    assert graphed.graphs == 0 and len(graphed.eager) == 1
    assert capsys.readouterr().err.count("--verify-graphs auto: capturing the verify step at B = 4, γ = 5") == 1
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    with pytest.raises(RuntimeError):
        syncing(GraphedVerify(sampler))(*inputs)
    torch.cuda.synchronize()


def test_graphs_replay_on_two_streams_at_once():
    """Two captured signatures, replayed concurrently on two streams: each graph has its own workspace."""
    from pipeline.samplers.cuda_graphs import GraphedVerify

    graphed = GraphedVerify(cupy_backend.SAMPLERS["exact"](temperature=1.0))
    a = make_inputs(CUDA, 8, 4, 128_256, 128_256, "bfloat16", seed=70)
    b = make_inputs(CUDA, 16, 3, 32_000, 32_000, "float16", seed=71)
    want_a = _run(graphed.sampler, a, 72)
    want_b = _run(graphed.sampler, b, 73)
    graphed(*a), graphed(*b)                                   # capture both
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(streams[0]):
        got_a = graphed(*a, generator=torch.Generator(device="cuda").manual_seed(72))
    with torch.cuda.stream(streams[1]):
        got_b = graphed(*b, generator=torch.Generator(device="cuda").manual_seed(73))
    for s in streams:
        torch.cuda.current_stream().wait_stream(s)
    assert _same(want_a, got_a) and _same(want_b, got_b)


def test_the_engine_decodes_the_same_tokens_with_graphed_verify(tmp_path):
    """The engine's verify step replayed from CUDA graphs (rows finish, B shrinks, new signatures are captured):
    the same seed gives the same tokens as eager kernel steps."""
    from tiny_models import PROMPTS, save_pair

    from pipeline.decoding.engine import SpeculativeEngine
    from pipeline.models import load_causal_lm, load_tokenizer
    from pipeline.samplers.cuda_graphs import GraphedVerify

    tp, dp = save_pair(tmp_path, kind="llama")
    tok = load_tokenizer(str(tp))
    target, draft = (load_causal_lm(str(p), torch.float32, "cuda") for p in (tp, dp))
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    outputs = []
    for graphs in (False, True):
        sampler = cupy_backend.SAMPLERS["exact"](temperature=1.0)
        engine = SpeculativeEngine(target, draft, GraphedVerify(sampler) if graphs else sampler, gamma=4, device="cuda",
                                   eos_token_ids=[1], pad_token_id=0)
        outputs.append(engine.generate(enc.input_ids, enc.attention_mask, 24,
                                       torch.Generator(device="cuda").manual_seed(5)).tokens)
    assert outputs[0] == outputs[1]
