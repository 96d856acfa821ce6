"""CTranslate2 Whisper models (faster-whisper's format) -> a transformers ``WhisperForConditionalGeneration`` folder.

A CTranslate2 model folder holds ``model.bin`` (the weights), ``config.json`` (``suppress_ids``,
``suppress_ids_begin``, ``alignment_heads``, ``lang_ids``) and ``tokenizer.json`` (a Hugging Face ``tokenizers``
file). ``model.bin`` (binary version 6, little-endian)::

    u32 version; str spec name ("WhisperSpec"); u32 spec revision; u32 n
    n x { str name; u8 rank; u32 dims[rank]; u8 dtype; u32 n_bytes; n_bytes of data (row-major) }
    u32 m; m x { str alias; str name }          # alias -> the variable it shares data with

where ``str`` is a u16 length (counting a trailing NUL), then the bytes and the NUL, and dtype is
0 float32, 1 int8, 2 int16, 3 int32, 4 float16, 5 bfloat16. Weights are float32, float16 or bfloat16 here
(an int8-quantised model is refused); the int scalars are settings (``encoder/num_heads``, ...).

How the variables map to transformers' (layer i; ``{encoder,decoder}`` prefixes ``model.encoder`` and
``model.decoder``): ``conv1``/``conv2`` and ``position_encodings/encodings`` -> ``conv1``, ``conv2`` and
``embed_positions``; ``layer_i/self_attention``: ``linear_0`` = [q; k; v] fused ([3 d, d], bias [3 d] whose k part
is zero: Whisper's k projection has no bias), ``linear_1`` = ``out_proj``, ``layer_norm`` (gamma, beta) =
``self_attn_layer_norm``; ``layer_i/attention`` (the decoder's cross-attention): ``linear_0`` = q, ``linear_1`` =
[k; v] fused, ``linear_2`` = ``out_proj``, ``layer_norm`` = ``encoder_attn_layer_norm``; ``layer_i/ffn``:
``linear_0`` = ``fc1``, ``linear_1`` = ``fc2``, ``layer_norm`` = ``final_layer_norm``; ``layer_norm`` = the stack's
final ``layer_norm``; ``decoder/embeddings/weight`` = ``embed_tokens`` (the output projection
``decoder/projection/weight`` is an alias of it: tied).

The model's size (layers, heads, widths, vocabulary, mel bins, positions) is read from the tensors and the head
counts; special token ids from the tokenizer; generation settings (suppressed tokens, alignment heads, languages)
from ``config.json``. The output folder holds the weights (safetensors), ``config.json``, ``generation_config.json``,
the tokenizer (a ``WhisperTokenizer``; timestamp tokens ``<|0.00|>``... added where ``tokenizer.json`` lacks them)
and the feature extractor, as a Hub Whisper checkpoint does.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import SpecsweepError

SPEC = "WhisperSpec"
VERSION = 6
SAMPLING_RATE = 16_000
HOP_LENGTH = 160            # Whisper's STFT hop: 100 frames a second, halved by conv2's stride to 50 positions
MULTILINGUAL_VOCAB = 51865  # Whisper's own rule: a vocabulary this large or larger has language and task tokens
_DTYPES = {0: "float32", 1: "int8", 2: "int16", 3: "int32", 4: "float16", 5: "bfloat16"}
_SPECIALS = ("<|endoftext|>", "<|startoftranscript|>", "<|translate|>", "<|transcribe|>", "<|startoflm|>",
             "<|startofprev|>", "<|nocaptions|>", "<|nospeech|>", "<|notimestamps|>")
_LAYER = re.compile(r"^(encoder|decoder)/layer_(\d+)/")


@dataclass
class Ct2Model:
    """A parsed ``model.bin``: ``variables`` maps every name, aliases included, to a tensor (an alias is the same
    tensor object as its target); scalars are 0-d tensors."""

    spec: str
    revision: int
    variables: dict


def read_header(path: Path) -> tuple[int, str]:
    """(binary version, spec name) of a CTranslate2 ``model.bin``; ValueError when it is not one."""
    with open(path, "rb") as f:
        head = f.read(4 + 2 + 256)
    if len(head) < 6:
        raise ValueError("too short")
    (version,) = struct.unpack_from("<I", head, 0)
    (length,) = struct.unpack_from("<H", head, 4)
    if not 0 < length <= 256 or head[6 + length - 1] != 0:
        raise ValueError("no spec name")
    return version, head[6: 6 + length - 1].decode("ascii")


def read(path: Path) -> Ct2Model:
    """Parse a CTranslate2 ``model.bin`` (see the module docstring). One-line :class:`SpecsweepError` for another
    binary version or a truncated file."""
    import torch

    data = memoryview(bytearray(path.stat().st_size))  # writable, so that tensors can view it without a copy
    with open(path, "rb") as f:
        f.readinto(data)
    pos = 0

    def take(fmt: str):
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise SpecsweepError(f"{path} ends early (at byte {len(data)}, inside its header or a variable's "
                                 "description): the file is truncated or a part of it is missing")
        values = struct.unpack_from(fmt, data, pos)
        pos += size
        return values[0] if len(values) == 1 else values

    def string() -> str:
        nonlocal pos
        length = take("<H")
        text = bytes(data[pos: pos + length - 1]).decode("utf-8")
        pos += length
        return text

    version = take("<I")
    if version != VERSION:
        raise SpecsweepError(f"{path} is CTranslate2 binary version {version}; only version {VERSION} (what "
                             "CTranslate2 4 writes) is read: convert the model again with a recent "
                             "ct2-transformers-converter")
    spec, revision, count = string(), take("<I"), take("<I")
    variables = {}
    for _ in range(count):
        name = string()
        rank = take("<B")
        shape = [take("<I") for _ in range(rank)]
        dtype, n_bytes = _DTYPES.get(take("<B"), "?"), take("<I")
        if pos + n_bytes > len(data):
            raise SpecsweepError(f"{path} ends inside {name} (needs {n_bytes} bytes at {pos}, the file has "
                                 f"{len(data)}): the file is truncated or a part of it is missing")
        if dtype == "?":
            raise SpecsweepError(f"{path}: variable {name} has an unknown dtype id; is this a CTranslate2 model?")
        kind = getattr(torch, dtype)
        variables[name] = torch.frombuffer(data, dtype=kind, count=n_bytes // kind.itemsize, offset=pos).reshape(shape)
        pos += n_bytes
    for _ in range(take("<I")):
        alias, target = string(), string()
        variables[alias] = variables[target]
    return Ct2Model(spec, revision, variables)


def state_dict(model: Ct2Model, dtype) -> dict:
    """transformers' ``WhisperForConditionalGeneration`` state dict (name -> tensor of ``dtype``) of a parsed
    model; the tied output projection ``proj_out.weight`` is the embeddings' tensor."""
    import torch

    v = model.variables
    weights = {k: t for k, t in v.items() if t.dim() > 0}
    quantised = sorted(k for k, t in weights.items() if not t.is_floating_point())
    if quantised or any(k.endswith("weight_scale") for k in v):
        raise SpecsweepError(f"this CTranslate2 model is quantised ({(quantised or ['weight_scale'])[0]} is not a "
                             "float): use a float32, float16 or bfloat16 model (ct2-transformers-converter "
                             "--quantization float16)")
    out = {}

    def put(name: str, tensor) -> None:
        out[name] = tensor.to(dtype, copy=True)  # a copy: ``tensor`` views the file's buffer

    def linear(src: str, dst: str) -> None:
        put(f"{dst}.weight", v[f"{src}/weight"])
        put(f"{dst}.bias", v[f"{src}/bias"])

    def fused(src: str, dsts: list[str]) -> None:
        """A fused projection: rows split in equal parts, one per destination; a k projection has no bias."""
        for dst, w, b in zip(dsts, v[f"{src}/weight"].chunk(len(dsts)), v[f"{src}/bias"].chunk(len(dsts))):
            put(f"{dst}.weight", w)
            if not dst.endswith("k_proj"):
                put(f"{dst}.bias", b)

    def norm(src: str, dst: str) -> None:
        put(f"{dst}.weight", v[f"{src}/gamma"])
        put(f"{dst}.bias", v[f"{src}/beta"])

    for stack in ("encoder", "decoder"):
        hf = f"model.{stack}"
        put(f"{hf}.embed_positions.weight", v[f"{stack}/position_encodings/encodings"])
        norm(f"{stack}/layer_norm", f"{hf}.layer_norm")
        for i in range(_count_layers(v, stack)):
            src, dst = f"{stack}/layer_{i}", f"{hf}.layers.{i}"
            fused(f"{src}/self_attention/linear_0", [f"{dst}.self_attn.{p}_proj" for p in "qkv"])
            linear(f"{src}/self_attention/linear_1", f"{dst}.self_attn.out_proj")
            norm(f"{src}/self_attention/layer_norm", f"{dst}.self_attn_layer_norm")
            if stack == "decoder":
                linear(f"{src}/attention/linear_0", f"{dst}.encoder_attn.q_proj")
                fused(f"{src}/attention/linear_1", [f"{dst}.encoder_attn.k_proj", f"{dst}.encoder_attn.v_proj"])
                linear(f"{src}/attention/linear_2", f"{dst}.encoder_attn.out_proj")
                norm(f"{src}/attention/layer_norm", f"{dst}.encoder_attn_layer_norm")
            linear(f"{src}/ffn/linear_0", f"{dst}.fc1")
            linear(f"{src}/ffn/linear_1", f"{dst}.fc2")
            norm(f"{src}/ffn/layer_norm", f"{dst}.final_layer_norm")
    for conv in ("conv1", "conv2"):
        linear(f"encoder/{conv}", f"model.encoder.{conv}")
    put("model.decoder.embed_tokens.weight", v["decoder/embeddings/weight"])
    if not torch.equal(v["decoder/projection/weight"], v["decoder/embeddings/weight"]):
        raise SpecsweepError("this CTranslate2 Whisper model's output projection differs from its embeddings; only "
                             "tied ones (as every Whisper checkpoint has) are converted")
    out["proj_out.weight"] = out["model.decoder.embed_tokens.weight"]
    return out


