"""Quantised drafts (pipeline/decoding/static/quant.py, ``--draft-quant``; ``+a8``: the prefill int8 by int8).

A quantised projection is the float product within its quantisation's error (relative error of the output on random
normal weights: int8 per output row below 2 %, int4 in groups of 128 inputs below 15 %; measured about 0.8 % and
10 %), on the kernel's path and on the dequantised weight's (more than KERNEL_ROWS rows), which agree with each other
to bfloat16 rounding. Greedy decoding with a quantised draft emits the float32 target's own tokens (lossless), and the
quantised draft still proposes what the target would: a draft that is the target's copy keeps an acceptance rate
above 0.5 (int8) and 0.15 (int4) where a wrong quantisation would fall to about 1 / V (measured: 0.86 and 0.27;
unquantised 0.81). With +a8 a projection over A8_ROWS rows or more is the int8-by-int8 product (within int8's error
on input and weight), and greedy decoding through it stays the target's. Bad settings are one-line errors with exit
code 2.
"""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import PROMPTS, cli_run_args, load_saved_pair, record_engines, save_pair, saved_cli_pair, write_prompts

from pipeline.cli import main
from pipeline.config import DRAFT_QUANTS, RunConfig
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.decoding.static import quant
from pipeline.decoding.static.quant import Int4Linear, Int8Linear, check_supported, projection
from pipeline.errors import SpecsweepError
from pipeline.kernels import cpu
from pipeline.samplers import get_sampler

EOS = 1
_int8_product = quant.int8_product
TOLERANCE = {"int8": 0.02, "int4": 0.15}


def test_the_settings_name_the_modes_the_module_has():
    assert DRAFT_QUANTS == quant.MODES


@pytest.mark.parametrize("mode,kernel", [("int8", "torch"), ("int4", "torch"), ("int4", "int4_linear")])
@pytest.mark.parametrize("n,k", [(64, 128), (100, 256)])      # N = 100: torch's int4 pads the rows to 112, ours to 100
def test_a_quantised_projection_is_the_float_product_within_its_tolerance(mode, kernel, n, k):
    if kernel == "int4_linear" and not cpu.available():
        pytest.skip(f"int4_linear: {cpu.unavailable_reason()}")
    g = torch.Generator().manual_seed(n + k)
    weight = (torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16)
    bias = (torch.randn(n, generator=g) * 0.05).to(torch.bfloat16)
    proj = projection(weight, bias, mode) if mode == "int8" else Int4Linear(weight, bias, ours=kernel != "torch")
    assert proj.kernel_name == kernel
    stored = {"int8": lambda: proj.q, "torch": lambda: proj.packed, "int4_linear": lambda: proj.weight.packed}
    stored = stored["int8" if mode == "int8" else kernel]()
    assert stored.dtype == (torch.int8 if mode == "int8" else torch.uint8)
    rows = {"int8": n, "torch": n + -n % quant.INT4_ROWS, "int4_linear": n + -n % cpu.BLOCK}
    assert stored.numel() == rows["int8" if mode == "int8" else kernel] * k // (1 if mode == "int8" else 2)
    x = torch.randn(2, quant.KERNEL_ROWS + 3, k, generator=g).to(torch.bfloat16)
    for rows in (1, quant.KERNEL_ROWS, quant.KERNEL_ROWS + 3):       # the kernel's path, then the dequantised weight's
        part = x[:1, :rows] if rows <= quant.KERNEL_ROWS else x[:, :rows]
        y = proj(part)
        reference = part.float() @ weight.float().T + bias.float()
        assert y.shape == reference.shape and y.dtype == torch.bfloat16
        error = float((y.float() - reference).norm() / reference.norm())
        assert error < TOLERANCE[mode], (rows, error)
    # one function on both paths: a row through the kernel is the same row among many, to bfloat16 rounding
    torch.testing.assert_close(proj(x[:1, :1]).float(), proj(x)[:1, :1].float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("mode", ["int8+a8", "int4+a8"])
def test_a8_multiplies_int8_by_int8_from_a8_rows_on(mode):
    """+a8: a projection over A8_ROWS rows or more is the int8-by-int8 product of its row-quantised input and the int8
    weight (the float product within int8 error on both sides, < 3 %); below A8_ROWS it is the weight-only mode's
    (the kernel, then the dequantised weight), and without +a8 no row count reaches the int8 product."""
    n, k = 100, 256
    g = torch.Generator().manual_seed(7)
    weight = (torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16)
    bias = (torch.randn(n, generator=g) * 0.05).to(torch.bfloat16)
    proj, plain = projection(weight, bias, mode), projection(weight, bias, quant.weight_mode(mode))
    x = torch.randn(1, quant.A8_ROWS, k, generator=g).to(torch.bfloat16)
    q8, s8 = (proj.q, proj.scales) if mode == "int8+a8" else (proj.q8, proj.s8)
    assert q8.dtype == torch.int8 and q8.shape == (n, k)
    y = proj(x)
    assert torch.equal(y, (quant.int8_product(x[0], q8, s8) + bias)[None])
    reference = x.float() @ weight.float().T + bias.float()
    error = float((y.float() - reference).norm() / reference.norm())
    assert error < TOLERANCE[quant.weight_mode(mode)] + 0.01, error
    assert not torch.equal(y, plain(x))                                   # the weight-only mode's wide path differs
    few = x[:, : quant.A8_ROWS - 1]
    assert torch.equal(proj(few), plain(few)) and torch.equal(proj(x[:, :2]), plain(x[:, :2]))


def test_quantize_rows_scales_each_row_and_keeps_a_zero_row():
    x = torch.tensor([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0], [254.0, 1.0, -127.0]])
    p, t = quant.quantize_rows(x)
    assert p.dtype == torch.int8 and p.tolist() == [[64, -127, 32], [0, 0, 0], [127, 0, -64]]
    torch.testing.assert_close(t[:, 0], torch.tensor([1 / 127, 1e-12, 2.0]))


