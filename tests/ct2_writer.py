"""A transformers Whisper model -> a CTranslate2 model folder, for the tests of pipeline/weights/ct2_whisper.py.

Written from CTranslate2's own description of the format (ctranslate2/specs/model_spec.py, ``_serialize``:
binary version 6) and of Whisper's variables (ctranslate2/converters/transformers.py, ``WhisperLoader``), not
from the reader it tests; where ctranslate2 is installed, the tests also run the written files with it. Users
convert with CTranslate2's ``ct2-transformers-converter``, so this stays in the tests.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

DTYPE_IDS = {torch.float32: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.float16: 4, torch.bfloat16: 5}
# the scalar settings of a Whisper spec (revision 3), as ct2-transformers-converter writes them
SETTINGS = {"decoder/activation": (torch.int8, 3), "decoder/alibi": (torch.int8, 0),  # 3 = GELU
            "decoder/alignment_heads": (torch.int16, 1), "decoder/alignment_layer": (torch.int16, -1),
            "decoder/pre_norm": (torch.int8, 1), "decoder/scale_embeddings": (torch.int8, 0),
            "decoder/start_from_zero_embedding": (torch.int8, 0)}


def ct2_variables(model, dtype=torch.float16) -> dict[str, torch.Tensor]:
    """CTranslate2 variable name -> tensor (floats in ``dtype``) of a ``WhisperForConditionalGeneration``."""
    sd = {k: t.detach() for k, t in model.state_dict().items()}
    c = model.config
    v: dict[str, torch.Tensor] = {}

    def linear(dst: str, src: str) -> None:
        v[f"{dst}/weight"], v[f"{dst}/bias"] = sd[f"{src}.weight"], sd[f"{src}.bias"]

    def fused(dst: str, srcs: list[str]) -> None:  # k_proj has no bias: zeros in its place
        v[f"{dst}/weight"] = torch.cat([sd[f"{s}.weight"] for s in srcs])
        v[f"{dst}/bias"] = torch.cat([sd.get(f"{s}.bias", torch.zeros(c.d_model)) for s in srcs])

    def norm(dst: str, src: str) -> None:
        v[f"{dst}/gamma"], v[f"{dst}/beta"] = sd[f"{src}.weight"], sd[f"{src}.bias"]

    for stack, layers, heads in (("encoder", c.encoder_layers, c.encoder_attention_heads),
                                 ("decoder", c.decoder_layers, c.decoder_attention_heads)):
        hf = f"model.{stack}"
        v[f"{stack}/num_heads"] = torch.tensor(heads, dtype=torch.int16)
        v[f"{stack}/position_encodings/encodings"] = sd[f"{hf}.embed_positions.weight"]
        norm(f"{stack}/layer_norm", f"{hf}.layer_norm")
        for i in range(layers):
            src, dst = f"{hf}.layers.{i}", f"{stack}/layer_{i}"
            fused(f"{dst}/self_attention/linear_0", [f"{src}.self_attn.{p}_proj" for p in "qkv"])
            linear(f"{dst}/self_attention/linear_1", f"{src}.self_attn.out_proj")
            norm(f"{dst}/self_attention/layer_norm", f"{src}.self_attn_layer_norm")
            if stack == "decoder":
                linear(f"{dst}/attention/linear_0", f"{src}.encoder_attn.q_proj")
                fused(f"{dst}/attention/linear_1", [f"{src}.encoder_attn.k_proj", f"{src}.encoder_attn.v_proj"])
                linear(f"{dst}/attention/linear_2", f"{src}.encoder_attn.out_proj")
                norm(f"{dst}/attention/layer_norm", f"{src}.encoder_attn_layer_norm")
            linear(f"{dst}/ffn/linear_0", f"{src}.fc1")
            linear(f"{dst}/ffn/linear_1", f"{src}.fc2")
            norm(f"{dst}/ffn/layer_norm", f"{src}.final_layer_norm")
    for conv in ("conv1", "conv2"):
        linear(f"encoder/{conv}", f"model.encoder.{conv}")
    v["decoder/embeddings/weight"] = sd["model.decoder.embed_tokens.weight"]
    v = {k: t.to(dtype) for k, t in v.items() if t.is_floating_point()} | {
        k: t for k, t in v.items() if not t.is_floating_point()}
    return v | {k: torch.tensor(value, dtype=dt) for k, (dt, value) in SETTINGS.items()}


def model_bin(variables: dict[str, torch.Tensor], aliases: dict[str, str], spec: str = "WhisperSpec",
              version: int = 6) -> bytes:
    """The bytes of a ``model.bin``: header, variables (sorted by name, as CTranslate2 writes them), aliases."""
    def string(text: str) -> bytes:
        data = text.encode() + b"\0"
        return struct.pack("<H", len(data)) + data

    out = [struct.pack("<I", version), string(spec), struct.pack("<II", 3, len(variables))]
    for name, t in sorted(variables.items()):
        data = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        out += [string(name), struct.pack(f"<B{t.dim()}I", t.dim(), *t.shape),
                struct.pack("<BI", DTYPE_IDS[t.dtype], len(data)), data]
    out.append(struct.pack("<I", len(aliases)))
    out += [string(alias) + string(name) for alias, name in aliases.items()]
    return b"".join(out)


def write(model, tokenizer, folder: Path, dtype=torch.float16) -> Path:
    """``folder`` with the model as CTranslate2 writes a Whisper model: model.bin (weights in ``dtype``; the output
    projection an alias of the embeddings), config.json (from the generation config), vocabulary.json, and the
    tokenizer's tokenizer.json (as faster-whisper's model folders carry it)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.bin").write_bytes(model_bin(ct2_variables(model, dtype),
                                                 {"decoder/projection/weight": "decoder/embeddings/weight"}))
    gen = model.generation_config
    heads = getattr(gen, "alignment_heads", None) or []
    (folder / "config.json").write_text(json.dumps({
        "alignment_heads": heads, "lang_ids": sorted((getattr(gen, "lang_to_id", None) or {}).values()),
        "suppress_ids": list(gen.suppress_tokens or []), "suppress_ids_begin": list(gen.begin_suppress_tokens or [])}))
    (folder / "vocabulary.json").write_text(json.dumps(tokenizer.convert_ids_to_tokens(
        list(range(model.config.vocab_size)))))
    tokenizer.backend_tokenizer.save(str(folder / "tokenizer.json"))
    return folder
