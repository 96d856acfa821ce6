"""The speculative decoding engine on tiny random-init models (CPU, offline).

Lossless: greedy verification reproduces the target's own greedy decoding token for token, for several γ,
alone and in batches of prompts of different lengths. Cache rollback: after a rejection, the cached target
gives the logits of a fresh forward over the accepted prefix. Sampling: with `exact` at T = 1 the first and
second emitted tokens follow the target's distribution (chi-square).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from stat_utils import assert_fits, counts
from tiny_models import PROMPTS, build_tokenizer, noisy_copy, save_pair

from pipeline.engine import CachedModel, SpeculativeEngine
from pipeline.errors import SpecsweepError
from pipeline.models import check_same_tokenizer, load_causal_lm, load_tokenizer
from pipeline.samplers import get_sampler

EOS = 1


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def pair(request, tmp_path_factory):
    """(target, draft, tokenizer); the llama draft has a smaller embedding matrix than its target."""
    root = tmp_path_factory.mktemp(request.param)
    tp, dp = save_pair(root, kind=request.param, draft_vocab_pad=-2 if request.param == "llama" else 0)
    tok = load_tokenizer(str(tp))
    return load_causal_lm(str(tp), torch.float32, "cpu"), load_causal_lm(str(dp), torch.float32, "cpu"), tok


def hf_greedy(model, tok, prompt, max_new, eos):
    enc = tok(prompt, return_tensors="pt")
    out = model.generate(**enc, do_sample=False, max_new_tokens=max_new, pad_token_id=0, eos_token_id=eos)
    return out[0, enc.input_ids.shape[1]:].tolist()


@pytest.mark.parametrize("gamma", [0, 1, 3, 5])
@pytest.mark.parametrize("sampler", ["greedy", "exact"])
def test_greedy_verification_is_lossless(pair, gamma, sampler):
    target, draft, tok = pair
    reference = [hf_greedy(target, tok, p, 24, EOS) for p in PROMPTS]
    engine = SpeculativeEngine(target, draft, get_sampler(sampler, temperature=0.0), gamma, "cpu", [EOS], 0)
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    batched = engine.generate(enc.input_ids, enc.attention_mask, 24)
    assert batched.tokens == reference
    for i in (0, 3):  # B = 1
        one = tok(PROMPTS[i], return_tensors="pt")
        assert engine.generate(one.input_ids, one.attention_mask, 24).tokens == [reference[i]]
    if gamma:
        stats = batched.row_stats
        assert 0 < sum(s["accepted"] for s in stats) < sum(s["drafted"] for s in stats), "no partial acceptance"


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_batched_decoding_is_lossless_with_either_attention_mask_format(pair, attn):
    """With holes the engine builds the 4-D mask itself: a boolean one for sdpa, an additive float one for eager
    attention. Both must reproduce the target's own greedy decoding (rows of different lengths, partial
    acceptance, so padding and rejected-position holes are both masked)."""
    import copy

    target, draft, tok = pair
    target, draft = copy.deepcopy(target), copy.deepcopy(draft)
    for m in (target, draft):
        m.set_attn_implementation(attn)
    reference = [hf_greedy(target, tok, p, 20, EOS) for p in PROMPTS]
    engine = SpeculativeEngine(target, draft, get_sampler("greedy"), 3, "cpu", [EOS], 0)
    assert engine.target._mask_format == {"eager": "float", "sdpa": "bool"}[attn]
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    assert engine.generate(enc.input_ids, enc.attention_mask, 20).tokens == reference


def test_sliding_window_models_keep_hfs_own_masks():
    """A 4-D mask built by the engine is plain causal; models with sliding-window (or mixed) layers get the
    2-D mask and HF's per-layer masks instead, and a cache that can roll back past the window (it could not:
    transformers refused the crop). Greedy decoding of a tiny Mistral whose window (4) is shorter than the
    sequences equals HF's, one prompt at a time. (In a batch a row's padding and rejected slots count
    against its window, as padding does in HF's own batched generate, so rows are not compared there.)"""
    from transformers import MistralConfig, MistralForCausalLM

    tok = build_tokenizer()
    config = MistralConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=4, pad_token_id=0,
                           bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    target = MistralForCausalLM(config).eval()
    draft = noisy_copy(target, 0.3, seed=1).eval()
    assert CachedModel(target)._mask_format == "2d"
    engine = SpeculativeEngine(target, draft, get_sampler("greedy"), 3, "cpu", [], 0)
    for p in PROMPTS:
        one = tok(p, return_tensors="pt")
        res = engine.generate(one.input_ids, one.attention_mask, 12)
        assert res.tokens == [hf_greedy(target, tok, p, 12, None)], p
    assert 0 < res.row_stats[0]["accepted"] < res.row_stats[0]["drafted"]  # rollbacks happened


