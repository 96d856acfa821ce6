"""Proof that the verify step preserves the target distribution (and that the test could tell if it did not).

Each case fixes target logits for γ+1 positions and draft logits for γ positions, independent of the
prefix. The test samples draft tokens from the draft's softmax, runs the sampler on many rows at once, and
compares with closed forms:

  first emitted token     exact: the target's softmax at position 0
                          any rejection sampler: q(y) min(1, w_t(y)/w_d(y)) + P(reject) norm(max(0, w_t - w_d))(y)
  accepted count          P(accepted >= k) = prod_{i<k} beta_i,  beta_i = sum_x q_i(x) min(1, w_t,i(x)/w_d,i(x))
                          (for exact: beta_i = sum_x min(p_i(x), q_i(x)))
  first two tokens        a Markov toy model, run through a second step where the first one emitted only one
                          token: joint = p_1(a) p_2(b | a)

Backends other than torch are held to the same tests through ``EXACT_BACKENDS`` / ``SIGMOID_BACKENDS``; each runs
on its own device (``BACKEND_DEVICES``: the cupy kernels on CUDA), with results brought back to the CPU. The CUDA
kernels also run here on the CPU runtime for CUDA kernels (tests/cuda_on_cpu, backend ``cuda-on-cpu``) in every
CI run: on a subset of the cases and with at most ``CPU_RUNTIME_SAMPLES`` rows, as it runs every GPU thread.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass

import cuda_on_cpu
import numpy as np
import pytest
import torch
from stat_utils import THRESHOLD, assert_fits, chisquare_pvalue, counts

from pipeline.samplers import available_samplers, get_sampler
from pipeline.samplers.contract import SamplerResult, assemble_tokens, uniforms
from pipeline.samplers.torch_ref import ExactSampler, rejection_verify, rows_at, softmax_fp32

NEG_INF = float("-inf")
N_SAMPLES = 20_000
EXACT_BACKENDS = sorted({b for n, b in available_samplers() if n == "exact"})
SIGMOID_BACKENDS = sorted({b for n, b in available_samplers() if n == "sigmoid"})
BACKEND_DEVICES = {"cupy": "cuda"}  # every other backend runs on the CPU
CPU_RUNTIME = "cuda-on-cpu"         # the CUDA kernels on the CPU runtime (where a C++ compiler exists)
CPU_RUNTIME_SAMPLES = 2_500       # ~1 minute for all its tests on 2 cores
CPU_RUNTIME_CASES = ("disjoint_supports", "draft_zeros_where_target_is_not", "draft_vocab_smaller", "bf16_logits")
if cuda_on_cpu.compiler() is not None:
    EXACT_BACKENDS.append(CPU_RUNTIME)
    SIGMOID_BACKENDS.append(CPU_RUNTIME)


@functools.cache
def _cpu_runtime_samplers() -> dict:
    from pipeline.kernels import loader
    from pipeline.samplers import cupy_backend

    library = cuda_on_cpu.KernelLibrary(cuda_on_cpu.build(loader.SOURCE_PATH, loader.NAME_EXPRESSIONS))
    return cupy_backend.bind(cuda_on_cpu.CpuLauncher(library))


def make_sampler(name: str, backend: str, **params):
    """get_sampler, plus the CPU runtime backend of the tests."""
    if backend == CPU_RUNTIME:
        return _cpu_runtime_samplers()[name](**params)
    return get_sampler(name, backend=backend, **params)


def backend_cases(backends: list[str], names) -> list[tuple[str, str]]:
    """(case name, backend) pairs: every case for every backend, the CPU runtime on CPU_RUNTIME_CASES only."""
    return [(n, b) for b in backends for n in names if b != CPU_RUNTIME or n in CPU_RUNTIME_CASES]


def _on_device(sampler, g: torch.Generator):
    """(device, generator) a sampler runs with: the CPU and ``g`` itself, or CUDA and a generator seeded from g."""
    device = BACKEND_DEVICES.get(sampler.backend, "cpu")
    if device == "cpu":
        return device, g
    return device, torch.Generator(device=device).manual_seed(int(torch.randint(2**62, (1,), generator=g)))


@dataclass
class Case:
    """Logits that do not depend on the prefix. target [γ+1, V_t], draft [γ, V_d]."""

    target: torch.Tensor
    draft: torch.Tensor
    temperature: float = 1.0
    dtype: torch.dtype = torch.float32
    n: int = N_SAMPLES

    @property
    def gamma(self) -> int:
        return self.draft.shape[0]

    def probs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(p [γ+1, V_t], q [γ, V_t] zero-padded) from the logits as the sampler sees them (rounded to dtype)."""
        t = self.target.to(self.dtype).float() / self.temperature
        d = self.draft.to(self.dtype).float() / self.temperature
        q = torch.softmax(d, -1)
        q = torch.nn.functional.pad(q, (0, t.shape[-1] - q.shape[-1]))
        return torch.softmax(t, -1).double(), q.double()


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _random_logits(g, *shape, scale=2.0):
    return torch.randn(*shape, generator=g) * scale


