"""`specsweep distill` end to end: the target's prompts, its pass over them, the draft, training, the folder.

    record = distill(DistillSettings(target=..., data=..., out=..., time_budget=600).validate())

1. The task's records (``--limit``: a seeded subset) are split: ``--holdout`` of them (a seeded choice) are kept
   out of training and written to ``<out>/heldout.jsonl``; their prompts are built as ``specsweep run`` builds
   them (the task's encoder: the chat template, the cue, the cuts).
2. The target continues every prompt (:mod:`pipeline.distill.teacher`), keeping its law along each sequence.
3. The draft is built (:mod:`pipeline.distill.student`), its vocabulary chosen on the training sequences, and it is
   trained within the budget (:mod:`pipeline.distill.train`), the curve written as it grows.
4. ``<out>`` is written in one go (built beside it and renamed): the draft (``save_pretrained``, its vocabulary map
   in its config with ``--draft-vocab``), the target's tokenizer and generation config, ``distill.json`` (what was
   done and measured), ``curve.json`` and ``curve.png``, ``heldout.jsonl``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from pipeline.config import RunConfig
from pipeline.data import load_task_data
from pipeline.decoding.drafters.vocab_map import CONFIG_KEY
from pipeline.decoding.logit_mask import LogitMask
from pipeline.distill import whisper
from pipeline.distill.curve import write_curve
from pipeline.distill.settings import DistillSettings
from pipeline.distill.student import Vocabulary, build_student, frequent_tokens, layer_stack
from pipeline.distill.teacher import teacher_pass
from pipeline.distill.train import train
from pipeline.env_info import ThreadSettings, provenance, usable_cores
from pipeline.errors import SpecsweepError
from pipeline.io import atomic_dir, write_json_atomic, write_text_atomic
from pipeline.models import (
    eos_token_ids,
    load_causal_lm,
    load_processor,
    load_speech_seq2seq,
    load_tokenizer,
    max_positions,
    resolve_device,
)
from pipeline.tasks import get_task


def split_records(records: list[dict], holdout: int, seed: int) -> tuple[list[dict], list[dict]]:
    """(training records, held-out records): ``holdout`` records chosen by a seeded permutation, each part in the
    data's order. At least one record stays for training."""
    if holdout >= len(records):
        raise SpecsweepError(f"--holdout {holdout} leaves no training record of {len(records)}: lower --holdout or "
                             "give more data")
    out = set(torch.randperm(len(records), generator=torch.Generator().manual_seed(seed))[:holdout].tolist())
    return [r for i, r in enumerate(records) if i not in out], [r for i, r in enumerate(records) if i in out]


def task_records(settings: DistillSettings) -> tuple[list[dict], int, list[dict]]:
    """The records distilled on (``--limit``: a seeded subset, taken before ``--exclude`` and ``--eval-data`` remove
    their ids), how many were removed, and the ``--eval-data`` records."""
    records = load_task_data(settings.task, settings.data, settings.limit, settings.seed if settings.limit else None)
    evaluated = load_task_data(settings.task, settings.eval_data) if settings.eval_data else []
    ids = {str(r.get("id")) for r in evaluated}
    if settings.exclude is not None:
        ids |= {str(r.get("id")) for r in load_task_data(settings.task, settings.exclude, None, None)}
    kept = [r for r in records if str(r.get("id")) not in ids]
    return kept, len(records) - len(kept), evaluated


def run_config(settings: DistillSettings) -> RunConfig:
    """The `specsweep run` settings whose prompts the draft is trained on (the task's encoder reads them)."""
    return RunConfig(target=settings.target, data=settings.data, task=settings.task,
                     max_new_tokens=settings.max_new_tokens, max_prompt_tokens=settings.max_prompt_tokens,
                     chat_template=settings.chat_template)


