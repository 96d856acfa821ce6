"""The sampler contract shared by every verify-step implementation.

A sampler verifies the γ tokens a draft model proposed against the target model's logits and emits
between 1 and γ+1 tokens::

    result = sampler(draft_tokens, draft_logits, target_logits, generator=None, lengths=None)

      draft_tokens   int64 [B, γ]          tokens the draft model sampled
      draft_logits   float [B, γ, V_d]     raw draft logits at those γ positions, or None: a deterministic draft
      target_logits  float [B, γ+1, V_t]   raw target logits at the γ+1 positions
                                           (position i scores the token after draft_tokens[:, :i])
      lengths        int64 [B] or None     per-row draft lengths g_b in 0..γ (None: γ for every row)
      result.accepted  int64 [B]           accepted draft tokens per row, 0..g_b
      result.tokens    int64 [B, γ+1]      the accepted draft tokens, then the one corrected or bonus
                                           token, then -1 padding

Deterministic drafts (``draft_logits=None``): drafters without a draft model (prompt lookup, suffix decoding, the
string mode of a draft with another tokenizer) propose each token with certainty, so their draft distribution at
position i is the point mass on draft_tokens[:, i]. The caller passes ``draft_logits=None`` instead of building
one-hot logits [B, γ, V]; draft_tokens int64 [B, γ] are then target ids (the draft's vocabulary is the target's,
V_d = V_t), target_logits [B, γ+1, V_t] and ``lengths`` are as above, and nothing of shape [B, γ, V] is built for the
draft on that path. A rule verifies such a draft exactly as it would verify the same tokens with one-hot draft logits
(0 at the token, -inf elsewhere) where that has a meaning; for exact that is: accept x with probability p(x) (the
target's probability at temperature T), and on rejection draw from p with x removed and renormalised; at T = 0 accept
iff x = argmax p. Which rules take deterministic drafts, and why the others refuse (SamplerInputError, one line), is
recorded per rule in pipeline/rules.py (``Rule.deterministic_drafts``). ``draft_ok`` is True in every row (there are
no draft logits to be non-finite), except that the CUDA kernels flag a token outside [0, V_t) as they do today.

Per-row draft lengths (an adaptive draft length: pipeline/decoding/draft_policy.py). Row b then drafted only
draft_tokens[b, :g_b]; the step treats that row exactly as it would treat the row alone with γ = g_b: at most g_b
tokens are accepted, a row that accepts all g_b draws its bonus token from the target's position g_b, and its
uniforms are u[b, :g_b] for the acceptance tests and u[b, g_b] for the emitted token. Columns past g_b (tokens,
logits and uniforms) are padding that never decides anything; the finiteness flags may still cover them, so they
must hold finite logits (a one-hot draft is fine). Values are clamped into [0, γ] on the device (never read on
the host). So a row's tokens do not depend on how long the other rows of its batch drafted.

Logits may be fp32, fp16 or bf16; arithmetic that matters is done in fp32. V_d may be smaller than V_t
(padded embedding matrices): draft entries past V_d count as probability 0. V_d > V_t is an error, because
the draft could propose a token the target cannot score.

A result's tensors may be the sampler's own buffers, rewritten by its next call with inputs of the same dtypes,
shapes, strides and devices: the kernel samplers (pipeline/samplers/cupy_backend.py) and a replayed CUDA graph
(pipeline/samplers/cuda_graphs.py) work so. Read a result, or ``.clone()`` it, before the next call.

Samplers never synchronise with the host inside a step: no ``.item()``, no Python branch on tensor values,
no ``.nonzero()``. Problems found in tensor *values* (NaN, +inf, a row of only -inf) are therefore reported
through device-side flags in the result (``draft_ok``, ``target_ok``), which the caller checks when it
chooses to sync (:meth:`SamplerResult.check`, or :class:`FiniteCheck` across a whole generation).

Randomness: one ``torch.rand((B, γ+1))`` call per step. Column i < γ is the acceptance uniform of draft
token i; column γ (column g_b with per-row lengths) picks the emitted token by inverse CDF
(:func:`sample_from_weights`). Backends that are
held to the reference take these same uniforms. With per-example randomness (a :class:`pipeline.rng.RowGenerators`
in place of the generator) row b's uniforms come from its own example's generator instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline import rng
from pipeline.dtypes import DTYPES, torch_dtype
from pipeline.errors import NonFiniteLogitsError, SamplerInputError
from pipeline.rng import RowGenerators

FLOAT_DTYPES = tuple(torch_dtype(name) for name in DTYPES)

# A residual whose mass is at most this fraction of the target row's mass is rounding noise: the two
# distributions are equal up to fp32 error. Sampling from it would amplify noise, so the target row is
# used instead (the induced error in the output distribution is below 1e-11).
RESIDUAL_ZERO_TOL = 16 * torch.finfo(torch.float32).eps

# Inverse-CDF sampling works on chunks of this many vocabulary entries: one pass of chunk sums, a
# cumulative sum over the chunks, then a cumulative sum inside the one chunk that holds the sample.
CDF_CHUNK = 1024


@dataclass
class SamplerResult:
    """What one verify step emits.

    accepted   int64 [B]        accepted draft tokens per row, 0..γ (0..g_b with per-row lengths)
    tokens     int64 [B, γ+1]   accepted draft tokens, the corrected/bonus token, then -1 padding
    draft_ok   bool  [B]        False where a draft logit the step read was NaN/+inf or a row was all -inf
    target_ok  bool  [B]        the same for the target logits
    path       int64 [B, D]     a token tree's step (pipeline/samplers/tree.py): the accepted path's node indices,
                                -1 after ``accepted`` (tokens then [B, D+1]); None for a chain
    """

    accepted: torch.Tensor
    tokens: torch.Tensor
    draft_ok: torch.Tensor
    target_ok: torch.Tensor
    path: torch.Tensor | None = None

    @property
    def emitted(self) -> torch.Tensor:
        """int64 [B]: tokens emitted per row (accepted + 1)."""
        return self.accepted + 1

    def check(self) -> SamplerResult:
        """Raise :class:`NonFiniteLogitsError` if any row read non-finite logits. Syncs with the device."""
        _raise_if_bad(self.draft_ok, "draft_logits")
        _raise_if_bad(self.target_ok, "target_logits")
        return self


def _raise_if_bad(ok: torch.Tensor, tensor_name: str, where: str = "") -> None:
    if not bool(ok.all()):
        rows = (~ok).nonzero().flatten().tolist()
        raise NonFiniteLogitsError(
            f"{tensor_name} has NaN/+inf values (or a row of only -inf) in batch rows {rows[:16]}{where}: "
            "check the model's dtype (fp16 overflow?) and any logits processors"
        )


class FiniteCheck:
    """Collects the device-side finiteness flags of many steps without syncing; ``check()`` syncs once.

    >>> guard = FiniteCheck()
    >>> for step in ...: guard.update(sampler(...))
    >>> guard.check()   # raises NonFiniteLogitsError naming the tensor
    """

    def __init__(self) -> None:
        self._flags: list[torch.Tensor] = []

    def update(self, result: SamplerResult) -> None:
        """Copies the step's flags (one small device op, no sync): a result's tensors may be buffers its sampler
        rewrites at its next call (the kernel samplers', a replayed CUDA graph's), so a reference would see only
        the last step."""
        self._flags.append(torch.cat((result.draft_ok, result.target_ok)))      # bool [2B]: draft, then target

    def check(self) -> None:
        if not self._flags:
            return
        ok = torch.cat([flags.view(2, -1) for flags in self._flags], dim=1).all(dim=1)        # bool [2]
        _raise_if_bad(ok[:1], "draft_logits", where=" (at some verify step)")
        _raise_if_bad(ok[1:], "target_logits", where=" (at some verify step)")


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def validate_inputs(draft_tokens: torch.Tensor, draft_logits: torch.Tensor | None, target_logits: torch.Tensor
                    ) -> None:
    """Check shapes, dtypes and devices against the contract. Looks only at metadata: never syncs.

    draft_logits None is a deterministic draft (see the module docstring): draft_tokens int64 [B, γ] and
    target_logits [B, γ+1, V_t] are checked as always, and there is nothing else to check."""
    if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.dtype != torch.int64 or draft_tokens.dim() != 2:
        got = _shape(draft_tokens) + f" {draft_tokens.dtype}" if isinstance(draft_tokens, torch.Tensor) else repr(
            type(draft_tokens))
        raise SamplerInputError(f"draft_tokens must be int64 [B, γ]; got {got}")
    checked = [("target_logits", target_logits, "[B, γ+1, V_t]")]
    if draft_logits is not None:
        checked.insert(0, ("draft_logits", draft_logits, "[B, γ, V_d] (or None: a deterministic draft)"))
    for name, t, dims in checked:
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            got = _shape(t) if isinstance(t, torch.Tensor) else repr(type(t))
            raise SamplerInputError(f"{name} must be a 3-d tensor {dims}; got {got}")
        if t.dtype not in FLOAT_DTYPES:
            raise SamplerInputError(f"{name} must be float32, float16 or bfloat16; got {t.dtype}")
        if t.device != draft_tokens.device:
            raise SamplerInputError(
                f"{name} is on {t.device} but draft_tokens is on {draft_tokens.device}: put all three on one device")
    B, gamma = draft_tokens.shape
    if target_logits.shape[0] != B or target_logits.shape[1] != gamma + 1:
        raise SamplerInputError(
            f"target_logits has shape {_shape(target_logits)} but draft_tokens has shape {_shape(draft_tokens)}: "
            f"expected target_logits [B, γ+1, V_t] = [{B}, {gamma + 1}, V_t]")
    if draft_logits is None:
        return
    if draft_logits.shape[0] != B or draft_logits.shape[1] != gamma:
        raise SamplerInputError(
            f"draft_logits has shape {_shape(draft_logits)} but draft_tokens has shape {_shape(draft_tokens)}: "
            f"expected draft_logits [B, γ, V_d] = [{B}, {gamma}, V_d]")
    if draft_logits.shape[2] > target_logits.shape[2]:
        raise SamplerInputError(
            f"draft vocabulary ({draft_logits.shape[2]}) is larger than the target's ({target_logits.shape[2]}): "
            "the target has no logits for some draft tokens; use a draft with the target's tokenizer")


def validate_lengths(lengths: torch.Tensor | None, draft_tokens: torch.Tensor) -> None:
    """Check per-row draft lengths against the contract: None, or int64 [B] on draft_tokens' device. Metadata only."""
    if lengths is None:
        return
    B = draft_tokens.shape[0]
    if not isinstance(lengths, torch.Tensor) or lengths.dtype != torch.int64 or tuple(lengths.shape) != (B,):
        got = _shape(lengths) + f" {lengths.dtype}" if isinstance(lengths, torch.Tensor) else repr(type(lengths))
        raise SamplerInputError(f"lengths must be None or int64 [B] = [{B}] (per-row draft lengths); got {got}")
    if lengths.device != draft_tokens.device:
        raise SamplerInputError(f"lengths is on {lengths.device} but draft_tokens is on {draft_tokens.device}: put "
                                "them on one device")


