"""A tiny random Llama written as a GGUF file with the ``gguf`` package, for the tests of pipeline/weights/gguf.py.

As llama.cpp's convert_hf_to_gguf.py writes a Llama: architecture metadata, a byte-level BPE tokenizer
(``tokenizer.ggml.model`` "gpt2": tokens, token types, merges, bos/eos ids), a chat template, and float32
tensors under GGUF's names with the q and k projections' rows permuted for llama.cpp's rotary layout.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>{% endfor %}"
HEADS, KV_HEADS, LAYERS, WIDTH = 4, 2, 2, 32
_LAYER_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def _permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's q/k row order: each head's two rotary halves interleaved."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_llama(tokenizer, seed: int = 0):
    """A random-init ``LlamaForCausalLM`` (2 layers, width 32, 4 query and 2 key/value heads, tied embeddings)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=WIDTH, intermediate_size=2 * WIDTH,
                         num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                         max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
                         bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def write_gguf(model, tokenizer, path: Path) -> Path:
    """``model`` (a tied-embedding Llama) and ``tokenizer`` (a byte-level BPE) as the GGUF file ``path``."""
    import gguf

    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in tokenizer.all_special_tokens else gguf.TokenType.NORMAL
                       for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_bos_token_id(tokenizer.eos_token_id)
    w.add_eos_token_id(tokenizer.eos_token_id)
    w.add_chat_template(CHAT_TEMPLATE)
    sd = model.state_dict()
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    names |= {f"model.layers.{i}.{hf}.weight": f"blk.{i}.{g}.weight"
              for i in range(c.num_hidden_layers) for hf, g in _LAYER_NAMES.items()}
    for hf, name in names.items():
        t = sd[hf]
        if ".attn_q." in name:
            t = _permute(t, c.num_attention_heads)
        elif ".attn_k." in name:
            t = _permute(t, c.num_key_value_heads)
        w.add_tensor(name, t.numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