def prompt_tokens(settings: DistillSettings, target, tokenizer, records: list[dict]) -> list[list[int]]:
    """Each record's prompt as ``specsweep run`` encodes it for the target (token ids, no padding)."""
    encode = get_task(settings.task).encoder(target, tokenizer, None, run_config(settings))
    out = []
    for r in records:
        batch, _ = encode([r])
        out.append(batch["input_ids"][0][batch["attention_mask"][0].bool()].tolist())
    return out


def target_tokenizer(name: str):
    """The target's tokenizer (the draft's too), with a pad token as `specsweep run` gives it; a one-line
    SpecsweepError when the target has none (transformers then builds an empty one)."""
    tokenizer = load_tokenizer(name)
    if len(tokenizer) < 2:
        raise SpecsweepError(f"the target {name!r} has no tokenizer (no tokenizer files beside its weights): distill "
                             "reads the data with the target's tokenizer and saves it with the draft")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    return tokenizer


def distill(settings: DistillSettings) -> dict:
    """Run the recipe (see the module docstring); returns what ``distill.json`` records."""
    settings.validate()
    previous = torch.get_num_threads()
    try:
        # every usable core: training is not a timed measurement, and a DVC stage runs alone
        threads = ThreadSettings(settings.threads or usable_cores(), None).apply()
        return _distill(settings, threads)
    finally:
        torch.set_num_threads(previous)


def _distill(settings: DistillSettings, threads: dict) -> dict:
    t0 = time.perf_counter()
    device = resolve_device(settings.device)
    get_task(settings.task).check_target(run_config(settings))   # e.g. --chat-template without one: before loading
    if not settings.progress:
        hf_logging.disable_progress_bar()
    records, excluded, evaluated = task_records(settings)
    train_records, heldout_records = split_records(records, settings.holdout, settings.seed)
    heldout_records += evaluated
    target, tokenizer, processor = load_target(settings, device)
    draft = build_student(target, settings)                # a shape or target distill cannot take: before the pass
    eos = eos_token_ids(target, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if eos else 0)
    t_teacher = time.perf_counter()
    train_seqs, heldout_seqs = (
        target_sequences(settings, target, tokenizer, processor, part, eos, pad, settings.seed + i, desc)
        for i, (part, desc) in enumerate(((train_records, "training"), (heldout_records, "held-out"))))
    teacher_s = time.perf_counter() - t_teacher
    target_vocab = target.get_output_embeddings().weight.shape[0]
    vocab = (Vocabulary.of(frequent_tokens([s.ids for s in train_seqs], settings.draft_vocab, eos, target_vocab),
                           target_vocab, True) if settings.draft_vocab else Vocabulary.full(target_vocab)).to(device)
    meta = {"target": settings.target, "divergence": settings.divergence}
    with atomic_dir(settings.out) as folder:
        log = train(draft, target, train_seqs, heldout_seqs, vocab, settings, eos, pad,
                    on_point=lambda curve: write_curve(folder, curve, meta),
                    suppress=suppress_mask(target, processor))
        record = {"settings": settings.to_dict(), "threads": threads, "provenance": provenance(device),
                  "data": {"records": len(records), "excluded": excluded, "train": len(train_records),
                           "heldout": len(heldout_records),
                           "heldout_ids": [r.get("id") for r in heldout_records]},
                  "teacher": teacher_summary(train_seqs, heldout_seqs, teacher_s),
                  "draft": draft_summary(draft, target, settings, vocab, heldout_seqs),
                  "training": {k: v for k, v in log.items() if k != "curve"},
                  "start": log["curve"][0], "final": log["curve"][-1], "seconds": None}
        save_draft(folder, draft, tokenizer, vocab, heldout_records, processor)
        record["seconds"] = time.perf_counter() - t0
        write_json_atomic(Path(folder) / "distill.json", record)
    return record


