"""The verify kernels against the torch reference: one set of cases, run on every place the kernels execute.

``KernelCases`` holds the tests; tests/test_kernels_cpu.py runs them on the CPU runtime for CUDA kernels (every
CI run) and tests/test_kernels_gpu.py on a GPU through CuPy. Each subclass provides the fixture ``kb``: the kernel
samplers, the device their tensors live on, and the largest batch worth running there.

Agreement rule: given the same inputs and uniforms, every row is identical to the reference, except where fp32
rounding can decide, because the kernels sum softmax normalisers and CDFs in another order than torch. A row
that differs must be explained by one of these, judged with fp64 weights:
  acceptance  at the first position where the two disagree, |u * w_d(x) - w_t(x)| <= BOUNDARY * w_t(x)
  token       (same accepted count) u_γ * total lies within BOUNDARY * total of both CDF steps that separate the
              two tokens, or the residual's mass is within 1 % of the rounding-noise threshold
and at most 1 % of rows (at least one) may differ at all. With per-row draft lengths g_b (the contract's
``lengths``) read g_b for γ: positions >= g_b never explain a difference, and the token is drawn with u_{g_b}. A
deterministic draft (draft logits None, the contract) is judged with w_d(x) = 1 and the residual w_t without x_n.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from pipeline.dtypes import torch_dtype
from pipeline.errors import SamplerInputError
from pipeline.samplers import contract, torch_ref

BOUNDARY = 1e-5
MAX_BOUNDARY_ROWS = 0.01
REFERENCE = {"exact": torch_ref.ExactSampler, "sigmoid": torch_ref.SigmoidSampler, "greedy": torch_ref.GreedySampler}

# (B, γ, V_t, V_d, dtype): odd V, the largest V, B = 1 and 256 (one block per row), γ = 16, a padded draft
# vocabulary, γ = 0, and V <= one chunk with γ > 0
CONFIGS = [
    (1, 5, 128_256, 128_256, "bfloat16"),
    (1, 16, 262_144, 262_144, "float16"),
    (256, 16, 51_865, 51_865, "bfloat16"),
    (256, 4, 32_000, 32_000, "float32"),
    (7, 3, 51_865, 51_800, "float32"),
    (5, 0, 1_000, 1_000, "float32"),
    (9, 4, 1_000, 997, "float16"),
]
CONFIG_ID = "B{}-g{}-V{}-Vd{}-{}".format


@dataclass
class KernelBackend:
    """The kernel samplers under test (name -> class) and the device of their tensors."""

    samplers: dict
    device: torch.device
    max_batch: int = 1 << 16     # configs with a larger B run with this B (the CPU runtime's time budget)

    def generator(self, seed: int) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(seed)

    def inputs(self, B, gamma, vt, vd, dtype, seed=0):
        return make_inputs(self.device, min(B, self.max_batch), gamma, vt, vd, dtype, seed)

    def deterministic(self, B, gamma, vt, vd, dtype, seed=0):
        """deterministic_inputs at this backend's batch limit (vd is not used: a deterministic draft has V_d = V_t)."""
        return deterministic_inputs(self.device, min(B, self.max_batch), gamma, vt, dtype, seed)


def make_inputs(device, B, gamma, vt, vd, dtype, seed=0, scale=3.0, draft_noise=1.0):
    """draft_tokens int64 [B, γ] (sampled from the draft), draft logits [B, γ, V_d] (the target's plus normal noise of
    standard deviation ``draft_noise``), target logits [B, γ+1, V_t]."""
    g = torch.Generator(device=device).manual_seed(seed)
    tl = (torch.randn(B, gamma + 1, vt, generator=g, device=device) * scale).to(torch_dtype(dtype))
    noise = torch.randn(B, gamma, vd, generator=g, device=device)
    if draft_noise != 1.0:
        noise *= draft_noise
    dl = (tl[:, :gamma, :vd].float() + noise).to(torch_dtype(dtype))
    gumbel = -torch.empty(B, gamma, vd, device=device).exponential_(generator=g).log()
    dt = (dl.float() + gumbel).argmax(-1)            # a draw from softmax(draft logits) (Gumbel-max)
    return dt, dl, tl


def deterministic_inputs(device, B, gamma, vt, dtype, seed=0):
    """(draft_tokens int64 [B, γ], None, target logits [B, γ+1, V_t]): a deterministic draft (draft logits None). The
    tokens are make_inputs' draft samples; the target gives 70 % of them a probability between 0.2 and 0.95 (so steps
    accept, reject and reach the bonus) and the others what it gives them (mostly rejected)."""
    dt, _, tl = make_inputs(device, B, gamma, vt, vt, dtype, seed)
    return dt, None, _boost_drafted(dt, tl, seed + 1)