def test_unsupported_devices_dtypes_and_shapes_are_one_line_errors():
    check_supported("int8", "cpu", torch.float32)
    check_supported("int4", "cpu", torch.bfloat16)
    for mode, device, dtype, message in (("int8", "cuda", torch.bfloat16, "runs torch's CPU kernels"),
                                         ("int4", "cpu", torch.float32, "use --dtype bfloat16, or --draft-quant int8"),
                                         ("int4+a8", "cpu", torch.float32,
                                          r"int4\+a8 multiplies in .* --draft-quant int8\+a8$"),
                                         ("int8", "cpu", torch.float16, "use --dtype bfloat16"),
                                         ("int2", "cpu", torch.bfloat16, "is not one of")):
        with pytest.raises(SpecsweepError, match=message):
            check_supported(mode, device, dtype)
    with pytest.raises(SpecsweepError, match="group a projection's inputs by 128, and one has 96: quantise this "
                                             "model's weights to int8"):
        Int4Linear(torch.zeros(16, 96, dtype=torch.bfloat16), None)
    with pytest.raises(SpecsweepError, match=r"inputs in multiples of 16 .*, and one has 24: leave this model's "
                                             r"weights unquantised \(drop --draft-quant / --target-quant\)"):
        Int8Linear(torch.zeros(16, 24, dtype=torch.bfloat16), None)      # torch's kernel would crash the process


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_fused_projections_compute_what_each_projection_quantised_alone_does(mode, monkeypatch):
    """A quantised static forward stacks q, k, v (with Qwen2's biases) and gate, up into one weight each; both
    quantisations work per output row, so its logits are those of the forward that quantises each projection alone."""
    import transformers

    from pipeline.decoding.static import llama

    config = transformers.Qwen2Config(vocab_size=300, hidden_size=256, intermediate_size=384, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      initializer_range=0.05, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).eval().to(torch.bfloat16)
    with torch.no_grad():                                   # biases that matter (transformers starts them at 0)
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    ids = torch.randint(0, 300, (1, 9))

    def logits(forward) -> torch.Tensor:
        forward.allocate(1, 16, torch.device("cpu"))
        first = forward(ids[:, :6], 0, None, None, 1)                        # the dequantised path (6 rows)
        steps = [forward(ids[:, i:i + 1], i, None, None, 1) for i in range(6, 9)]  # the kernel's path (1 row)
        return torch.cat([first, *steps], dim=1)

    with torch.inference_mode():
        fused = llama.LlamaStaticForward(model, mode)
        fused.row_forward = None            # llama.py's forward over both (int4_row.py's: tests/test_int4_row.py)
        assert [len(layer.qkv(torch.zeros(1, 1, 256, dtype=torch.bfloat16))) for layer in fused.layers] == [3, 3]
        monkeypatch.setattr(llama, "_stacked", lambda modules, q, packed: llama._separate(
            *(projection(m.weight, m.bias, q) for m in modules)))
        separate = llama.LlamaStaticForward(model, mode)
        torch.testing.assert_close(logits(fused), logits(separate), rtol=0, atol=0)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny Llama target (float32) and a draft that is its copy in bfloat16 (widths multiples of 128 for int4)."""
    target, draft, tok = load_saved_pair(tmp_path_factory.mktemp("quant"), kind="llama", width=128, noise=0.0)
    return target, draft.to(torch.bfloat16), tok


@pytest.mark.parametrize("mode,floor", [("int8", 0.5), ("int4", 0.15), ("int8+a8", 0.5), ("int4+a8", 0.15)])
def test_greedy_decoding_with_a_quantised_draft_is_the_target_alone(pair, mode, floor, monkeypatch):
    target, draft, tok = pair
    monkeypatch.setattr(quant, "A8_ROWS", 8)                # the prompts' prefill takes the int8 product (+a8)
    products = []
    monkeypatch.setattr(quant, "int8_product", lambda *a: products.append(1) or _int8_product(*a))
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    alone = SpeculativeEngine(target, None, get_sampler("greedy"), gamma=0, device="cpu", eos_token_ids=[EOS],
                              pad_token_id=0).generate(enc.input_ids, enc.attention_mask, 24).tokens
    engine = SpeculativeEngine(target, draft, get_sampler("exact", temperature=0.0), gamma=3, device="cpu",
                               eos_token_ids=[EOS], pad_token_id=0, draft_quant=mode)
    static = engine.drafter.model.static
    kind = Int8Linear if quant.weight_mode(mode) == "int8" else Int4Linear
    assert isinstance(static.layers[0].down_proj, kind) and isinstance(static.head, kind)
    assert engine.target.static.quant == "none"                        # the target is never quantised
    result = engine.generate(enc.input_ids, enc.attention_mask, 24)
    assert result.tokens == alone
    assert bool(products) == mode.endswith("+a8")
    accepted = sum(s["accepted"] for s in result.row_stats)
    drafted = sum(s["drafted"] for s in result.row_stats)
    assert accepted / drafted > floor, (accepted, drafted)
    assert draft.model.layers[0].mlp.down_proj.weight.dtype == torch.bfloat16      # the loaded draft as it was


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return saved_cli_pair(tmp_path_factory.mktemp("quant-cli"))


_args = cli_run_args


def test_a_run_with_a_quantised_draft_records_it_and_the_target_alones_tokens(saved):
    root = saved[0]
    out = root / "int8.json"
    assert main(_args(saved, out, "--dtype", "float32", "--draft-quant", "int8")) == 0
    result = json.loads(out.read_text())
    assert result["config"]["draft_quant"] == "int8" and result["resolved"]["forward"]["draft"] == "static"
    agreement = result["metrics"]["greedy_agreement"]
    assert agreement["samples"] == 2 and agreement["identical"] == 2
    # packed weights (the default on a CPU): the target's, and the quantised draft's dequantised prefill weights; the
    # draft's steps run its int8 kernel (torch's)
    from pipeline.decoding.static.packed import available

    packs = available("cpu", torch.float32)
    assert result["resolved"]["packed_weights"] == {"target": packs, "draft": packs}
    assert result["resolved"]["quant_kernel"] == {"draft": "torch"}
    assert result["resolved"]["few_rows_kernel"] == ({"target": "onednn"} if packs else {})   # float32: oneDNN's
    out = root / "plain.json"
    assert main(_args(saved, out, "--dtype", "float32", "--draft-quant", "int8", "--no-packed-weights")) == 0
    plain = json.loads(out.read_text())
    assert plain["config"]["packed_weights"] is False
    assert plain["resolved"]["packed_weights"] == {"target": False, "draft": False}


def test_an_int4_run_records_the_kernel_its_draft_ran(saved):
    out = saved[0] / "int4.json"
    assert main(_args(saved, out, "--dtype", "bfloat16", "--draft-quant", "int4")) == 0
    result = json.loads(out.read_text())
    expected = "int4_linear" if cpu.available() else "torch"
    assert result["resolved"]["quant_kernel"] == {"draft": expected}
    # the draft's one-token forwards in one call (kernels/int4_layers.cpp) where our int4 kernel runs
    assert result["resolved"]["row_kernel"] == ({"draft": "int4_layers"} if cpu.available() else {})
    # the packed bfloat16 target's verify and one-token forwards: ours where it runs (kernels/bf16_linear.cpp)
    from pipeline.decoding.static.packed import available, few_rows_kernel

    packs = available("cpu", torch.bfloat16)
    assert result["resolved"]["few_rows_kernel"] == ({"target": few_rows_kernel(torch.bfloat16)} if packs else {})
    assert result["metrics"]["greedy_agreement"]["samples"] == 2


@pytest.mark.parametrize("extra,message", [
    (["--dtype", "float32", "--draft-quant", "int4"], "use --dtype bfloat16, or --draft-quant int8"),
    (["--draft-quant", "int8", "--no-static-cache"], "--draft-quant int8 quantises a draft model"),
    (["--draft-quant", "int8", "--drafter", "prompt-lookup"], "--draft-quant int8 quantises a draft model"),
    (["--draft-quant", "int8", "--engine", "hf"], "--draft-quant int8 quantises a draft model"),
    (["--draft-quant", "int3"], "--draft-quant 'int3' is not one of"),
])
def test_bad_settings_are_one_line_errors_with_exit_code_2(saved, capsys, extra, message):
    assert main(_args(saved, saved[0] / "bad.json", *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_bench_engine_quantises_the_draft_of_its_static_cache_loop_only(saved, monkeypatch):
    root, tp, dp, _ = saved
    engines = record_engines(monkeypatch)
    out = root / "bench.json"
    assert main(["bench", "engine", "--target", str(tp), "--draft", str(dp), "--gamma", "2", "--device", "cpu",
                 "--repeats", "1", "--temperature", "0", "--max-new-tokens", "6", "--limit", "2",
                 "--draft-quant", "int8", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    drafts = {e.target.static is not None: e.drafter.model.static for e in engines if e.drafter is not None}
    assert isinstance(drafts[True].head, Int8Linear) and drafts[False] is None    # transformers' forward: as loaded
    assert result["settings"]["ours"]["draft_quant"] == "int8"
    ours = next(r for r in result["results"] if r["loop"] == "ours_speculative")
    assert ours["identical_to_hf_assisted"]                                        # lossless at T = 0


def test_the_search_space_searches_the_drafts_weights_and_prunes_int4_outside_bfloat16(tmp_path):
    import optuna

    from pipeline.tuning.space import SearchSpace

    path = tmp_path / "space.yaml"
    path.write_text("gamma: {low: 1, high: 4}\nsampler: [exact]\ndtype: [float32, bfloat16]\n"
                    "drafter: [model, prompt-lookup]\ndraft_quant: [int8, none, int4]\n")
    space = SearchSpace.load(path)
    assert space.first_point()["draft_quant"] == "none" and space.recorded()["quants"] == ["int8", "none", "int4"]
    fixed = {"gamma": 2, "sampler": "exact", "drafter": "model"}
    params = space.suggest(optuna.trial.FixedTrial({**fixed, "dtype": "bfloat16", "draft_quant": "int4"}))
    assert params["draft_quant"] == "int4"
    RunConfig.from_dict({"target": "t", "draft": "d", "data": str(path), **params}).validate_decoding()
    with pytest.raises(optuna.TrialPruned):
        space.suggest(optuna.trial.FixedTrial({**fixed, "dtype": "float32", "draft_quant": "int4"}))
    lookup = space.suggest(optuna.trial.FixedTrial({**fixed, "drafter": "prompt-lookup", "lookup_max": 2,
                                                    "dtype": "float32"}))
    assert "draft_quant" not in lookup                               # no draft model to quantise
    assert "quants" not in SearchSpace().recorded()                  # a study made before it continues
    path.write_text("draft_quant: [int2]\n")
    with pytest.raises(SpecsweepError, match="draft_quant must be a list from"):
        SearchSpace.load(path)


def test_a_draft_without_a_quantised_forward_is_refused_in_one_line(tmp_path, capsys):
    tp, dp = save_pair(tmp_path, kind="gpt2")
    data = write_prompts(tmp_path / "prompts.jsonl")
    capsys.readouterr()          # saving the pair may draw transformers' progress bar: only the command's output counts
    assert main(_args((tmp_path, tp, dp, data), tmp_path / "bad.json", "--draft-quant", "int8")) == 2
    err = capsys.readouterr().err.strip()
    assert "quantises the static forward of a Llama, Mistral or Qwen2 draft; this draft is a GPT2LMHeadModel" in err
    assert len(err.splitlines()) == 1


def test_a_study_searches_the_drafts_weights_only_for_a_family_that_quantises(tmp_path, capsys):
    """A space with draft_quant keeps it for a Llama-family draft and drops it, saying so, for a draft whose forward
    takes no quantised weights (GPT-2 here; Whisper's tiny.en in the real profile): its trials would all fail."""
    from pipeline.tuning.space import SearchSpace, space_for_pair

    space = SearchSpace(samplers=("exact",), dtypes=("bfloat16",), quants=("int4",)).check()
    data = write_prompts(tmp_path / "prompts.jsonl")
    llama_t, llama_d = save_pair(tmp_path / "llama", kind="llama")
    kept = space_for_pair(space, RunConfig(target=str(llama_t), draft=str(llama_d), data=str(data)))
    assert kept.quants == ("int4",) and kept.first_point()["draft_quant"] == "int4"
    capsys.readouterr()
    gpt2_t, gpt2_d = save_pair(tmp_path / "gpt2", kind="gpt2")
    dropped = space_for_pair(space, RunConfig(target=str(gpt2_t), draft=str(gpt2_d), data=str(data)))
    assert dropped.quants == () and "draft_quant" not in dropped.first_point()
    assert "GPT2LMHeadModel, whose forward takes no quantised weights" in capsys.readouterr().err


def test_the_search_space_prunes_int4_a8_outside_bfloat16_and_keeps_int8_a8():
    import optuna

    from pipeline.tuning.space import SearchSpace

    space = SearchSpace(samplers=("exact",), dtypes=("float32", "bfloat16"), quants=("int8+a8", "int4+a8")).check()
    fixed = {"gamma": 2, "sampler": "exact"}
    with pytest.raises(optuna.TrialPruned, match="int4\\+a8 runs in bfloat16"):
        space.suggest(optuna.trial.FixedTrial({**fixed, "dtype": "float32", "draft_quant": "int4+a8"}))
    assert space.suggest(optuna.trial.FixedTrial({**fixed, "dtype": "float32",
                                                  "draft_quant": "int8+a8"}))["draft_quant"] == "int8+a8"
