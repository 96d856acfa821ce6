"""Block verification (pipeline/samplers/block.py) is lossless, computes the algorithm it documents, and accepts at
least as many tokens as token-wise verification (`exact`).

  exact math       the law of one step, enumerated over every draft block in fp64, followed by target samples, is
                   the target's law of the first γ+1 tokens (and the wrong variants' is not)
  the sampler      its emitted block follows that enumerated law (chi-square over all emitted sequences), its
                   accepted counts follow the enumerated law of τ, its first token follows the target, and the
                   first two tokens of a Markov model follow the target jointly (the machinery of
                   test_sampler_exactness.py)
  acceptance       enumerated E[τ] >= token-wise E[accepted]; paired over the same inputs and uniforms, the
                   sampler's mean gain over `exact` is positive (one-sided 3-SE bound) and matches enumeration
  power            two wrong variants (stop at the first failing h_i; residual with p instead of p_τ · p) fail
                   the joint test and the exact-math check
The sampler contract (shapes, V_d < V_t, flags, no host sync) is tests/test_sampler_contract.py's, which lists
`block` among its torch samplers.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from stat_utils import THRESHOLD, assert_fits, chisquare_pvalue, counts
from test_sampler_contract import random_inputs
from test_sampler_exactness import CASES, N_SAMPLES, first_two_tokens, joint_pvalue, markov_model, run_case

from pipeline.samplers import get_sampler
from pipeline.samplers.block import BlockSampler, residual_draw, stop_probs, survival_probs
from pipeline.samplers.contract import SamplerResult, assemble_tokens, count_accepted, uniforms
from pipeline.samplers.torch_ref import softmax_fp32

# ---- the algorithm by enumeration (fp64, one draft block at a time) -----------------------------------------


def step_law(p_fn, q_fn, V: int, gamma: int, variant: str = "block"):
    """Exact law of one verify step by enumeration over every draft block X in V^γ.

    p_fn(prefix) -> float64 [V] target probabilities after the tuple ``prefix`` (length 0..γ); q_fn likewise for
    the draft (length 0..γ-1, zero past its vocabulary). variant: "block", or a wrong one of the negative
    controls: "first_failing" (τ = the last i before the first failing h_i) or "unscaled_residual" (the residual
    max(p - q, 0) instead of max(p_τ · p - q, 0)).
    Returns (P(τ = t) float64 [γ+1], {emitted tuple X^τ + (Y,): probability}).
    """
    tau_law = np.zeros(gamma + 1)
    law: dict[tuple, float] = defaultdict(float)
    for X in itertools.product(range(V), repeat=gamma):
        qs = [q_fn(X[:i]) for i in range(gamma)]
        q_block = np.prod([qs[i][X[i]] for i in range(gamma)])
        if q_block == 0:
            continue
        ps = [p_fn(X[:i]) for i in range(gamma + 1)]
        surv = [1.0]                                           # p_0 .. p_γ
        for i in range(gamma):
            surv.append(min(1.0, surv[-1] * ps[i][X[i]] / qs[i][X[i]]))
        h = []                                                 # h_1 .. h_γ
        for i in range(1, gamma):
            s = np.maximum(surv[i] * ps[i] - qs[i], 0).sum()
            h.append(s / (s + 1 - surv[i]) if s + 1 - surv[i] > 0 else 1.0)
        h.append(surv[gamma])
        for t in range(gamma + 1):
            if variant == "first_failing":                    # h_1..h_t pass, h_{t+1} fails
                p_t = np.prod(h[:t]) * (1 - h[t] if t < gamma else 1.0)
            else:                                              # h_t passes, every later one fails
                p_t = (h[t - 1] if t else 1.0) * np.prod([1 - x for x in h[t:]])
            if p_t == 0:
                continue
            if t == gamma:
                y = ps[gamma]
            else:
                r = np.maximum((1.0 if variant == "unscaled_residual" else surv[t]) * ps[t] - qs[t], 0)
                y = r / r.sum() if r.sum() > 1e-12 else ps[t]
            tau_law[t] += q_block * p_t
            for tok in np.flatnonzero(y):
                law[(*X[:t], int(tok))] += q_block * p_t * y[tok]
    return tau_law, dict(law)


def tokenwise_expected_accepted(p_fn, q_fn, V: int, gamma: int) -> float:
    """E[accepted] of token-wise verification (`exact`), by enumeration: Σ_X q(X) Σ_k Π_{i<k} min(1, p/q)."""
    total = 0.0
    for X in itertools.product(range(V), repeat=gamma):
        q_block, run, accepted = 1.0, 1.0, 0.0
        for i in range(gamma):
            p_i, q_i = p_fn(X[:i])[X[i]], q_fn(X[:i])[X[i]]
            q_block *= q_i
            run *= min(1.0, p_i / q_i) if q_i > 0 else 0.0
            accepted += run
        total += q_block * accepted
    return total


def composed_error(law: dict, p_fn, V: int, gamma: int) -> float:
    """Largest |P - target| over the first γ+1 tokens when one step's output (``law``) is continued with target
    samples: 0 (up to rounding) for a lossless step."""
    worst = 0.0
    for s in itertools.product(range(V), repeat=gamma + 1):
        cond = [p_fn(s[:i])[s[i]] for i in range(gamma + 1)]
        total = sum(law.get(s[:m], 0.0) * np.prod(cond[m:]) for m in range(1, gamma + 2))
        worst = max(worst, abs(total - np.prod(cond)))
    return worst


@dataclass
class TreeModel:
    """Target and draft logits that depend on the whole prefix: target[i] float [V_t]*i + [V_t] (i = 0..γ),
    draft[i] float [V_t]*i + [V_d] (i = 0..γ-1), V_d <= V_t (the draft proposes only ids below V_d)."""

    target: list
    draft: list
    temperature: float = 1.0

    @property
    def gamma(self) -> int:
        return len(self.draft)

    @property
    def vocab(self) -> int:
        return self.target[0].shape[-1]

    def p_fn(self, prefix: tuple) -> np.ndarray:
        return torch.softmax(self.target[len(prefix)][prefix].double() / self.temperature, -1).numpy()

    def q_fn(self, prefix: tuple) -> np.ndarray:
        q = torch.softmax(self.draft[len(prefix)][prefix].double() / self.temperature, -1).numpy()
        return np.pad(q, (0, self.vocab - q.shape[0]))

    def law(self, variant: str = "block"):
        return step_law(self.p_fn, self.q_fn, self.vocab, self.gamma, variant)

    def batch(self, n: int, g: torch.Generator):
        """n independent steps: (draft_tokens [n, γ], draft_logits [n, γ, V_d], target_logits [n, γ+1, V_t])."""
        x = torch.empty(n, 0, dtype=torch.int64)
        draft_logits = []
        for i in range(self.gamma):
            logits = self.draft[i][tuple(x.T)] if i else self.draft[0].expand(n, -1)
            draft_logits.append(logits)
            probs = torch.softmax(logits / self.temperature, -1)
            x = torch.cat([x, torch.multinomial(probs, 1, generator=g)], 1)
        target_logits = [self.target[i][tuple(x[:, :i].T)] if i else self.target[0].expand(n, -1)
                         for i in range(self.gamma + 1)]
        return x, torch.stack(draft_logits, 1), torch.stack(target_logits, 1)


def tree_model(seed: int, V: int, gamma: int, scale: float = 2.0, temperature: float = 1.0,
               draft_vocab: int | None = None) -> TreeModel:
    g = torch.Generator().manual_seed(seed)
    V_d = V if draft_vocab is None else draft_vocab
    target = [torch.randn(*[V] * i, V, generator=g) * scale for i in range(gamma + 1)]
    draft = [torch.randn(*[V] * i, V_d, generator=g) * scale for i in range(gamma)]
    return TreeModel(target, draft, temperature)


def from_markov(m: dict, temperature: float = 1.0) -> TreeModel:
    """test_sampler_exactness.markov_model (γ = 2) as a TreeModel."""
    return TreeModel([m["p1"], m["p2"], m["p3"]], [m["q1"], m["q2"]], temperature)


def run_steps(sampler, model: TreeModel, n: int, seed: int) -> SamplerResult:
    g = torch.Generator().manual_seed(seed)
    dt, dl, tl = model.batch(n, g)
    return sampler(dt, dl, tl, generator=g).check()


def emitted_counts(res: SamplerResult, law: dict) -> tuple[np.ndarray, np.ndarray]:
    """(observed counts, expected probabilities) over every emitted sequence ``law`` gives mass to."""
    cells = {seq: k for k, seq in enumerate(law)}
    tokens, accepted = res.tokens.numpy(), res.accepted.numpy()
    observed = np.zeros(len(cells) + 1)  # the last cell: a sequence the law says is impossible
    for row, acc in zip(tokens, accepted):
        observed[cells.get(tuple(row[: acc + 1].tolist()), len(cells))] += 1
    return observed, np.append(np.array(list(law.values())), 0.0)


# ---- the math: enumeration says block verification is lossless, and the wrong variants are not ---------------

MATH_MODELS = {
    "markov7": lambda: from_markov(markov_model(seed=7)),
    "markov15": lambda: from_markov(markov_model(seed=15)),
    "tree_V3_g3": lambda: tree_model(1, V=3, gamma=3),
    "tree_V3_g3_T0.6": lambda: tree_model(2, V=3, gamma=3, temperature=0.6),
    "tree_V4_g3_draft_vocab_3": lambda: tree_model(3, V=4, gamma=3, draft_vocab=3),
    "tree_V2_g4_flat": lambda: tree_model(4, V=2, gamma=4, scale=0.5),
}


@pytest.mark.parametrize("name", MATH_MODELS)
def test_enumerated_step_followed_by_target_samples_is_the_target(name):
    m = MATH_MODELS[name]()
    tau_law, law = m.law()
    assert tau_law.sum() == pytest.approx(1.0, abs=1e-12) and sum(law.values()) == pytest.approx(1.0, abs=1e-12)
    assert composed_error(law, m.p_fn, m.vocab, m.gamma) < 1e-12


def test_enumeration_has_power_the_wrong_variants_are_not_lossless():
    for name in ("markov15", "tree_V3_g3"):
        m = MATH_MODELS[name]()
        for variant in ("first_failing", "unscaled_residual"):
            assert composed_error(m.law(variant)[1], m.p_fn, m.vocab, m.gamma) > 1e-4, (name, variant)


def test_p_equal_q_after_a_fully_surviving_prefix_is_exact_whatever_h_is():
    """h_i = S / (S + 1 - p_i) is 0/0 where p_i = 1 and p = q after X^i; the sampler takes h_i = 1. Lossless."""
    m = tree_model(5, V=3, gamma=3)
    m.draft[1] = m.target[1].clone()  # p(· | X^1) = q(· | X^1) for every X_1
    _, law = m.law()
    assert composed_error(law, m.p_fn, m.vocab, m.gamma) < 1e-12
    res = run_steps(get_sampler("block"), m, 20_000, seed=5)
    assert_fits(*emitted_counts(res, law), "p = q after X^1: emitted block")


# ---- the sampler against the enumerated law -----------------------------------------------------------------

@pytest.mark.parametrize("name", MATH_MODELS)
def test_emitted_block_and_accepted_count_follow_the_enumerated_law(name):
    m = MATH_MODELS[name]()
    tau_law, law = m.law()
    res = run_steps(get_sampler("block", temperature=m.temperature), m, 30_000, seed=len(name))
    assert_fits(*emitted_counts(res, law), f"{name}: emitted block X^τ, Y")
    assert_fits(counts(res.accepted.numpy(), m.gamma + 1), tau_law, f"{name}: accepted count τ")


BLOCK_CASES = ["draft_equals_target", "disjoint_supports", "one_hot_draft_on_wrong_token",
               "draft_zeros_where_target_is_not", "temperature_0.7", "temperature_1.5", "draft_vocab_smaller",
               "bf16_logits"]


@pytest.mark.parametrize("name", BLOCK_CASES)
def test_first_token_follows_the_target_and_accepted_count_its_law(name):
    """The cases of test_sampler_exactness.py (logits independent of the prefix, γ = 3)."""
    case = CASES[name]
    tokens, accepted = run_case(get_sampler("block", temperature=case.temperature), case, seed=len(name) + 100)
    p, q = case.probs()
    assert_fits(counts(tokens[:, 0], p.shape[1]), p[0].numpy(), f"{name}: first emitted token vs target")
    tau_law, _ = step_law(lambda pre: p[len(pre)].numpy(), lambda pre: q[len(pre)].numpy(), p.shape[1],
                          case.gamma)
    assert_fits(counts(accepted, case.gamma + 1), tau_law, f"{name}: accepted count")
    pos = np.arange(case.gamma + 1)
    assert ((tokens == -1) == (pos[None] > accepted[:, None])).all()


@pytest.mark.parametrize("seed,temperature", [(7, 1.0), (7, 0.7), (15, 1.0), (8, 1.5)])
def test_joint_of_first_two_tokens(seed, temperature):
    m = markov_model(seed=seed)
    V = m["p1"].shape[0]
    pairs = first_two_tokens(get_sampler("block", temperature=temperature), m, N_SAMPLES, temperature, seed=11)
    joint = torch.softmax(m["p1"] / temperature, -1)[:, None] * torch.softmax(m["p2"] / temperature, -1)
    assert_fits(counts(pairs[:, 0] * V + pairs[:, 1], V * V), joint.double().flatten().numpy(),
                f"block: joint of first two tokens, markov seed {seed}, T={temperature}")


# ---- acceptance: never below token-wise --------------------------------------------------------------------

GAIN_MODELS = {"markov7": lambda: from_markov(markov_model(seed=7)),
               "tree_V4_g4": lambda: tree_model(6, V=4, gamma=4, scale=1.5)}


@pytest.mark.parametrize("name", [*MATH_MODELS, *GAIN_MODELS])
def test_enumerated_expected_acceptance_is_at_least_tokenwise(name):
    m = {**MATH_MODELS, **GAIN_MODELS}[name]()
    block = float(np.arange(m.gamma + 1) @ m.law()[0])
    assert block >= tokenwise_expected_accepted(m.p_fn, m.q_fn, m.vocab, m.gamma) - 1e-12


@pytest.mark.parametrize("name", GAIN_MODELS)
def test_paired_gain_over_exact_on_the_same_inputs(name):
    """Same draft blocks, logits and uniforms for both rules; the per-step difference in accepted tokens has a
    positive one-sided 3-SE lower bound, and each rule's mean matches its enumerated expectation (4 SE)."""
    m, n = GAIN_MODELS[name](), 40_000
    acc = {rule: run_steps(get_sampler(rule), m, n, seed=3).accepted.double() for rule in ("block", "exact")}
    diff = acc["block"] - acc["exact"]
    mean, se = diff.mean().item(), diff.std().item() / n**0.5
    expected_block = float(np.arange(m.gamma + 1) @ m.law()[0])
    expected_exact = tokenwise_expected_accepted(m.p_fn, m.q_fn, m.vocab, m.gamma)
    print(f"\n{name}: γ = {m.gamma}, accepted per step: block {acc['block'].mean():.4f} (enumerated "
          f"{expected_block:.4f}), exact {acc['exact'].mean():.4f} (enumerated {expected_exact:.4f}); gain "
          f"{mean:+.4f} ± {se:.4f} (SE), enumerated {expected_block - expected_exact:+.4f}")
    assert mean - 3 * se > 0, (mean, se)
    for rule, expected in (("block", expected_block), ("exact", expected_exact)):
        assert abs(acc[rule].mean().item() - expected) < 4 * acc[rule].std().item() / n**0.5, rule