def make_cases() -> dict[str, Case]:
    g = _gen(1234)
    V, gamma = 10, 3
    cases = {}
    t = _random_logits(g, gamma + 1, V)
    cases["draft_equals_target"] = Case(t, t[:gamma].clone())

    t = torch.full((gamma + 1, V), NEG_INF)
    d = torch.full((gamma, V), NEG_INF)
    t[:, :5] = _random_logits(g, gamma + 1, 5)
    d[:, 5:] = _random_logits(g, gamma, 5)
    cases["disjoint_supports"] = Case(t, d)

    t = _random_logits(g, gamma + 1, V)
    t[:, 7] = t[:, :7].min() - 1.0  # the draft's only token is unlikely under the target
    d = torch.full((gamma, V), NEG_INF)
    d[:, 7] = 0.0
    cases["one_hot_draft_on_wrong_token"] = Case(t, d)

    t = _random_logits(g, gamma + 1, V)
    d = _random_logits(g, gamma, V)
    d[:, :4] = NEG_INF  # draft gives zero probability where the target does not
    cases["draft_zeros_where_target_is_not"] = Case(t, d)

    Vl = 32_000
    t = _random_logits(g, gamma + 1, Vl, scale=1.0)
    d = _random_logits(g, gamma, Vl, scale=1.0)
    t[:, [3, 999, 17_000, 31_999]] += torch.tensor([11.0, 10.5, 10.0, 9.5])
    d[:, [3, 17_000, 25_000]] += torch.tensor([10.0, 11.0, 10.5])
    cases["large_vocab_few_heavy_tokens"] = Case(t, d, n=8_000)

    t, d = _random_logits(g, gamma + 1, V), _random_logits(g, gamma, V)
    cases["temperature_0.7"] = Case(t, d, temperature=0.7)
    cases["temperature_1.5"] = Case(t, d, temperature=1.5)

    t = _random_logits(g, gamma + 1, V + 1)
    t[:, V] += 1.5  # the padded entry has real target mass; the draft cannot propose it
    cases["draft_vocab_smaller"] = Case(t, _random_logits(g, gamma, V))

    t, d = _random_logits(g, gamma + 1, V), _random_logits(g, gamma, V)
    cases["fp16_logits"] = Case(t * 3, d * 3, dtype=torch.float16)
    cases["bf16_logits"] = Case(t * 3, d * 3, dtype=torch.bfloat16)
    return cases


CASES = make_cases()


