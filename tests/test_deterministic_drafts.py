"""Deterministic drafts: a sampler called with ``draft_logits=None`` (pipeline/samplers/contract.py).

A drafter without a draft model (prompt lookup, suffix decoding, the string mode of a draft with another tokenizer)
proposes each token with certainty: its draft distribution is the point mass on the token. Exact verification then
accepts x with probability p(x) and, on rejection, draws from p with x removed; at T = 0 it is greedy matching.

  contract     None is accepted and validated; the registry says which rules take it (sigmoid refuses at T > 0, in
               one line, at the sampler and through Rule.check_run); every rule that takes it emits what it emits
               for one-hot draft logits, given the same uniforms; no tensor of the draft's [B, γ, V] size is
               allocated on that path; no host sync; per-row lengths; flags
  exactness    chi-square: the first emitted token follows the target and the accepted count its law
               (P(accepted >= k) = Π p_i(x_i)) for exact, block and hf at T = 1 and 0.7, on the torch reference and
               on the CUDA kernels run on the CPU runtime (tests/cuda_on_cpu; a subset); the first two tokens of a
               Markov model follow the target jointly; at T = 0 every lossless rule is greedy matching
  power        two broken variants (accept x with probability 1; keep x in the residual) fail the same tests; the
               kernel mutants of tests/test_kernels_cpu.py fail the kernel's agreement and the same chi-square test
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from stat_utils import THRESHOLD, assert_fits, chisquare_pvalue, counts
from sync_detector import assert_no_host_sync
from test_sampler_contract import PER_ROW_LENGTHS, assert_rows_verify_as_alone, per_row_inputs
from test_sampler_exactness import (
    CPU_RUNTIME,
    EXACT_BACKENDS,
    _on_device,
    accepted_distribution,
    make_sampler,
    markov_model,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from pipeline.errors import NonFiniteLogitsError, SamplerInputError, SpecsweepError
from pipeline.rules import RULES
from pipeline.samplers import get_sampler
from pipeline.samplers.block import deterministic_stop_probs, stop_probs, survival_probs
from pipeline.samplers.contract import SamplerResult, assemble_tokens, uniforms, validate_inputs
from pipeline.samplers.lossy import LN2, js_divergence, js_to_point_mass
from pipeline.samplers.torch_ref import ExactSampler, rejection_verify, rows_at, softmax_fp32

NEG_INF = float("-inf")
N_SAMPLES = 20_000
HF_SAMPLES = 2_000                 # hf runs one row per call, as HF does
CPU_RUNTIME_CASES = ("mixed", "mixed_T0.7", "bf16")

# whether each rule takes a deterministic draft at (T = 1, T = 0)
TAKES = {"exact": (True, True), "block": (True, True), "sigmoid": (False, True), "greedy": (True, True),
         "hf": (True, None), "typical": (True, True), "fuzzy": (True, True), "relaxed": (True, True),
         "accept_all": (True, True), "synthetic": (True, True)}


def one_hot(draft_tokens: torch.Tensor, V: int, dtype=torch.float32) -> torch.Tensor:
    """[B, γ, V] logits 0 at the drafted token and -inf elsewhere: the way string mode passes a deterministic draft
    today, the reference the None path is held to."""
    out = torch.full((*draft_tokens.shape, V), NEG_INF, dtype=dtype, device=draft_tokens.device)
    return out.scatter_(2, draft_tokens[..., None], 0.0)


def det_inputs(B=64, gamma=4, V=50, seed=0, dtype=torch.float32, match=0.6):
    """(draft_tokens int64 [B, γ], target_logits [B, γ+1, V]): the target's argmax where a coin of probability
    ``match`` says so, else a random token, so that steps accept some tokens and reject others."""
    g = torch.Generator().manual_seed(seed)
    tl = (torch.randn(B, gamma + 1, V, generator=g) * 2).to(dtype)
    argmax = tl[:, :gamma].float().argmax(-1)
    dt = torch.where(torch.rand(B, gamma, generator=g) < match, argmax, torch.randint(0, V, (B, gamma), generator=g))
    return dt, tl


def _temperatures(name):
    for temperature, takes in zip((1.0, 0.0), TAKES[name]):
        if takes:
            yield name, temperature


RULE_TEMPERATURES = [nt for name in RULES for nt in _temperatures(name)]


# ---- contract and registry ---------------------------------------------------------------------------------------

def test_the_registry_records_which_rules_take_deterministic_drafts():
    assert set(TAKES) == set(RULES)
    for name, (at_one, at_zero) in TAKES.items():
        rule = RULES[name]
        assert rule.takes_deterministic_drafts(1.0) is at_one, name
        if at_zero is not None:
            assert rule.takes_deterministic_drafts(0.0) is at_zero, name
        assert (rule.deterministic_drafts == "always") is (at_one and at_zero is not False), name
    assert RULES["sigmoid"].deterministic_drafts == "at T = 0"
    assert RULES["sigmoid"].takes_deterministic_drafts("0") and not RULES["sigmoid"].takes_deterministic_drafts(None)


def test_a_run_can_be_refused_early_through_the_registry():
    args = {"backend": "torch", "batch_size": 4, "engine": "specsweep", "params": {}, "preset": None}
    with pytest.raises(SpecsweepError) as e:
        RULES["sigmoid"].check_run(temperature=1.0, deterministic_draft=True, **args)
    assert "cannot verify a deterministic draft" in str(e.value) and "exact" in str(e.value)
    assert "\n" not in str(e.value)
    RULES["sigmoid"].check_run(temperature=0.0, deterministic_draft=True, **args)
    RULES["sigmoid"].check_run(temperature=1.0, **args)                        # a draft model: fine
    for name in ("exact", "block", "greedy", "typical", "fuzzy", "relaxed", "accept_all"):
        RULES[name].check_run(temperature=1.0, deterministic_draft=True, **args)


def test_sigmoid_refuses_a_deterministic_draft_in_one_line_and_verifies_greedily_at_zero():
    dt, tl = det_inputs(B=8)
    with pytest.raises(SamplerInputError) as e:
        get_sampler("sigmoid", temperature=1.0)(dt, None, tl)
    assert "sigmoid at T > 0 cannot verify a deterministic draft (draft_logits=None)" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(SamplerInputError, match="cannot verify a deterministic draft"):
        get_sampler("sigmoid", preset="paper")(dt, None, tl)
    got = get_sampler("sigmoid", temperature=0.0)(dt, None, tl)
    want = get_sampler("greedy")(dt, None, tl)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.accepted, want.accepted)
    assert not get_sampler("sigmoid").takes_deterministic_drafts and get_sampler("exact").takes_deterministic_drafts


def test_validation_takes_none_and_still_checks_the_rest():
    dt, tl = det_inputs(B=2, gamma=3)
    validate_inputs(dt, None, tl)
    s = get_sampler("exact")
    with pytest.raises(SamplerInputError, match=r"target_logits has shape \[2, 3, 50\].*\[2, 3\]"):
        s(dt, None, tl[:, :3])
    with pytest.raises(SamplerInputError, match="int64"):
        s(dt.int(), None, tl)
    with pytest.raises(SamplerInputError, match=r"target_logits must be a 3-d tensor"):
        s(dt, None, tl[0])
    with pytest.raises(SamplerInputError, match=r"draft_logits must be a 3-d tensor \[B, γ, V_d\] \(or None"):
        s(dt, tl[0], tl)


@pytest.mark.parametrize("name,temperature", RULE_TEMPERATURES)
def test_every_rule_verifies_none_as_it_verifies_one_hot_logits(name, temperature):
    """Same uniforms, same tokens: None is the point-mass draft that one-hot logits encode. exact, greedy and the
    rules that read only the target give the very same tokens (exact's residual is bit for bit the one-hot one);
    block and fuzzy compute their stop probabilities and divergences in closed form, so a row may differ only where
    fp32 rounding decides (at most 1 % of rows; none did when this was written)."""
    sampler = get_sampler(name, temperature=temperature)
    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    if RULES[name].batch_one:   # hf: one row per call
        inputs = [det_inputs(B=1, seed=k, dtype=dtypes[k % 3]) for k in range(60)]
    else:
        inputs = [det_inputs(B=400, seed=k, dtype=dtype) for k, dtype in enumerate(dtypes)]
    same = total = 0
    for k, (dt, tl) in enumerate(inputs):
        got = sampler(dt, None, tl, generator=torch.Generator().manual_seed(k))
        want = sampler(dt, one_hot(dt, tl.shape[-1], tl.dtype), tl, generator=torch.Generator().manual_seed(k))
        assert torch.equal(got.target_ok, want.target_ok) and bool(got.draft_ok.all())
        same += int((got.tokens == want.tokens).all(1).sum())
        total += dt.shape[0]
    if name in ("block", "fuzzy"):
        assert same >= 0.99 * total, f"{total - same} of {total} rows differ"
    else:
        assert same == total, f"{total - same} of {total} rows differ"


def test_the_comparison_has_teeth_rows_accept_and_reject():
    dt, tl = det_inputs(B=400)
    res = get_sampler("exact")(dt, None, tl, generator=torch.Generator().manual_seed(0))
    assert bool((res.accepted == 0).any()) and bool((res.accepted >= 2).any())


class AllocationRecorder(TorchDispatchMode):
    """Shapes of the tensors the ops inside it allocate (outputs sharing no storage with an input: not views, not
    in-place results)."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.shapes.append(tuple(t.shape))
        return out


@pytest.mark.parametrize("name,temperature", [nt for nt in RULE_TEMPERATURES if not RULES[nt[0]].batch_one])
def test_no_draft_sized_tensor_is_allocated(name, temperature):
    """With draft_logits None no op allocates a tensor of B·γ·V elements (the size of the one-hot logits it
    replaces, or of their softmax) beyond those the rule allocates from the target alone, which it allocates just
    the same with draft logits (typical's entropy and relaxed's ranks are over the target's γ positions). The same
    recorder sees the draft's softmax with one-hot logits, so it can tell. hf (batch 1) builds its one-hot logits on
    purpose: transformers' function takes nothing else (pipeline/samplers/hf.py)."""
    B, gamma, V = 3, 4, 50
    dt, tl = det_inputs(B=B, gamma=gamma, V=V)
    sampler = get_sampler(name, temperature=temperature)

    def draft_sized(dl):
        with AllocationRecorder() as rec:
            sampler(dt, dl, tl, generator=torch.Generator().manual_seed(0))
        return sorted(s for s in rec.shapes if int(np.prod(s)) == B * gamma * V)

    none = draft_sized(None)
    target_only = {"typical", "relaxed"}
    assert none == ([] if name not in target_only else draft_sized(torch.randn(B, gamma, V))), none
    if name in ("exact", "block", "fuzzy") and temperature > 0:
        assert draft_sized(one_hot(dt, V)), "the recorder does not see the draft's softmax: the test has no teeth"


@pytest.mark.parametrize("name,temperature", [nt for nt in RULE_TEMPERATURES if not RULES[nt[0]].batch_one])
def test_never_syncs_with_the_host(name, temperature):
    dt, tl = det_inputs(B=3, gamma=4, dtype=torch.bfloat16)
    assert_no_host_sync(get_sampler(name, temperature=temperature), dt, None, tl,
                        generator=torch.Generator().manual_seed(0))
    assert_no_host_sync(lambda: get_sampler(name, temperature=temperature)(
        dt, None, tl, generator=torch.Generator(), lengths=torch.tensor([0, 2, 4])))


@pytest.mark.parametrize("name,temperature", [nt for nt in RULE_TEMPERATURES if not RULES[nt[0]].batch_one])
def test_a_row_with_its_own_draft_length_verifies_as_it_would_alone(name, temperature):
    """Per-row lengths with a deterministic draft: row b of a batch verifies as it would alone with γ = g_b, and the
    padding (the target's argmax) would be accepted if it were read."""
    assert_rows_verify_as_alone(get_sampler(name, temperature=temperature), seeds=range(4), deterministic=True)


def test_hf_cuts_a_deterministic_draft_to_the_rows_own_length():
    sampler = get_sampler("hf")
    dt, _, tl = per_row_inputs(3)
    for b, g in enumerate(PER_ROW_LENGTHS):
        res = sampler(dt[b:b + 1], None, tl[b:b + 1], generator=torch.Generator().manual_seed(b),
                      lengths=torch.tensor([g]))
        alone = sampler(dt[b:b + 1, :g], None, tl[b:b + 1, : g + 1], generator=torch.Generator().manual_seed(b))
        n = int(alone.accepted)
        assert int(res.accepted) == n and res.tokens[0, : n + 1].tolist() == alone.tokens[0, : n + 1].tolist()


@pytest.mark.parametrize("name,temperature", RULE_TEMPERATURES)
def test_non_finite_target_logits_are_flagged_and_draft_ok_holds(name, temperature):
    dt, tl = det_inputs(B=1 if RULES[name].batch_one else 4, gamma=3, V=20, seed=2)
    tl[0, :, :] = float("nan")
    if RULES[name].batch_one:   # HF has no check of its own: NaN reaches torch.multinomial, which raises
        with pytest.raises(RuntimeError):
            get_sampler(name, temperature=temperature)(dt, None, tl, generator=torch.Generator())
        return
    res = get_sampler(name, temperature=temperature)(dt, None, tl, generator=torch.Generator())
    assert bool(res.draft_ok.all())
    with pytest.raises(NonFiniteLogitsError, match=r"target_logits .* rows \[0\]"):
        res.check()


def test_at_zero_temperature_every_lossless_rule_is_greedy_matching():
    """At T = 0 exact, block (and typical, fuzzy, sigmoid, which verify greedily there) accept while x is the target's
    argmax and emit the argmax: the same tokens as greedy, with or without logits."""
    dt, tl = det_inputs(B=500, seed=5)
    argmax = tl.argmax(-1)
    want = get_sampler("greedy")(dt, None, tl)
    match = (dt == argmax[:, :4]).long().cumprod(1).sum(1)
    assert torch.equal(want.accepted, match) and bool((want.accepted > 0).any()) and bool((want.accepted < 4).any())
    assert torch.equal(want.tokens, get_sampler("greedy")(dt, one_hot(dt, 50), tl).tokens)
    for name in ("exact", "block", "typical", "fuzzy", "sigmoid"):
        got = get_sampler(name, temperature=0.0)(dt, None, tl, generator=torch.Generator().manual_seed(1))
        assert torch.equal(got.tokens, want.tokens) and torch.equal(got.accepted, want.accepted), name


def test_js_to_a_point_mass_is_the_divergence_from_one_hot():
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(2_000, 30, generator=g) * torch.rand(2_000, 1, generator=g) * 6, -1)
    x = torch.randint(0, 30, (2_000,), generator=g)
    a = p.gather(1, x[:, None]).squeeze(1)
    closed = js_to_point_mass(a)
    full = js_divergence(p.double(), torch.nn.functional.one_hot(x, 30).double())
    torch.testing.assert_close(closed.double(), full, atol=2e-6, rtol=0)
    ends = js_to_point_mass(torch.tensor([0.0, 1e-30, 0.5, 1.0]))
    assert ends[0].item() == pytest.approx(LN2) and ends[-1].item() == pytest.approx(0.0, abs=1e-7)
    assert bool((ends[:-1] >= ends[1:]).all())


