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

from pipeline.decoding.cache import CachedModel
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.errors import SpecsweepError
from pipeline.models import check_same_tokenizer, load_causal_lm, load_tokenizer
from pipeline.samplers import get_sampler

EOS = 1


_GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module", params=[("gpt2", "cpu"), ("llama", "cpu"), pytest.param(("gpt2", "cuda"), marks=_GPU),
                                        pytest.param(("llama", "cuda"), marks=_GPU)], ids=lambda p: "-".join(p))
def pair(request, tmp_path_factory):
    """(target, draft, tokenizer, device); the llama draft has a smaller embedding matrix than its target. Every
    test that takes a pair runs on the CPU and, where there is one, on a CUDA GPU: one meaning, both devices."""
    kind, device = request.param
    root = tmp_path_factory.mktemp(kind)
    tp, dp = save_pair(root, kind=kind, draft_vocab_pad=-2 if kind == "llama" else 0)
    tok = load_tokenizer(str(tp))
    return load_causal_lm(str(tp), torch.float32, device), load_causal_lm(str(dp), torch.float32, device), tok, device


def gen(device: str, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def hf_greedy(model, tok, prompt, max_new, eos):
    enc = tok(prompt, return_tensors="pt").to(model.device)
    out = model.generate(**enc, do_sample=False, max_new_tokens=max_new, pad_token_id=0, eos_token_id=eos)
    return out[0, enc.input_ids.shape[1]:].tolist()


@pytest.mark.parametrize("gamma", [0, 1, 3, 5])
@pytest.mark.parametrize("sampler", ["greedy", "exact"])
def test_greedy_verification_is_lossless(pair, gamma, sampler):
    target, draft, tok, dev = pair
    reference = [hf_greedy(target, tok, p, 24, EOS) for p in PROMPTS]
    engine = SpeculativeEngine(target, draft, get_sampler(sampler, temperature=0.0), gamma=gamma, device=dev,
                               eos_token_ids=[EOS], pad_token_id=0)
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

    target, draft, tok, dev = pair
    target, draft = copy.deepcopy(target), copy.deepcopy(draft)
    for m in (target, draft):
        m.set_attn_implementation(attn)
    reference = [hf_greedy(target, tok, p, 20, EOS) for p in PROMPTS]
    engine = SpeculativeEngine(target, draft, get_sampler("greedy"), gamma=3, device=dev, eos_token_ids=[EOS],
                               pad_token_id=0)
    assert engine.target._mask_format == {"eager": "float", "sdpa": "bool"}[attn]
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    assert engine.generate(enc.input_ids, enc.attention_mask, 20).tokens == reference


def test_sliding_window_models_keep_hfs_own_masks():
    """A 4-D mask built by the engine is plain causal; models with sliding-window (or mixed) layers get the
    2-D mask and HF's per-layer masks instead, and a full-length cache that can roll back past the window (a
    window-sized one could not: transformers refused the crop). Greedy decoding of a tiny Mistral whose window
    (4) is shorter than the sequences equals HF's, one prompt at a time. (In a batch a row's padding and
    rejected slots count against its window, as padding does in HF's own batched generate, so rows are not
    compared there.)"""
    from transformers import MistralConfig, MistralForCausalLM

    tok = build_tokenizer()
    config = MistralConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=4, pad_token_id=0,
                           bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    target = MistralForCausalLM(config).eval()
    draft = noisy_copy(target, 0.3, seed=1).eval()
    assert CachedModel(target)._mask_format == "2d"
    engine = SpeculativeEngine(target, draft, get_sampler("greedy"), gamma=3, device="cpu", eos_token_ids=[],
                               pad_token_id=0)
    for p in PROMPTS:
        one = tok(p, return_tensors="pt")
        res = engine.generate(one.input_ids, one.attention_mask, 12)
        assert res.tokens == [hf_greedy(target, tok, p, 12, None)], p
    assert 0 < res.row_stats[0]["accepted"] < res.row_stats[0]["drafted"]  # rollbacks happened


def test_the_engine_drafts_at_the_temperature_its_verify_rule_asks_for(pair):
    target, draft, _, dev = pair
    for name, temperature, expected in (("greedy", 1.0, 0.0), ("exact", 0.7, 0.7), ("sigmoid", 0.0, 0.0)):
        engine = SpeculativeEngine(target, draft, get_sampler(name, temperature=temperature), gamma=2, device=dev,
                                   eos_token_ids=[EOS], pad_token_id=0)
        assert engine.draft_temperature == expected, name


def test_sampler_sees_fresh_forward_distributions_at_every_step(pair):
    """Both caches, after every rollback: at each step of sampled decoding (T = 1, so rejections at varied
    positions), the draft logits [1, γ, V_d] and target logits [1, γ+1, V_t] handed to the sampler equal
    those of fresh, cache-free forwards of each model over the context emitted so far plus the drafts."""
    target, draft, tok, dev = pair
    engine = SpeculativeEngine(target, draft, get_sampler("exact"), gamma=4, device=dev, eos_token_ids=[],
                               pad_token_id=0)
    inner, seen = engine.sampler, []

    def checking(draft_tokens, draft_logits, target_logits, generator=None):
        seq = torch.tensor([context + draft_tokens[0].tolist()], device=dev)
        g, n = draft_tokens.shape[1], len(context)
        with torch.no_grad():
            fresh_d = draft(seq).logits[0, n - 1: n - 1 + g, : draft_logits.shape[-1]]
            fresh_t = target(seq).logits[0, n - 1: n + g]
        if g:   # a step that drafted nothing (the last) hands the sampler an empty draft
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
        engine.generate(enc.input_ids, enc.attention_mask, 24, gen(dev, 0))
    assert any(seen) and not all(seen)  # both rollbacks and fully accepted steps were checked


@pytest.mark.parametrize("batch", [1, len(PROMPTS)])
def test_model_forwards_add_no_host_syncs(pair, batch):
    """The only syncs the op-level detector may see in a whole generate call are the two of the final
    finite-logits check, however many steps ran: no per-forward reads of the attention mask (transformers'
    mask preparation with holes) or of the input ids (GPT-2's padding warning). The one-per-step .tolist()
    of the bookkeeping is deliberate and does not pass through the dispatcher."""
    from sync_detector import NoHostSync

    target, draft, tok, dev = pair
    enc = tok(PROMPTS[:batch], return_tensors="pt", padding=True)
    engine = SpeculativeEngine(target, draft, get_sampler("exact"), gamma=4, device=dev, eos_token_ids=[],
                               pad_token_id=0)
    with NoHostSync() as mode:
        res = engine.generate(enc.input_ids, enc.attention_mask, 24, gen(dev, 0))
    assert res.verify_steps >= 5
    assert len(mode.syncs) <= 2, sorted(set(mode.syncs))


def test_one_host_sync_per_step_on_cuda(pair):
    """On a GPU, torch's own detector (set_sync_debug_mode) sees every blocking read of device memory. A
    generate call makes one per verify step (the bookkeeping read), one per finish event that leaves rows
    running (their indices go to the device), and a few per call; a forward or sampler that synced would
    add one or more per step on top. The CPU runs of the test above prove the same with the op-level
    detector."""
    import warnings

    target, draft, tok, dev = pair
    if dev != "cuda":
        pytest.skip("CUDA's sync detector: the op-level detector covers the CPU")
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    engine = SpeculativeEngine(target, draft, get_sampler("exact"), gamma=4, device=dev, eos_token_ids=[],
                               pad_token_id=0)
    engine.generate(enc.input_ids, enc.attention_mask, 4, gen(dev, 0))  # warm-up: lazy CUDA initialisation
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            res = engine.generate(enc.input_ids, enc.attention_mask, 24, gen(dev, 0))
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message)]
    assert res.verify_steps >= 5
    assert res.verify_steps <= len(syncs) <= res.verify_steps + len(PROMPTS) + 6, (res.verify_steps, syncs[:3])


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two or more CUDA GPUs")
def test_a_target_spread_over_several_gpus_decodes_losslessly(tmp_path):
    """--device auto with several GPUs loads the target with device_map="auto" (each layer, and its KV cache,
    on one GPU; the draft stays on the first). Batched greedy decoding, with rows finishing at different steps
    so cache rows are dropped on every GPU, must still equal HF's greedy decoding of the same sharded model."""
    from pipeline.models import resolve_device, spreads_target

    tp, dp = save_pair(tmp_path, kind="llama", draft_vocab_pad=-2)
    device = resolve_device("auto")
    assert spreads_target("auto") and not spreads_target("cuda")
    target = load_causal_lm(str(tp), torch.float32, device, spread=True)
    draft = load_causal_lm(str(dp), torch.float32, device)
    tok = load_tokenizer(str(tp))
    assert len({str(d) for d in target.hf_device_map.values()}) >= 2, target.hf_device_map
    free = [hf_greedy(target, tok, p, 16, None) for p in PROMPTS]
    eos = free[0][len(free[0]) // 2]  # a token one row reaches mid-way: rows finish at different steps
    reference = [hf_greedy(target, tok, p, 16, eos) for p in PROMPTS]
    engine = SpeculativeEngine(target, draft, get_sampler("greedy"), gamma=3, device=device, eos_token_ids=[eos],
                               pad_token_id=0)
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    assert engine.generate(enc.input_ids, enc.attention_mask, 16).tokens == reference


def test_stops_at_eos_and_never_emits_past_it(pair):
    target, draft, tok, dev = pair
    free = [hf_greedy(target, tok, p, 20, None) for p in PROMPTS]
    # a token that greedy decoding will produce
    eos = max({t for row in free for t in row}, key=lambda t: sum(row.count(t) for row in free))
    reference = [hf_greedy(target, tok, p, 20, eos) for p in PROMPTS]
    engine = SpeculativeEngine(target, draft, get_sampler("greedy"), gamma=4, device=dev, eos_token_ids=[eos],
                               pad_token_id=0)
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    out = engine.generate(enc.input_ids, enc.attention_mask, 20).tokens
    assert out == reference
    assert any(len(r) < 20 for r in out) and all(r.count(eos) <= 1 and (eos not in r or r[-1] == eos) for r in out)


@pytest.mark.parametrize("max_new", [1, 2, 7])
def test_never_emits_past_max_new_tokens(pair, max_new):
    target, draft, tok, dev = pair
    engine = SpeculativeEngine(target, draft, get_sampler("exact"), gamma=5, device=dev, eos_token_ids=[],
                               pad_token_id=0)
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    res = engine.generate(enc.input_ids, enc.attention_mask, max_new, gen(dev, 0))
    assert [len(t) for t in res.tokens] == [max_new] * len(PROMPTS)
    assert all(s["new_tokens"] == max_new for s in res.row_stats)


def test_cache_rollback_matches_a_fresh_forward(pair):
    """Rows keep different numbers of the γ+1 scored positions; the next logits must equal a fresh forward
    over each row's kept prefix."""
    target, _, tok, dev = pair
    enc = tok(PROMPTS[:4], return_tensors="pt", padding=True)
    ids, mask = enc.input_ids.to(dev), enc.attention_mask.bool().to(dev)
    g = torch.Generator().manual_seed(3)
    model = CachedModel(target)
    model.reset(4, torch.device(dev))
    model.forward(ids, mask, holes=True)
    scored = torch.randint(3, 90, (4, 5), generator=g).to(dev)
    model.forward(scored, torch.ones_like(scored, dtype=torch.bool))
    keep = torch.tensor([1, 3, 5, 2], device=dev)
    model.retain(5, keep, 5, 1)
    nxt = torch.randint(3, 90, (4, 1), generator=g).to(dev)
    cached = model.forward(nxt, torch.ones_like(nxt, dtype=torch.bool))[:, -1]
    for b in range(4):
        prefix = torch.cat([ids[b][mask[b]], scored[b, : keep[b]], nxt[b]])[None]
        fresh = target(input_ids=prefix).logits[0, -1]
        torch.testing.assert_close(cached[b], fresh, rtol=1e-4, atol=1e-4)
    assert model.length == ids.shape[1] + 5 + 1  # cropped to the longest kept prefix, plus the new token


def test_exact_sampling_follows_the_target_distribution(pair):
    """First and second emitted tokens of `exact` at T = 1 against the target's p(t1) and sum_t1 p(t1) p(t2|t1)."""
    target, draft, tok, dev = pair
    n = 6000
    enc = tok([PROMPTS[0]] * n, return_tensors="pt", padding=True)
    engine = SpeculativeEngine(target, draft, get_sampler("exact", temperature=1.0), gamma=3, device=dev,
                               eos_token_ids=[], pad_token_id=0)
    res = engine.generate(enc.input_ids, enc.attention_mask, 2, gen(dev, 1))
    out = np.array(res.tokens)
    stats = res.row_stats
    assert 0 < sum(s["accepted"] for s in stats) < sum(s["drafted"] for s in stats)
    V = target.config.vocab_size
    with torch.no_grad():
        prompt = enc.input_ids[:1].to(dev)
        p1 = torch.softmax(target(prompt).logits[0, -1].double(), -1).cpu()
        seqs = torch.cat([prompt.expand(V, -1), torch.arange(V, device=dev)[:, None]], 1)
        p2_given = torch.softmax(target(seqs).logits[:, -1].double(), -1).cpu()
    assert_fits(counts(out[:, 0], V), p1.numpy(), "engine first token")
    assert_fits(counts(out[:, 1], V), (p1[:, None] * p2_given).sum(0).numpy(), "engine second token")


def test_same_seed_same_tokens(pair):
    target, draft, tok, dev = pair
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    engine = SpeculativeEngine(target, draft, get_sampler("exact", temperature=1.0), gamma=3, device=dev,
                               eos_token_ids=[EOS], pad_token_id=0)

    def run(seed):
        return engine.generate(enc.input_ids, enc.attention_mask, 16, gen(dev, seed)).tokens

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_one_engine_reused_reports_each_calls_own_statistics(pair):
    """The drafter lives as long as the engine; each generate call's statistics (draft forwards) count that call
    alone, so a run's warm-up and earlier batches never leak into a later batch's figures."""
    target, draft, tok, dev = pair
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    engine = SpeculativeEngine(target, draft, get_sampler("exact", temperature=1.0), gamma=3, device=dev,
                               eos_token_ids=[EOS], pad_token_id=0)
    first, second = (engine.generate(enc.input_ids, enc.attention_mask, 16, gen(dev, 5)) for _ in range(2))
    assert first.tokens == second.tokens
    assert first.extra["draft_forwards"] == second.extra["draft_forwards"] > 0


def test_sigmoid_and_gamma_zero_run_through_the_same_loop(pair):
    target, draft, tok, dev = pair
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    for sampler, gamma, d in ((get_sampler("sigmoid", temperature=0.8), 4, draft), (get_sampler("exact"), 0, None)):
        res = SpeculativeEngine(target, d, sampler, gamma=gamma, device=dev, eos_token_ids=[EOS],
                                pad_token_id=0).generate(
            enc.input_ids, enc.attention_mask, 12, gen(dev, 0))
        assert all(1 <= len(t) <= 12 for t in res.tokens)
        # one target forward per step, the first's too; the prompt but its last token is read before it, timed as
        # prefill (beside the draft's prefill when there is a draft)
        assert res.verify_steps >= 1 and res.phase_calls["target"] == res.verify_steps
        assert res.phase_calls["prefill"] == 1 + (gamma > 0)
        # phases do not overlap: perf_counter on CPU, CUDA events (GPU time between records) on a GPU
        assert set(res.phase_time_s) == set(res.phase_calls)
        assert all(t > 0 for t in res.phase_time_s.values())
        assert sum(res.phase_time_s.values()) <= res.wall_time_s
        if gamma == 0:
            assert "draft" not in res.phase_calls and all(s["drafted"] == 0 for s in res.row_stats)


def test_refuses_different_tokenizers_and_overlong_requests(pair):
    target, draft, tok, dev = pair
    other = build_tokenizer(words=["zebra", "yak", "the"])
    with pytest.raises(SpecsweepError, match=r"different tokenizers.*use --draft-tokenizer-mode auto, intersection"):
        check_same_tokenizer(tok, other, "t", "d")
    check_same_tokenizer(tok, tok, "t", "d")
    engine = SpeculativeEngine(target, draft, get_sampler("greedy"), gamma=4, device=dev, eos_token_ids=[EOS],
                               pad_token_id=0)
    enc = tok(PROMPTS[:1], return_tensors="pt")
    with pytest.raises(SpecsweepError, match="exceeds the target's 256 positions"):
        engine.generate(enc.input_ids, enc.attention_mask, 400)
    with pytest.raises(SpecsweepError, match="gamma must be >= 0"):
        SpeculativeEngine(target, draft, get_sampler("greedy"), gamma=-1, device=dev, eos_token_ids=[EOS],
                          pad_token_id=0)


def test_accepted_histogram_and_position_acceptance(pair):
    from pipeline.objectives import position_acceptance

    target, draft, tok, dev = pair
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    res = SpeculativeEngine(target, draft, get_sampler("exact"), gamma=3, device=dev, eos_token_ids=[],
                            pad_token_id=0).generate(
        enc.input_ids, enc.attention_mask, 20, gen(dev, 0))
    hist = res.extra["accepted_histogram"]
    assert len(hist) == 4 and sum(hist) <= sum(s["verify_steps"] for s in res.row_stats)
    # full-γ steps account for all accepted tokens except those of the last, shortened steps
    assert sum(k * n for k, n in enumerate(hist)) <= sum(s["accepted"] for s in res.row_stats)
    assert position_acceptance([10, 5, 5, 80]) == [0.9, 85 / 90, 80 / 85]
    assert position_acceptance([0, 0, 4]) == [1.0, 1.0] and position_acceptance([3, 0, 0]) == [0.0, None]


def test_iid_alpha_recovers_the_per_token_rate_that_accepted_over_drafted_does_not():
    """For an i.i.d. per-token acceptance α, a full-γ step accepts k < γ tokens with probability α^k (1 - α) and
    all γ with probability α^γ. The estimator must return α from those (scaled) counts; accepted/drafted is lower."""
    from pipeline.objectives import iid_alpha, theoretical_speedup

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

    target, draft, tok, dev = pair
    free = [hf_greedy(target, tok, p, 12, None) for p in PROMPTS]
    suppress = sorted({row[1] for row in free})            # tokens greedy decoding wanted at step 2
    begin = sorted({row[0] for row in free} - set(suppress))  # and at step 1
    engine = SpeculativeEngine(target, draft, get_sampler("greedy"), gamma=3, device=dev, eos_token_ids=[],
                               pad_token_id=0, suppress_tokens=suppress, begin_suppress_tokens=begin)
    for i, p in enumerate(PROMPTS):
        enc = tok(p, return_tensors="pt").to(dev)
        ref = target.generate(**enc, do_sample=False, max_new_tokens=12, min_new_tokens=12, pad_token_id=0,
                              suppress_tokens=suppress, begin_suppress_tokens=begin)[0, enc.input_ids.shape[1]:]
        out = engine.generate(enc.input_ids, enc.attention_mask, 12).tokens[0]
        assert out == ref.tolist(), i
        assert not set(out) & set(suppress) and out[0] not in begin
    for V in {target.config.vocab_size, draft.get_output_embeddings().weight.shape[0]}:
        logits = torch.zeros(2, 3, V, device=dev)
        with NoHostSync() as mode:
            engine.mask(logits, first_position=False)
            engine.mask(logits[:, :1], first_position=True)
        assert not mode.syncs
        assert torch.isinf(logits[..., suppress]).all() and torch.isinf(logits[:, 0, begin]).all()
        assert not torch.isinf(logits[:, 1:, begin]).any()