def run_case(sampler, case: Case, seed: int, chunk: int = 2_000) -> tuple[np.ndarray, np.ndarray]:
    """Run ``case.n`` independent verify steps (as batch rows; CPU_RUNTIME_SAMPLES at most on the CPU runtime).
    Returns (tokens [n, γ+1], accepted [n])."""
    g = _gen(seed)
    device, sg = _on_device(sampler, g)
    _, q = case.probs()
    gamma = case.gamma
    n = min(case.n, CPU_RUNTIME_SAMPLES) if sampler.backend == CPU_RUNTIME else case.n
    all_tokens, all_accepted = [], []
    for start in range(0, n, chunk):
        b = min(chunk, n - start)
        draft_tokens = torch.stack(
            [torch.multinomial(q[i].float(), b, replacement=True, generator=g) for i in range(gamma)], dim=1)
        dl = case.draft.to(case.dtype).expand(b, -1, -1)
        tl = case.target.to(case.dtype).expand(b, -1, -1)
        res = sampler(draft_tokens.to(device), dl.to(device), tl.to(device), generator=sg)
        res.check()
        all_tokens.append(res.tokens.cpu().numpy())
        all_accepted.append(res.accepted.cpu().numpy())
    return np.concatenate(all_tokens), np.concatenate(all_accepted)


def accepted_distribution(beta: np.ndarray) -> np.ndarray:
    """P(accepted = k), k = 0..γ, from per-position acceptance probabilities beta [γ]."""
    surv = np.concatenate([[1.0], np.cumprod(beta)])  # P(accepted >= k)
    return np.append(surv[:-1] - surv[1:], surv[-1])


def rejection_closed_form(w_t: torch.Tensor, w_d: torch.Tensor, q: torch.Tensor):
    """For weights w_t [V], w_d [V] (padded), draft distribution q [V]: (first-token dist, acceptance prob)."""
    ratio = torch.where(w_d > 0, (w_t / w_d).clamp(max=1.0), torch.zeros_like(w_t))
    accept_mass = q * ratio
    beta = accept_mass.sum()
    resid = (w_t - w_d).clamp(min=0)
    resid = resid / resid.sum() if resid.sum() > 1e-12 * w_t.sum() else w_t / w_t.sum()
    return accept_mass + (1 - beta) * resid, beta


@pytest.mark.parametrize("name,backend", backend_cases(EXACT_BACKENDS, CASES))
def test_exact_first_token_and_acceptance_follow_closed_forms(name, backend):
    case = CASES[name]
    sampler = make_sampler("exact", backend, temperature=case.temperature)
    tokens, accepted = run_case(sampler, case, seed=zlib.crc32(name.encode()))
    p, q = case.probs()
    assert_fits(counts(tokens[:, 0], p.shape[1]), p[0].numpy(), f"{name}: first emitted token vs target")
    beta = torch.minimum(p[: case.gamma], q).sum(-1).numpy()
    assert_fits(counts(accepted, case.gamma + 1), accepted_distribution(beta), f"{name}: accepted count")
    # tokens past the emitted ones are -1, and the emitted prefix is the drafted prefix
    pos = np.arange(case.gamma + 1)
    assert ((tokens == -1) == (pos[None] > accepted[:, None])).all()


@pytest.mark.parametrize("name,backend", backend_cases(SIGMOID_BACKENDS, [
    "draft_equals_target", "temperature_0.7", "one_hot_draft_on_wrong_token", "draft_vocab_smaller", "bf16_logits"]))
@pytest.mark.parametrize("alpha,beta", [(1.0, -20.0), (0.5, 0.0), (2.0, 1.0)])
def test_sigmoid_follows_its_own_closed_form(name, backend, alpha, beta):
    """The sigmoid sampler is not lossless, but it must compute exactly the rejection scheme it documents."""
    case = CASES[name]
    sampler = make_sampler("sigmoid", backend, temperature=case.temperature, alpha=alpha, beta=beta)
    tokens, accepted = run_case(sampler, case, seed=zlib.crc32(f"{name}{alpha}".encode()))
    _, q = case.probs()

    def w(logits):
        return torch.sigmoid(alpha * logits.to(case.dtype).double() / case.temperature + beta)

    w_t = w(case.target)
    w_d = torch.nn.functional.pad(w(case.draft), (0, w_t.shape[1] - case.draft.shape[1]))
    first, _ = rejection_closed_form(w_t[0], w_d[0], q[0])
    assert_fits(counts(tokens[:, 0], w_t.shape[1]), first.numpy(), f"sigmoid {name}: first token")
    betas = np.array([rejection_closed_form(w_t[i], w_d[i], q[i])[1].item() for i in range(case.gamma)])
    assert_fits(counts(accepted, case.gamma + 1), accepted_distribution(betas), f"sigmoid {name}: accepted")


