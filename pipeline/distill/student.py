"""The draft being distilled: its shape, its initial weights, its vocabulary, and its logits at chosen positions.

The draft is the target's architecture (its config, copied) with fewer layers and optionally another width; a
Whisper target's draft is its decoder alone, reading the target's encoder output (:mod:`pipeline.distill.whisper`). With
``init="target"`` it starts from the target: the embedding, final norm and head, and the layers ``chosen`` (the
first ones by default, an early exit of the target as in LayerSkip; any others with ``--init-layers``); the
embedding and head are then frozen, so training only moves the layers (and norms) and the draft keeps writing into
the target's own output space. ``init="fresh"`` is random weights, all trained.

Its vocabulary is all of the target's tokens, or (``--draft-vocab K``) the K most frequent target tokens on the
data (:func:`frequent_tokens`), always with the end-of-sequence ids: the draft is then trained and decoded with its
head cut to those rows (pipeline/decoding/drafters/vocab_map.py), and the map is saved in its config.

    draft = build_student(target, settings)                 # float32, train mode, frozen parts requires_grad False
    vocab = Vocabulary.full(V_t) | Vocabulary.frequent(sequences, K, eos, V_t)
    logits = student_logits(draft, input_ids, attention_mask, rows, cols, vocab)   # [N, K]
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass

import torch

from pipeline.decoding.drafters.vocab_map import head_rows
from pipeline.distill import whisper
from pipeline.distill.settings import DistillSettings
from pipeline.distill.whisper import is_speech
from pipeline.errors import SpecsweepError


def layer_stack(model) -> tuple[str, torch.nn.ModuleList]:
    """The decoder's layers and their state-dict prefix ("model.layers" for Llama, "transformer.h" for GPT-2,
    "model.decoder.layers" for Whisper and its decoder-only draft)."""
    base = model.base_model
    decoder = getattr(base, "decoder", None)
    if isinstance(getattr(decoder, "layers", None), torch.nn.ModuleList):
        return f"{model.base_model_prefix}.decoder.layers", decoder.layers
    for name in ("layers", "h"):
        layers = getattr(base, name, None)
        if isinstance(layers, torch.nn.ModuleList):
            return f"{model.base_model_prefix}.{name}", layers
    raise SpecsweepError(f"cannot find the decoder layers of {type(model).__name__}: distill takes Llama- and "
                         "GPT-2-style causal LMs")


def draft_config(target, settings: DistillSettings, chosen: list[int]):
    """The target's config with ``settings.layers`` layers (their layer types those of the ``chosen`` target layers)
    and, when ``settings.width`` differs from the target's, that width (the MLP scaled alike, the heads kept); every
    dropout probability 0."""
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = settings.layers
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[i] for i in chosen]
    width = settings.width or config.hidden_size
    if width != config.hidden_size:
        heads = config.num_attention_heads
        if width % heads:
            raise SpecsweepError(f"--width {width} must be a multiple of the target's {heads} attention heads")
        scale = width / config.hidden_size
        if getattr(config, "intermediate_size", None):
            config.intermediate_size = max(1, round(config.intermediate_size * scale))
        if getattr(config, "n_inner", None):
            config.n_inner = max(1, round(config.n_inner * scale))
        if getattr(config, "head_dim", None):
            config.head_dim = width // heads
        config.hidden_size = width
    for name, value in list(vars(config).items()):      # no dropout: the draft learns the target's function
        if ("dropout" in name or name.endswith("pdrop")) and isinstance(value, float):
            setattr(config, name, 0.0)
    config.use_cache = True
    return config


def build_student(target, settings: DistillSettings):
    """The draft (see the module docstring), float32 on the target's device, in train mode."""
    from transformers import AutoModelForCausalLM

    prefix, layers = layer_stack(target)
    chosen = settings.layer_choice(len(layers))
    if is_speech(target):
        if settings.width is not None:
            raise SpecsweepError("--width: a Whisper draft decoder reads the target's encoder output, so it keeps the "
                                 "target's width: drop --width")
        config = whisper.draft_config(target, settings.layers)
    else:
        config = draft_config(target, settings, chosen)
    if settings.init == "target" and config.hidden_size != target.config.hidden_size:
        raise SpecsweepError(f"--init target copies the target's weights, so it keeps its width "
                             f"({target.config.hidden_size}): drop --width or use --init fresh")
    torch.manual_seed(settings.seed)
    draft = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    draft.generation_config = copy.deepcopy(target.generation_config)
    if settings.init == "target":
        draft.load_state_dict(copied_state(target, draft, prefix, chosen))
        for module in (draft.get_input_embeddings(), draft.get_output_embeddings()):
            module.requires_grad_(False)
    return draft.to(next(target.parameters()).device).train()