def test_block_stop_probabilities_in_closed_form_are_the_general_ones_with_a_point_mass():
    """block.py's closed forms (P_i, h_i) for q one-hot equal what its general stop_probs computes with one-hot q."""
    dt, tl = det_inputs(B=300, gamma=5, seed=6)
    p = softmax_fp32(tl, 1.0)
    q = softmax_fp32(one_hot(dt, 50), 1.0)
    a = p[:, :5].gather(2, dt[..., None]).squeeze(2)
    surv = survival_probs(a, torch.ones_like(a))
    torch.testing.assert_close(surv, survival_probs(a, q.gather(2, dt[..., None]).squeeze(2)), rtol=0, atol=0)
    torch.testing.assert_close(deterministic_stop_probs(a, surv), stop_probs(p, q, surv), rtol=1e-5, atol=1e-6)


# ---- exactness: chi-square against the target ----------------------------------------------------------------

@dataclass
class DetCase:
    """Target logits [γ+1, V] that do not depend on the prefix, and the γ tokens a deterministic drafter proposes."""

    target: torch.Tensor
    tokens: torch.Tensor
    temperature: float = 1.0
    dtype: torch.dtype = torch.float32
    n: int = N_SAMPLES

    @property
    def gamma(self) -> int:
        return self.tokens.shape[0]

    def probs(self) -> torch.Tensor:
        """float64 [γ+1, V]: the target's tempered softmax of the logits as the sampler sees them."""
        return torch.softmax(self.target.to(self.dtype).double() / self.temperature, -1)

    def accepted_law(self) -> np.ndarray:
        """P(accepted = k), k = 0..γ: P(accepted >= k) = Π_{i<k} p_i(x_i)."""
        p = self.probs()
        return accepted_distribution(p[: self.gamma].gather(1, self.tokens[:, None]).squeeze(1).numpy())


