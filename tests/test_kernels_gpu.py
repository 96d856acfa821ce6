"""The cupy kernels against the torch reference on the GPU, with the same uniforms (skips without CUDA).

Agreement rule (documented rounding boundaries): the kernels sum softmax normalisers and CDFs in another order
than torch, so results may differ only where fp32 rounding can decide:
  acceptance  a position whose reference margin |u * w_d(x) - w_t(x)| is below BOUNDARY * w_t(x) (fp64)
  token       a draw whose u_γ * total lies within BOUNDARY * total of a CDF step between the two tokens
Rows touched by such a boundary are excluded from the identity check; they must be under 1% of rows.
"""

from __future__ import annotations

import pytest
import torch

from pipeline.samplers import contract, cupy_backend, torch_ref

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cupy_backend.available(), reason=f"cupy backend: {cupy_backend.unavailable_reason()}"),
]

BOUNDARY = 1e-5
MAX_BOUNDARY_ROWS = 0.01
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# (B, γ, V_t, V_d, dtype): odd V, the largest V, B = 1 and 256, γ = 16, a padded draft vocabulary, γ = 0
CONFIGS = [
    (1, 5, 128_256, 128_256, "bfloat16"),
    (1, 16, 262_144, 262_144, "float16"),
    (256, 16, 51_865, 51_865, "bfloat16"),
    (256, 4, 32_000, 32_000, "float32"),
    (7, 3, 51_865, 51_800, "float32"),
    (5, 0, 1_000, 1_000, "float32"),
]


def _inputs(B, gamma, vt, vd, dtype, seed=0, scale=3.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    tl = (torch.randn(B, gamma + 1, vt, generator=g, device="cuda") * scale).to(DTYPES[dtype])
    dl = (tl[:, :gamma, :vd].float() + torch.randn(B, gamma, vd, generator=g, device="cuda")).to(DTYPES[dtype])
    probs = torch.softmax(dl.float(), -1).reshape(B * gamma, vd) if gamma else None
    dt = (torch.multinomial(probs, 1, generator=g).reshape(B, gamma) if gamma
          else torch.empty(B, 0, dtype=torch.int64, device="cuda"))
    return dt, dl, tl


def _run(sampler, inputs, seed):
    return sampler(*inputs, generator=torch.Generator(device="cuda").manual_seed(seed))


def _weights64(name, logits, params):
    z = logits.double()
    if name == "exact":
        return torch.softmax(z / params["temperature"], -1)
    return torch.sigmoid(params["alpha"] * z / params["temperature"] + params["beta"])


def _boundary_rows(name, params, inputs, ref, u):
    """bool [B]: rows where rounding may decide (see module docstring), from fp64 weights of the reference."""
    dt, dl, tl = inputs
    B, gamma = dt.shape
    wt, wd = _weights64(name, tl, params), _weights64(name, dl, params)
    wd = torch.nn.functional.pad(wd, (0, wt.shape[-1] - wd.shape[-1]))
    boundary = torch.zeros(B, dtype=torch.bool, device="cuda")
    if gamma:
        pt = wt[:, :gamma].gather(2, dt[..., None]).squeeze(2)
        qd = wd.gather(2, dt[..., None]).squeeze(2)
        near = (u[:, :gamma].double() * qd - pt).abs() <= BOUNDARY * pt
        considered = torch.arange(gamma, device="cuda")[None] <= ref.accepted[:, None]
        boundary |= (near & considered).any(1)
    n = ref.accepted
    rows = torch.arange(B, device="cuda")
    w = wt[rows, n]
    if gamma:
        resid = (w - wd[rows, n.clamp(max=gamma - 1)]).clamp(min=0)
        ratio = resid.sum(1) / w.sum(1)
        use = (n < gamma) & (ratio > contract.RESIDUAL_ZERO_TOL)
        boundary |= (n < gamma) & ((ratio / contract.RESIDUAL_ZERO_TOL - 1).abs() < 1e-2)
        w = torch.where(use[:, None], resid, w)
    cdf = w.cumsum(1)
    total = cdf[:, -1]
    x = u[:, gamma].double() * total
    tok = ref.tokens[rows, n]
    lo = torch.where(tok > 0, cdf.gather(1, (tok - 1).clamp(min=0)[:, None]).squeeze(1), torch.zeros_like(x))
    hi = cdf.gather(1, tok[:, None]).squeeze(1)
    boundary |= ((x - lo).abs() <= BOUNDARY * total) | ((x - hi).abs() <= BOUNDARY * total)
    return boundary


def _assert_agree(name, params, inputs, seed):
    ref = _run(torch_ref.__dict__[f"{name.capitalize()}Sampler"](**params), inputs, seed)
    got = _run(cupy_backend.SAMPLERS[name](**params), inputs, seed)
    B, gamma = inputs[0].shape
    u = contract.uniforms(B, gamma, torch.device("cuda"), torch.Generator(device="cuda").manual_seed(seed))
    assert got.tokens.shape == (B, gamma + 1) and got.accepted.dtype == torch.int64
    assert torch.equal(got.draft_ok, ref.draft_ok) and torch.equal(got.target_ok, ref.target_ok)
    boundary = _boundary_rows(name, params, inputs, ref, u)
    assert boundary.float().mean().item() <= MAX_BOUNDARY_ROWS, f"{boundary.sum().item()} boundary rows of {B}"
    keep = ~boundary
    assert torch.equal(got.accepted[keep], ref.accepted[keep]), "acceptance differs away from rounding boundaries"
    assert torch.equal(got.tokens[keep], ref.tokens[keep]), "emitted tokens differ away from rounding boundaries"
    return got


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "B{}-g{}-V{}-Vd{}-{}".format(*c))
def test_exact_matches_reference(config):
    _assert_agree("exact", {"temperature": 1.0}, _inputs(*config), seed=1)


