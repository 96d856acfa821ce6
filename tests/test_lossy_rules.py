"""The lossy acceptance rules of pipeline/samplers/lossy.py (typical, fuzzy, relaxed, accept_all): each one's law
checked against a closed form on small hand-checked distributions, their limits (typical with epsilon 0, fuzzy with
threshold 0 = exact token for token, relaxed with top_k 1 or prob_delta 0 = greedy, accept_all), batched rows with
different distributions, a smaller draft vocabulary, the finite flags, no host sync, and the contract's shapes.

Each case fixes logits per position, independent of the prefix, samples the draft tokens from the draft's tempered
softmax, and runs the sampler on many rows at once. Deterministic parts (which draft tokens a rule accepts, the
argmax it emits) are compared exactly; the random parts with a chi-square test (tests/stat_utils.py)."""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest
import torch
from stat_utils import assert_fits, counts
from sync_detector import assert_no_host_sync
from test_sampler_contract import random_inputs

from pipeline.commands import run as run_command
from pipeline.config import RunConfig
from pipeline.errors import NonFiniteLogitsError, SamplerInputError, SpecsweepError
from pipeline.rules import RULES, get_rule, is_lossless, param_is_integer
from pipeline.samplers import available_samplers, get_sampler
from pipeline.samplers.lossy import TYPICAL_ENTROPY_EPS, js_divergence

LOSSY = ["typical", "fuzzy", "relaxed", "accept_all"]
N = 20_000


def logits_of(probs) -> torch.Tensor:
    """float32 logits whose softmax is ``probs`` (rows of a [P, V] list)."""
    return torch.tensor(np.log(np.asarray(probs, dtype=np.float64)), dtype=torch.float32)


def softmax64(logits: torch.Tensor, temperature: float = 1.0) -> np.ndarray:
    return torch.softmax(logits.double() / temperature, dim=-1).numpy()


