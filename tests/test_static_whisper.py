"""The static-cache forward of Whisper's decoder (pipeline/decoding/static/whisper.py) computes what transformers'
forward computes.

On a tiny random Whisper pair (pipeline/synthetic.py) with both draft kinds (a full Whisper, and a
WhisperForCausalLM decoder reading the target's encoder output): logits agree with transformers' over a batch
of clips through holes from uneven rollbacks, rows dropped and the buffer grown past its first capacity; a seeded
speculative generation emits the same tokens, step for step, with and without it; a model with an embedding scale
or eager attention falls back to transformers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.decoding.cache import CachedModel, model_kind
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.decoding.static import WhisperStaticForward, static_forward_for
from pipeline.samplers import get_sampler
from pipeline.synthetic import save_whisper_pair

EOS = 0


@pytest.fixture(scope="module", params=["seq2seq", "decoder_only"])
def pair(request, tmp_path_factory):
    """(target, draft, processor, clip features [4, 80, F]) for each draft kind."""
    from transformers import AutoModelForCausalLM, AutoProcessor, WhisperForConditionalGeneration

    tp, dp = save_whisper_pair(tmp_path_factory.mktemp(request.param), draft_kind=request.param)
    draft_cls = WhisperForConditionalGeneration if request.param == "seq2seq" else AutoModelForCausalLM
    processor = AutoProcessor.from_pretrained(tp)
    rs = np.random.RandomState(0)
    audio = [(rs.randn(int(16000 * (0.5 + i * 0.4))) * (0.05 + 0.3 * i)).astype("float32") for i in range(4)]
    feats = processor.feature_extractor(audio, sampling_rate=16000, return_tensors="pt").input_features
    return (WhisperForConditionalGeneration.from_pretrained(tp).eval(), draft_cls.from_pretrained(dp).eval(),
            processor, feats)


def _encoder_output(target, feats):
    with torch.no_grad():
        return target.get_encoder()(feats).last_hidden_state


@pytest.mark.parametrize("which", ["target", "draft"])
def test_logits_agree_through_holes_rollback_row_drops_and_growth(pair, which):
    target, draft, processor, feats = pair
    model = target if which == "target" else draft
    kind = model_kind(model, target_is_seq2seq=True)
    static, dynamic = CachedModel(model, kind, static=True), CachedModel(model, kind, static=False)
    assert isinstance(static.static, WhisperStaticForward) and dynamic.static is None
    hidden = _encoder_output(target if kind == "decoder_with_encoder" else model, feats)
    prompt = torch.tensor([processor.tokenizer.prefix_tokens] * 4)
    g = torch.Generator().manual_seed(0)
    V = model.config.vocab_size

    def both(ids, valid=None, last=0, holes=False):
        with torch.no_grad():
            out = [m.forward(ids, valid, last, holes) for m in (static, dynamic)]
        torch.testing.assert_close(out[0], out[1], rtol=1e-4, atol=1e-4)
        return out[0]

    for m in (static, dynamic):
        m.reset(4, torch.device("cpu"), hidden, capacity=prompt.shape[1] + 2)   # small: the static one must grow
    both(prompt, last=1)
    for step in range(6):
        ids = torch.randint(1, V, (static.batch, 4), generator=g)
        both(ids)
        keep = torch.randint(0, 5, (static.batch,), generator=g)
        for m in (static, dynamic):
            m.retain(4, keep, int(keep.max()), int(keep.min()))
        if step == 3:                    # rows finish and leave the cache (and their encoder output with them)
            for m in (static, dynamic):
                m.select(torch.tensor([0, 2]))
    assert static.static.capacity > prompt.shape[1] + 2 and static.static.cross_keys.shape[1] == 2
    assert static.length == dynamic.length
    torch.testing.assert_close(static.mask, dynamic.mask)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_seeded_generation_emits_the_same_tokens_with_and_without_it(pair, temperature):
    target, draft, processor, feats = pair
    prompt = torch.tensor([processor.tokenizer.prefix_tokens] * 4)
    sampler = get_sampler("greedy") if temperature == 0 else get_sampler("exact", temperature=temperature)
    results = []
    for static in (True, False):
        engine = SpeculativeEngine(target, draft, sampler, gamma=3, device="cpu", eos_token_ids=[EOS], pad_token_id=EOS,
                                   static_cache=static)
        assert (engine.target.static is not None) is static
        results.append(engine.generate(prompt, torch.ones_like(prompt), 16, torch.Generator().manual_seed(7),
                                       encoder_inputs={"input_features": feats}))
    assert results[0].tokens == results[1].tokens
    assert [r["accepted"] for r in results[0].row_stats] == [r["accepted"] for r in results[1].row_stats]
    assert sum(r["accepted"] for r in results[0].row_stats) > 0


def test_whisper_models_it_does_not_reproduce_use_transformers(pair):
    target = pair[0]
    assert static_forward_for(target) is not None
    target.config.scale_embedding = True                   # an embedding scale this forward does not apply
    assert static_forward_for(target) is None
    target.config.scale_embedding = False
    target.config._attn_implementation = "eager"           # eager attention rounds differently from sdpa
    assert static_forward_for(target) is None
    target.config._attn_implementation = "sdpa"
    assert static_forward_for(target) is not None