def _boost_drafted(dt, tl, seed, where=None):
    """Target logits tl [B, γ+1, V] (a copy) in which 70 % of the drafted tokens dt [B, γ] (only where ``where``, bool
    [B, γ], if given) get a target probability drawn from [0.2, 0.95]."""
    B, gamma = dt.shape
    g = torch.Generator(device=dt.device).manual_seed(seed)
    t = tl[:, :gamma].float()
    others = t.scatter(2, dt[..., None], -math.inf).logsumexp(-1)                # [B, γ]
    r = 0.2 + 0.75 * torch.rand(B, gamma, generator=g, device=dt.device)
    boosted = t.scatter(2, dt[..., None], (others + torch.log(r / (1 - r)))[..., None])
    pick = torch.rand(B, gamma, generator=g, device=dt.device) < 0.7
    if where is not None:
        pick &= where
    tl = tl.clone()
    tl[:, :gamma] = torch.where(pick[..., None], boosted, t).to(tl.dtype)
    return tl


def one_hot_logits(draft_tokens, vocab, dtype):
    """[B, γ, V] logits of the point mass on each drafted token (0 there, -inf elsewhere): what string mode passes."""
    out = torch.full((*draft_tokens.shape, vocab), -math.inf, dtype=dtype, device=draft_tokens.device)
    return out.scatter_(2, draft_tokens[..., None], 0.0)


def _weights64(name, logits, params):
    """fp64 weights [..., V] of logits [..., V] (softmax for exact, sigmoid otherwise), in batch chunks."""
    parts = []
    for z in logits.split(16):
        z = z.double()
        if name == "exact":
            parts.append(torch.softmax(z / params["temperature"], -1))
        else:
            parts.append(torch.sigmoid(params["alpha"] * z / params["temperature"] + params["beta"]))
    return torch.cat(parts)


def explained_rows(name, params, inputs, ref, got, u, lengths=None) -> torch.Tensor:
    """bool [B]: rows whose difference from the reference fp32 rounding can explain (see module docstring).
    lengths: the per-row draft lengths of the step (int64 [B]), or None."""
    dt, dl, tl = inputs
    B, gamma = dt.shape
    device = dt.device
    rows = torch.arange(B, device=device)
    g = torch.full((B,), gamma, device=device) if lengths is None else lengths.clamp(0, gamma)
    explained = torch.zeros(B, dtype=torch.bool, device=device)
    n_ref, n_got = ref.accepted, got.accepted
    if gamma:
        wt = _weights64(name, tl[:, :gamma], params)
        pt = wt.gather(2, dt.clamp(0, wt.shape[2] - 1)[..., None]).squeeze(2)
        if dl is None:                                                 # a deterministic draft: w_d(x) = 1
            qd = torch.ones_like(pt)
        else:
            wd = _weights64(name, dl, params)
            qd = wd.gather(2, dt.clamp(0, wd.shape[2] - 1)[..., None]).squeeze(2)
        near = (u[:, :gamma].double() * qd - pt).abs() <= BOUNDARY * pt
        near &= torch.arange(gamma, device=device) < g[:, None]        # a padded position decides nothing
        first = torch.minimum(n_ref, n_got).clamp(max=gamma - 1)
        explained |= (n_ref != n_got) & near[rows, first]
    tok_ref, tok_got = ref.tokens[rows, n_ref], got.tokens[rows, n_ref]
    differ = ((n_ref == n_got) & (tok_ref != tok_got)).nonzero().flatten()
    if len(differ):
        n, gd = n_ref[differ], g[differ]
        w = _weights64(name, tl[differ, n], params)                              # [k, V_t]: target row n
        if gamma:
            if dl is None:                                       # a deterministic draft: x_n removed
                x_n = dt[differ, n.clamp(max=gamma - 1)].clamp(0, w.shape[1] - 1)
                resid = w.scatter(1, x_n[:, None], 0.0)
            else:
                q = _weights64(name, dl[differ, n.clamp(max=gamma - 1)], params)
                resid = (w - torch.nn.functional.pad(q, (0, w.shape[1] - q.shape[1]))).clamp(min=0)
            ratio = resid.sum(1) / w.sum(1)
            switch_near = (n < gd) & ((ratio / contract.RESIDUAL_ZERO_TOL - 1).abs() < 1e-2)
            w = torch.where(((n < gd) & (ratio > contract.RESIDUAL_ZERO_TOL))[:, None], resid, w)
        else:
            switch_near = torch.zeros(len(differ), dtype=torch.bool, device=device)
        cdf = w.cumsum(1)
        total = cdf[:, -1]
        x = u[differ, gd].double() * total
        lo = torch.minimum(tok_ref[differ], tok_got[differ]).clamp(min=0)
        hi = torch.maximum(tok_ref[differ], tok_got[differ])
        step_lo = cdf.gather(1, lo[:, None]).squeeze(1)                           # end of the lower token
        step_hi = cdf.gather(1, (hi - 1).clamp(min=0)[:, None]).squeeze(1)        # start of the higher token
        tol = BOUNDARY * total
        seam = ((x - step_lo).abs() <= tol) & ((x - step_hi).abs() <= tol)
        explained[differ] |= seam | switch_near
    return explained