def make_det_cases() -> dict[str, DetCase]:
    g = torch.Generator().manual_seed(4321)
    V, gamma = 10, 3
    t = torch.randn(gamma + 1, V, generator=g) * 2
    order = t[:gamma].argsort(-1, descending=True)
    x = torch.stack([order[0, 1], order[1, 0], order[2, 3]])        # the second choice, the first, the fourth
    cases = {"mixed": DetCase(t, x), "mixed_T0.7": DetCase(t, x, temperature=0.7)}
    impossible = t.clone()
    impossible[0, x[0]] = NEG_INF                                      # the target gives x_0 probability 0
    cases["impossible_first"] = DetCase(impossible, x)
    certain = t.clone()
    certain[1] = NEG_INF
    certain[1, x[1]] = 0.0                                             # the target is sure of x_1
    cases["certain_second"] = DetCase(certain, x, temperature=0.7)
    Vl = 32_000
    tl = torch.randn(gamma + 1, Vl, generator=g)
    tl[:, [3, 999, 17_000, 31_999]] += torch.tensor([11.0, 10.5, 10.0, 9.5])
    cases["large_vocab"] = DetCase(tl, torch.tensor([999, 3, 31_999]), n=2_000)
    cases["bf16"] = DetCase(t * 3, x, dtype=torch.bfloat16)
    return cases