def test_closed_form_of_exact_weights_is_the_target():
    """Sanity of the generic closed form used for sigmoid: with softmax weights it reduces to the target."""
    p, q = CASES["temperature_0.7"].probs()
    first, beta = rejection_closed_form(p[0], q[0], q[0])
    torch.testing.assert_close(first, p[0])
    assert beta.item() == pytest.approx(torch.minimum(p[0], q[0]).sum().item())


# ---- joint distribution of the first two emitted tokens (Markov toy model) ---------------------------------

def markov_model(seed: int, V: int = 6):
    g = _gen(seed)
    return {
        "p1": _random_logits(g, V), "p2": _random_logits(g, V, V), "p3": _random_logits(g, V, V, V),
        "q1": _random_logits(g, V), "q2": _random_logits(g, V, V),
    }


def first_two_tokens(sampler, m, n: int, temperature: float, seed: int) -> np.ndarray:
    """Emit two tokens per row with γ = 2, running a second verify step (γ = 1) for rows whose first step
    emitted one token. Returns int [n, 2]."""
    g = _gen(seed)
    device, sg = _on_device(sampler, g)
    V = m["p1"].shape[0]

    def draw(logits):  # logits [n, V] -> [n]
        return torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=g).squeeze(1)

    x1 = draw(m["q1"].expand(n, V))
    x2 = draw(m["q2"][x1])
    draft_logits = torch.stack([m["q1"].expand(n, V), m["q2"][x1]], 1)
    target_logits = torch.stack([m["p1"].expand(n, V), m["p2"][x1], m["p3"][x1, x2]], 1)
    res = sampler(torch.stack([x1, x2], 1).to(device), draft_logits.to(device), target_logits.to(device),
                  generator=sg)
    tokens, accepted = res.tokens.cpu(), res.accepted.cpu()
    y1, y2 = tokens[:, 0], tokens[:, 1]
    # rows that emitted only the corrected token need a second step from context y1
    x1b = draw(m["q2"][y1])
    res2 = sampler(x1b[:, None].to(device), m["q2"][y1][:, None].to(device),
                   torch.stack([m["p2"][y1], m["p3"][y1, x1b]], 1).to(device), generator=sg)
    y2 = torch.where(accepted >= 1, y2, res2.tokens[:, 0].cpu())
    return torch.stack([y1, y2], 1).numpy()


@pytest.mark.parametrize("backend", EXACT_BACKENDS)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_exact_joint_of_first_two_tokens(backend, temperature):
    m = markov_model(seed=7)
    V = m["p1"].shape[0]
    sampler = make_sampler("exact", backend, temperature=temperature)
    pairs = first_two_tokens(sampler, m, CPU_RUNTIME_SAMPLES if backend == CPU_RUNTIME else N_SAMPLES, temperature,
                             seed=11)
    joint = (torch.softmax(m["p1"] / temperature, -1)[:, None] * torch.softmax(m["p2"] / temperature, -1))
    assert_fits(counts(pairs[:, 0] * V + pairs[:, 1], V * V), joint.double().flatten().numpy(),
                f"joint of first two tokens, T={temperature}")


@pytest.mark.parametrize("backend", EXACT_BACKENDS)
def test_rows_of_one_batch_with_different_distributions(backend):
    """Interleave three cases in one batch; each row must follow its own target."""
    names = ["temperature_0.7", "disjoint_supports", "one_hot_draft_on_wrong_token"]
    n = CPU_RUNTIME_SAMPLES if backend == CPU_RUNTIME else 9_000
    g = _gen(5)
    which = torch.arange(n) % len(names)
    tl = torch.stack([CASES[k].target for k in names])[which]
    dl = torch.stack([CASES[k].draft for k in names])[which]
    # one temperature for the whole batch: use T = 1 probabilities of each case
    qs = torch.stack([torch.softmax(CASES[k].draft, -1) for k in names])
    draft_tokens = torch.stack(
        [torch.multinomial(qs[which, i], 1, generator=g).squeeze(1) for i in range(tl.shape[1] - 1)], 1)
    sampler = make_sampler("exact", backend)
    device, sg = _on_device(sampler, g)
    res = sampler(draft_tokens.to(device), dl.to(device), tl.to(device), generator=sg).check()
    tokens = res.tokens.cpu()
    for k, name in enumerate(names):
        rows = (which == k).numpy()
        p0 = torch.softmax(CASES[name].target[0], -1).double().numpy()
        assert_fits(counts(tokens[rows, 0].numpy(), p0.shape[0]), p0, f"batch rows of {name}")