def clamp_lengths(lengths: torch.Tensor | None, gamma: int) -> torch.Tensor | None:
    """int64 [B] per-row draft lengths clamped into [0, γ] (None stays None: every row drafted γ)."""
    return None if lengths is None else lengths.clamp(0, gamma)


def within_lengths(accept: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """bool [B, γ] per-position acceptance with the positions past each row's draft length (lengths int64 [B], or
    None) rejected."""
    if lengths is None:
        return accept
    return accept & (torch.arange(accept.shape[1], device=accept.device) < lengths[:, None])


def is_full(accepted: torch.Tensor, gamma: int, lengths: torch.Tensor | None) -> torch.Tensor:
    """bool [B]: rows that accepted their whole draft (γ, or their own length), so their next token is a bonus token
    drawn from the target rather than a corrected one."""
    return accepted == (gamma if lengths is None else lengths)


def emit_uniform(u: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """float32 [B]: each row's uniform for its emitted token, column γ of u [B, γ+1] (column g_b with lengths)."""
    if lengths is None:
        return u[:, -1]
    return u.gather(1, lengths[:, None]).squeeze(1)


def uniforms(batch: int, gamma: int, device: torch.device, generator: torch.Generator | RowGenerators | None
             ) -> torch.Tensor:
    """float32 [B, γ+1] uniforms in [0, 1): acceptance tests in columns 0..γ-1, the emitted-token draw in γ.

    generator: one ``torch.Generator`` for the batch (None: torch's global one), or a
    :class:`pipeline.rng.RowGenerators` (per-example randomness): row b then comes from active row b's own generator.
    """
    return rng.rand(generator, (batch, gamma + 1), device, torch.float32)


def count_accepted(accept: torch.Tensor) -> torch.Tensor:
    """bool [B, γ] per-position acceptance -> int64 [B] length of the accepted prefix."""
    return accept.to(torch.int64).cumprod(dim=1).sum(dim=1)


def assemble_tokens(draft_tokens: torch.Tensor, accepted: torch.Tensor, next_token: torch.Tensor) -> torch.Tensor:
    """int64 [B, γ+1]: draft_tokens[:, :accepted], then next_token, then -1.

    draft_tokens int64 [B, γ], accepted int64 [B], next_token int64 [B].
    """
    B, gamma = draft_tokens.shape
    pos = torch.arange(gamma + 1, device=draft_tokens.device).expand(B, gamma + 1)
    padded = torch.nn.functional.pad(draft_tokens, (0, 1), value=-1)
    acc = accepted[:, None]
    return torch.where(pos < acc, padded, torch.where(pos == acc, next_token[:, None], -1))


def first_positive_above(cdf: torch.Tensor, weights: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """int64 [B]: per row, the first index i with cdf[i] > x and weights[i] > 0; where there is none, the last index
    with weights[i] > 0 (0 for a row without mass).

    cdf, weights float32 [B, N]; x float32 [B, 1]. With a monotone cdf this is searchsorted(cdf, x, right=True)
    clamped to the last positive entry. The weight condition keeps a zero-weight entry from being chosen where
    rounding makes a cdf non-monotone (a parallel scan adds in a different order for each position).
    """
    idx = torch.arange(cdf.shape[1], device=cdf.device)
    positive = weights > 0
    first = torch.where(positive & (cdf > x), idx, cdf.shape[1]).amin(dim=1)
    last = torch.where(positive, idx, 0).amax(dim=1)
    return torch.where(first < cdf.shape[1], first, last)


def sample_from_weights(weights: torch.Tensor, u: torch.Tensor, chunk: int = CDF_CHUNK) -> torch.Tensor:
    """Inverse-CDF sample from non-negative, unnormalised weights, without a host sync.

    weights  float32 [B, V] (contiguous), each row with positive mass
    u        float32 [B] uniforms in [0, 1)
    returns  int64 [B]: the first index i with cumsum(weights)[i] > u * sum(weights) and weights[i] > 0

    Two levels, so only one full pass over V: chunk sums, a cumulative sum over chunks, then a cumulative sum
    inside the chosen chunk; each level picks with :func:`first_positive_above`, so a zero-weight token is never
    returned for a row with positive mass, however rounding falls.
    """
    B, V = weights.shape
    if V <= chunk:  # one chunk: a single cumulative sum
        cdf = weights.cumsum(dim=1)
        return first_positive_above(cdf, weights, u[:, None] * cdf[:, -1:])
    n_full = V // chunk
    parts = []
    if n_full:
        parts.append(weights[:, : n_full * chunk].reshape(B, n_full, chunk).sum(dim=-1))
    if V % chunk:
        parts.append(weights[:, n_full * chunk:].sum(dim=-1, keepdim=True))
    chunk_sums = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]          # [B, n_chunks]
    chunk_cdf = chunk_sums.cumsum(dim=1)
    x = u[:, None] * chunk_cdf[:, -1:]                                              # [B, 1]
    k = first_positive_above(chunk_cdf, chunk_sums, x)[:, None]                     # [B, 1]
    offset = x - (chunk_cdf.gather(1, k) - chunk_sums.gather(1, k))                 # mass left inside chunk k

    idx = k * chunk + torch.arange(chunk, device=weights.device)                    # [B, chunk]
    in_range = idx < V
    window = torch.where(in_range, weights.gather(1, idx.clamp_max(V - 1)), 0.0)
    j = first_positive_above(window.cumsum(dim=1), window, offset)
    return k.squeeze(1) * chunk + j


def draft_sample(logits: torch.Tensor, temperature: float, u: torch.Tensor) -> torch.Tensor:
    """Sample the draft's proposal from logits [B, V] (any float dtype) with uniforms u [B]: argmax at T = 0,
    else inverse CDF of softmax(logits / T). int64 [B]. No host sync."""
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    if temperature != 1.0:
        logits = logits.float() / temperature
    return sample_from_weights(torch.softmax(logits, dim=-1, dtype=torch.float32), u)