def _count_layers(variables: dict, stack: str) -> int:
    return len({int(m.group(2)) for k in variables if (m := _LAYER.match(k)) and m.group(1) == stack})


def whisper_config(model: Ct2Model, tokenizer):
    """The ``WhisperConfig`` of a parsed model: sizes from its tensors and head counts, special ids from the
    ``tokenizers.Tokenizer``."""
    from transformers import WhisperConfig

    v = model.variables
    vocab, d_model = v["decoder/embeddings/weight"].shape
    ids = _special_ids(tokenizer)
    return WhisperConfig(
        vocab_size=vocab, d_model=d_model, num_mel_bins=v["encoder/conv1/weight"].shape[1],
        encoder_layers=_count_layers(v, "encoder"), decoder_layers=_count_layers(v, "decoder"),
        encoder_attention_heads=int(v["encoder/num_heads"]), decoder_attention_heads=int(v["decoder/num_heads"]),
        encoder_ffn_dim=v["encoder/layer_0/ffn/linear_0/weight"].shape[0],
        decoder_ffn_dim=v["decoder/layer_0/ffn/linear_0/weight"].shape[0],
        max_source_positions=v["encoder/position_encodings/encodings"].shape[0],
        max_target_positions=v["decoder/position_encodings/encodings"].shape[0],
        pad_token_id=ids["<|endoftext|>"], bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|endoftext|>"],
        decoder_start_token_id=ids["<|startoftranscript|>"], begin_suppress_tokens=None, suppress_tokens=None,
        tie_word_embeddings=True, architectures=["WhisperForConditionalGeneration"])


