"""Per-token cost of a draft against its target: analytic FLOPs and measured time of one cached decode step.

FLOPs follow Kaplan et al. (2020): a forward pass costs about ``2 * N`` FLOPs per token for ``N`` matrix
parameters (embedding lookups excluded, the output projection included), plus ``2 * n_layer * n_ctx * d``
for attention scores and values over ``n_ctx`` cached positions (and, for an encoder-decoder's decoder,
the same again for cross-attention over the encoder's positions).

Time is the median wall time of single-token forwards with a KV cache after a prefill, batch 1, on the
current device and thread count, through the forward the engine runs (pipeline/decoding/engine.py's CachedModel): what a
draft step costs in a speculative loop on this machine. On a CPU
and at these tiny sizes fixed per-call overheads (Python, kernel launches) weigh much more than on a GPU,
so the time ratio is far closer to 1 than the FLOP ratio.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from pipeline.decoding.cache import CachedModel


def matrix_params(model: torch.nn.Module) -> int:
    """Parameters used as matrices in a forward pass: all but embedding tables (token and position), plus the
    output projection even when it is tied to the token embedding."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    n = sum(p.numel() for p in model.parameters() if id(p) not in embeddings)
    head = model.get_output_embeddings()
    if head is not None and id(head.weight) in embeddings:
        n += head.weight.numel()
    return n


def decode_flops_per_token(matrix_parameters: int, n_layer: int, d_model: int, n_ctx: int,
                           cross_ctx: int = 0) -> float:
    """Forward FLOPs of one decoded token (see the module docstring)."""
    return 2.0 * matrix_parameters + 2.0 * n_layer * (n_ctx + cross_ctx) * d_model


def median_step_seconds(step: Callable[[], None], warmup: int = 3, repeats: int = 30) -> float:
    """Median wall time (s) of ``step()`` over ``repeats`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@torch.inference_mode()
def causal_lm_step_seconds(model, prompt_ids: torch.Tensor, repeats: int = 30) -> float:
    """Median seconds of one cached decode step of a causal LM, through the forward the engine runs for it
    (its static-cache forward where the family has one, else transformers'). ``prompt_ids``: int64 [1, T]."""

    model.eval()
    cached = CachedModel(model, static=True)
    cached.reset(1, prompt_ids.device, capacity=prompt_ids.shape[1] + 1)
    token = cached.forward(prompt_ids, last=1).argmax(-1)        # [1, 1]
    keep_none = torch.zeros(1, dtype=torch.int64, device=prompt_ids.device)

    def step():
        cached.forward(token, last=1)
        cached.retain(1, keep_none, 0, 0)  # drop the new position again: the context length stays fixed

    return median_step_seconds(step, repeats=repeats)