def assert_agree(kb: KernelBackend, name, params, inputs, seed, lengths=None):
    """The kernel sampler and the reference, same inputs, uniforms and per-row lengths (int64 [B] or None):
    identical but for rounding (module doc)."""
    reference = REFERENCE[name](**params)
    ref = reference(*inputs, generator=kb.generator(seed), lengths=lengths)
    got = kb.samplers[name](**params)(*inputs, generator=kb.generator(seed), lengths=lengths)
    params = reference.params                        # with the defaults filled in
    B, gamma = inputs[0].shape
    u = contract.uniforms(B, gamma, kb.device, kb.generator(seed))
    assert got.tokens.shape == (B, gamma + 1) and got.accepted.dtype == torch.int64
    assert torch.equal(got.draft_ok, ref.draft_ok) and torch.equal(got.target_ok, ref.target_ok)
    pos = torch.arange(gamma + 1, device=kb.device)
    assert torch.equal(got.tokens >= 0, pos <= got.accepted[:, None]), "padding does not follow the accepted count"
    _assert_within_lengths(got, lengths)
    differ = ~(got.tokens == ref.tokens).all(1)
    unexplained = differ & ~explained_rows(name, params, inputs, ref, got, u, lengths)
    assert_rounding_rare(differ, unexplained, got, ref)
    return got


def assert_rounding_rare(differ: torch.Tensor, unexplained: torch.Tensor, got, ref) -> None:
    """The agreement rule's verdict on the rows that differ from the reference (differ bool [B]) and those of them
    that rounding does not explain (unexplained bool [B]): none of the latter, and at most MAX_BOUNDARY_ROWS of the
    rows (at least one) differ at all. got, ref: the two SamplerResults (for the message)."""
    B = differ.shape[0]
    assert not bool(unexplained.any()), (
        f"{int(unexplained.sum())} of {B} rows differ from the reference away from rounding boundaries: rows "
        f"{unexplained.nonzero().flatten()[:8].tolist()}, accepted {got.accepted[unexplained][:8].tolist()} vs "
        f"{ref.accepted[unexplained][:8].tolist()}")
    assert int(differ.sum()) <= max(1, int(MAX_BOUNDARY_ROWS * B)), f"{int(differ.sum())} of {B} rows differ"


def _assert_within_lengths(got, lengths) -> None:
    if lengths is not None:
        over = got.accepted > lengths.clamp(0, got.tokens.shape[1] - 1)
        assert not bool(over.any()), f"rows {over.nonzero().flatten()[:8].tolist()} accepted past their draft length"


def assert_greedy_agrees(kb: KernelBackend, inputs, lengths=None):
    """Greedy: identical, except that a tie of the maximum may pick another index of the same value."""
    dt, _, tl = inputs
    ref = torch_ref.GreedySampler()(*inputs, lengths=lengths)
    got = kb.samplers["greedy"]()(*inputs, lengths=lengths)
    _assert_within_lengths(got, lengths)
    assert torch.equal(got.draft_ok, ref.draft_ok) and torch.equal(got.target_ok, ref.target_ok)
    B, gamma = dt.shape
    pos = torch.arange(gamma + 1, device=kb.device).expand(B, -1)
    valid = (got.tokens >= 0) & (ref.tokens >= 0)
    same_value = tl.gather(2, got.tokens.clamp(min=0)[..., None]) == tl.gather(2, ref.tokens.clamp(min=0)[..., None])
    assert torch.equal(got.tokens >= 0, ref.tokens >= 0)
    assert bool((got.tokens[valid] == ref.tokens[valid]).logical_or(same_value.squeeze(2)[valid]).all())
    assert torch.equal(got.accepted, ref.accepted) or bool(same_value.all())
    assert bool((pos <= got.accepted[:, None]).eq(got.tokens >= 0).all())
    return got


def assert_any(name: str, inputs, kb: KernelBackend, params: dict, seed: int, lengths=None):
    """assert_agree for exact/sigmoid, assert_greedy_agrees for greedy."""
    if name == "greedy":
        return assert_greedy_agrees(kb, inputs, lengths)
    return assert_agree(kb, name, params, inputs, seed, lengths)


# ---- per-row draft lengths -----------------------------------------------------------------------------------

# (B, γ, V_t, V_d): a padded draft vocabulary at an odd V, several slices and chunks per row on a 132-SM geometry
LENGTH_CASE = (12, 5, 5_003, 4_999)