# ---- negative controls ---------------------------------------------------------------------------------------

class _WrongBlock(BlockSampler):
    first_failing = False
    scale_residual = True

    def verify_checked(self, draft_tokens, draft_logits, target_logits, generator, lengths=None):
        B, gamma = draft_tokens.shape
        p, q = softmax_fp32(target_logits, 1 / self.temperature), softmax_fp32(draft_logits, 1 / self.temperature)
        idx = draft_tokens[..., None]
        surv = survival_probs(p[:, :gamma].gather(2, idx).squeeze(2), q.gather(2, idx).squeeze(2))
        u = uniforms(B, gamma, p.device, generator)
        h = stop_probs(p, q, surv)
        passed = u[:, :gamma] < h
        tau = count_accepted(passed) if self.first_failing else \
            torch.where(passed, torch.arange(1, gamma + 1), 0).amax(1)
        nxt = residual_draw(p, q, surv if self.scale_residual else torch.ones_like(surv), tau, u[:, gamma])
        ok = torch.ones(B, dtype=torch.bool)
        return SamplerResult(tau, assemble_tokens(draft_tokens, tau, nxt), ok, ok)


class FirstFailing(_WrongBlock):
    """WRONG: stops before the first failing h_i, as token-wise verification does (block residual)."""

    first_failing = True


