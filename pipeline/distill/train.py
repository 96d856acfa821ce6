"""The training loop: batches of teacher sequences (and on-policy ones), the divergence, the budget, the curve.

Each step draws ``batch_size`` teacher sequences (seeded epochs), runs the draft over them (right-padded) and
computes its law over its K tokens at the continuation positions and at up to ``prompt_positions`` random prompt
positions of each; the loss is the mean divergence over the continuation positions plus ``prompt_weight`` times the
mean over the prompt positions. After the first quarter of the budget a step is on-policy with probability
``on_policy`` (:mod:`pipeline.distill.on_policy`). AdamW, a linear warm-up over the first 5 % of the budget, then
cosine decay to 10 % (the toy pairs' schedule), gradient clipping at 1.

The budget is seconds of training or steps; the learning rate follows the share of it used. The draft is evaluated
on the held-out teacher sequences before the first step (the untrained draft), every ``eval_every`` of the budget
and at the end: the curve's points (:func:`evaluate`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from pipeline.decoding.logit_mask import LogitMask
from pipeline.distill.divergence import acceptance, agreement, divergence
from pipeline.distill.on_policy import on_policy_batch
from pipeline.distill.settings import DistillSettings
from pipeline.distill.student import Vocabulary, student_logits
from pipeline.distill.teacher import TeacherSequence
from pipeline.toy.train_text import lr_at

ON_POLICY_AFTER = 0.25
"""On-policy steps start after this share of the budget (the draft first learns from the target's own text)."""


@dataclass
class Batch:
    """One step's positions. input_ids, attention_mask int64 [B, L] (right-padded); rows, cols int64 [N]: the
    positions whose law is trained; top_ids int64 [N, k], top_logp float32 [N, k]: the target's law there; weight
    float32 [N]: each position's weight in the loss (summing to 1 + prompt_weight, or 1); continuation bool [N];
    context float32 [B, F, H] or None: the sequences' encoder outputs (a Whisper draft)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    top_ids: torch.Tensor
    top_logp: torch.Tensor
    weight: torch.Tensor
    continuation: torch.Tensor
    context: torch.Tensor | None = None


def make_batch(seqs: list[TeacherSequence], pad: int, prompt_positions: int | None, prompt_weight: float,
               generator: torch.Generator, device) -> Batch:
    """The sequences as one right-padded batch, with every continuation position and (``prompt_positions`` None:
    every, else at most that many random) prompt positions of each."""
    width = max(len(s.ids) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    rows, picks = [], []
    for b, s in enumerate(seqs):
        ids[b, : len(s.ids)] = s.ids
        mask[b, : len(s.ids)] = 1
        cont = s.continuation.nonzero().flatten()
        prompt = (~s.continuation).nonzero().flatten()
        if prompt_positions is not None and len(prompt) > prompt_positions:
            prompt = prompt[torch.randperm(len(prompt), generator=generator)[:prompt_positions]]
        if prompt_weight == 0:
            prompt = prompt[:0]
        chosen = torch.cat([cont, prompt])
        picks.append((s, chosen))
        rows.append(torch.full((len(chosen),), b, dtype=torch.long))
    cols = torch.cat([s.positions[c] for s, c in picks])
    continuation = torch.cat([s.continuation[c] for s, c in picks])
    n_cont, n_prompt = int(continuation.sum()), int((~continuation).sum())
    weight = torch.where(continuation, 1.0 / max(1, n_cont), prompt_weight / max(1, n_prompt))
    context = torch.stack([s.context for s in seqs]).to(device) if seqs[0].context is not None else None
    return Batch(ids.to(device), mask.to(device), torch.cat(rows).to(device), cols.to(device),
                 torch.cat([s.top_ids[c] for s, c in picks]).to(device),
                 torch.cat([s.top_logp[c] for s, c in picks]).to(device), weight.to(device), continuation.to(device),
                 context)


@torch.no_grad()
def evaluate(draft, sequences: list[TeacherSequence], vocab: Vocabulary, settings: DistillSettings, pad: int,
             device, suppress: LogitMask | None = None) -> dict | None:
    """The draft on held-out teacher sequences, over their continuation positions: the mean divergence (``loss``),
    the share of positions where its most probable token is the target's (``agreement``: a T = 0 step's per-token
    acceptance, given the target's prefix) and Σ min(p, q) on the target's top tokens (``acceptance_t1``, a lower
    bound of a T = 1 step's). ``suppress``: the target's ids never emitted (Whisper's suppress lists, over target
    ids), masked in the draft's rows as `specsweep run` masks them (begin_suppress at each first continuation
    position). None without held-out sequences."""
    if not sequences:
        return None
    draft.eval()
    rows_mask = vocab.mask(suppress)
    sums, n = torch.zeros(3, dtype=torch.float64), 0
    for i in range(0, len(sequences), settings.batch_size):
        seqs = sequences[i: i + settings.batch_size]
        batch = make_batch(seqs, pad, None, 0.0, torch.Generator(), device)
        logits = student_logits(draft, batch.input_ids, batch.attention_mask, batch.rows, batch.cols, vocab,
                                batch.context)
        if rows_mask is not None:
            prompts = torch.tensor([s.prompt for s in seqs], device=batch.cols.device)
            first = batch.cols == prompts[batch.rows] - 1           # the law of each continuation's first token
            logits = rows_mask.at(logits.clone(), first)
        values = [divergence(settings.divergence, logits, batch.top_ids, batch.top_logp, vocab.t2d),
                  agreement(logits, batch.top_ids, vocab.d2t).float(),
                  acceptance(logits, batch.top_ids, batch.top_logp, vocab.t2d)]
        sums += torch.stack([v.sum().double().cpu() for v in values])
        n += len(batch.cols)
    draft.train()
    loss, agree, accept = (sums / max(1, n)).tolist()
    return {"loss": loss, "agreement": agree, "acceptance_t1": accept, "positions": n}


class Budget:
    """A training budget of seconds or steps: ``used(step, seconds)`` is the share of it spent, in [0, 1]."""

    def __init__(self, seconds: float | None, steps: int | None) -> None:
        self.seconds, self.steps = seconds, steps

    def used(self, step: int, seconds: float) -> float:
        return min(1.0, step / self.steps if self.steps is not None else seconds / self.seconds)

    def bar(self, progress: bool):
        total = self.steps if self.steps is not None else round(self.seconds)
        return tqdm(total=total, desc="distil the draft", unit="step" if self.steps is not None else "s",
                    disable=not progress)


def train(draft, target, train_seqs: list[TeacherSequence], heldout: list[TeacherSequence], vocab: Vocabulary,
          settings: DistillSettings, eos: list[int], pad: int, on_point=None,
          suppress: LogitMask | None = None) -> dict:
    """Train ``draft`` in place within the budget. Returns the record: steps, seconds (training, and of it the
    on-policy steps'), the curve (a point per evaluation: step, seconds, mean training loss since the last point,
    the held-out record of :func:`evaluate`, with ``suppress``). ``on_point(curve)`` is called after each point (the
    caller writes the curve as it grows)."""
    device = next(draft.parameters()).device
    g = torch.Generator().manual_seed(settings.seed)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=settings.lr, weight_decay=0.01, betas=(0.9, 0.98))
    budget = Budget(settings.time_budget, settings.steps)
    curve = [{"step": 0, "seconds": 0.0, "train_loss": None,
              "heldout": evaluate(draft, heldout, vocab, settings, pad, device, suppress)}]
    if on_point:
        on_point(curve)
    order, cursor, step, losses, policy_steps, policy_s = [], 0, 0, [], 0, 0.0
    bar, t0, next_eval = budget.bar(settings.progress), time.perf_counter(), settings.eval_every
    draft.train()
    while budget.used(step, time.perf_counter() - t0) < 1.0:
        if cursor + settings.batch_size > len(order):
            order, cursor = torch.randperm(len(train_seqs), generator=g).tolist(), 0
        seqs = [train_seqs[i] for i in order[cursor: cursor + settings.batch_size]]
        cursor += settings.batch_size
        used = budget.used(step, time.perf_counter() - t0)
        if used >= ON_POLICY_AFTER and settings.on_policy > 0 and torch.rand((), generator=g) < settings.on_policy:
            t_policy = time.perf_counter()
            seqs = on_policy_batch(draft, target, vocab, seqs, settings.on_policy_tokens, eos, pad, settings.top_k, g,
                                   suppress)
            policy_steps, policy_s = policy_steps + 1, policy_s + time.perf_counter() - t_policy
        losses.append(_step(draft, opt, params, seqs, vocab, settings, pad, g, device, lr_at(round(used * 1000), 1000,
                                                                                             settings.lr)))
        step += 1
        elapsed = time.perf_counter() - t0
        bar.update(1 if settings.steps is not None else max(0, min(bar.total, round(elapsed)) - bar.n))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        if budget.used(step, elapsed) >= min(1.0, next_eval - 1e-9):
            next_eval += settings.eval_every
            curve.append({"step": step, "seconds": elapsed, "train_loss": sum(losses) / len(losses),
                          "heldout": evaluate(draft, heldout, vocab, settings, pad, device, suppress)})
            losses = []
            if curve[-1]["heldout"]:
                bar.set_postfix(loss=f"{curve[-1]['train_loss']:.3f}", agree=f"{curve[-1]['heldout']['agreement']:.3f}")
            if on_point:
                on_point(curve)
    bar.close()
    if curve[-1]["step"] != step:
        curve.append({"step": step, "seconds": time.perf_counter() - t0,
                      "train_loss": sum(losses) / len(losses) if losses else None,
                      "heldout": evaluate(draft, heldout, vocab, settings, pad, device, suppress)})
        if on_point:
            on_point(curve)
    draft.eval()
    return {"steps": step, "seconds": time.perf_counter() - t0, "on_policy_steps": policy_steps,
            "on_policy_seconds": policy_s, "curve": curve}


def _step(draft, opt, params, seqs: list[TeacherSequence], vocab: Vocabulary, settings: DistillSettings, pad: int,
          g: torch.Generator, device, lr: float) -> float:
    """One AdamW update on ``seqs``; returns its loss."""
    batch = make_batch(seqs, pad, settings.prompt_positions, settings.prompt_weight, g, device)
    logits = student_logits(draft, batch.input_ids, batch.attention_mask, batch.rows, batch.cols, vocab,
                                batch.context)
    loss = (divergence(settings.divergence, logits, batch.top_ids, batch.top_logp, vocab.t2d) * batch.weight).sum()
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    return loss.item()