def generation_config(config, settings: dict, tokenizer):
    """The ``GenerationConfig`` a Hub Whisper checkpoint carries, from the model's ``WhisperConfig``, the
    CTranslate2 ``config.json`` (``settings``) and the ``tokenizers.Tokenizer``; multilingual (language and task
    tokens in ``lang_to_id`` and ``task_to_id``) when the vocabulary has :data:`MULTILINGUAL_VOCAB` tokens or more."""
    from transformers import GenerationConfig

    ids = _special_ids(tokenizer)
    multilingual = config.vocab_size >= MULTILINGUAL_VOCAB
    extra = {}
    if multilingual:
        extra["lang_to_id"] = {tokenizer.id_to_token(i): i for i in settings.get("lang_ids", [])}
        extra["task_to_id"] = {"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]}
    heads = settings.get("alignment_heads")
    return GenerationConfig(
        decoder_start_token_id=config.decoder_start_token_id, bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, max_length=config.max_target_positions,
        suppress_tokens=list(settings.get("suppress_ids", [])),
        begin_suppress_tokens=list(settings.get("suppress_ids_begin", [])),
        alignment_heads=[list(h) for h in heads] if heads else None,
        no_timestamps_token_id=ids["<|notimestamps|>"], prev_sot_token_id=ids.get("<|startofprev|>"),
        is_multilingual=multilingual, max_initial_timestamp_index=50, return_timestamps=False, **extra)


def _special_ids(tokenizer) -> dict[str, int]:
    """Whisper's special token -> id, for those ``tokenizer`` has (``<|endoftext|>``, ``<|startoftranscript|>`` and
    ``<|notimestamps|>`` are required)."""
    ids = {t: tokenizer.token_to_id(t) for t in _SPECIALS}
    missing = [t for t in ("<|endoftext|>", "<|startoftranscript|>", "<|notimestamps|>") if ids[t] is None]
    if missing:
        raise SpecsweepError(f"tokenizer.json has no {missing[0]} token: not a Whisper tokenizer")
    return {t: i for t, i in ids.items() if i is not None}


def whisper_processor(tokenizer_file: Path, config):
    """A ``WhisperProcessor``: the tokenizer of ``tokenizer_file`` as a ``WhisperTokenizer`` (Whisper's special
    tokens registered as special, timestamp tokens added up to the model's vocabulary, ``<|0.00|>`` at 0.02 s
    steps, as Hub checkpoints have them) and a feature extractor for the model's mel bins and input length."""
    from tokenizers import AddedToken
    from transformers import WhisperFeatureExtractor, WhisperProcessor, WhisperTokenizer

    tok = WhisperTokenizer(tokenizer_file=str(tokenizer_file))
    specials = [t.content for t in tok.added_tokens_decoder.values() if t.special and t.content != tok.eos_token]
    tok.add_special_tokens({"additional_special_tokens": specials})
    missing = config.vocab_size - len(tok)
    if missing > 0 and tok.convert_tokens_to_ids("<|0.00|>") in (None, tok.unk_token_id):
        tok.add_tokens([AddedToken(f"<|{i * 0.02:.2f}|>", special=False, normalized=True) for i in range(missing)])
    tok.pad_token = tok.eos_token
    # one position of the encoder = 2 feature frames = 2 hops
    seconds = config.max_source_positions * 2 * HOP_LENGTH // SAMPLING_RATE
    fe = WhisperFeatureExtractor(feature_size=config.num_mel_bins, sampling_rate=SAMPLING_RATE,
                                 hop_length=HOP_LENGTH, chunk_length=seconds)
    return WhisperProcessor(feature_extractor=fe, tokenizer=tok)


def convert(folder: Path, out: Path, dtype) -> None:
    """``folder`` (``model.bin``, ``config.json``, ``tokenizer.json``) -> a transformers Whisper folder in ``out``
    with weights of ``dtype`` (a torch dtype)."""
    import torch
    from tokenizers import Tokenizer
    from transformers import WhisperForConditionalGeneration

    for name in ("model.bin", "tokenizer.json"):
        if not (folder / name).is_file():
            raise SpecsweepError(f"{folder} has no {name}: a CTranslate2 Whisper model needs model.bin, "
                                 "tokenizer.json and config.json")
    settings = json.loads((folder / "config.json").read_text(encoding="utf-8")) \
        if (folder / "config.json").is_file() else {}
    parsed = read(folder / "model.bin")
    if parsed.spec != SPEC:
        raise SpecsweepError(f"{folder / 'model.bin'} is a CTranslate2 {parsed.spec}; only Whisper models "
                             f"({SPEC}) are converted")
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    config = whisper_config(parsed, tokenizer)
    with torch.device("meta"):
        model = WhisperForConditionalGeneration(config)
    model.load_state_dict(state_dict(parsed, dtype), strict=True, assign=True)
    model.generation_config = generation_config(config, settings, tokenizer)
    model.save_pretrained(out)
    whisper_processor(folder / "tokenizer.json", config).save_pretrained(out)