class UnscaledResidual(_WrongBlock):
    """WRONG: draws from max(p - q, 0) at τ instead of max(p_τ · p - q, 0)."""

    scale_residual = False


def test_the_wrong_variants_share_the_right_ones_pieces():
    """The controls differ from BlockSampler only in the piece they break: with both pieces right, same tokens."""
    dt, dl, tl = random_inputs(B=64, gamma=4, V=20, seed=1)
    right = get_sampler("block")(dt, dl, tl, generator=torch.Generator().manual_seed(0))
    control = _WrongBlock()(dt, dl, tl, generator=torch.Generator().manual_seed(0))
    assert torch.equal(right.tokens, control.tokens)


@pytest.mark.parametrize("wrong", [FirstFailing, UnscaledResidual])
def test_negative_control_fails_the_joint_test(wrong):
    """Seed 15: a Markov model where the unscaled residual moves the joint enough for 20 000 samples to see."""
    pvalue = joint_pvalue(wrong(temperature=1.0), markov_model(seed=15))
    assert pvalue <= THRESHOLD, f"{wrong.__name__} passed the joint test (p = {pvalue:.3g}): it has no power"


@pytest.mark.parametrize("wrong", [FirstFailing, UnscaledResidual])
def test_negative_control_fails_the_emitted_block_test(wrong):
    m = MATH_MODELS["tree_V3_g3"]()
    res = run_steps(wrong(), m, 30_000, seed=len("tree_V3_g3"))
    try:
        pvalue = chisquare_pvalue(*emitted_counts(res, m.law()[1]))
    except AssertionError:  # it emitted a sequence the law gives probability 0: caught as well
        pvalue = 0.0
    assert pvalue <= THRESHOLD, f"{wrong.__name__} passed the emitted-block test (p = {pvalue:.3g})"