def load_target(settings: DistillSettings, device: str):
    """(target in float32, its tokenizer, its processor or None): a speech task's target is a Whisper."""
    if not get_task(settings.task).speech:
        tokenizer = target_tokenizer(settings.target)
        return load_causal_lm(settings.target, torch.float32, device), tokenizer, None
    processor = load_processor(settings.target)
    return load_speech_seq2seq(settings.target, torch.float32, device), processor.tokenizer, processor


def target_sequences(settings: DistillSettings, target, tokenizer, processor, records: list[dict], eos: list[int],
                     pad: int, seed: int, part: str):
    """The target's pass over ``records`` (the training or the held-out part): it continues each prompt, or
    transcribes each clip (its suppress lists applied, as `specsweep run` decodes it)."""
    if processor is None:
        return teacher_pass(target, prompt_tokens(settings, target, tokenizer, records), eos, pad,
                            settings.max_new_tokens, settings.teacher_temperature, settings.top_k, seed,
                            settings.progress, f"target continues the {part} prompts")
    encode = get_task(settings.task).encoder(target, tokenizer, processor, run_config(settings))
    return whisper.teacher_pass(target, encode, records, eos, pad, settings.max_new_tokens, settings.top_k,
                                suppress_mask(target, processor), settings.progress,
                                f"target transcribes the {part} clips")


def suppress_mask(target, processor) -> LogitMask | None:
    """A speech target's ids never emitted (Whisper's suppress_tokens, and begin_suppress_tokens first), as
    `specsweep run` masks them; None for a text target (``processor`` None)."""
    if processor is None:
        return None
    gc = target.generation_config
    return LogitMask(getattr(gc, "suppress_tokens", None) or (), getattr(gc, "begin_suppress_tokens", None) or (),
                     next(target.parameters()).device)


def teacher_summary(train_seqs, heldout_seqs, seconds: float) -> dict:
    """What the target's pass produced: sequences, continuation tokens, prompt tokens, the time it took."""
    seqs = list(train_seqs) + list(heldout_seqs)
    cont = [len(s.ids) - s.prompt for s in seqs]
    return {"sequences": len(seqs), "continuation_tokens": sum(cont), "prompt_tokens": sum(s.prompt for s in seqs),
            "mean_continuation": sum(cont) / max(1, len(cont)), "seconds": seconds}


def draft_summary(draft, target, settings: DistillSettings, vocab: Vocabulary, heldout_seqs) -> dict:
    """The draft's shape, its parameters against the target's, and its vocabulary (with ``--draft-vocab``: the share
    of the held-out continuations' tokens it can propose, which bounds a T = 0 step's acceptance)."""
    _, layers = layer_stack(target)
    params = sum(p.numel() for p in draft.parameters())
    out = {"layers": settings.layers, "width": draft.config.hidden_size, "init": settings.init,
           "init_layers": settings.layer_choice(len(layers)) if settings.init == "target" else None,
           "parameters": params, "target_parameters": sum(p.numel() for p in target.parameters()),
           "target_layers": len(layers), "vocab": len(vocab.d2t), "target_vocab": len(vocab.t2d),
           "max_positions": max_positions(draft.config)}
    if vocab.reduced and heldout_seqs:
        tokens = torch.cat([s.ids[s.prompt:] for s in heldout_seqs]).to(vocab.t2d.device)
        out["heldout_continuation_coverage"] = float((vocab.t2d[tokens] >= 0).float().mean())
    return out


def save_draft(folder: str | Path, draft, tokenizer, vocab: Vocabulary, heldout_records: list[dict],
               processor=None) -> None:
    """The draft as a plain transformers folder (float32), the target's tokenizer (a speech target's processor), and
    the held-out records (a speech task's without their audio: their ids and transcripts)."""
    if vocab.reduced:
        setattr(draft.config, CONFIG_KEY, vocab.d2t.tolist())
    draft.save_pretrained(folder)
    (processor or tokenizer).save_pretrained(folder)
    rows = [{k: v for k, v in r.items() if k not in ("audio", "duration")} for r in heldout_records]
    write_text_atomic(Path(folder) / "heldout.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
