"""The compiled static forward (pipeline/decoding/static/compiled.py) computes what the eager one computes.

``forward_at`` (the fixed-shape step over the whole cache) is held to ``forward`` on logits and cache contents; a
seeded generation through torch.compile (inductor on the CPU: the path CUDA graphs take on a GPU, less the graphs)
emits the eager engine's tokens, at T = 0 and T = 1, for the target alone and with a draft model; what it cannot
compile is refused in one line.
"""

from __future__ import annotations

import pytest
import torch
from test_static_llama import build
from tiny_models import load_saved_pair

from pipeline.config import RunConfig
from pipeline.decoding.cache import CachedModel
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.decoding.static import static_forward_for
from pipeline.errors import SpecsweepError
from pipeline.samplers import get_sampler

EOS = 1


@pytest.mark.parametrize("heads", [(4, 2), (4, 4)], ids=["gqa", "mha"])
def test_forward_at_is_the_causal_forward_over_the_whole_cache(heads):
    model = build(num_attention_heads=heads[0], num_key_value_heads=heads[1])
    eager, fixed = (CachedModel(model, static=True) for _ in range(2))
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 97, (2, 7), generator=g)
    for m in (eager, fixed):
        m.reset(2, torch.device("cpu"), capacity=40)
        m.forward(prompt)
    for q in (1, 4, 1, 3):                      # one-token steps and verify widths, after a rollback too
        ids = torch.randint(3, 97, (2, q), generator=g)
        want = eager.forward(ids)
        at = torch.arange(fixed.length, fixed.length + q)
        got = fixed.static.forward_at(ids, at, 0)
        fixed.length += q
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        if q > 1:
            for m in (eager, fixed):
                m.retain(q, torch.tensor([1, 1]), 1, 1)
    end = eager.length
    torch.testing.assert_close(fixed.static.keys[:, :, :, :end], eager.static.keys[:, :, :, :end])
    torch.testing.assert_close(fixed.static.values[:, :, :, :end], eager.static.values[:, :, :, :end])


@pytest.fixture(scope="module")
def llama_pair(tmp_path_factory):
    return load_saved_pair(tmp_path_factory.mktemp("compiled"), kind="llama")


_GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CASES = [(3, 0.0, "cpu", "default"), (3, 1.0, "cpu", "default"), (0, 1.0, "cpu", "default"),
         pytest.param(3, 0.0, "cuda", "reduce-overhead", marks=_GPU),     # CUDA graphs
         pytest.param(3, 1.0, "cuda", "reduce-overhead", marks=_GPU)]


@pytest.mark.parametrize("gamma, temperature, device, mode", CASES)
def test_a_compiled_generation_emits_the_eager_tokens(llama_pair, gamma, temperature, device, mode):
    """Rows of one length (no padding: the steps the compiled path takes), seeded, compiled against eager."""
    import copy

    target, draft, tok = llama_pair
    if device != "cpu":
        target, draft = copy.deepcopy(target).to(device), copy.deepcopy(draft).to(device)
    enc = tok(["the storm hit the city", "police said the fire was"], return_tensors="pt", padding=True).to(device)
    assert bool(enc.attention_mask.all())
    results = []
    for compile in ("off", mode):
        engine = SpeculativeEngine(target, draft, get_sampler("exact", temperature=temperature), gamma=gamma,
                                   device=device, eos_token_ids=[EOS], pad_token_id=0, compile=compile)
        results.append(engine.generate(enc.input_ids, enc.attention_mask, 20,
                                       generator=torch.Generator(device).manual_seed(7)))
        models = [engine.target] + ([engine.drafter.model] if gamma else [])
        for m in models:
            assert (m.static.compiled is None) is (compile == "off")
            if compile != "off":             # the steps ran compiled: one shape at least, and its compile was timed
                record = m.static.compiled.record()
                assert record["shapes"] >= 1 and record["compile_s"] > 0 and record["mode"] == mode
                assert m.static.packed is False
    assert results[0].tokens == results[1].tokens
    assert [r["accepted"] for r in results[0].row_stats] == [r["accepted"] for r in results[1].row_stats]


def test_what_it_cannot_compile_is_refused_in_one_line():
    from pipeline.synthetic import build_model

    gpt2 = build_model("gpt2", 50, 1, 16, seed=0)
    with pytest.raises(SpecsweepError, match="--compile compiles the static forward of a Llama"):
        static_forward_for(gpt2, compile="default")
    with pytest.raises(SpecsweepError, match="drop --draft-quant"):
        static_forward_for(build(), quant="int8", compile="default")
    with pytest.raises(SpecsweepError, match="--no-static-cache"):
        CachedModel(build(), static=False, compile="default")
    base = dict(target="t", task="prompts", data="d.jsonl", out="o.json", compile="default")
    with pytest.raises(SpecsweepError, match="--engine specsweep"):
        RunConfig(**base, engine="hf", gamma=0).validate_decoding()
    with pytest.raises(SpecsweepError, match="drop one of them"):
        RunConfig(**base, draft="d", gamma=2, draft_quant="int4").validate_decoding()