def test_sampler_sees_fresh_forward_distributions_at_every_step(pair):
    """Both caches, after every rollback: at each step of sampled decoding (T = 1, so rejections at varied
    positions), the draft logits [1, γ, V_d] and target logits [1, γ+1, V_t] handed to the sampler equal
    those of fresh, cache-free forwards of each model over the context emitted so far plus the drafts."""
    target, draft, tok = pair
    engine = SpeculativeEngine(target, draft, get_sampler("exact"), 4, "cpu", [], 0)
    inner, seen = engine.sampler, []

    def checking(draft_tokens, draft_logits, target_logits, generator=None):
        seq = torch.tensor([context + draft_tokens[0].tolist()])
        g, n = draft_tokens.shape[1], len(context)
        with torch.no_grad():
            fresh_d = draft(seq).logits[0, n - 1: n - 1 + g, : draft_logits.shape[-1]]
            fresh_t = target(seq).logits[0, n - 1: n + g]
        torch.testing.assert_close(draft_logits[0], fresh_d, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(target_logits[0], fresh_t, atol=1e-4, rtol=1e-4)
        res = inner(draft_tokens, draft_logits, target_logits, generator=generator)
        k = int(res.accepted[0])
        seen.append(k < g)
        context.extend(res.tokens[0, : k + 1].tolist())
        return res

    engine.sampler = checking
    for p in PROMPTS[:3]:
        enc = tok(p, return_tensors="pt")
        context = enc.input_ids[0].tolist()
        engine.generate(enc.input_ids, enc.attention_mask, 24, torch.Generator().manual_seed(0))
    assert any(seen) and not all(seen)  # both rollbacks and fully accepted steps were checked


@pytest.mark.parametrize("batch", [1, len(PROMPTS)])
def test_model_forwards_add_no_host_syncs(pair, batch):
    """The only syncs the op-level detector may see in a whole generate call are the two of the final
    finite-logits check, however many steps ran: no per-forward reads of the attention mask (transformers'
    mask preparation with holes) or of the input ids (GPT-2's padding warning). The one-per-step .tolist()
    of the bookkeeping is deliberate and does not pass through the dispatcher."""
    from sync_detector import NoHostSync

    target, draft, tok = pair
    enc = tok(PROMPTS[:batch], return_tensors="pt", padding=True)
    engine = SpeculativeEngine(target, draft, get_sampler("exact"), 4, "cpu", [], 0)
    with NoHostSync() as mode:
        res = engine.generate(enc.input_ids, enc.attention_mask, 24, torch.Generator().manual_seed(0))
    assert res.verify_steps >= 5
    assert len(mode.syncs) <= 2, sorted(set(mode.syncs))


def test_stops_at_eos_and_never_emits_past_it(pair):
    target, draft, tok = pair
    free = [hf_greedy(target, tok, p, 20, None) for p in PROMPTS]
    # a token that greedy decoding will produce
    eos = max({t for row in free for t in row}, key=lambda t: sum(row.count(t) for row in free))
    reference = [hf_greedy(target, tok, p, 20, eos) for p in PROMPTS]
    engine = SpeculativeEngine(target, draft, get_sampler("greedy"), 4, "cpu", [eos], 0)
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    out = engine.generate(enc.input_ids, enc.attention_mask, 20).tokens
    assert out == reference
    assert any(len(r) < 20 for r in out) and all(r.count(eos) <= 1 and (eos not in r or r[-1] == eos) for r in out)


@pytest.mark.parametrize("max_new", [1, 2, 7])
def test_never_emits_past_max_new_tokens(pair, max_new):
    target, draft, tok = pair
    engine = SpeculativeEngine(target, draft, get_sampler("exact"), 5, "cpu", [], 0)
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    res = engine.generate(enc.input_ids, enc.attention_mask, max_new, torch.Generator().manual_seed(0))
    assert [len(t) for t in res.tokens] == [max_new] * len(PROMPTS)
    assert all(s["new_tokens"] == max_new for s in res.row_stats)


def test_cache_rollback_matches_a_fresh_forward(pair):
    """Rows keep different numbers of the γ+1 scored positions; the next logits must equal a fresh forward
    over each row's kept prefix."""
    target, _, tok = pair
    enc = tok(PROMPTS[:4], return_tensors="pt", padding=True)
    ids, mask = enc.input_ids, enc.attention_mask.bool()
    g = torch.Generator().manual_seed(3)
    model = CachedModel(target)
    model.reset(4, torch.device("cpu"))
    model.forward(ids, mask, holes=True)
    scored = torch.randint(3, 90, (4, 5), generator=g)
    model.forward(scored, torch.ones_like(scored, dtype=torch.bool))
    keep = torch.tensor([1, 3, 5, 2])
    model.retain(5, keep, 5, 1)
    nxt = torch.randint(3, 90, (4, 1), generator=g)
    cached = model.forward(nxt, torch.ones_like(nxt, dtype=torch.bool))[:, -1]
    for b in range(4):
        prefix = torch.cat([ids[b][mask[b]], scored[b, : keep[b]], nxt[b]])[None]
        fresh = target(input_ids=prefix).logits[0, -1]
        torch.testing.assert_close(cached[b], fresh, rtol=1e-4, atol=1e-4)
    assert model.length == ids.shape[1] + 5 + 1  # cropped to the longest kept prefix, plus the new token


def test_exact_sampling_follows_the_target_distribution(pair):
    """First and second emitted tokens of `exact` at T = 1 against the target's p(t1) and sum_t1 p(t1) p(t2|t1)."""
    target, draft, tok = pair
    n = 6000
    enc = tok([PROMPTS[0]] * n, return_tensors="pt", padding=True)
    engine = SpeculativeEngine(target, draft, get_sampler("exact", temperature=1.0), 3, "cpu", [], 0)
    res = engine.generate(enc.input_ids, enc.attention_mask, 2, torch.Generator().manual_seed(1))
    out = np.array(res.tokens)
    stats = res.row_stats
    assert 0 < sum(s["accepted"] for s in stats) < sum(s["drafted"] for s in stats)
    V = target.config.vocab_size
    with torch.no_grad():
        prompt = enc.input_ids[:1]
        p1 = torch.softmax(target(prompt).logits[0, -1].double(), -1)
        seqs = torch.cat([prompt.expand(V, -1), torch.arange(V)[:, None]], 1)
        p2_given = torch.softmax(target(seqs).logits[:, -1].double(), -1)
    assert_fits(counts(out[:, 0], V), p1.numpy(), "engine first token")
    assert_fits(counts(out[:, 1], V), (p1[:, None] * p2_given).sum(0).numpy(), "engine second token")


def test_same_seed_same_tokens(pair):
    target, draft, tok = pair
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    engine = SpeculativeEngine(target, draft, get_sampler("exact", temperature=1.0), 3, "cpu", [EOS], 0)

    def run(seed):
        return engine.generate(enc.input_ids, enc.attention_mask, 16, torch.Generator().manual_seed(seed)).tokens

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_sigmoid_and_gamma_zero_run_through_the_same_loop(pair):
    target, draft, tok = pair
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    for sampler, gamma, d in ((get_sampler("sigmoid", temperature=0.8), 4, draft), (get_sampler("exact"), 0, None)):
        res = SpeculativeEngine(target, d, sampler, gamma, "cpu", [EOS], 0).generate(
            enc.input_ids, enc.attention_mask, 12, torch.Generator().manual_seed(0))
        assert all(1 <= len(t) <= 12 for t in res.tokens)
        # one target forward per step; the first takes the prompt too and is timed as prefill (beside the
        # draft's prefill when there is a draft)
        assert res.verify_steps >= 1 and res.phase_calls["target"] == res.verify_steps - 1
        assert res.phase_calls["prefill"] == 1 + (gamma > 0)
        if gamma == 0:
            assert "draft" not in res.phase_calls and all(s["drafted"] == 0 for s in res.row_stats)


def test_refuses_different_tokenizers_and_overlong_requests(pair):
    target, draft, tok = pair
    other = build_tokenizer(words=["zebra", "yak", "the"])
    with pytest.raises(SpecsweepError, match="different tokenizers"):
        check_same_tokenizer(tok, other, "t", "d")
    check_same_tokenizer(tok, tok, "t", "d")
    engine = SpeculativeEngine(target, draft, get_sampler("greedy"), 4, "cpu", [EOS], 0)
    enc = tok(PROMPTS[:1], return_tensors="pt")
    with pytest.raises(SpecsweepError, match="exceeds the target's 256 positions"):
        engine.generate(enc.input_ids, enc.attention_mask, 400)
    with pytest.raises(SpecsweepError, match="gamma must be >= 0"):
        SpeculativeEngine(target, draft, get_sampler("greedy"), -1, "cpu", [EOS], 0)


def test_accepted_histogram_and_position_acceptance(pair):
    from pipeline.runner import position_acceptance

    target, draft, tok = pair
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    res = SpeculativeEngine(target, draft, get_sampler("exact"), 3, "cpu", [], 0).generate(
        enc.input_ids, enc.attention_mask, 20, torch.Generator().manual_seed(0))
    hist = res.extra["accepted_histogram"]
    assert len(hist) == 4 and sum(hist) <= sum(s["verify_steps"] for s in res.row_stats)
    # full-γ steps account for all accepted tokens except those of the last, shortened steps
    assert sum(k * n for k, n in enumerate(hist)) <= sum(s["accepted"] for s in res.row_stats)
    assert position_acceptance([10, 5, 5, 80]) == [0.9, 85 / 90, 80 / 85]
    assert position_acceptance([0, 0, 4]) == [1.0, 1.0] and position_acceptance([3, 0, 0]) == [0.0, None]


def test_iid_alpha_recovers_the_per_token_rate_that_accepted_over_drafted_does_not():
    """For an i.i.d. per-token acceptance α, a full-γ step accepts k < γ tokens with probability α^k (1 - α) and
    all γ with probability α^γ. The estimator must return α from those (scaled) counts; accepted/drafted is lower."""
    from pipeline.runner import iid_alpha, theoretical_speedup

    for alpha, gamma in ((0.7, 4), (0.3, 6), (0.95, 8)):
        hist = [round(1e6 * alpha**k * (1 - alpha)) for k in range(gamma)] + [round(1e6 * alpha**gamma)]
        assert iid_alpha(hist) == pytest.approx(alpha, abs=1e-5)
        accepted_over_drafted = sum(k * n for k, n in enumerate(hist)) / (gamma * sum(hist))
        assert accepted_over_drafted < alpha - 0.01
    assert iid_alpha([0, 0, 7]) == 1.0 and iid_alpha([5, 0, 0]) == 0.0 and iid_alpha(None) is None
    # Leviathan et al.: (1 - α^(γ+1)) / ((1 - α)(γc + 1)); α = 1 gives (γ + 1) / (γc + 1)
    assert theoretical_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / (0.2 * 1.4))
    assert theoretical_speedup(1.0, 4, 0.25) == pytest.approx(5 / 2)


