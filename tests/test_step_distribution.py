"""A rule's step distribution in closed form (``Sampler.step_distribution``, ``bonus_distribution``): what its verify
step emits at a drafted position and after a full block, held to the verify step itself by sampling it.

Each case fixes the target's and the draft's logits at one drafted position and the bonus position, draws the draft
token from the draft's tempered softmax in each of N rows, and runs the rule at γ 1: the first emitted token's counts
fit the step distribution (chi-square, tests/stat_utils.py), the accepted share fits the acceptance probability, the
bonus tokens of the accepted rows fit the bonus distribution. A lossless rule's step distribution is the target's
softmax; the distortion bench (pipeline/benchmarks/distortion.py) reads a lossy rule's distance from it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats
from stat_utils import THRESHOLD, assert_fits, counts

from pipeline.samplers import get_sampler
from pipeline.samplers.torch_ref import softmax_fp32

N = 40_000
V = 8

CASES = [  # (rule, its parameters, temperature, the draft's vocabulary)
    ("exact", {}, 1.0, V),
    ("exact", {}, 0.7, V - 2),
    ("sigmoid", {}, 1.0, V),                              # the registry's α 1, β −20: no weight saturates
    ("sigmoid", {"alpha": 1.0, "beta": -1.0}, 1.0, V),    # the weights saturate: far from exact
    ("sigmoid", {"alpha": 2.0, "beta": 0.5}, 0.8, V - 2),
    ("typical", {}, 1.0, V),
    ("typical", {"epsilon": 0.3, "delta": 0.6}, 1.0, V - 2),
]


def _logits(seed: int, rows: int, size: int, scale: float = 2.0) -> torch.Tensor:
    return torch.randn(rows, size, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("name,params,temperature,v_d", CASES)
def test_the_verify_step_emits_its_step_distribution(name, params, temperature, v_d):
    sampler = get_sampler(name, temperature=temperature, **params)
    z_t = _logits(1, 2, V)                      # [position 0 (drafted), position 1 (bonus)], V_t
    z_d = _logits(2, 1, v_d)
    dist, acceptance = sampler.step_distribution(z_t[:1], z_d)
    assert dist.shape == (1, V) and acceptance.shape == (1,)
    torch.testing.assert_close(dist.sum(dim=1), torch.ones(1), rtol=0, atol=1e-5)
    bonus = sampler.bonus_distribution(z_t[1:])

    g = torch.Generator().manual_seed(3)
    q = softmax_fp32(z_d, 1.0 / temperature)
    draft_tokens = torch.multinomial(q.expand(N, -1), 1, replacement=True, generator=g)   # [N, 1]
    result = sampler(draft_tokens, z_d[None].expand(N, 1, v_d).contiguous(),
                     z_t[None].expand(N, 2, V).contiguous(), generator=g)
    first = result.tokens[:, 0].numpy()
    assert_fits(counts(first, V), dist[0].double().numpy(), f"{name} {params}: the first emitted token")
    accepted = int(result.accepted.sum())
    assert stats.binomtest(accepted, N, float(acceptance)).pvalue > THRESHOLD, (accepted / N, float(acceptance))
    full = result.accepted == 1
    assert_fits(counts(result.tokens[full, 1].numpy(), V), bonus[0].double().numpy(),
                f"{name} {params}: the bonus token")


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_a_lossless_rules_step_distribution_is_the_targets_and_a_lossy_ones_is_not(temperature):
    z_t, z_d = _logits(4, 16, 50), _logits(5, 16, 47)
    p = softmax_fp32(z_t, 1.0 / temperature)
    exact, _ = get_sampler("exact", temperature=temperature).step_distribution(z_t, z_d)
    torch.testing.assert_close(exact, p, rtol=0, atol=2e-6)
    saturated, _ = get_sampler("sigmoid", temperature=temperature, alpha=1.0, beta=0.0).step_distribution(z_t, z_d)
    assert float((saturated - p).abs().sum(dim=1).mean()) / 2 > 0.05        # its total variation from the target's


def test_the_exact_rules_acceptance_is_one_minus_the_total_variation():
    """Leviathan et al.'s α at one position: Σ min(p, q) = 1 − TV(p, q)."""
    z_t, z_d = _logits(6, 8, 30), _logits(7, 8, 30)
    p, q = softmax_fp32(z_t, 1.0), softmax_fp32(z_d, 1.0)
    _, acceptance = get_sampler("exact", temperature=1.0).step_distribution(z_t, z_d)
    torch.testing.assert_close(acceptance, torch.minimum(p, q).sum(dim=1), rtol=0, atol=1e-6)


def test_a_rule_without_a_closed_form_says_so():
    with pytest.raises(NotImplementedError, match="fuzzy has no closed-form step distribution"):
        get_sampler("fuzzy", temperature=1.0).step_distribution(_logits(8, 1, V), _logits(9, 1, V))


def test_the_sums_are_probabilities_on_wide_logits():
    """Logits of a real model's size (|z| up to ~30) and a vocabulary of thousands: no NaN, each row sums to 1."""
    z_t, z_d = _logits(10, 4, 5000, scale=10.0), _logits(11, 4, 5000, scale=10.0)
    for name, params in (("sigmoid", {}), ("sigmoid", {"alpha": 4.0, "beta": 0.0}), ("typical", {})):
        dist, acceptance = get_sampler(name, temperature=1.0, **params).step_distribution(z_t, z_d)
        assert not dist.isnan().any() and bool(((acceptance >= 0) & (acceptance <= 1 + 1e-6)).all())
        np.testing.assert_allclose(dist.sum(dim=1).numpy(), 1.0, atol=1e-4)


def test_the_sigmoid_far_below_saturation_is_exact_only_for_normalised_logits():
    """β → −∞ (α 1): the weights become exp(z / T + β), the ratio w_t / w_d misses exact's Z_d / Z_t. On
    log-probabilities (both normalisers 1) it is exact's distribution and acceptance; the target's logits shifted by a
    constant (the same p, another Z_t) move its distribution away from p."""
    z_t, z_d = _logits(12, 16, 40), _logits(13, 16, 40)
    p = softmax_fp32(z_t, 1.0)
    far = get_sampler("sigmoid", temperature=1.0, alpha=1.0, beta=-60.0)
    logp_t, logp_d = torch.log_softmax(z_t, dim=1), torch.log_softmax(z_d, dim=1)
    normalised, acceptance = far.step_distribution(logp_t, logp_d)
    torch.testing.assert_close(normalised, p, rtol=0, atol=1e-5)
    _, exact_acceptance = get_sampler("exact", temperature=1.0).step_distribution(z_t, z_d)
    torch.testing.assert_close(acceptance, exact_acceptance, rtol=0, atol=1e-5)
    shifted, _ = far.step_distribution(logp_t + 3.0, logp_d)            # the same p, a larger Z_t
    assert float((shifted - p).abs().sum(dim=1).mean()) / 2 > 0.01