def drafts(q: np.ndarray, n: int, seed: int) -> torch.Tensor:
    """int64 [n, γ]: n draft blocks, position i drawn from q[i] (independent of the prefix, as in the cases)."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.multinomial(torch.tensor(row), n, replacement=True, generator=g) for row in q], 1)


def run_case(name, target, draft, n=N, seed=0, **params):
    """Expand one case to n rows, sample the drafts from softmax(draft / T), run the sampler. Returns (dt, result)."""
    sampler = get_sampler(name, **params)
    q = softmax64(draft, sampler.draft_temperature or 1.0)
    dt = drafts(q, n, seed)
    tl = target.expand(n, *target.shape).contiguous()
    dl = draft.expand(n, *draft.shape).contiguous()
    return dt, sampler(dt, dl, tl, generator=torch.Generator().manual_seed(seed + 1)).check()


# ---- typical -----------------------------------------------------------------------------------------------------

TYPICAL_TARGET = [[0.5, 0.3, 0.15, 0.04, 0.01],      # H = 1.17: delta e^-H = 0.093 > epsilon, threshold 0.09
                  [0.3, 0.25, 0.22, 0.05, 0.18],     # H = 1.50: delta e^-H = 0.067 < epsilon binds
                  [0.1, 0.2, 0.3, 0.25, 0.15]]       # the bonus position
TYPICAL_DRAFT = [[0.25, 0.25, 0.25, 0.25], [0.1, 0.2, 0.3, 0.4]]  # V_d = 4 < V_t = 5


def typical_thresholds(p: np.ndarray, epsilon: float, delta: float) -> np.ndarray:
    entropy = -(p * np.log(p + TYPICAL_ENTROPY_EPS)).sum(-1)
    return np.minimum(epsilon, delta * np.exp(-entropy))


def test_typical_thresholds_by_hand():
    p = np.array(TYPICAL_TARGET)
    thr = typical_thresholds(p[:2], 0.09, 0.3)
    assert thr[0] == 0.09 and 0.066 < thr[1] < 0.068
    accepts = [set(np.flatnonzero(p[i] > thr[i]).tolist()) for i in range(2)]
    assert accepts == [{0, 1, 2}, {0, 1, 2, 4}]


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_typical_accepts_by_its_threshold_and_emits_argmax_then_target_bonus(temperature):
    target, draft = logits_of(TYPICAL_TARGET), logits_of(TYPICAL_DRAFT)
    dt, res = run_case("typical", target, draft, temperature=temperature)
    p = softmax64(target, temperature)
    thr = typical_thresholds(p[:2], 0.09, 0.3)
    assert (np.abs(p[:2] - thr[:, None]) > 1e-4).all(), "a probability too close to its threshold for fp32"
    accept = torch.from_numpy(p[:2] > thr[:, None])                       # [γ, V_t]: deterministic given x
    ok = torch.stack([accept[i, dt[:, i]] for i in range(2)], 1)
    want = ok.long().cumprod(1).sum(1)
    assert torch.equal(res.accepted, want)
    rejected = want < 2
    argmax = torch.from_numpy(p.argmax(-1))
    assert torch.equal(res.tokens[rejected, want[rejected]], argmax[want[rejected]])
    # closed forms: acceptance per position beta_i = sum_x q_i(x) [x accepted]; the bonus follows p_γ
    q = softmax64(draft, temperature)
    beta = [(q[i] * accept[i, :4].numpy()).sum() for i in range(2)]
    law = [1 - beta[0], beta[0] * (1 - beta[1]), beta[0] * beta[1]]
    assert_fits(counts(res.accepted.numpy(), 3), np.array(law), f"typical accepted count, T={temperature}")
    assert_fits(counts(res.tokens[~rejected, 2].numpy(), 5), p[2], f"typical bonus, T={temperature}")
    if temperature == 1.0:  # by hand: x_0 ∈ {0, 1, 2} kept (q = 1/4 each), else argmax 0: [1/2, 1/4, 1/4, 0, 0]
        assert_fits(counts(res.tokens[:, 0].numpy(), 5), np.array([0.5, 0.25, 0.25, 0, 0]), "typical first token")


def test_typical_with_epsilon_zero_accepts_every_token_the_target_can_emit():
    dt, dl, tl = random_inputs(B=64, gamma=4, V=30, V_d=27, seed=3)
    tl[::3, 1, :] = float("-inf")
    tl[::3, 1, 5] = 0.0            # these rows: position 1 can only be token 5
    res = get_sampler("typical", epsilon=0.0, delta=0.3)(dt, dl, tl, generator=torch.Generator().manual_seed(0))
    possible = torch.isfinite(tl[:, :4].gather(2, dt[..., None]).squeeze(2))
    assert torch.equal(res.accepted, possible.long().cumprod(1).sum(1))
    assert (res.accepted[1::3] == 4).all() and (res.accepted[::3] <= 1).all()


def test_typical_at_zero_temperature_is_greedy():
    dt, dl, tl = random_inputs(B=64, gamma=4, V=30, seed=9)
    dt[::2] = tl[::2, :4].argmax(-1)
    greedy = get_sampler("greedy")(dt, dl, tl)
    res = get_sampler("typical", temperature=0.0)(dt, dl, tl)
    assert torch.equal(res.accepted, greedy.accepted) and torch.equal(res.tokens, greedy.tokens)


# ---- fuzzy ---------------------------------------------------------------------------------------------------------

FUZZY_FAR = ([0.6, 0.2, 0.1, 0.1], [0.1, 0.2, 0.7])     # JS ≈ 0.21: exact's test
FUZZY_NEAR = ([0.3, 0.3, 0.3, 0.1], [0.35, 0.3, 0.35])  # JS ≈ 0.04: accepted outright
FUZZY_BONUS = [0.25, 0.25, 0.4, 0.1]
FUZZY_THRESHOLD = 0.1


def js64(p, q) -> float:
    p, q = np.asarray(p, float), np.pad(np.asarray(q, float), (0, len(p) - len(q)))
    m = (p + q) / 2
    return 0.5 * sum(a * math.log(a / c) for a, c in zip(p, m) if a > 0) + \
        0.5 * sum(b * math.log(b / c) for b, c in zip(q, m) if b > 0)


def test_fuzzy_divergence_is_jensen_shannon_in_nats():
    for p, q in (FUZZY_FAR, FUZZY_NEAR, ([1.0, 0.0], [0.0, 1.0]), ([0.5, 0.5], [0.5, 0.5]), ([0.2, 0.3, 0.5], [1.0])):
        got = float(js_divergence(torch.tensor([p], dtype=torch.float32), torch.tensor([q], dtype=torch.float32)))
        assert got == pytest.approx(js64(p, q), abs=1e-6)
    assert js64([1.0, 0.0], [0.0, 1.0]) == pytest.approx(math.log(2))
    assert js64(*FUZZY_NEAR) < FUZZY_THRESHOLD - 0.03 and js64(*FUZZY_FAR) > FUZZY_THRESHOLD + 0.03


@pytest.mark.parametrize("order", ["far_then_near", "near_then_far"])
def test_fuzzy_accepts_close_positions_outright_and_runs_exacts_test_elsewhere(order):
    """Position-wise closed form: where JS < threshold the draft token is kept (its law is q); elsewhere exact's test
    accepts with probability sum min(p, q) and the emitted token follows p. V_d = 3 < V_t = 4."""
    first, second = (FUZZY_FAR, FUZZY_NEAR) if order == "far_then_near" else (FUZZY_NEAR, FUZZY_FAR)
    target = logits_of([first[0], second[0], FUZZY_BONUS])
    draft = logits_of([first[1], second[1]])
    _, res = run_case("fuzzy", target, draft, threshold=FUZZY_THRESHOLD)
    p, q = softmax64(target), np.pad(softmax64(draft), ((0, 0), (0, 1)))
    beta = [1.0 if js64(p[i], q[i, :3]) < FUZZY_THRESHOLD else np.minimum(p[i], q[i]).sum() for i in range(2)]
    law = [1 - beta[0], beta[0] * (1 - beta[1]), beta[0] * beta[1]]
    assert_fits(counts(res.accepted.numpy(), 3), np.array(law), f"fuzzy accepted count ({order})")
    # position 0 emits q_0 where it is close (kept outright), p_0 where exact's test runs (lossless there)
    assert_fits(counts(res.tokens[:, 0].numpy(), 4), q[0] if beta[0] == 1.0 else p[0], f"fuzzy first token ({order})")
    if order == "far_then_near":
        assert not (res.accepted == 1).any()          # position 1 is never rejected
        kept = res.accepted == 2
        assert_fits(counts(res.tokens[kept, 1].numpy(), 4), q[1], "fuzzy kept second token")
        assert_fits(counts(res.tokens[kept, 2].numpy(), 4), p[2], "fuzzy bonus")
    else:
        assert (res.accepted >= 1).all()              # position 0 is never rejected
        second_token = res.tokens[:, 1]
        assert_fits(counts(second_token.numpy(), 4), p[1], "fuzzy second token (exact's test)")


@pytest.mark.parametrize("threshold", [0.0, -1.0])
@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
@pytest.mark.parametrize("V_d", [50, 43])
def test_fuzzy_with_threshold_zero_is_exact_token_for_token(threshold, temperature, V_d):
    for seed in range(3):
        dt, dl, tl = random_inputs(B=64, gamma=4, V=50, V_d=V_d, seed=seed)
        dl[:8] = tl[:8, :4, :V_d]  # identical rows: JS = 0, still not below a threshold of 0
        fuzzy = get_sampler("fuzzy", temperature=temperature, threshold=threshold)(
            dt, dl, tl, generator=torch.Generator().manual_seed(seed))
        exact = get_sampler("exact", temperature=temperature)(dt, dl, tl, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(fuzzy.accepted, exact.accepted) and torch.equal(fuzzy.tokens, exact.tokens)


def test_fuzzy_above_ln2_accepts_everything_and_samples_the_bonus_from_the_target():
    target, draft = logits_of([FUZZY_FAR[0], FUZZY_FAR[0], FUZZY_BONUS]), logits_of([FUZZY_FAR[1]] * 2)
    dt, res = run_case("fuzzy", target, draft, threshold=0.7)
    assert (res.accepted == 2).all() and torch.equal(res.tokens[:, :2], dt)
    assert_fits(counts(res.tokens[:, 2].numpy(), 4), softmax64(target)[2], "fuzzy bonus above ln 2")


def test_fuzzy_at_zero_temperature_is_the_limit_of_one_hot_distributions():
    dt, dl, tl = random_inputs(B=256, gamma=4, V=12, seed=5)
    dt = dl.argmax(-1)                        # at T = 0 the draft proposes its argmax
    greedy = get_sampler("greedy")(dt, dl, tl)
    for threshold in (0.0, 0.3, math.log(2)):  # JS of one-hots is 0 or ln 2: greedy up to ln 2
        res = get_sampler("fuzzy", temperature=0.0, threshold=threshold)(dt, dl, tl)
        assert torch.equal(res.tokens, greedy.tokens)
    res = get_sampler("fuzzy", temperature=0.0, threshold=0.7)(dt, dl, tl)
    assert (res.accepted == 4).all() and torch.equal(res.tokens[:, 4], tl[:, 4].argmax(-1))


# ---- relaxed -------------------------------------------------------------------------------------------------------

RELAXED_TARGET = [[0.5, 0.3, 0.15, 0.05], [0.4, 0.35, 0.2, 0.05], [0.1, 0.6, 0.2, 0.1]]


@pytest.mark.parametrize("top_k,prob_delta,accepts", [
    (2, 0.25, ({0, 1}, {0, 1})),       # gaps 0.2 and 0.05 within 0.25; token 2 is not in the top 2
    (3, 0.25, ({0, 1}, {0, 1, 2})),    # position 0: token 2's gap 0.35 is too wide; position 1: 0.2 is not
    (3, 0.1, ({0}, {0, 1})),
    (4, 1.0, ({0, 1, 2, 3}, {0, 1, 2, 3})),
    (1, 1.0, ({0}, {0})),              # top 1: greedy
])
def test_relaxed_by_hand_on_every_draft_block(top_k, prob_delta, accepts):
    target = logits_of(RELAXED_TARGET)
    dt = torch.cartesian_prod(torch.arange(4), torch.arange(4))        # all 16 blocks of γ = 2
    tl = target.expand(16, 3, 4).contiguous()
    dl = torch.randn(16, 2, 4, generator=torch.Generator().manual_seed(0))
    res = get_sampler("relaxed", top_k=top_k, prob_delta=prob_delta)(dt, dl, tl).check()
    for b, (x0, x1) in enumerate(dt.tolist()):
        n = 0 if x0 not in accepts[0] else 1 if x1 not in accepts[1] else 2
        assert res.tokens[b].tolist() == [x0, x1][:n] + [[0, 0, 1][n]] + [-1] * (2 - n), (b, x0, x1)


@pytest.mark.parametrize("top_k,prob_delta", [(1, 0.6), (1, 1.0), (5, 0.0), (10, 0.0)])
@pytest.mark.parametrize("V_d", [40, 37])
def test_relaxed_with_top_1_or_no_gap_is_greedy(top_k, prob_delta, V_d):
    dt, dl, tl = random_inputs(B=128, gamma=4, V=40, V_d=V_d, seed=11)
    argmax = tl.argmax(-1)
    dt[::2] = argmax[::2, :4].clamp_max(V_d - 1)
    res = get_sampler("relaxed", top_k=top_k, prob_delta=prob_delta)(dt, dl, tl)
    greedy = get_sampler("greedy")(dt, dl, tl)
    assert torch.equal(res.accepted, greedy.accepted) and torch.equal(res.tokens, greedy.tokens)
    assert res.accepted.float().mean() > 1.0  # the comparison saw accepted tokens


def test_relaxed_breaks_ties_by_token_id_and_never_accepts_a_masked_token():
    tl = torch.tensor([[[2.0, 2.0, 0.0, float("-inf")], [0.0, 0.0, 0.0, 0.0]]])
    dl = torch.zeros(1, 1, 4)
    run = [get_sampler("relaxed", top_k=k, prob_delta=d)(torch.tensor([[x]]), dl, tl).accepted.item()
           for k, d, x in [(1, 1.0, 0), (1, 1.0, 1), (2, 0.0, 1), (4, 1.0, 3)]]
    assert run == [1, 0, 1, 0]


def test_relaxed_ignores_temperature_and_drafts_argmax():
    dt, dl, tl = random_inputs(B=32, gamma=3, V=20, seed=2)
    a = get_sampler("relaxed", temperature=0.0, top_k=3, prob_delta=0.3)(dt, dl, tl)
    b = get_sampler("relaxed", temperature=1.5, top_k=3, prob_delta=0.3)(dt, dl, tl)
    assert torch.equal(a.tokens, b.tokens)
    assert get_sampler("relaxed", temperature=1.0).draft_temperature == 0.0
    assert not get_rule("relaxed").uses_temperature


# ---- accept_all ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [0.7, 0.0])
def test_accept_all_keeps_every_draft_and_draws_the_bonus_from_the_target(temperature):
    g = torch.Generator().manual_seed(4)
    target, draft = torch.randn(4, 6, generator=g) * 2, torch.randn(3, 5, generator=g) * 2
    dt, res = run_case("accept_all", target, draft, temperature=temperature)
    assert (res.accepted == 3).all() and torch.equal(res.tokens[:, :3], dt)
    if temperature == 0.0:
        assert (res.tokens[:, 3] == target[3].argmax()).all()
    else:
        assert_fits(counts(res.tokens[:, 3].numpy(), 6), softmax64(target, temperature)[3], "accept_all bonus")


@pytest.mark.parametrize("name", ["typical", "fuzzy", "accept_all"])
def test_gamma_zero_samples_the_target(name):
    g = torch.Generator().manual_seed(0)
    tl = torch.randn(1, 1, 8, generator=g).expand(N, 1, 8)
    out = get_sampler(name)(torch.empty(N, 0, dtype=torch.int64), torch.empty(N, 0, 8), tl, generator=g)
    assert (out.accepted == 0).all()
    assert_fits(counts(out.tokens[:, 0].numpy(), 8), softmax64(tl[0, 0]), f"{name} γ=0")


# ---- batched rows with different distributions -----------------------------------------------------------------------

def test_batched_rows_each_follow_their_own_distributions():
    """Rows alternate between two cases; each row's law is its own case's (typical: deterministic acceptance per row;
    fuzzy: a close row keeps q_0, a far row runs exact's test and emits p_0)."""
    n = N // 2
    near = logits_of([FUZZY_NEAR[0], FUZZY_FAR[0], FUZZY_BONUS]), logits_of([FUZZY_NEAR[1], FUZZY_FAR[1]])
    far = logits_of([FUZZY_FAR[0], FUZZY_NEAR[0], FUZZY_BONUS]), logits_of([FUZZY_FAR[1], FUZZY_NEAR[1]])
    tl = torch.stack([near[0], far[0]]).repeat(n, 1, 1)                  # rows 0, 2, ...: near; 1, 3, ...: far
    dl = torch.stack([near[1], far[1]]).repeat(n, 1, 1)
    dt = torch.empty(2 * n, 2, dtype=torch.int64)
    dt[0::2], dt[1::2] = drafts(softmax64(near[1]), n, 1), drafts(softmax64(far[1]), n, 2)
    res = get_sampler("fuzzy", threshold=FUZZY_THRESHOLD)(dt, dl, tl, generator=torch.Generator().manual_seed(3))
    q_near = np.pad(softmax64(near[1])[0], (0, 1))
    assert (res.accepted[0::2] >= 1).all()
    assert_fits(counts(res.tokens[0::2, 0].numpy(), 4), q_near, "fuzzy near rows")
    assert_fits(counts(res.tokens[1::2, 0].numpy(), 4), softmax64(far[0])[0], "fuzzy far rows")

    typical = get_sampler("typical")(dt, dl, tl, generator=torch.Generator().manual_seed(4))
    for rows in (slice(0, None, 2), slice(1, None, 2)):
        p = softmax64(tl[rows][0])
        thr = typical_thresholds(p[:2], 0.09, 0.3)
        ok = torch.from_numpy(p[:2])[torch.arange(2), dt[rows]] > torch.from_numpy(thr)
        assert torch.equal(typical.accepted[rows], ok.long().cumprod(1).sum(1))


# ---- contract: shapes, finite flags, no host sync, determinism ------------------------------------------------------

def test_the_lossy_rules_are_registered_lossy_and_torch_only():
    for name in LOSSY:
        assert (name, "torch") in available_samplers()
        assert RULES[name].lossless == "never" and not is_lossless(name, 0.0)
        assert RULES[name].tunable is (name != "accept_all")
    assert param_is_integer("top_k") and not param_is_integer("prob_delta") and not param_is_integer("nope")


@pytest.mark.parametrize("name", LOSSY)
def test_bad_shapes_and_a_larger_draft_vocabulary_are_errors(name):
    s = get_sampler(name)
    dt, dl, tl = random_inputs(B=2, gamma=3)
    with pytest.raises(SamplerInputError, match=r"draft_logits has shape \[2, 2, 50\]"):
        s(dt, dl[:, :2], tl)
    with pytest.raises(SamplerInputError, match=r"target_logits has shape \[2, 3, 50\]"):
        s(dt, dl, tl[:, :3])
    dt, dl, tl = random_inputs(V=50, V_d=51)
    with pytest.raises(SamplerInputError, match=r"draft vocabulary \(51\) is larger than the target's \(50\)"):
        s(dt, dl, tl)


@pytest.mark.parametrize("name,params,message", [
    ("typical", {"epsilon": 1.0}, "epsilon (posterior threshold) must be in [0, 1)"),
    ("typical", {"delta": -0.1}, "delta (posterior alpha) must be a finite number >= 0"),
    ("fuzzy", {"threshold": float("nan")}, "fuzzy threshold"),
    ("relaxed", {"top_k": 2.5}, "top_k must be an integer >= 1"),
    ("relaxed", {"top_k": 0}, "top_k must be an integer >= 1"),
    ("relaxed", {"prob_delta": -1.0}, "prob_delta must be a finite number >= 0"),
    ("accept_all", {"alpha": 1.0}, "got unknown ['alpha']"),
])
def test_bad_parameters_are_one_line_errors(name, params, message):
    with pytest.raises(SpecsweepError) as e:
        get_sampler(name, **params)
    assert message in str(e.value) and "\n" not in str(e.value)


def _bad_at(tensor: torch.Tensor, index: tuple, bad: str) -> None:
    if bad == "all_neginf":
        tensor[index[:2]] = float("-inf")
    else:
        tensor[index] = float("nan") if bad == "nan" else float("inf")


@pytest.mark.parametrize("name", LOSSY)
@pytest.mark.parametrize("bad", ["nan", "posinf", "all_neginf"])
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_non_finite_logits_are_flagged_per_row_not_raised_inside_the_step(name, bad, temperature):
    dt, dl, tl = random_inputs(B=4, gamma=3, V=20, seed=2)
    _bad_at(tl, (1, 3, 0), bad)                          # the bonus position: every rule reads it
    res = get_sampler(name, temperature=temperature)(dt, dl, tl, generator=torch.Generator().manual_seed(0))
    assert res.target_ok.tolist() == [True, False, True, True] and res.draft_ok.all()
    with pytest.raises(NonFiniteLogitsError, match=r"target_logits.*rows \[1\]"):
        res.check()
    dt, dl, tl = random_inputs(B=4, gamma=3, V=20, seed=2)
    if bad == "all_neginf" and name != "fuzzy":
        return  # the others read the draft only at the drafted tokens, where -inf is a zero probability
    _bad_at(dl, (2, 0, int(dt[2, 0])), bad)
    res = get_sampler(name, temperature=temperature)(dt, dl, tl, generator=torch.Generator().manual_seed(0))
    assert res.draft_ok.tolist() == [True, True, False, True] and res.target_ok.all()
    with pytest.raises(NonFiniteLogitsError, match=r"draft_logits.*rows \[2\]"):
        res.check()


@pytest.mark.parametrize("name,params", [(n, {}) for n in LOSSY] + [
    ("fuzzy", {"threshold": 0.0}), ("fuzzy", {"threshold": 0.7}), ("relaxed", {"top_k": 1}),
    ("typical", {"epsilon": 0.0})])
@pytest.mark.parametrize("temperature", [1.0, 0.0])
@pytest.mark.parametrize("V_d", [50, 47])
def test_never_syncs_with_the_host(name, params, temperature, V_d):
    dt, dl, tl = random_inputs(B=3, gamma=4, V=50, V_d=V_d, dtype=torch.bfloat16)
    s = get_sampler(name, temperature=temperature, **params)
    assert_no_host_sync(s, dt, dl, tl, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name,temperature,params,draft_t,argmax", [
    ("typical", 0.7, {}, 0.7, False), ("typical", 0.0, {}, 0.0, True),
    ("fuzzy", 0.7, {}, 0.7, False), ("fuzzy", 0.0, {}, 0.0, True), ("fuzzy", 0.0, {"threshold": 0.7}, 0.0, False),
    ("relaxed", 1.0, {}, 0.0, False), ("relaxed", 1.0, {"top_k": 1}, 0.0, True),
    ("accept_all", 0.7, {}, 0.7, False), ("accept_all", 0.0, {}, 0.0, False)])
