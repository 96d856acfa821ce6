"""A GGUF file (llama.cpp's format: weights, often quantised, with the config, tokenizer and chat template in its
metadata) -> a plain transformers folder.

transformers reads GGUF itself (``from_pretrained(folder, gguf_file=...)``, with the ``gguf`` package): it
dequantises the weights to float32 and builds the config and a fast tokenizer (chat template included) from the
metadata, for the architectures it knows (Llama, Mistral, Qwen2, Gemma, Phi-3, ...). A model loaded that way
refuses ``save_pretrained``, so its weights are loaded into a model built from its config, which saves as any
other. The folder holds ``config.json``, ``generation_config.json`` (bos, eos and pad ids), ``model.safetensors``
(the dequantised weights, cast to the requested dtype), ``tokenizer.json``, ``tokenizer_config.json`` and
``chat_template.jinja``; ``AutoModelForCausalLM`` and ``AutoTokenizer`` load it with no GGUF support.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import SpecsweepError


def convert(path: Path, out: Path, dtype) -> None:
    """The GGUF file ``path`` -> a transformers causal-LM folder in ``out`` with weights of ``dtype`` (a torch
    dtype)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(path.parent), path.name
    try:
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, config=config, dtype=torch.float32)
    except (ValueError, KeyError, OSError) as e:  # an architecture or quantisation transformers cannot read
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise SpecsweepError(f"transformers cannot read {path.name} ({first[:200]}): it reads the GGUF "
                             "architectures and quantisations listed in its GGUF documentation") from None
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.load_state_dict({k: t.to(dtype) for k, t in loaded.state_dict().items()}, strict=True, assign=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