# ---- negative controls: the same tests must reject deliberately wrong samplers -----------------------------

class ResampleFromTargetOnReject(ExactSampler):
    """WRONG: on rejection draws from the target instead of the residual max(0, p - q)."""

    def verify_checked(self, draft_tokens, draft_logits, target_logits, generator, lengths=None):
        B, gamma = draft_tokens.shape
        p, q = softmax_fp32(target_logits, 1 / self.temperature), softmax_fp32(draft_logits, 1 / self.temperature)
        idx = draft_tokens[..., None]
        accepted, nxt = rejection_verify(
            draft_tokens, p[:, :gamma].gather(2, idx).squeeze(2), q.gather(2, idx).squeeze(2),
            lambda n: rows_at(p, n), lambda n: torch.zeros_like(rows_at(q, n)), uniforms(B, gamma, p.device, generator))
        ok = torch.ones(B, dtype=torch.bool)
        return SamplerResult(accepted, assemble_tokens(draft_tokens, accepted, nxt), ok, ok)


class InvertedRatio(ExactSampler):
    """WRONG: accepts with probability min(1, q/p) instead of min(1, p/q)."""

    def verify_checked(self, draft_tokens, draft_logits, target_logits, generator, lengths=None):
        B, gamma = draft_tokens.shape
        p, q = softmax_fp32(target_logits, 1 / self.temperature), softmax_fp32(draft_logits, 1 / self.temperature)
        idx = draft_tokens[..., None]
        accepted, nxt = rejection_verify(
            draft_tokens, q.gather(2, idx).squeeze(2), p[:, :gamma].gather(2, idx).squeeze(2),
            lambda n: rows_at(p, n), lambda n: rows_at(q, n), uniforms(B, gamma, p.device, generator))
        ok = torch.ones(B, dtype=torch.bool)
        return SamplerResult(accepted, assemble_tokens(draft_tokens, accepted, nxt), ok, ok)


@pytest.mark.parametrize("wrong", [ResampleFromTargetOnReject, InvertedRatio])
@pytest.mark.parametrize("name", ["temperature_0.7", "temperature_1.5", "draft_zeros_where_target_is_not"])
def test_negative_control_wrong_samplers_fail_the_same_test(wrong, name):
    case = CASES[name]
    tokens, _ = run_case(wrong(temperature=case.temperature), case, seed=99)
    p, _ = case.probs()
    pvalue = chisquare_pvalue(counts(tokens[:, 0], p.shape[1]), p[0].numpy())
    assert pvalue <= THRESHOLD, f"{wrong.__name__} on {name} passed (p = {pvalue:.3g}): the test has no power"


def joint_pvalue(sampler, m, seed: int = 11) -> float:
    """Chi-square p-value of the first two emitted tokens of ``sampler`` against the Markov model's joint law."""
    V = m["p1"].shape[0]
    pairs = first_two_tokens(sampler, m, N_SAMPLES, 1.0, seed=seed)
    joint = torch.softmax(m["p1"], -1)[:, None] * torch.softmax(m["p2"], -1)
    return chisquare_pvalue(counts(pairs[:, 0] * V + pairs[:, 1], V * V), joint.double().flatten().numpy())


@pytest.mark.parametrize("wrong", [ResampleFromTargetOnReject, InvertedRatio])
def test_negative_control_fails_the_joint_test(wrong):
    assert joint_pvalue(wrong(temperature=1.0), markov_model(seed=7)) <= THRESHOLD
