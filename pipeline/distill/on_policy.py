"""On-policy sequences: the draft's own samples, scored by the target (GKD, Agarwal et al. 2024; DistillSpec).

Teacher-forced training shows the draft only prefixes the target wrote; at decoding time the draft also continues
prefixes that end in its own (accepted) tokens. An on-policy step lets the draft sample a few tokens at T = 1 after
a prefix (a prompt and a random part of the target's continuation of it), the target scores the result in one
forward, and the draft is trained on the target's law at those positions, as on a teacher sequence.

A Whisper draft's sequences carry their clip's encoder output (``context``): the draft reads it as it samples, the
target's decoder reads the same one as it scores (:func:`pipeline.distill.whisper.encoder_forward`), and the
target's suppressed ids (``suppress``) are masked in its law as the teacher pass masks them and in the draft's rows
as `specsweep run` masks them, so the draft never samples a token the target cannot emit.

    sequences = on_policy_batch(draft, target, vocab, teachers, n_tokens, eos, pad, top_k, generator, suppress)
"""

from __future__ import annotations

import torch

from pipeline.decoding.drafters.vocab_map import head_rows
from pipeline.distill.student import Vocabulary
from pipeline.distill.teacher import TeacherSequence, causal_forward, left_pad, position_ids, target_laws
from pipeline.distill.whisper import encoder_forward


@torch.no_grad()
def draft_continue(draft, vocab: Vocabulary, prefixes: list[list[int]], n_tokens: int, eos: list[int], pad: int,
                   generator: torch.Generator, context: torch.Tensor | None = None, suppress=None,
                   first: torch.Tensor | None = None) -> list[list[int]]:
    """The draft samples up to ``n_tokens`` target ids at T = 1 after each prefix (left-padded together, one KV
    cache; a row stops after an EOS). ``context`` float32 [B, F, H]: a Whisper draft's encoder outputs.
    ``suppress`` (a :class:`~pipeline.decoding.logit_mask.LogitMask` over target ids, or None) is masked in the draft's
    rows, begin_suppress also at the first sample of the rows where ``first`` bool [B] (their prefix is the prompt)."""
    device = next(draft.parameters()).device
    training = draft.training
    draft.eval()
    ids, mask = left_pad(prefixes, pad, device)
    base, extra = draft.base_model, {} if context is None else {"encoder_hidden_states": context}
    out = base(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), use_cache=True, **extra)
    weight, bias = head_rows(draft, vocab.d2t)
    rows_mask = vocab.mask(suppress)
    at_first = torch.zeros(len(prefixes), dtype=torch.bool, device=device) if first is None else first.to(device)
    hidden, cache, pos = out.last_hidden_state[:, -1], out.past_key_values, position_ids(mask)[:, -1]
    rows: list[list[int]] = [[] for _ in prefixes]
    done = [False] * len(prefixes)
    for step in range(n_tokens):
        logits = torch.nn.functional.linear(hidden, weight, bias).float()
        if rows_mask is not None:
            rows_mask.at(logits, at_first if step == 0 else torch.zeros_like(at_first))
        probs = torch.softmax(logits, dim=-1)
        token = vocab.d2t[torch.multinomial(probs.cpu(), 1, generator=generator)[:, 0].to(device)]
        for b, t in enumerate(token.tolist()):
            if not done[b]:
                rows[b].append(t)
                done[b] = t in eos
        if all(done) or step == n_tokens - 1:
            break
        mask = torch.cat([mask, torch.ones(len(prefixes), 1, dtype=mask.dtype, device=device)], dim=1)
        pos = pos + 1
        out = base(input_ids=token[:, None], attention_mask=mask, position_ids=pos[:, None], past_key_values=cache,
                   use_cache=True, **extra)
        hidden, cache = out.last_hidden_state[:, -1], out.past_key_values
    draft.train(training)
    return rows


def on_policy_batch(draft, target, vocab: Vocabulary, teachers: list[TeacherSequence], n_tokens: int, eos: list[int],
                    pad: int, top_k: int, generator: torch.Generator, suppress=None) -> list[TeacherSequence]:
    """One :class:`TeacherSequence` (source "draft", the teacher's context kept) per teacher sequence: its prompt
    and a random part of its continuation, then the draft's sample, with the target's law at the sampled positions
    only. Sequences with a ``context`` (a Whisper draft's) are sampled and scored reading it; ``suppress``: the
    target's ids never emitted (a :class:`~pipeline.decoding.logit_mask.LogitMask`, or None)."""
    prefixes = []
    for seq in teachers:
        cut = seq.prompt + int(torch.randint(0, len(seq.ids) - seq.prompt, (1,), generator=generator))
        prefixes.append(seq.ids[:cut].tolist())
    device = next(target.parameters()).device
    context = torch.stack([s.context for s in teachers]).to(device) if teachers[0].context is not None else None
    starts = torch.tensor([len(p) == s.prompt for p, s in zip(prefixes, teachers)])
    samples = draft_continue(draft, vocab, prefixes, n_tokens, eos, pad, generator, context, suppress, starts)
    full = [p + s for p, s in zip(prefixes, samples)]
    ids, mask = left_pad(full, pad, device)
    width = ids.shape[1]
    first = torch.zeros(ids.shape, dtype=torch.bool)               # each row's law of its first continuation token
    for b, (row, seq) in enumerate(zip(full, teachers)):
        first[b, width - len(row) + seq.prompt - 1] = True
    forward = causal_forward(target) if context is None else encoder_forward(target, context)
    top_ids, top_logp, _, _ = target_laws(forward, ids, mask, top_k, suppress, first)
    out = []
    for b, (prefix, sample) in enumerate(zip(prefixes, samples)):
        length = len(prefix) + len(sample)
        positions = torch.arange(len(prefix) - 1, length - 1)          # each predicts a sampled token
        at = positions + width - length                               # their columns in the left-padded batch
        out.append(TeacherSequence(torch.tensor(prefix + sample), len(prefix), positions, top_ids[b, at].cpu(),
                                   top_logp[b, at].cpu(), source="draft", context=teachers[b].context))
    return out