def test_each_rule_says_what_its_draft_should_propose_at(name, temperature, params, draft_t, argmax):
    sampler = get_sampler(name, temperature=temperature, **params)
    assert sampler.draft_temperature == draft_t and sampler.verifies_by_argmax is argmax


# ---- the run's settings: flags, integer parameters -------------------------------------------------------------------

def test_rule_flags_parse_with_each_parameters_type_and_reach_the_sampler():
    parser = argparse.ArgumentParser()
    run_command.add_arguments(parser)
    args = vars(parser.parse_args(["--target", "t", "--data", "d", "--sampler", "relaxed", "--top_k", "3",
                                   "--prob_delta", "0.2"]))
    cfg = RunConfig.from_dict({k: v for k, v in args.items() if k not in run_command.DISPLAY_FLAGS})
    assert cfg.rule_params == {"top_k": 3, "prob_delta": 0.2} and isinstance(cfg.rule_params["top_k"], int)
    assert cfg.sampler_params() == {"top_k": 3, "prob_delta": 0.2}  # relaxed takes no temperature
    with pytest.raises(SystemExit):
        parser.parse_args(["--target", "t", "--data", "d", "--top_k", "2.5"])
    args = vars(parser.parse_args(["--target", "t", "--data", "d", "--sampler", "typical", "--epsilon", "0.05"]))
    settings = {k: v for k, v in args.items() if k not in run_command.DISPLAY_FLAGS}
    assert RunConfig.from_dict(settings).sampler_params() == {"epsilon": 0.05, "temperature": 1.0}


def test_run_checks_an_integer_parameter_through_the_registry():
    check = {"backend": "torch", "temperature": 0.0, "batch_size": 1, "engine": "specsweep", "preset": None}
    get_rule("relaxed").check_run(params={"top_k": 3.0}, **check)
    with pytest.raises(SpecsweepError, match=r"--top_k must be an integer; got 2\.5"):
        get_rule("relaxed").check_run(params={"top_k": 2.5}, **check)
    with pytest.raises(SpecsweepError, match="--threshold do"):
        get_rule("relaxed").check_run(params={"threshold": 0.1}, **check)
