"""The sampler contract: registry, shapes, edge cases, non-finite logits, no host sync, determinism."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from stat_utils import assert_fits, counts
from sync_detector import NoHostSync, assert_no_host_sync

from pipeline.errors import BackendUnavailableError, NonFiniteLogitsError, SamplerInputError, SpecsweepError
from pipeline.rules import RULES
from pipeline.samplers import FiniteCheck, SamplerResult, available_samplers, get_sampler
from pipeline.samplers.contract import assemble_tokens, sample_from_weights
from pipeline.samplers.torch_ref import SigmoidSampler, rejection_verify

# Every rule with a torch implementation (pipeline/rules.py) except hf, which is transformers' own code (batch 1).
TORCH_SAMPLERS = [name for name, rule in RULES.items() if "torch" in rule.backends and not rule.batch_one]


def random_inputs(B=3, gamma=4, V=50, V_d=None, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    V_d = V if V_d is None else V_d
    tl = (torch.randn(B, gamma + 1, V, generator=g) * 2).to(dtype)
    dl = (torch.randn(B, gamma, V_d, generator=g) * 2).to(dtype)
    dt = torch.randint(0, V_d, (B, gamma), generator=g)
    return dt, dl, tl


# ---- registry ----------------------------------------------------------------------------------------------

def test_registry_lists_torch_samplers_and_builds_them():
    pairs = available_samplers()
    for name in ["exact", "sigmoid", "greedy", "hf"]:
        assert (name, "torch") in pairs
        s = get_sampler(name, temperature=0.0 if name == "greedy" else 1.0)
        assert s.name == name and s.backend == "torch"


@pytest.mark.parametrize("kwargs,message", [
    ({"name": "nope"}, "unknown sampler 'nope'"),
    ({"name": "exact", "backend": "tpu"}, "unknown sampler backend 'tpu'"),
    ({"name": "exact", "alpha": 1.0}, "got unknown ['alpha']"),
    ({"name": "exact", "temperature": -0.1}, "temperature must be >= 0"),
    ({"name": "sigmoid", "alpha": 0.0}, "alpha must be a finite number > 0"),
    ({"name": "sigmoid", "beta": float("nan")}, "beta must be finite"),
    ({"name": "exact", "preset": "paper"}, "preset 'paper' does not exist for rule exact"),
    ({"name": "sigmoid", "preset": "paper", "alpha": 2.0}, "preset 'paper' fixes alpha, beta"),
    ({"name": "hf", "temperature": 0.0}, "use sampler greedy"),
])
def test_registry_rejects_bad_requests_with_one_line(kwargs, message):
    with pytest.raises(SpecsweepError) as e:
        get_sampler(**kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_paper_preset_constants():
    s = get_sampler("sigmoid", preset="paper", temperature=1.0)
    # sigmoid((z + 1e4) / 2e4) == sigmoid(alpha * z + beta)
    z = torch.tensor([-30.0, 0.0, 25.0])
    torch.testing.assert_close(torch.sigmoid(s.alpha * z + s.beta), torch.sigmoid((z + 1e4) / 2e4))
    assert (s.alpha, s.beta) == (SigmoidSampler.PAPER_ALPHA, SigmoidSampler.PAPER_BETA)


def test_paper_preset_accepts_nearly_everything():
    """What its docstring claims: with the released constants nearly every draft token is accepted."""
    dt, dl, tl = random_inputs(B=2000, gamma=4, V=100, seed=3)
    res = get_sampler("sigmoid", preset="paper")(dt, dl * 5, tl * 5, generator=torch.Generator().manual_seed(0))
    exact = get_sampler("exact")(dt, dl * 5, tl * 5, generator=torch.Generator().manual_seed(0))
    assert res.accepted.float().mean() > 3.9 and exact.accepted.float().mean() < 2.0


def test_cupy_backend_unavailable_without_gpu_is_one_clear_error():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert not [p for p in available_samplers() if p[1] == "cupy"]
    with pytest.raises(BackendUnavailableError) as e:
        get_sampler("exact", backend="cupy")
    assert "cupy" in str(e.value) and "\n" not in str(e.value)


# ---- shapes --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", TORCH_SAMPLERS)
def test_disagreeing_shapes_name_both_shapes(name):
    s = get_sampler(name, temperature=1.0)
    dt, dl, tl = random_inputs(B=2, gamma=3)
    with pytest.raises(SamplerInputError, match=r"draft_logits has shape \[2, 2, 50\] but draft_tokens has shape"):
        s(dt, dl[:, :2], tl)
    with pytest.raises(SamplerInputError, match=r"target_logits has shape \[2, 3, 50\].*\[2, 3\]"):
        s(dt, dl, tl[:, :3])
    with pytest.raises(SamplerInputError, match=r"target_logits has shape \[1, 4, 50\]"):
        s(dt, dl, tl[:1])
    with pytest.raises(SamplerInputError, match="int64"):
        s(dt.int(), dl, tl)
    with pytest.raises(SamplerInputError, match="float32, float16 or bfloat16"):
        s(dt, dl.double(), tl)


@pytest.mark.parametrize("name", TORCH_SAMPLERS)
def test_draft_vocab_larger_than_target_is_an_error(name):
    dt, dl, tl = random_inputs(V=50, V_d=51)
    with pytest.raises(SamplerInputError, match=r"draft vocabulary \(51\) is larger than the target's \(50\)"):
        get_sampler(name)(dt, dl, tl)


@pytest.mark.parametrize("name", TORCH_SAMPLERS)
def test_output_shapes_dtypes_and_padding(name):
    dt, dl, tl = random_inputs(B=5, gamma=4, V=50, V_d=48)
    res = get_sampler(name)(dt, dl, tl, generator=torch.Generator().manual_seed(1))
    assert res.accepted.shape == (5,) and res.accepted.dtype == torch.int64
    assert res.tokens.shape == (5, 5) and res.tokens.dtype == torch.int64
    for b in range(5):
        n = int(res.accepted[b])
        assert 0 <= n <= 4
        assert torch.equal(res.tokens[b, :n], dt[b, :n])
        assert 0 <= int(res.tokens[b, n]) < 50
        assert (res.tokens[b, n + 1:] == -1).all()


@pytest.mark.parametrize("name", ["exact", "sigmoid"])
def test_gamma_zero_samples_the_target(name):
    """γ = 0 is plain autoregressive sampling through the same code."""
    g = torch.Generator().manual_seed(0)
    tl = torch.randn(1, 1, 8, generator=g).expand(20_000, 1, 8)
    res = get_sampler(name, alpha=1.0, beta=-30.0) if name == "sigmoid" else get_sampler(name)
    out = res(torch.empty(20_000, 0, dtype=torch.int64), torch.empty(20_000, 0, 8), tl, generator=g)
    assert (out.accepted == 0).all()
    assert_fits(counts(out.tokens[:, 0].numpy(), 8), torch.softmax(tl[0, 0].double(), -1).numpy(), "γ=0")


# ---- edge cases of the values --------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_zero_draft_probability_rejects_without_dividing_by_zero(dtype):
    """p_draft(x) == 0 (a masked or underflowed token): reject, and emit a valid token."""
    B, gamma, V = 1000, 3, 20
    tl = torch.zeros(B, gamma + 1, V, dtype=dtype)
    tl[:, :, 5] = 8.0  # the target loves token 5
    dl = torch.zeros(B, gamma, V, dtype=dtype)
    dl[:, :, 5] = float("-inf")  # ... which the draft gives probability 0
    dt = torch.full((B, gamma), 5)
    for name in ["exact", "sigmoid"]:
        res = get_sampler(name)(dt, dl, tl, generator=torch.Generator().manual_seed(0)).check()
        assert (res.accepted == 0).all(), name
        assert ((res.tokens[:, 0] >= 0) & (res.tokens[:, 0] < V)).all()


def test_zero_residual_falls_back_to_the_target_row():
    """A rejection whose residual max(0, w_t - w_d) is zero up to rounding draws from the target row."""
    B, V = 20_000, 6
    g = torch.Generator().manual_seed(0)
    w = torch.softmax(torch.randn(V, generator=g), -1)
    row = w.expand(B, V).contiguous()
    u = torch.rand(B, 2, generator=g)
    accepted, nxt = rejection_verify(
        torch.zeros(B, 1, dtype=torch.int64), torch.zeros(B, 1), torch.ones(B, 1),  # always rejects
        lambda n: row.clone(), lambda n: row.clone(), u)
    assert (accepted == 0).all()
    assert_fits(counts(nxt.numpy(), V), w.double().numpy(), "zero-residual fallback")


def test_inverse_cdf_never_returns_zero_weight_and_matches_weights():
    g = torch.Generator().manual_seed(0)
    V = 5000  # several chunks plus a ragged tail
    w = torch.rand(V, generator=g) * (torch.rand(V, generator=g) < 0.01)
    w[-1] = 0.0
    B = 40_000
    u = torch.rand(B, generator=g)
    u[:10] = 1.0 - 2.0**-24  # the largest float32 below 1: rounding must not run off the end
    idx = sample_from_weights(w.expand(B, V).contiguous(), u)
    assert (w[idx] > 0).all()
    assert_fits(counts(idx.numpy(), V), (w / w.sum()).double().numpy(), "inverse CDF")


def test_assemble_tokens():
    dt = torch.tensor([[7, 8, 9], [7, 8, 9], [7, 8, 9]])
    out = assemble_tokens(dt, torch.tensor([0, 2, 3]), torch.tensor([1, 2, 3]))
    assert out.tolist() == [[1, -1, -1, -1], [7, 8, 2, -1], [7, 8, 9, 3]]


# ---- greedy and T = 0 ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["greedy", "exact", "sigmoid"])
def test_greedy_and_zero_temperature_agree_with_argmax(name):
    dt, dl, tl = random_inputs(B=64, gamma=4, V=30, seed=9)
    argmax = tl.argmax(-1)
    dt[::2] = argmax[::2, :4]  # half the rows draft exactly what the target wants
    dt[1::4, 2] = (argmax[1::4, 2] + 1) % 30
    res = get_sampler(name, temperature=0.0)(dt, dl, tl)
    match = (dt == argmax[:, :4]).long().cumprod(1).sum(1)
    assert torch.equal(res.accepted, match)
    for b in range(64):
        n = int(res.accepted[b])
        assert torch.equal(res.tokens[b, : n + 1], argmax[b, : n + 1])


# ---- non-finite logits ---------------------------------------------------------------------------------------

# Rules that accept by the target alone or by set rates (they read the draft's logits only at the drafted tokens), and
# the rule that reads the target only at the bonus position.
ARGMAX_OR_TARGET_ONLY = {"greedy", "typical", "relaxed", "accept_all", "synthetic"}
BONUS_ROW_ONLY = {"accept_all"}


@pytest.mark.parametrize("name", TORCH_SAMPLERS)
@pytest.mark.parametrize("bad", ["nan", "posinf", "all_neginf"])
@pytest.mark.parametrize("tensor", ["target_logits", "draft_logits"])
def test_non_finite_logits_are_flagged_and_named(name, bad, tensor):
    dt, dl, tl = random_inputs(B=4, gamma=3, V=20, seed=2)
    if tensor == "target_logits":
        t, pos = tl, 0
        dt[1] = tl[1, :3].argmax(-1)  # let the draft tokens point at what the target reads
    else:
        t, pos = dl, 0
    col = int(dt[1, 0])
    if bad == "nan":
        t[1, pos, col] = float("nan")
    elif bad == "posinf":
        t[1, pos, col] = float("inf")
    else:
        t[1, pos, :] = float("-inf")
    res = get_sampler(name, temperature=0.0 if name == "greedy" else 1.0)(dt, dl, tl,
                                                                          generator=torch.Generator())
    if (name in ARGMAX_OR_TARGET_ONLY and tensor == "draft_logits" and bad == "all_neginf") or \
            (name in BONUS_ROW_ONLY and tensor == "target_logits"):
        # a rule reads only what it needs: the draft at the drafted tokens (-inf there is a zero probability, not
        # an error), or the target only at the bonus position; what it does not read it cannot flag
        res.check()
        return
    with pytest.raises(NonFiniteLogitsError, match=tensor) as e:
        res.check()
    assert "rows [1]" in str(e.value)


def test_finite_check_accumulates_without_syncing_and_raises_at_the_end():
    s = get_sampler("exact")
    guard = FiniteCheck()
    dt, dl, tl = random_inputs(seed=4)
    with NoHostSync() as mode:
        guard.update(s(dt, dl, tl))
        tl_bad = tl.clone()
        tl_bad[0, 1, 3] = float("nan")
        guard.update(s(dt, dl, tl_bad))
        guard.update(s(dt, dl, tl))
    assert not mode.syncs
    with pytest.raises(NonFiniteLogitsError, match="target_logits"):
        guard.check()
    ok = FiniteCheck()
    ok.update(s(dt, dl, tl))
    ok.check()


def test_finite_check_keeps_each_steps_flags_when_the_sampler_rewrites_its_buffers():
    """A kernel sampler (or a replayed CUDA graph) hands back the same flag tensors every step: a non-finite step
    in the middle is still reported after later finite steps have rewritten them."""
    ok = torch.ones((2, 3), dtype=torch.bool)
    res = SamplerResult(accepted=torch.zeros(3, dtype=torch.int64), tokens=torch.zeros((3, 2), dtype=torch.int64),
                        draft_ok=ok[0], target_ok=ok[1])
    guard = FiniteCheck()
    with NoHostSync() as mode:
        guard.update(res)
        ok[1, 2] = False                    # step 2: a NaN in row 2's target logits
        guard.update(res)
        ok[1, 2] = True                     # step 3 rewrites the flags
        guard.update(res)
    assert not mode.syncs
    with pytest.raises(NonFiniteLogitsError, match="target_logits"):
        guard.check()


# ---- no host sync, determinism -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", TORCH_SAMPLERS)
@pytest.mark.parametrize("temperature", [1.0, 0.0])
@pytest.mark.parametrize("V_d", [50, 47])
def test_torch_samplers_never_sync_with_the_host(name, temperature, V_d):
    dt, dl, tl = random_inputs(B=3, gamma=4, V=50, V_d=V_d, dtype=torch.bfloat16)
    s = get_sampler(name, temperature=temperature)
    assert_no_host_sync(s, dt, dl, tl, generator=torch.Generator().manual_seed(0))


def test_sync_detector_has_power():
    with NoHostSync() as mode:
        torch.ones(3).sum().item()
        torch.arange(4).nonzero()
        x = torch.arange(4)
        x[x > 1]  # boolean-mask indexing: its nonzero runs inside the kernel on CPU
    assert {"aten::_local_scalar_dense", "aten::nonzero", "aten::index with a boolean mask"} <= set(mode.syncs)


@pytest.mark.parametrize("name", ["exact", "block", "sigmoid", "hf", "typical", "fuzzy", "accept_all", "synthetic"])
def test_same_seed_same_tokens(name):
    """Every stochastic rule: the same generator seed gives the same tokens, another seed other tokens."""
    dt, dl, tl = random_inputs(B=1 if name == "hf" else 8, gamma=4, V=50, seed=6)
    dt[:] = tl[:, :4].argmax(-1)  # tokens every rule can accept, so blocks also reach the (random) bonus token
    s = get_sampler(name)

    def run(seed):
        g = torch.Generator().manual_seed(seed)
        return [s(dt, dl, tl, generator=g).tokens for _ in range(10)]

    runs = [run(1), run(1), run(2)]
    assert all(torch.equal(a, b) for a, b in zip(runs[0], runs[1]))
    assert not all(torch.equal(a, b) for a, b in zip(runs[0], runs[2]))


# ---- per-row draft lengths -------------------------------------------------------------------------------------

PER_ROW_LENGTHS = [0, 1, 2, 3, 5, 4, 5, 2]     # B = 8 rows of a γ = 5 step


def per_row_inputs(seed: int):
    """Random inputs whose padding (the columns past each row's length) holds the target's argmax with a one-hot
    draft, as the engine pads: every rule would accept it if it read it."""
    B, gamma = len(PER_ROW_LENGTHS), max(PER_ROW_LENGTHS)
    dt, dl, tl = random_inputs(B=B, gamma=gamma, V=40, seed=seed)
    for b, g in enumerate(PER_ROW_LENGTHS):
        top = tl[b, g:gamma].argmax(-1)
        dt[b, g:] = top
        dl[b, g:] = float("-inf")
        dl[b, g:].scatter_(-1, top[:, None], 0.0)
    return dt, dl, tl


def _rule_temperatures():
    for name in TORCH_SAMPLERS:
        for temperature in (1.0, 0.0):
            if not (RULES[name].needs_sampling and temperature == 0.0):
                yield name, temperature


def assert_rows_verify_as_alone(sampler, seeds=range(6), deterministic: bool = False) -> None:
    """Row b of a batched step of per_row_inputs with lengths[b] = g gives the tokens that row gives alone with γ = g,
    drawing its uniforms from its own stream (pipeline.rng.RowGenerators.set_step), and without lengths some row would
    differ. ``deterministic``: a deterministic draft (draft_logits None) proposes the same tokens."""
    from pipeline.rng import RowGenerators

    ids = [f"row{b}" for b in range(len(PER_ROW_LENGTHS))]
    gamma = max(PER_ROW_LENGTHS)
    differs_without = 0
    for seed in seeds:
        dt, dl, tl = per_row_inputs(seed)
        dl = None if deterministic else dl
        rows = RowGenerators(seed, ids, "cpu")
        rows.set_step(gamma, PER_ROW_LENGTHS)
        res = sampler(dt, dl, tl, generator=rows, lengths=torch.tensor(PER_ROW_LENGTHS))
        plain = sampler(dt, dl, tl, generator=RowGenerators(seed, ids, "cpu"))
        for b, g in enumerate(PER_ROW_LENGTHS):
            alone = sampler(dt[b:b + 1, :g], None if dl is None else dl[b:b + 1, :g], tl[b:b + 1, : g + 1],
                            generator=RowGenerators(seed, [ids[b]], "cpu"))
            n = int(alone.accepted)
            assert int(res.accepted[b]) == n <= g, (seed, b)
            assert res.tokens[b, : n + 1].tolist() == alone.tokens[0, : n + 1].tolist(), (seed, b)
            assert (res.tokens[b, n + 1:] == -1).all()
            differs_without += (int(plain.accepted[b]) != n
                                or plain.tokens[b, : n + 1].tolist() != alone.tokens[0, : n + 1].tolist())
    assert differs_without > 0


@pytest.mark.parametrize("name,temperature", list(_rule_temperatures()))
def test_a_row_with_its_own_draft_length_verifies_as_it_would_alone(name, temperature):
    """The contract's per-row lengths: row b of a batched step with lengths[b] = g gives the tokens that row gives
    alone with γ = g, whatever the other rows drafted; without lengths the padding would be verified and some rows
    would differ."""
    assert_rows_verify_as_alone(get_sampler(name, temperature=temperature))


def test_lengths_are_checked_against_the_contract():
    dt, dl, tl = random_inputs(B=3, gamma=4)
    for bad, message in ((torch.tensor([1, 2]), r"\[3\]"), (torch.tensor([1.0, 2.0, 3.0]), "int64")):
        with pytest.raises(SamplerInputError, match=message):
            get_sampler("exact")(dt, dl, tl, lengths=bad)
    # out-of-range values are clamped on the device: 9 means all γ, -1 means none
    g = torch.Generator().manual_seed(0)
    res = get_sampler("greedy")(dt, dl, tl, generator=g, lengths=torch.tensor([9, -1, 4]))
    ref = get_sampler("greedy")(dt, dl, tl, generator=g)
    assert res.accepted[0] == ref.accepted[0] and res.accepted[1] == 0


def test_hf_cuts_the_draft_to_the_rows_own_length():
    """The hf rule (batch 1) gives with lengths [g] what it gives for the first g drafts alone, same seed."""
    sampler = get_sampler("hf")
    dt, dl, tl = per_row_inputs(3)
    for b, g in enumerate(PER_ROW_LENGTHS):
        row = (dt[b:b + 1], dl[b:b + 1], tl[b:b + 1])
        for seed in range(3):
            res = sampler(*row, generator=torch.Generator().manual_seed(seed), lengths=torch.tensor([g]))
            alone = sampler(dt[b:b + 1, :g], dl[b:b + 1, :g], tl[b:b + 1, : g + 1],
                            generator=torch.Generator().manual_seed(seed))
            n = int(alone.accepted)
            assert int(res.accepted) == n and res.tokens[0, : n + 1].tolist() == alone.tokens[0, : n + 1].tolist()
            assert res.tokens.shape == (1, max(PER_ROW_LENGTHS) + 1) and (res.tokens[0, n + 1:] == -1).all()


@pytest.mark.parametrize("name", [n for n in TORCH_SAMPLERS if not RULES[n].needs_sampling])
def test_per_row_lengths_never_sync_with_the_host(name):
    dt, dl, tl = per_row_inputs(0)
    lengths = torch.tensor(PER_ROW_LENGTHS)
    assert_no_host_sync(lambda: get_sampler(name, temperature=1.0)(dt, dl, tl, generator=torch.Generator(),
                                                                   lengths=lengths))


# ---- the hf baseline -------------------------------------------------------------------------------------------

def test_hf_sampler_is_batch_one_and_follows_the_target():
    s = get_sampler("hf")
    dt, dl, tl = random_inputs(B=2, gamma=2, V=8)
    with pytest.raises(SamplerInputError, match="batch 1"):
        s(dt, dl, tl)
    g = torch.Generator().manual_seed(0)
    t = torch.randn(1, 3, 8, generator=g) * 2
    d = torch.randn(1, 2, 7, generator=g) * 2  # padded target vocabulary
    q = torch.softmax(d[0], -1)
    firsts = []
    for _ in range(3000):
        x = torch.stack([torch.multinomial(q[i], 1, generator=g) for i in range(2)], 1)
        firsts.append(int(s(x, d, t, generator=g).tokens[0, 0]))
    assert_fits(counts(np.array(firsts), 8), torch.softmax(t[0, 0].double(), -1).numpy(), "hf first token")


def test_hf_sampler_refuses_a_changed_signature(monkeypatch):
    from transformers.generation import utils as hf_utils

    def changed(candidate_logits, new_logits):
        return None

    monkeypatch.setattr(hf_utils, "_speculative_sampling", changed)
    with pytest.raises(SpecsweepError, match="changed _speculative_sampling"):
        get_sampler("hf")


def test_hf_sampler_passes_not_done_to_releases_that_take_is_done_candidate(monkeypatch):
    """transformers up to about 5.17 (and 4.x) take a fifth argument, is_done_candidate; a verify step on its
    own is never at the end of a sequence, so the hf sampler passes False there (and nothing to newer ones)."""
    from transformers.generation import utils as hf_utils

    seen = []

    def older(candidate_input_ids, candidate_logits, candidate_length, new_logits, is_done_candidate):
        seen.append(is_done_candidate)  # a stand-in: rejects the first draft, emits the target's argmax
        return new_logits[:, :1].argmax(-1), torch.tensor(0)

    monkeypatch.setattr(hf_utils, "_speculative_sampling", older)
    dt, dl, tl = random_inputs(B=1, gamma=3)
    res = get_sampler("hf")(dt, dl, tl, generator=torch.Generator().manual_seed(0))
    assert seen == [False] and int(res.accepted[0]) == 0 and int(res.tokens[0, 0]) == int(tl[0, 0].argmax())


@pytest.mark.parametrize("name,temperature,draft_t,argmax", [
    ("exact", 0.7, 0.7, False), ("exact", 0.0, 0.0, True), ("sigmoid", 1.0, 1.0, False), ("hf", 1.0, 1.0, False),
    ("greedy", 1.0, 0.0, True), ("greedy", 0.0, 0.0, True)])
def test_each_rule_says_what_its_draft_should_propose_at(name, temperature, draft_t, argmax):
    """The engine drafts at ``sampler.draft_temperature`` (no branch on the rule's name): greedy verification
    accepts only the target's argmax, so its draft proposes argmax whatever the run's temperature."""
    sampler = get_sampler(name, backend="torch", temperature=temperature)
    assert sampler.draft_temperature == draft_t and sampler.verifies_by_argmax is argmax


def test_hf_with_no_draft_tokens_samples_from_the_target_as_exact_does():
    """The engine drafts fewer tokens near a row's limit, down to none: HF's loop then samples from the target."""
    dt, dl, tl = random_inputs(B=1, gamma=0, V=50, seed=9)
    ours = get_sampler("hf", temperature=0.8)(dt, dl, tl, generator=torch.Generator().manual_seed(3))
    ref = get_sampler("exact", temperature=0.8)(dt, dl, tl, generator=torch.Generator().manual_seed(3))
    assert ours.accepted.tolist() == [0] and torch.equal(ours.tokens, ref.tokens) and ours.tokens.shape == (1, 1)
