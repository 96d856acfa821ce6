"""Static-KV-cache forwards: the engine's fast path for the model families it knows (GPT-2; Llama,
Mistral and Qwen2; Whisper's decoder).

Why. A speculative loop makes γ draft forwards and one target forward per step, each over a handful of tokens.
At the toy pairs' sizes, and for any small draft on a GPU, such a forward is mostly fixed per-call cost, not
arithmetic: transformers' module dispatch, its mask builder, the DynamicCache's concatenations. That makes a
draft with 1/12 of the target's FLOPs cost 0.8 of its time (docs/measurement.md), and speculative
decoding cannot win. gpt-fast answers with its own model code over a preallocated cache; so does this module,
for one family at a time, over the transformers model's own parameters (nothing is copied, so a checkpoint
loads once and both paths compute with the same weights).

What it computes. Exactly the transformers forward of the same model in eval mode with sdpa attention (the
same operations in the same order: ``addmm`` for GPT-2's Conv1D, Llama's float32 RMSNorm and rotate-half RoPE,
the model's own activation, epsilons and RoPE frequencies, sdpa with the model's scaling), so logits agree with
transformers' to rounding and a seeded run emits the same tokens with and without it (tests/test_static_cache.py,
tests/test_static_llama.py).

The cache (base.py). Keys and values live in one buffer per kind, dtype [n_layer, B, H_kv, capacity, D] (H_kv:
the key/value heads, fewer than the query heads with grouped-query attention), allocated when a
generation starts (capacity: prompt + new tokens + γ + 2, grown by doubling if a caller asks for more).
Appending k tokens writes positions [length, length + k); rolling back is ``length -= n``: the stale
positions past ``length`` are never attended (the causal mask ends at each query's own position) and the
next append overwrites them. No allocation, no copy, no host sync per forward.

    base.py    StaticForward: the call CachedModel makes, the cache, its growth and row selection
    gpt2.py    GPT2LMHeadModel
    llama.py   LlamaForCausalLM, and MistralForCausalLM / Qwen2ForCausalLM without sliding windows
    whisper.py the decoder of WhisperForConditionalGeneration and WhisperForCausalLM, with the cross-attention
               keys and values of the encoder output computed once per generate call
    quant.py   weight-only int8 and int4 projections for the Llama family's forward (a draft's ``--draft-quant``)
    int4_row.py  a draft's one-token forward with int4 projections in one kernel call (kernels/int4_layers.cpp)
    packed.py  the Llama family's projections from packed copies of their weights on a CPU (``--no-packed-weights``
               turns them off): the same products, read faster
    compiled.py  the decoding steps through torch.compile (``--compile``), under CUDA graphs on a GPU

:func:`static_forward_for` picks the implementation for a model, or None when the model's family (or one of
its options) has none; the engine then uses transformers' forward with a DynamicCache.
"""

from __future__ import annotations

from pipeline.decoding.static.gpt2 import GPT2StaticForward
from pipeline.decoding.static.llama import FAMILIES as LLAMA_FAMILIES
from pipeline.decoding.static.llama import LlamaStaticForward
from pipeline.decoding.static.whisper import WhisperStaticForward
from pipeline.errors import SpecsweepError

# model families with a static forward, tried in order
STATIC_FORWARDS = (GPT2StaticForward, LlamaStaticForward, WhisperStaticForward)
QUANTIZED_FORWARDS = (LlamaStaticForward,)
"""The static forwards that take quantised projections (quant.py)."""
QUANTIZED_FAMILIES = LLAMA_FAMILIES
"""The model classes (a config's ``architectures``) whose static forward takes quantised projections."""
PACKED_FORWARDS = (LlamaStaticForward,)
"""The static forwards whose projections can multiply packed weights (packed.py); the others ignore ``packed``."""


def static_forward_for(model, quant: str = "none", packed: bool = False, compile: str = "off"):
    """The static forward for ``model``, or None when its family or configuration has none. ``quant`` int8 or int4:
    its projections quantised (quant.py), for a family of QUANTIZED_FORWARDS only (one-line SpecsweepError for
    another family). ``packed``: projections multiply packed weights where the family, device and dtype allow
    (packed.py; a quantised forward's prefill products). ``compile``: "off", or the torch.compile mode its decoding
    steps run in (compiled.py; packed weights are then not used: inductor chooses the products)."""
    forward = None
    for impl in STATIC_FORWARDS:
        if not impl.supports(model):
            continue
        if quant == "none":
            forward = impl(model, packed=packed and compile == "off") if impl in PACKED_FORWARDS else impl(model)
        elif impl not in QUANTIZED_FORWARDS:
            raise SpecsweepError(f"--draft-quant {quant} quantises the static forward of a Llama, Mistral or Qwen2 "
                                 f"draft; this draft is a {type(model).__name__}: drop --draft-quant")
        else:
            forward = impl(model, quant, packed=packed)
        break
    if forward is not None and compile != "off":
        forward.compile(compile)
    return forward