def copied_state(target, draft, prefix: str, chosen: list[int]) -> dict[str, torch.Tensor]:
    """The draft's state dict from the target's: draft layer i from target layer chosen[i], the rest by name."""
    source = target.state_dict()
    pattern = re.compile(rf"{re.escape(prefix)}\.(\d+)\.(.*)")
    state = {}
    for key, tensor in draft.state_dict().items():
        m = pattern.fullmatch(key)
        name = f"{prefix}.{chosen[int(m[1])]}.{m[2]}" if m else key
        if name not in source or source[name].shape != tensor.shape:
            raise SpecsweepError(f"cannot initialise the draft's {key} from the target's {name}: use --init fresh")
        state[key] = source[name].detach().float().clone()
    return state


@dataclass
class Vocabulary:
    """What the draft can propose.

    d2t  int64 [K]: the target id of each of the draft's output rows (sorted)
    t2d  int64 [V_t]: each target id's draft row, -1 where it has none
    reduced  whether K < V_t (a vocabulary map is saved with the draft)
    """

    d2t: torch.Tensor
    t2d: torch.Tensor
    reduced: bool

    @classmethod
    def of(cls, ids: list[int], target_vocab: int, reduced: bool) -> Vocabulary:
        d2t = torch.tensor(sorted(ids), dtype=torch.long)
        t2d = torch.full((target_vocab,), -1, dtype=torch.long)
        t2d[d2t] = torch.arange(len(d2t))
        return cls(d2t, t2d, reduced)

    @classmethod
    def full(cls, target_vocab: int) -> Vocabulary:
        return cls.of(list(range(target_vocab)), target_vocab, False)

    def to(self, device) -> Vocabulary:
        return Vocabulary(self.d2t.to(device), self.t2d.to(device), self.reduced)

    def mask(self, suppress):
        """``suppress`` (a :class:`~pipeline.decoding.logit_mask.LogitMask` over target ids: a speech target's ids never
        emitted) over the draft's rows, as `specsweep run` masks them; None when there is nothing to mask."""
        return suppress.restricted(self.d2t.tolist()) if suppress is not None and suppress.active else None


def frequent_tokens(sequences: list[torch.Tensor], k: int, always: list[int], target_vocab: int) -> list[int]:
    """The ``k`` most frequent target ids in ``sequences`` (each int64 [L]; ties by id), ``always`` among them."""
    if k > target_vocab:
        raise SpecsweepError(f"--draft-vocab {k} is more than the target's {target_vocab} tokens: give K < "
                             f"{target_vocab}, or leave it out for the whole vocabulary")
    counts = torch.bincount(torch.cat(sequences), minlength=target_vocab)[:target_vocab].double()
    counts[torch.tensor([i for i in always if i < target_vocab], dtype=torch.long)] = float("inf")
    return sorted(torch.sort(-counts, stable=True).indices[:k].tolist())


def student_logits(draft, input_ids: torch.Tensor, attention_mask: torch.Tensor, rows: torch.Tensor,
                   cols: torch.Tensor, vocab: Vocabulary, context: torch.Tensor | None = None) -> torch.Tensor:
    """The draft's logits over its K tokens at the positions (rows[n], cols[n]) of a right-padded batch
    input_ids int64 [B, L]: float [N, K]. The head runs at those N positions only. ``context`` float32 [B, F, H]:
    a Whisper draft's encoder output (:mod:`pipeline.distill.whisper`)."""
    if context is not None:
        hidden = whisper.decoder_hidden(draft, input_ids, attention_mask, context)
    else:
        hidden = draft.base_model(input_ids=input_ids, attention_mask=attention_mask,
                                  use_cache=False).last_hidden_state
    if vocab.reduced:
        weight, bias = head_rows(draft, vocab.d2t)
    else:
        head = draft.get_output_embeddings()
        weight, bias = head.weight, getattr(head, "bias", None)
    return torch.nn.functional.linear(hidden[rows, cols], weight, bias)