# ---- T = 0, γ = 0 and γ = 1: the exact sampler's behaviour ---------------------------------------------------

def test_zero_temperature_verifies_greedily_like_exact():
    dt, dl, tl = random_inputs(B=64, gamma=4, V=30, seed=9)
    argmax = tl.argmax(-1)
    dt[::2] = argmax[::2, :4]
    dt[1::4, 2] = (argmax[1::4, 2] + 1) % 30
    block, exact = get_sampler("block", temperature=0.0), get_sampler("exact", temperature=0.0)
    assert block.verifies_by_argmax and block.draft_temperature == 0.0
    res, ref = block(dt, dl, tl), exact(dt, dl, tl)
    assert torch.equal(res.accepted, (dt == argmax[:, :4]).long().cumprod(1).sum(1))
    assert torch.equal(res.tokens, ref.tokens)


@pytest.mark.parametrize("gamma", [0, 1])
def test_gamma_zero_and_one_are_the_exact_sampler(gamma):
    """γ = 0 draws from the target, γ = 1 is token-wise verification: same uniforms, same tokens as `exact`."""
    dt, dl, tl = random_inputs(B=4_000, gamma=gamma, V=12, V_d=10, seed=2)
    g = torch.Generator().manual_seed(0)
    dt = torch.multinomial(torch.softmax(dl.reshape(-1, 10), -1), 1, generator=g).reshape(dt.shape) if gamma else dt
    res = get_sampler("block")(dt, dl, tl, generator=torch.Generator().manual_seed(1))
    ref = get_sampler("exact")(dt, dl, tl, generator=torch.Generator().manual_seed(1))
    assert torch.equal(res.tokens, ref.tokens)


# ---- `specsweep bench block` ----------------------------------------------------------------------------------

def test_bench_block_smoke_writes_json_and_figure(tmp_path, capsys):
    """A tiny run of the benchmark on a synthetic pair: both rules at each γ, paired over the prompts."""
    import json

    from tiny_models import save_pair, write_articles

    from pipeline.cli import main

    target, draft = save_pair(tmp_path / "pair")
    out = tmp_path / "block.json"
    assert main(["bench", "block", "--target", str(target), "--draft", str(draft), "--data",
                 str(write_articles(tmp_path / "a.jsonl", 3, 1)), "--gammas", "1,3", "--steps", "8", "--ignore-eos",
                 "--device", "cpu", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["gamma"] for r in result["results"]] == [1, 3] and out.with_suffix(".png").stat().st_size > 0
    for row in result["results"]:
        assert row["difference"]["n"] == 3 and set(row["per_prompt_accepted_per_step"]) == {"exact", "block"}
    # at γ = 1 block verification is token-wise verification: same seeds, same decodes
    assert result["results"][0]["difference"]["mean"] == 0.0
    assert "block - exact (paired)" in capsys.readouterr().out