@pytest.mark.parametrize("config", CONFIGS[:3] + CONFIGS[4:], ids=lambda c: "B{}-g{}-V{}-Vd{}-{}".format(*c))
def test_exact_tempered_matches_reference(config):
    _assert_agree("exact", {"temperature": 0.7}, _inputs(*config), seed=2)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "B{}-g{}-V{}-Vd{}-{}".format(*c))
@pytest.mark.parametrize("alpha,beta", [(1.0, -20.0), (0.5, 0.0)])
def test_sigmoid_matches_reference(config, alpha, beta):
    _assert_agree("sigmoid", {"temperature": 1.0, "alpha": alpha, "beta": beta}, _inputs(*config), seed=3)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "B{}-g{}-V{}-Vd{}-{}".format(*c))
def test_greedy_matches_reference(config):
    inputs = _inputs(*config)
    dt, _, tl = inputs
    ref = torch_ref.GreedySampler()(*inputs)
    got = cupy_backend.GreedySampler()(*inputs)
    assert torch.equal(got.draft_ok, ref.draft_ok) and torch.equal(got.target_ok, ref.target_ok)
    # ties of the maximum may pick another index of the same value; otherwise identical
    B, gamma = dt.shape
    pos = torch.arange(gamma + 1, device="cuda").expand(B, -1)
    valid = (got.tokens >= 0) & (ref.tokens >= 0)
    same_value = tl.gather(2, got.tokens.clamp(min=0)[..., None]) == tl.gather(2, ref.tokens.clamp(min=0)[..., None])
    assert torch.equal(got.tokens >= 0, ref.tokens >= 0)
    assert bool((got.tokens[valid] == ref.tokens[valid]).logical_or(same_value.squeeze(2)[valid]).all())
    assert torch.equal(got.accepted, ref.accepted) or bool(same_value.all())
    assert bool((pos <= got.accepted[:, None]).eq(got.tokens >= 0).all())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["exact", "sigmoid"])
def test_half_precision_within_tolerance_of_fp32(dtype, name):
    """The same logit values as fp16/bf16 and as fp32 (exact upcast): only the summation grouping differs, so at
    least 99% of rows must be identical."""
    dt, dl, tl = _inputs(64, 8, 128_256, 128_256, dtype, seed=4)
    sampler = cupy_backend.SAMPLERS[name](temperature=1.0)
    half = _run(sampler, (dt, dl, tl), seed=5)
    full = _run(sampler, (dt, dl.float(), tl.float()), seed=5)
    same = (half.tokens == full.tokens).all(1)
    assert same.float().mean().item() >= 0.99, f"{(~same).sum().item()} of 64 rows differ"


@pytest.mark.parametrize("name", ["exact", "sigmoid", "greedy"])
def test_nan_and_inf_are_flagged_like_the_reference(name):
    dt, dl, tl = _inputs(6, 4, 51_865, 51_865, "float32", seed=6)
    tl[1, :, 100] = float("nan")              # NaN in every target row of batch row 1
    tl[2, :, 7] = float("inf")                # +inf in every target row of batch row 2
    dl[3, :, 9] = float("nan")                # NaN in every draft row of batch row 3
    tl[4] = float("-inf")                     # batch row 4: target rows of only -inf
    dl[5, :, 11] = float("inf")               # +inf in every draft row of batch row 5
    ref = (torch_ref.GreedySampler() if name == "greedy" else
           torch_ref.__dict__[f"{name.capitalize()}Sampler"]())(dt, dl, tl, torch.Generator("cuda").manual_seed(0))
    got = cupy_backend.SAMPLERS[name]()(dt, dl, tl, torch.Generator("cuda").manual_seed(0))
    assert torch.equal(got.target_ok.cpu(), ref.target_ok.cpu()), (got.target_ok, ref.target_ok)
    assert torch.equal(got.draft_ok.cpu(), ref.draft_ok.cpu()), (got.draft_ok, ref.draft_ok)
    assert not bool(got.target_ok[1]) and bool(got.target_ok[0]) and bool(got.draft_ok[0])
    assert bool(((got.tokens >= -1) & (got.tokens < 51_865)).all()), "a flagged row emitted an out-of-range token"


def test_no_host_sync_and_reproducible():
    inputs = _inputs(16, 5, 32_000, 32_000, "bfloat16", seed=7)
    samplers = [cupy_backend.SAMPLERS[n]() for n in ("exact", "sigmoid", "greedy")]
    for s in samplers:                        # warm up: compile / load the module outside the checked region
        _run(s, inputs, 0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        first = [_run(s, inputs, 8) for s in samplers]
        second = [_run(s, inputs, 8) for s in samplers]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for a, b in zip(first, second):
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.accepted, b.accepted)


def test_bad_input_is_one_line_error():
    from pipeline.errors import SamplerInputError

    dt, dl, tl = _inputs(1, 17, 1000, 1000, "float32")
    with pytest.raises(SamplerInputError, match="at most γ = 16"):
        cupy_backend.ExactSampler()(dt, dl, tl)
    with pytest.raises(SamplerInputError, match="CUDA tensors"):
        cupy_backend.ExactSampler()(*(t.cpu() for t in _inputs(1, 2, 1000, 1000, "float32")))
