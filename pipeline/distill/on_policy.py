"""On-policy sequences: the draft's own samples, scored by the target (GKD, Agarwal et al. 2024; DistillSpec).

Teacher-forced training shows the draft only prefixes the target wrote; at decoding time the draft also continues
prefixes that end in its own (accepted) tokens. An on-policy step lets the draft sample a few tokens at T = 1 after
a prefix (a prompt and a random part of the target's continuation of it), the target scores the result in one
forward, and the draft is trained on the target's law at those positions, as on a teacher sequence.

    sequences = on_policy_batch(draft, target, vocab, teachers, n_tokens, eos, pad, top_k, generator)
"""

from __future__ import annotations

import torch

from pipeline.decoding.drafters.vocab_map import head_rows
from pipeline.distill.student import Vocabulary
from pipeline.distill.teacher import TeacherSequence, causal_forward, left_pad, position_ids, target_laws


@torch.no_grad()
def draft_continue(draft, vocab: Vocabulary, prefixes: list[list[int]], n_tokens: int, eos: list[int], pad: int,
                   generator: torch.Generator) -> list[list[int]]:
    """The draft samples up to ``n_tokens`` target ids at T = 1 after each prefix (left-padded together, one KV
    cache; a row stops after an EOS)."""
    device = next(draft.parameters()).device
    training = draft.training
    draft.eval()
    ids, mask = left_pad(prefixes, pad, device)
    base = draft.base_model
    out = base(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), use_cache=True)
    weight, bias = head_rows(draft, vocab.d2t)
    hidden, cache, pos = out.last_hidden_state[:, -1], out.past_key_values, position_ids(mask)[:, -1]
    rows: list[list[int]] = [[] for _ in prefixes]
    done = [False] * len(prefixes)
    for step in range(n_tokens):
        probs = torch.softmax(torch.nn.functional.linear(hidden, weight, bias).float(), dim=-1)
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
                   use_cache=True)
        hidden, cache = out.last_hidden_state[:, -1], out.past_key_values
    draft.train(training)
    return rows


def on_policy_batch(draft, target, vocab: Vocabulary, teachers: list[TeacherSequence], n_tokens: int, eos: list[int],
                    pad: int, top_k: int, generator: torch.Generator) -> list[TeacherSequence]:
    """One :class:`TeacherSequence` (source "draft") per teacher sequence: its prompt and a random part of its
    continuation, then the draft's sample, with the target's law at the sampled positions only."""
    prefixes = []
    for seq in teachers:
        cut = seq.prompt + int(torch.randint(0, len(seq.ids) - seq.prompt, (1,), generator=generator))
        prefixes.append(seq.ids[:cut].tolist())
    samples = draft_continue(draft, vocab, prefixes, n_tokens, eos, pad, generator)
    device = next(target.parameters()).device
    full = [p + s for p, s in zip(prefixes, samples)]
    ids, mask = left_pad(full, pad, device)
    top_ids, top_logp, _, _ = target_laws(causal_forward(target), ids, mask, top_k)
    out = []
    for b, (prefix, sample) in enumerate(zip(prefixes, samples)):
        width, length = ids.shape[1], len(prefix) + len(sample)
        positions = torch.arange(len(prefix) - 1, length - 1)          # each predicts a sampled token
        at = positions + width - length                               # their columns in the left-padded batch
        out.append(TeacherSequence(torch.tensor(prefix + sample), len(prefix), positions, top_ids[b, at].cpu(),
                                   top_logp[b, at].cpu(), source="draft"))
    return out
