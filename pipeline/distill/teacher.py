"""The target's side of distillation: its continuation of each prompt, and its next-token law along the sequence.

A :class:`TeacherSequence` is one prompt, the target's continuation (greedy, or sampled at a temperature) and, at
every position, the target's k most probable next tokens with their log-probabilities (the rest of the mass is one
bin). Keeping the top k instead of the whole law keeps a pass over the data small (k = 32 at 49152 tokens) and is
what the divergences of :mod:`pipeline.distill.divergence` read. The prompt positions come from the prefill the
continuation needs anyway, so they cost nothing extra.

    sequences = teacher_pass(target, prompts, eos, max_new_tokens=64, temperature=0.0, top_k=32)
    top_ids, top_logp, logits, cache = target_laws(causal_forward(target), input_ids, attention_mask, top_k)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

PROMPT_BATCH = 4
"""Prompts the target continues together (sorted by length, so little padding)."""


@dataclass
class TeacherSequence:
    """One prompt, its continuation, and the target's next-token law along both.

    ids        int64 [L]: the prompt's tokens, then the continuation's (no padding)
    prompt     P: the prompt's length (the continuation is ids[P:]; the law at position P - 1 predicts its first token)
    positions  int64 [N]: the positions i whose law (of token i + 1) is kept, ascending; here 0 .. L - 2
    top_ids    int64 [N, k]: the target's k most probable next tokens at each kept position
    top_logp   float32 [N, k]: their log-probabilities (the target's law at T = 1)
    source     "teacher" (the target's own continuation) or "draft" (an on-policy sample)
    context    float32 [F, H] or None: what the draft reads besides the tokens (a speech target's encoder output,
               :mod:`pipeline.distill.whisper`)
    """

    ids: torch.Tensor
    prompt: int
    positions: torch.Tensor
    top_ids: torch.Tensor
    top_logp: torch.Tensor
    source: str = "teacher"
    context: torch.Tensor | None = None

    @property
    def continuation(self) -> torch.Tensor:
        """bool [N]: the kept positions that predict a continuation token (position >= P - 1)."""
        return self.positions >= self.prompt - 1


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """int64 [B, L]: each real token's position in its row of a left-padded batch (0 at padding)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


def top_law(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [..., V] -> the k most probable tokens int64 [..., k] and their log-probabilities float32 [..., k]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    values, ids = logp.topk(min(top_k, logp.shape[-1]), dim=-1)
    return ids, values


def causal_forward(target):
    """A causal LM as the teacher pass calls it: ``forward(ids int64 [B, L], mask int64 [B, L_cache + L], positions
    int64 [B, L], cache) -> (logits [B, L, V], cache)``."""
    def forward(ids, mask, positions, cache):
        out = target(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True)
        return out.logits, out.past_key_values
    return forward


@torch.inference_mode()
def target_laws(forward, input_ids: torch.Tensor, attention_mask: torch.Tensor, top_k: int, mask_logits=None,
                first: torch.Tensor | None = None):
    """One forward (:func:`causal_forward`'s signature) over a left-padded batch int64 [B, L] -> (top ids int64
    [B, L, k], top log-probs float32 [B, L, k], the logits [B, L, V], the KV cache). ``mask_logits`` (a speech
    target's suppressed ids, :class:`pipeline.decoding.logit_mask.LogitMask`) is applied first: at every position, and
    where ``first`` bool [B, L] (default: the last column, the first new token's law) also as a continuation's first
    token's. Row by row, so [B, L, V] float32 exists once."""
    logits, cache = forward(input_ids, attention_mask, position_ids(attention_mask), None)
    if mask_logits is not None:
        if first is None:
            first = torch.zeros(input_ids.shape, dtype=torch.bool, device=logits.device)
            first[:, -1] = True
        mask_logits.at(logits, first.to(logits.device))
    parts = [top_law(logits[b], top_k) for b in range(input_ids.shape[0])]
    return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]), logits, cache


def left_pad(rows: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> input_ids int64 [B, L] left-padded with ``pad``, attention_mask int64 [B, L]."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[b, width - len(r):] = 1
    return ids.to(device), mask.to(device)


def pick(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """logits [B, V] -> int64 [B]: the argmax at temperature 0, else a sample at ``temperature``."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs.cpu(), 1, generator=generator)[:, 0].to(logits.device)


@torch.inference_mode()
def continue_batch(forward, prompts: list[list[int]], eos: list[int], pad: int, max_new_tokens: int,
                   temperature: float, top_k: int, generator: torch.Generator | None, device,
                   mask_logits=None) -> list[TeacherSequence]:
    """The target (``forward``, as :func:`target_laws` takes it) continues each prompt (left-padded together, one KV
    cache), keeping its law at every position."""
    ids, mask = left_pad(prompts, pad, device)
    B, width = ids.shape
    top_ids, top_logp, logits, cache = target_laws(forward, ids, mask, top_k, mask_logits)
    last, pos = logits[:, -1], position_ids(mask)[:, -1]
    del logits
    eos_t = torch.tensor(eos or [-1], device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    tokens, laws = [], []
    for step in range(max_new_tokens):
        token = torch.where(done, pad, pick(last, temperature, generator))
        tokens.append(token)
        done = done | torch.isin(token, eos_t)
        if step == max_new_tokens - 1 or bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones(B, 1, dtype=mask.dtype, device=device)], dim=1)
        pos = pos + 1
        logits, cache = forward(token[:, None], mask, pos[:, None], cache)
        last = logits[:, -1] if mask_logits is None else mask_logits(logits[:, -1], first_position=False)
        laws.append(top_law(last, top_k))
    generated = torch.stack(tokens, dim=1).cpu()
    gen_ids = torch.stack([g[0] for g in laws], 1).cpu() if laws else torch.empty(B, 0, top_ids.shape[-1])
    gen_logp = torch.stack([g[1] for g in laws], 1).cpu() if laws else torch.empty(B, 0, top_ids.shape[-1])
    return [_sequence(prompts[b], generated[b], eos, (top_ids[b, width - len(prompts[b]):].cpu(),
                                                      top_logp[b, width - len(prompts[b]):].cpu()),
                      (gen_ids[b], gen_logp[b])) for b in range(B)]


def _sequence(prompt: list[int], generated: torch.Tensor, eos: list[int], prompt_law, generated_law) -> TeacherSequence:
    """One row: the continuation up to and including its first EOS, and the laws at positions 0 .. L - 2."""
    cont = generated.tolist()
    for i, t in enumerate(cont):
        if t in eos:
            cont = cont[: i + 1]
            break
    ids = torch.tensor(prompt + cont, dtype=torch.long)
    n = len(ids) - 1                                     # positions 0 .. L - 2 predict tokens 1 .. L - 1
    top_ids = torch.cat([prompt_law[0], generated_law[0].long()])[:n]
    top_logp = torch.cat([prompt_law[1], generated_law[1].float()])[:n]
    return TeacherSequence(ids, len(prompt), torch.arange(n), top_ids.long(), top_logp.float())


def teacher_pass(target, prompts: list[list[int]], eos: list[int], pad: int, max_new_tokens: int, temperature: float,
                 top_k: int, seed: int, progress: bool = True, desc: str = "target continues the prompts"
                 ) -> list[TeacherSequence]:
    """A :class:`TeacherSequence` per prompt (token lists, in order), batched by length."""
    generator = torch.Generator().manual_seed(seed)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[TeacherSequence | None] = [None] * len(prompts)
    bar = tqdm(total=len(prompts), desc=desc, unit="prompt", disable=not progress)
    for start in range(0, len(order), PROMPT_BATCH):
        chunk = order[start: start + PROMPT_BATCH]
        for i, seq in zip(chunk, continue_batch(causal_forward(target), [prompts[i] for i in chunk], eos, pad,
                                                max_new_tokens, temperature, top_k, generator,
                                                next(target.parameters()).device)):
            out[i] = seq
        bar.update(len(chunk))
    bar.close()
    return out