def length_inputs(device, B, gamma, vt, vd, dtype, seed=0, match=0.0):
    """make_inputs with per-row draft lengths -> ((draft_tokens, draft_logits, target_logits), lengths int64 [B]).

    lengths: 0, γ and γ + 3 (out of range: acts as γ) in rows 0, 1, 2, random in 1..γ-1 in the others (the draft
    is close to the target, so that many rows accept all of a short draft and draw a bonus token). Row b drafted only
    g_b tokens; its padded positions j >= g_b hold what a kernel that ignored the lengths would accept: the draft
    token is the target's argmax x (inside the draft's vocabulary) with a one-hot draft (logit 0 at x, -inf
    elsewhere: finite, as the contract asks of padding), and the target gives x 90 % of its mass (so a
    full-length row's bonus row g_b, and the residual there, are far apart). ``match``: the share of the real
    draft tokens replaced by the target's argmax (greedy accepts nothing else).
    """
    dt, dl, tl = make_inputs(device, B, gamma, vt, vd, dtype, seed, draft_noise=0.3)
    g = torch.Generator(device=device).manual_seed(seed + 1)
    lengths = torch.randint(1, gamma, (B,), generator=g, device=device)
    lengths[:3] = torch.tensor([0, gamma, gamma + 3], device=device)
    pad = torch.arange(gamma, device=device) >= lengths.clamp(max=gamma)[:, None]   # bool [B, γ]: j >= g_b
    t = tl[:, :gamma].float()
    x = t[..., :vd].argmax(-1)                                                   # [B, γ]
    others = t.scatter(2, x[..., None], -math.inf).logsumexp(-1)                 # [B, γ]
    boosted = t.scatter(2, x[..., None], (others + math.log(9.0))[..., None])    # p(x) = 0.9
    tl[:, :gamma] = torch.where(pad[..., None], boosted, t).to(tl.dtype)
    one_hot = torch.full_like(dl, -math.inf).scatter(2, x[..., None], 0.0)
    dl = torch.where(pad[..., None], one_hot, dl)
    if match:
        argmax = tl[:, :gamma].float().argmax(-1)
        dt = torch.where(torch.rand(B, gamma, generator=g, device=device) < match, argmax, dt)
    dt = torch.where(pad, x, dt)
    return (dt, dl, tl), lengths


LENGTH_PARAMS = {"exact": {"temperature": 1.0}, "sigmoid": {"temperature": 1.0, "alpha": 1.0, "beta": -20.0},
                 "greedy": {}}


def assert_lengths_agree(kb: KernelBackend, name: str, dtype: str, seed: int = 40):
    """The per-row length case (length_inputs) held to the reference with the same uniforms and lengths."""
    inputs, lengths = length_inputs(kb.device, *LENGTH_CASE, dtype, seed=seed, match=0.8 if name == "greedy" else 0)
    return assert_any(name, inputs, kb, LENGTH_PARAMS[name], seed + 2, lengths), inputs, lengths


def assert_deterministic_lengths_agree(kb: KernelBackend, name: str):
    """The per-row length case with a deterministic draft (draft logits None), held to the reference; for exact, the
    target also likes most drafted tokens before each row's length, so that rows reach it."""
    (dt, _, tl), lengths = length_inputs(kb.device, *LENGTH_CASE, "float32", seed=55,
                                         match=0.8 if name == "greedy" else 0)
    if name == "exact":
        tl = _boost_drafted(dt, tl, 58, where=torch.arange(dt.shape[1], device=kb.device) < lengths[:, None])
    inputs = (dt, None, tl)
    return assert_any(name, inputs, kb, LENGTH_PARAMS[name], 56, lengths), inputs, lengths