DET_CASES = make_det_cases()


def run_det_case(sampler, case: DetCase, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``case.n`` independent steps of the deterministic draft (fewer on the CPU runtime and for hf, which runs one
    row per call), in chunks of at most 2^25 target logits. Returns (tokens [n, γ+1], accepted [n])."""
    g = torch.Generator().manual_seed(seed)
    device, sg = _on_device(sampler, g)
    n = case.n
    chunk = max(1, min(2_000, 2**25 // case.target.numel()))
    if sampler.backend == CPU_RUNTIME:
        n = min(n, 2_500)
    if RULES[sampler.name].batch_one:
        # one row per call, from torch's global generator seeded once (hf seeds a forked generator per call when it
        # is handed one, which costs more than its step), forked so that the test leaves it as it found it
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            rows = [sampler(case.tokens[None], None, case.target.to(case.dtype)[None]).check()
                    for _ in range(min(n, HF_SAMPLES))]
        return (np.concatenate([r.tokens.numpy() for r in rows]), np.concatenate([r.accepted.numpy() for r in rows]))
    tokens, accepted = [], []
    for start in range(0, n, chunk):
        b = min(chunk, n - start)
        dt = case.tokens.expand(b, -1).to(device)
        tl = case.target.to(case.dtype).expand(b, -1, -1).to(device)
        res = sampler(dt, None, tl, generator=sg).check()
        tokens.append(res.tokens.cpu().numpy())
        accepted.append(res.accepted.cpu().numpy())
    return np.concatenate(tokens), np.concatenate(accepted)


def first_token_pvalue(sampler, case: DetCase, seed: int) -> tuple[float, float]:
    """Chi-square p-values of (the first emitted token against the target's p_0, the accepted count against its
    law): what the exactness test asserts, and what the negative controls must fail."""
    tokens, accepted = run_det_case(sampler, case, seed)
    p = case.probs()
    return (chisquare_pvalue(counts(tokens[:, 0], p.shape[1]), p[0].numpy()),
            chisquare_pvalue(counts(accepted, case.gamma + 1), case.accepted_law()))


def _backend_cases():
    cases = [("exact", b, c) for b in EXACT_BACKENDS for c in DET_CASES if b != CPU_RUNTIME or c in CPU_RUNTIME_CASES]
    cases += [("block", "torch", c) for c in DET_CASES]
    cases += [("hf", "torch", c) for c in ("mixed", "mixed_T0.7")]
    return cases


@pytest.mark.parametrize("rule,backend,name", _backend_cases())
def test_first_token_follows_the_target_and_accepted_count_its_law(rule, backend, name):
    case = DET_CASES[name]
    sampler = make_sampler(rule, backend, temperature=case.temperature)
    tokens, accepted = run_det_case(sampler, case, seed=zlib.crc32(f"{rule}{name}".encode()))
    p = case.probs()
    assert_fits(counts(tokens[:, 0], p.shape[1]), p[0].numpy(), f"{rule} {backend} {name}: first token vs target")
    assert_fits(counts(accepted, case.gamma + 1), case.accepted_law(), f"{rule} {backend} {name}: accepted count")
    pos = np.arange(case.gamma + 1)
    assert ((tokens == -1) == (pos[None] > accepted[:, None])).all()
    kept = pos[None, :-1] < accepted[:, None]
    assert (tokens[:, : case.gamma] == case.tokens.numpy()[None])[kept].all(), "the emitted prefix is not the draft"
    if name == "impossible_first":
        assert (accepted == 0).all()


def markov_det_first_two(sampler, m, n: int, temperature: float, seed: int) -> np.ndarray:
    """First two emitted tokens, int [n, 2], of a deterministic drafter on the Markov model of
    test_sampler_exactness (the target at step k depends on the previous token): the drafter proposes token 2 first
    and then f(a) = (3a + 1) mod V after a. Rows whose first step emitted one token run a second step (γ = 1) from
    the context it emitted."""
    g = torch.Generator().manual_seed(seed)
    device, sg = _on_device(sampler, g)
    V = m["p1"].shape[0]

    def f(a):
        return (3 * a + 1) % V

    x1 = torch.full((n,), 2)
    x2 = f(x1)
    tl = torch.stack([m["p1"].expand(n, V), m["p2"][x1], m["p3"][x1, x2]], 1)
    res = sampler(torch.stack([x1, x2], 1).to(device), None, tl.to(device), generator=sg).check()
    tokens, accepted = res.tokens.cpu(), res.accepted.cpu()
    y1 = tokens[:, 0]
    x1b = f(y1)
    res2 = sampler(x1b[:, None].to(device), None, torch.stack([m["p2"][y1], m["p3"][y1, x1b]], 1).to(device),
                   generator=sg).check()
    y2 = torch.where(accepted >= 1, tokens[:, 1], res2.tokens[:, 0].cpu())
    return torch.stack([y1, y2], 1).numpy()


def joint_pvalue(sampler, temperature: float, n: int = N_SAMPLES, seed: int = 17) -> float:
    m = markov_model(seed=7)
    V = m["p1"].shape[0]
    pairs = markov_det_first_two(sampler, m, n, temperature, seed)
    joint = torch.softmax(m["p1"] / temperature, -1)[:, None] * torch.softmax(m["p2"] / temperature, -1)
    return chisquare_pvalue(counts(pairs[:, 0] * V + pairs[:, 1], V * V), joint.double().flatten().numpy())


@pytest.mark.parametrize("rule,backend", [("exact", b) for b in EXACT_BACKENDS] + [("block", "torch")])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_joint_of_the_first_two_tokens_is_the_targets(rule, backend, temperature):
    sampler = make_sampler(rule, backend, temperature=temperature)
    pvalue = joint_pvalue(sampler, temperature, n=2_500 if backend == CPU_RUNTIME else N_SAMPLES)
    assert pvalue > THRESHOLD, f"{rule} {backend} T={temperature}: joint of the first two tokens, p = {pvalue:.3g}"


def test_block_accepts_what_exact_accepts_in_law():
    """block.py's docstring: with a deterministic draft P(τ >= k) = Π p_i(x_i) for block, exact's law (and the most
    a lossless rule can accept), so paired on the same inputs the mean accepted counts agree."""
    case = DET_CASES["mixed"]
    _, exact = run_det_case(get_sampler("exact"), case, seed=21)
    _, block = run_det_case(get_sampler("block"), case, seed=21)
    expected = (case.accepted_law() * np.arange(case.gamma + 1)).sum()
    for got in (exact, block):
        assert abs(got.mean() - expected) < 4 * got.std() / np.sqrt(len(got))


# ---- negative controls: the same tests must reject broken variants -------------------------------------------

class AcceptsTheDraftAlways(ExactSampler):
    """WRONG: accepts a deterministic draft's token with probability 1 (q(x) = 1 read as 'the ratio is 1')."""

    def verify_checked(self, draft_tokens, draft_logits, target_logits, generator, lengths=None):
        B, gamma = draft_tokens.shape
        p = softmax_fp32(target_logits, 1 / self.temperature)
        ones = torch.ones(B, gamma)
        accepted, nxt = rejection_verify(draft_tokens, ones, ones * 0.5, lambda n: rows_at(p, n), None,
                                         uniforms(B, gamma, p.device, generator), lengths)
        ok = torch.ones(B, dtype=torch.bool)
        return SamplerResult(accepted, assemble_tokens(draft_tokens, accepted, nxt), ok, ok)


class KeepsTheDraftTokenInTheResidual(ExactSampler):
    """WRONG: accepts x with probability p(x), but on rejection draws from p itself, x not removed."""

    def verify_checked(self, draft_tokens, draft_logits, target_logits, generator, lengths=None):
        B, gamma = draft_tokens.shape
        p = softmax_fp32(target_logits, 1 / self.temperature)
        p_x = p[:, :gamma].gather(2, draft_tokens[..., None]).squeeze(2)
        accepted, nxt = rejection_verify(draft_tokens, p_x, torch.ones_like(p_x), lambda n: rows_at(p, n),
                                         lambda n: torch.zeros_like(rows_at(p, n)),
                                         uniforms(B, gamma, p.device, generator), lengths)
        ok = torch.ones(B, dtype=torch.bool)
        return SamplerResult(accepted, assemble_tokens(draft_tokens, accepted, nxt), ok, ok)


@pytest.mark.parametrize("wrong", [AcceptsTheDraftAlways, KeepsTheDraftTokenInTheResidual])
@pytest.mark.parametrize("name", ["mixed", "mixed_T0.7"])
def test_negative_control_broken_variants_fail_the_first_token_test(wrong, name):
    case = DET_CASES[name]
    first, _ = first_token_pvalue(wrong(temperature=case.temperature), case, seed=99)
    assert first <= THRESHOLD, f"{wrong.__name__} on {name} passed (p = {first:.3g}): the test has no power"
    right, _ = first_token_pvalue(ExactSampler(temperature=case.temperature), case, seed=99)
    assert right > THRESHOLD


@pytest.mark.parametrize("wrong", [AcceptsTheDraftAlways, KeepsTheDraftTokenInTheResidual])
def test_negative_control_broken_variants_fail_the_joint_test(wrong):
    assert joint_pvalue(wrong(temperature=1.0), 1.0) <= THRESHOLD