def test_suppressed_tokens_match_hf_and_never_sync(pair):
    """suppress_tokens / begin_suppress_tokens (Whisper's generation config asks for them) behave as HF's logits
    processors: greedy decoding through the speculative loop equals HF's greedy generate with the same lists."""
    from sync_detector import NoHostSync

    target, draft, tok = pair
    free = [hf_greedy(target, tok, p, 12, None) for p in PROMPTS]
    suppress = sorted({row[1] for row in free})            # tokens greedy decoding wanted at step 2
    begin = sorted({row[0] for row in free} - set(suppress))  # and at step 1
    engine = SpeculativeEngine(target, draft, get_sampler("greedy"), 3, "cpu", [], 0, suppress_tokens=suppress,
                               begin_suppress_tokens=begin)
    for i, p in enumerate(PROMPTS):
        enc = tok(p, return_tensors="pt")
        ref = target.generate(**enc, do_sample=False, max_new_tokens=12, min_new_tokens=12, pad_token_id=0,
                              suppress_tokens=suppress, begin_suppress_tokens=begin)[0, enc.input_ids.shape[1]:]
        out = engine.generate(enc.input_ids, enc.attention_mask, 12).tokens[0]
        assert out == ref.tolist(), i
        assert not set(out) & set(suppress) and out[0] not in begin
    for V in {target.config.vocab_size, draft.get_output_embeddings().weight.shape[0]}:
        logits = torch.zeros(2, 3, V)
        with NoHostSync() as mode:
            engine._mask_logits(logits, first_position=False)
            engine._mask_logits(logits[:, :1], first_position=True)
        assert not mode.syncs
        assert torch.isinf(logits[..., suppress]).all() and torch.isinf(logits[:, 0, begin]).all()
        assert not torch.isinf(logits[:, 1:, begin]).any()