class KernelCases:
    """Kernel = reference tests. Subclasses provide the fixture ``kb`` (a KernelBackend)."""

    @pytest.mark.parametrize("config", CONFIGS, ids=lambda c: CONFIG_ID(*c))
    def test_exact_matches_reference(self, kb, config):
        assert_agree(kb, "exact", {"temperature": 1.0}, kb.inputs(*config), seed=1)

    @pytest.mark.parametrize("config", CONFIGS[:3] + CONFIGS[4:], ids=lambda c: CONFIG_ID(*c))
    def test_exact_tempered_matches_reference(self, kb, config):
        assert_agree(kb, "exact", {"temperature": 0.7}, kb.inputs(*config), seed=2)

    @pytest.mark.parametrize("config", CONFIGS, ids=lambda c: CONFIG_ID(*c))
    @pytest.mark.parametrize("alpha,beta", [(1.0, -20.0), (0.5, 0.0)])
    def test_sigmoid_matches_reference(self, kb, config, alpha, beta):
        assert_agree(kb, "sigmoid", {"temperature": 1.0, "alpha": alpha, "beta": beta},
                     kb.inputs(*config), seed=3)

    @pytest.mark.parametrize("config", [CONFIGS[0], CONFIGS[4], CONFIGS[6]], ids=lambda c: CONFIG_ID(*c))
    def test_sigmoid_tempered_matches_reference(self, kb, config):
        assert_agree(kb, "sigmoid", {"temperature": 0.6, "alpha": 1.0, "beta": -8.0},
                     kb.inputs(*config), seed=4)

    @pytest.mark.parametrize("config", CONFIGS, ids=lambda c: CONFIG_ID(*c))
    def test_greedy_matches_reference(self, kb, config):
        assert_greedy_agrees(kb, kb.inputs(*config))

    @pytest.mark.parametrize("name", ["exact", "sigmoid", "greedy"])
    def test_nan_and_inf_are_flagged_like_the_reference(self, kb, name):
        dt, dl, tl = make_inputs(kb.device, 6, 4, 51_865, 51_865, "float32", seed=6)
        tl[1, :, 100] = float("nan")              # NaN in every target row of batch row 1
        tl[2, :, 7] = float("inf")                # +inf in every target row of batch row 2
        dl[3, :, 9] = float("nan")                # NaN in every draft row of batch row 3
        tl[4] = float("-inf")                     # batch row 4: target rows of only -inf
        dl[5, :, 11] = float("inf")               # +inf in every draft row of batch row 5
        ref = REFERENCE[name]()(dt, dl, tl, kb.generator(0))
        got = kb.samplers[name]()(dt, dl, tl, kb.generator(0))
        assert torch.equal(got.target_ok.cpu(), ref.target_ok.cpu()), (got.target_ok, ref.target_ok)
        assert torch.equal(got.draft_ok.cpu(), ref.draft_ok.cpu()), (got.draft_ok, ref.draft_ok)
        assert not bool(got.target_ok[1]) and bool(got.target_ok[0]) and bool(got.draft_ok[0])
        assert bool(((got.tokens >= -1) & (got.tokens < 51_865)).all()), "a flagged row emitted an out-of-range token"

    @pytest.mark.parametrize("name", ["exact", "sigmoid", "greedy"])
    def test_strided_views_and_offset_rows(self, kb, name):
        """Logits as views into a [B, L, V] tensor (position stride != V, batch stride != (γ+1) V) that start at an
        odd element offset: the kernels read them in place with their strides, as the engine hands them over."""
        B, gamma, V = 5, 4, 5_003
        dt, dl, tl = make_inputs(kb.device, B, gamma, V, V, "bfloat16", seed=7)
        big_t = torch.randn(B, 3 * (gamma + 1), V + 3, device=kb.device).to(torch.bfloat16)
        big_d = torch.randn(B, 2 * gamma + 1, V + 1, device=kb.device).to(torch.bfloat16)
        tv = big_t[:, 1::3, 3:]                      # stride (3 (γ+1) (V+3), 3 (V+3), 1), offset 3 elements
        dv = big_d[:, 1::2, 1:]
        tv.copy_(tl)
        dv.copy_(dl)
        assert tv.stride(1) != V and dv.stride(1) != V and tv.storage_offset() % 2 == 1
        params = {} if name == "greedy" else {"temperature": 0.9}
        want = assert_any(name, (dt, dl, tl), kb, params, seed=8)
        got = kb.samplers[name](**params)(dt, dv, tv, kb.generator(8))
        assert torch.equal(got.tokens, want.tokens) and torch.equal(got.accepted, want.accepted)

    def test_mixed_draft_and_target_dtypes(self, kb):
        """A bf16 draft and an fp32 target are both read as fp32 (exact upcast): the fp32 results, exactly."""
        dt, dl, tl = make_inputs(kb.device, 6, 3, 32_000, 32_000, "bfloat16", seed=9)
        for name in ("exact", "sigmoid", "greedy"):
            s = kb.samplers[name]()
            mixed = s(dt, dl, tl.float(), kb.generator(10))
            full = s(dt, dl.float(), tl.float(), kb.generator(10))
            assert torch.equal(mixed.tokens, full.tokens), name
        assert_agree(kb, "exact", {"temperature": 1.0}, (dt, dl, tl.float()), seed=10)

    @pytest.mark.parametrize("name", ["exact", "sigmoid", "greedy"])
    def test_out_of_range_draft_token_is_rejected_and_flagged(self, kb, name):
        dt, dl, tl = make_inputs(kb.device, 4, 3, 2_000, 2_000, "float32", seed=11)
        dt[1, 0] = 2_000                             # == V_d: a token the draft cannot have proposed
        dt[2, 1] = -3
        got = kb.samplers[name]()(dt, dl, tl, kb.generator(12))
        assert got.draft_ok.tolist() == [True, False, False, True]
        assert int(got.accepted[1]) == 0 and int(got.accepted[2]) <= 1
        assert bool(((got.tokens >= -1) & (got.tokens < 2_000)).all())

    def test_a_long_mixed_sequence_on_one_stream(self, kb):
        """Samplers, B, γ, V and dtypes change from step to step on one stream, sharing one workspace: every step
        still agrees with the reference (the arrival counters are back at zero after every kernel)."""
        steps = [("exact", 3, 2, 5_000, "float32"), ("sigmoid", 1, 4, 40_000, "bfloat16"),
                 ("greedy", 6, 1, 3_000, "float16"), ("exact", 6, 0, 70_001, "float16"),
                 ("exact", 2, 6, 1_024, "bfloat16"), ("sigmoid", 8, 2, 9_999, "float32"),
                 ("exact", 1, 3, 130_000, "bfloat16"), ("greedy", 2, 5, 8_192, "float32"),
                 ("exact", 12, 2, 4_097, "float32"), ("sigmoid", 3, 0, 2_048, "float16")]
        workspace = kb.samplers["exact"].launcher.workspace(kb.device)
        for i, (name, B, gamma, V, dtype) in enumerate(steps):
            inputs = make_inputs(kb.device, B, gamma, V, V, dtype, seed=100 + i)
            params = {} if name == "greedy" else {"temperature": 1.0}
            assert_any(name, inputs, kb, params, seed=200 + i)
            assert not bool(workspace.count.any()), f"step {i}: an arrival counter was left non-zero"

    @pytest.mark.parametrize("name", ["exact", "sigmoid"])
    def test_a_zero_weight_token_is_never_emitted(self, kb, name):
        """95 % of target and draft logits are -inf (masked, top-k removed): whatever rounding does to the CDF,
        the emitted token always has positive weight."""
        B, gamma, V, draws = 64, 2, 3_000, 12
        g = torch.Generator(device=kb.device).manual_seed(13)
        sampler = kb.samplers[name](temperature=1.0)
        for d in range(draws):
            allowed = torch.rand(B, gamma + 1, V, generator=g, device=kb.device) < 0.05
            tl = torch.where(allowed, torch.randn(B, gamma + 1, V, generator=g, device=kb.device) * 4, -torch.inf)
            dl = torch.where(allowed[:, :gamma], tl[:, :gamma] + torch.randn(B, gamma, V, generator=g,
                                                                              device=kb.device), -torch.inf)
            dt = torch.multinomial(torch.softmax(dl, -1).reshape(-1, V), 1, generator=g).reshape(B, gamma)
            out = sampler(dt, dl, tl, kb.generator(d))
            n = out.accepted
            emitted = out.tokens.gather(1, n[:, None]).squeeze(1)
            ok_row = allowed[torch.arange(B, device=kb.device), n].gather(1, emitted[:, None]).squeeze(1)
            assert bool(ok_row.all()), f"draw {d}: a token of weight 0 was emitted in rows {(~ok_row).nonzero()}"

    def test_weights_below_flt_min_count_as_zero(self, kb):
        """The -ftz band, a documented difference: CuPy compiles with -ftz=true, so a weight below FLT_MIN
        (1.2e-38) is 0 in the kernels; the reference keeps it. Here the drafted token's softmax weights are e^-95
        (target) and e^-97 (draft), both subnormal: the reference accepts it (u * q < p), the kernels reject it
        (q = 0), in every row."""
        B, gamma, V = 4, 1, 2_048
        tl = torch.zeros(B, gamma + 1, V, device=kb.device)
        dl = torch.full((B, gamma, V), -torch.inf, device=kb.device)
        tl[:, 0] = -torch.inf
        tl[:, 0, 0], tl[:, 0, 5] = 0.0, -95.0
        dl[:, 0, 0], dl[:, 0, 5] = 0.0, -97.0
        dt = torch.full((B, gamma), 5, dtype=torch.int64, device=kb.device)
        ref = torch_ref.ExactSampler()(dt, dl, tl, kb.generator(0))
        got = kb.samplers["exact"]()(dt, dl, tl, kb.generator(0))
        assert ref.accepted.tolist() == [1] * B, "the reference accepts a subnormal-weight draft token"
        assert got.accepted.tolist() == [0] * B, "the kernels flush subnormal weights to zero and reject"

    @pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
    @pytest.mark.parametrize("name", ["exact", "sigmoid", "greedy"])
    def test_per_row_lengths_match_reference(self, kb, name, dtype):
        """Per-row draft lengths 0..γ (and γ + 3, clamped to γ): each row verified as if alone with γ = g_b, the
        same uniforms as the reference. The padded positions would be accepted by a step that ignored the lengths:
        without them the same inputs do accept past g_b (the case has teeth)."""
        got, inputs, lengths = assert_lengths_agree(kb, name, dtype)
        g = lengths.clamp(max=inputs[0].shape[1])
        assert bool((got.accepted == g).any()) and bool((got.accepted < g).any()), "want full and rejected rows"
        ignored = kb.samplers[name](**LENGTH_PARAMS[name])(*inputs, generator=kb.generator(42))
        assert bool((ignored.accepted > g).any()), "the padded positions would not be accepted: no test of lengths"
        if name == "greedy":                         # the other rules at temperature 0 verify greedily, lengths too
            for other in ("exact", "sigmoid"):
                same = kb.samplers[other](temperature=0.0)(*inputs, lengths=lengths)
                assert torch.equal(same.tokens, got.tokens) and torch.equal(same.accepted, got.accepted), other

    @pytest.mark.parametrize("name", ["exact", "sigmoid", "greedy"])
    def test_lengths_of_gamma_are_no_lengths(self, kb, name):
        """lengths all γ (or beyond) is exactly lengths None: the same tokens, bit for bit."""
        inputs = make_inputs(kb.device, 6, 4, 3_001, 3_001, "float16", seed=43)
        sampler = kb.samplers[name](**LENGTH_PARAMS[name])
        none = sampler(*inputs, generator=kb.generator(44))
        for value in (4, 9):
            full = sampler(*inputs, generator=kb.generator(44),
                           lengths=torch.full((6,), value, dtype=torch.int64, device=kb.device))
            assert torch.equal(full.tokens, none.tokens) and torch.equal(full.accepted, none.accepted), value

    @pytest.mark.parametrize("name", ["exact", "sigmoid", "greedy"])
    def test_the_kernels_clamp_lengths_themselves(self, kb, name):
        """The step functions hand lengths to the kernels unclamped (the samplers clamp before): -2 acts as 0 and
        γ + 3 as γ, on the device."""
        from pipeline.samplers import cupy_backend

        (dt, dl, tl), lengths = length_inputs(kb.device, *LENGTH_CASE, "float32", seed=45)
        gamma = dt.shape[1]
        raw = lengths.clone()
        raw[0] = -2                                                              # row 0 drafted 0
        launcher = kb.samplers[name].launcher
        u = contract.uniforms(dt.shape[0], gamma, kb.device, kb.generator(46))

        def step(lens):
            if name == "greedy":
                return cupy_backend.greedy_step(launcher, dt, dl, tl, lens)
            if name == "exact":
                return cupy_backend.exact_step(launcher, dt, dl, tl, 1.0, u=u, lengths=lens)
            return cupy_backend.sigmoid_step(launcher, dt, dl, tl, 1.0, -20.0, u=u, lengths=lens)

        got, want = step(raw), step(raw.clamp(0, gamma))
        assert torch.equal(got.tokens, want.tokens) and torch.equal(got.accepted, want.accepted)

    # ---- deterministic drafts (draft logits None) ----------------------------------------------------------------

    @pytest.mark.parametrize("config", [CONFIGS[i] for i in (0, 2, 4, 5, 6)], ids=lambda c: CONFIG_ID(*c))
    def test_exact_deterministic_matches_reference(self, kb, config):
        got = assert_agree(kb, "exact", {"temperature": 1.0}, kb.deterministic(*config), seed=51)
        assert bool(got.draft_ok.all())

    @pytest.mark.parametrize("config", [CONFIGS[i] for i in (0, 4, 6)], ids=lambda c: CONFIG_ID(*c))
    def test_exact_deterministic_tempered_matches_reference(self, kb, config):
        assert_agree(kb, "exact", {"temperature": 0.7}, kb.deterministic(*config), seed=52)

    @pytest.mark.parametrize("config", [CONFIGS[i] for i in (0, 4, 6)], ids=lambda c: CONFIG_ID(*c))
    def test_greedy_deterministic_matches_reference(self, kb, config):
        inputs = kb.deterministic(*config)
        got = assert_greedy_agrees(kb, inputs)
        for other in ("exact", "sigmoid"):                            # they verify greedily at T = 0, None too
            same = kb.samplers[other](temperature=0.0)(*inputs)
            assert torch.equal(same.tokens, got.tokens) and torch.equal(same.accepted, got.accepted), other

    @pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
    @pytest.mark.parametrize("name", ["exact", "greedy"])
    def test_deterministic_draft_is_one_hot_logits_bit_for_bit(self, kb, name, dtype):
        """The kernels' deterministic mode computes what they compute for one-hot draft logits (0 at the token,
        -inf elsewhere) without reading them: the same uniforms give the same tokens, counts and flags, with and
        without per-row lengths (an odd V: rows off 16-byte alignment, several slices and chunks per row)."""
        dt, _, tl = deterministic_inputs(kb.device, 9, 5, 5_003, dtype, seed=53)
        params = {"temperature": 0.8} if name == "exact" else {}
        sampler = kb.samplers[name](**params)
        lengths = torch.tensor([0, 5, 2, 9, 3, 1, 4, 5, 5], device=kb.device)
        for lens in (None, lengths):
            got = sampler(dt, None, tl, generator=kb.generator(54), lengths=lens)
            want = sampler(dt, one_hot_logits(dt, tl.shape[2], tl.dtype), tl, generator=kb.generator(54),
                           lengths=lens)
            for a, b in ((got.tokens, want.tokens), (got.accepted, want.accepted), (got.draft_ok, want.draft_ok),
                         (got.target_ok, want.target_ok)):
                assert torch.equal(a, b), (lens, a, b)
        assert bool((got.accepted == 0).any()) and bool((got.accepted > 0).any()), "want rejected and accepted rows"

    @pytest.mark.parametrize("name", ["exact", "greedy"])
    def test_deterministic_per_row_lengths_match_reference(self, kb, name):
        """Per-row lengths with a deterministic draft: the padding holds tokens the target gives probability 0.9, which
        a length-blind step would accept (the case has teeth)."""
        got, inputs, lengths = assert_deterministic_lengths_agree(kb, name)
        g = lengths.clamp(max=inputs[0].shape[1])
        ignored = kb.samplers[name](**LENGTH_PARAMS[name])(*inputs, generator=kb.generator(56))
        assert bool((ignored.accepted > g).any()) and bool((got.accepted <= g).all())
        assert bool((got.accepted == g).any()) and bool((got.accepted < g).any()), "want full and rejected rows"

    @pytest.mark.parametrize("name", ["exact", "greedy"])
    def test_deterministic_flags(self, kb, name):
        """Non-finite target logits are flagged as the reference flags them; draft_ok holds (no draft logits), except
        where a token is outside [0, V_t): rejected and flagged, as with draft logits."""
        dt, _, tl = deterministic_inputs(kb.device, 6, 4, 3_000, "float32", seed=57)
        tl[1, :, 100] = float("nan")
        tl[2, :, 7] = float("inf")
        tl[4] = float("-inf")
        params = {} if name == "greedy" else {"temperature": 1.0}
        ref = REFERENCE[name](**params)(dt, None, tl, kb.generator(0))
        got = kb.samplers[name](**params)(dt, None, tl, kb.generator(0))
        assert torch.equal(got.target_ok.cpu(), ref.target_ok.cpu()) and not bool(got.target_ok[1])
        assert bool(got.draft_ok.all()) and bool(ref.draft_ok.all())
        dt[3, 0] = 3_000
        dt[5, 1] = -2
        bad = kb.samplers[name](**params)(dt, None, tl, kb.generator(1))
        assert bad.draft_ok.tolist() == [True, True, True, False, True, False]
        assert int(bad.accepted[3]) == 0 and int(bad.accepted[5]) <= 1
        assert bool(((bad.tokens >= -1) & (bad.tokens < 3_000)).all())

    def test_sigmoid_refuses_a_deterministic_draft(self, kb):
        from pipeline.samplers import cupy_backend

        dt, _, tl = deterministic_inputs(kb.device, 3, 2, 1_000, "float32")
        with pytest.raises(SamplerInputError, match="sigmoid at T > 0 cannot verify a deterministic draft"):
            kb.samplers["sigmoid"](temperature=1.0)(dt, None, tl)
        with pytest.raises(SamplerInputError, match="sample_sigmoid needs draft logits"):
            cupy_backend.sigmoid_step(kb.samplers["sigmoid"].launcher, dt, None, tl, 1.0, -20.0)

    def test_bad_lengths_are_one_line_errors(self, kb):
        from pipeline.samplers import cupy_backend

        dt, dl, tl = make_inputs(kb.device, 3, 2, 1000, 1000, "float32")
        sampler = kb.samplers["exact"]()
        with pytest.raises(SamplerInputError, match=r"lengths must be None or int64 \[B\] = \[3\]"):
            sampler(dt, dl, tl, lengths=torch.ones(3, dtype=torch.int32, device=kb.device))
        with pytest.raises(SamplerInputError, match=r"lengths must be None or int64"):
            sampler(dt, dl, tl, lengths=torch.ones(4, dtype=torch.int64, device=kb.device))
        with pytest.raises(SamplerInputError, match=r"lengths must be None or int64"):   # the step's own check
            cupy_backend.greedy_step(sampler.launcher, dt, dl, tl, torch.ones((3, 1), dtype=torch.int64,
                                                                              device=kb.device))

    def test_bad_input_is_one_line_error(self, kb):
        dt, dl, tl = make_inputs(kb.device, 1, 17, 1000, 1000, "float32")
        with pytest.raises(SamplerInputError, match="at most γ = 16"):
            kb.samplers["exact"]()(dt, dl, tl)
        other = torch.device("cpu" if kb.device.type != "cpu" else "meta")
        with pytest.raises(SamplerInputError, match="tensors; got"):
            kb.samplers["exact"]()(*(t.to(other) for t in make_inputs(kb.device, 1, 2, 1000, 1000, "float32")))
