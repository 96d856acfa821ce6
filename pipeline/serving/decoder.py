"""The served pair and the decoding of one batch of requests.

:class:`Decoder` loads the pair as a run does (pipeline/runner.py: the same loading, sampler and engine), encodes
prompts as the ``prompts`` task does (left-padded, cut to --max-prompt-tokens, the chat template on request),
and decodes a batch of :class:`~pipeline.serving.batching.Job` with ``SpeculativeEngine.generate``. Its per-step
callback hands each row's new tokens to the row's job as the step's one host sync brings them, finishes a job at
EOS or at its own max_tokens (a batch decodes to its largest max_tokens; a row that reaches its own is truncated
to it and cancelled, which frees its slot), and cancels the rows whose client went away.

Randomness: one generator per job, seeded with its seed (pipeline.rng.RowGenerators.from_seeds). Each row draws
only its own uniforms and is verified with its own draft length (near the end, its own room), so a job with seed S
gets the same tokens alone or in any batch, and those are the tokens ``specsweep run --batch-size 1 --seed S``
gives for its prompt (tests/test_serve.py and tests/test_rng.py check both; on a GPU, batched kernels may round a
row's logits differently from a lone row's, which can change a sampled token).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from pipeline import stack
from pipeline.config import RunConfig
from pipeline.env_info import ThreadSettings, default_threads
from pipeline.errors import SpecsweepError
from pipeline.models import eos_token_ids, max_positions, parse_dtype, resolve_device
from pipeline.origins import ACCEPTED, BONUS, CORRECTED, TARGET
from pipeline.rng import RowGenerators
from pipeline.rules import get_rule
from pipeline.serving.batching import Job
from pipeline.tasks import get_task

log = logging.getLogger("specsweep.serve")

ENGINES_KEPT = 8
"""Engines (one per temperature) kept at once; the least recently used is dropped beyond it."""


@dataclass
class BatchReport:
    """What one batch did: its size, new tokens (kept in responses), the engine's seconds and verify steps, and
    the full-γ steps (one per row) that accepted k = 0..γ draft tokens."""

    size: int
    new_tokens: int
    seconds: float
    verify_steps: int
    accepted: int
    drafted: int
    accepted_histogram: list[int]


class Decoder:
    """The loaded pair and its engines. ``models``: (target, draft or None, tokenizer) already loaded (tests);
    None loads them from ``config`` as a run does."""

    def __init__(self, config: RunConfig, models: tuple | None = None) -> None:
        import torch


        self.config = config
        self.rule = get_rule(config.sampler)
        self.device = resolve_device(config.device, parse_dtype(config.dtype))
        task = get_task("prompts")
        if models is None:
            target, draft, tokenizer, _ = stack.load_pair(config, task, parse_dtype(config.dtype), self.device)
        else:
            target, draft, tokenizer = models
            if tokenizer.pad_token_id is None:
                tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
        self.target, self.draft, self.tokenizer = target, draft, tokenizer
        self.encode = task.encoder(target, tokenizer, None, config)
        self.positions = max_positions(target.config)
        self.eos = set() if config.ignore_eos else set(eos_token_ids(target, tokenizer))
        self._engines: OrderedDict = OrderedDict()
        self._torch = torch
        # A fast tokenizer is not safe to share between threads while one of them pads (padding mutates its
        # settings: "Already borrowed"): the handlers and the worker take turns.
        self._tokenizer_lock = threading.Lock()

    # ---- requests ------------------------------------------------------------------------------------------------

    def group(self, temperature: float):
        """Jobs with equal groups may share a batch (one sampler, one temperature): the temperature, or None where
        the rule verifies by argmax whatever the temperature (greedy, relaxed)."""
        return float(temperature) if self.rule.uses_temperature else None

    def prompt_ids(self, prompt: str) -> list[int]:
        """The token ids of ``prompt`` as the engine gets them (cut to --max-prompt-tokens, in the chat template if
        asked)."""
        with self._tokenizer_lock:
            return self.encode([{"prompt": prompt}])[0]["input_ids"][0].tolist()

    def room(self, prompt_tokens: int) -> int | None:
        """The most new tokens a prompt of this length may ask for: the target's positions less the prompt, γ + 1
        (the engine's own check); None where the target has no known limit."""
        if self.positions is None:
            return None
        return self.positions - prompt_tokens - self.config.gamma - 1

    def fits(self, batch: list[Job], job: Job) -> bool:
        """Whether ``job`` may join ``batch``: the batch is left-padded to its longest prompt and decodes to its
        largest max_tokens, and that must still fit the target's positions."""
        if self.positions is None:
            return True
        longest = max(job.prompt_tokens, *(j.prompt_tokens for j in batch))
        most = max(job.max_tokens, *(j.max_tokens for j in batch))
        return longest + most + self.config.gamma + 1 <= self.positions

    def text(self, tokens: list[int]) -> str:
        with self._tokenizer_lock:
            return self.tokenizer.decode(tokens, skip_special_tokens=True)

    # ---- engines -------------------------------------------------------------------------------------------------

    def engine(self, temperature: float):
        """The engine for ``temperature`` (built on first use, from the run's own builders)."""
        key = self.group(temperature)
        if key in self._engines:
            self._engines.move_to_end(key)
            return self._engines[key]
        config = self.config if key is None else dataclasses.replace(self.config, temperature=key)
        engine = stack.build_engine(config, stack.build_sampler(config), self.target, self.draft, self.tokenizer,
                                    self.device)
        self._engines[key] = engine
        while len(self._engines) > ENGINES_KEPT:
            self._engines.popitem(last=False)
        return engine

    def warm_up(self) -> None:
        """One short untimed generation with the default temperature (one-time costs out of the first request), on
        its own generator."""
        self.threads().apply()
        with self._tokenizer_lock:
            inputs, _ = self.encode([{"prompt": "warm up"}])
        if inputs["input_ids"].shape[1] == 0:
            return
        generator = self._torch.Generator(device=self.device).manual_seed(0)
        self.engine(self.config.temperature).generate(inputs["input_ids"], inputs["attention_mask"], 4, generator)

    def threads(self):
        """torch's thread settings for the decoding thread (--threads, else the run's default)."""

        return ThreadSettings(self.config.threads or default_threads(), None)

    # ---- a batch -------------------------------------------------------------------------------------------------

    def decode(self, jobs: list[Job]) -> BatchReport:
        """Decode ``jobs`` together and finish each (done, or error with a one-line message)."""

        start = time.perf_counter()
        for job in jobs:
            job.started, job.batch_size = start, len(jobs)
        try:
            engine = self.engine(jobs[0].temperature)
            with self._tokenizer_lock:
                inputs, _ = self.encode([{"prompt": j.prompt} for j in jobs])
            generator = RowGenerators.from_seeds([j.seed for j in jobs], self.device)
            result = engine.generate(inputs["input_ids"], inputs["attention_mask"], max(j.max_tokens for j in jobs),
                                     generator, on_step=lambda *step: self._on_step(jobs, *step))
        except SpecsweepError as e:
            for job in jobs:
                job.finish("error", str(e))
            return BatchReport(len(jobs), 0, time.perf_counter() - start, 0, 0, 0, [])
        for job in jobs:  # every row ends in a step (EOS, length or cancelled); this is for safety only
            job.finish("cancelled" if job.cancelled else "length")
        return BatchReport(size=len(jobs), new_tokens=sum(len(j.tokens) for j in jobs), seconds=result.wall_time_s,
                           verify_steps=result.verify_steps, accepted=sum(j.accepted for j in jobs),
                           drafted=sum(j.drafted for j in jobs),
                           accepted_histogram=list(result.extra.get("accepted_histogram") or []))

    def _on_step(self, jobs: list[Job], rows: list[int], tokens: list[list[int]], accepted: list[int],
                 finished: list[bool], lengths: list[int]) -> list[int]:
        """The engine's per-step callback: hand each row's new tokens to its job; finish jobs at EOS or their own
        max_tokens; return the rows to cancel (done early, or cancelled by their client)."""
        now = time.perf_counter()
        cancel = []
        for r, new, acc, fin, gamma in zip(rows, tokens, accepted, finished, lengths):
            job = jobs[r]
            new = new[: job.max_tokens - len(job.tokens)]
            job.steps += 1
            job.accepted += acc
            job.drafted += gamma
            if new:
                job.first_token = job.first_token or now
                job.origins.extend(step_origins(len(new), acc, gamma))  # before the tokens: readers slice by them
                job.tokens.extend(new)
                if job.stream:
                    job.notify("tokens", new)
            if fin or len(job.tokens) >= job.max_tokens:
                job.finish("stop" if job.tokens and job.tokens[-1] in self.eos else "length")
                if not fin:
                    cancel.append(r)
            elif job.cancelled:
                job.finish("cancelled")
                cancel.append(r)
        return cancel


def step_origins(n: int, accepted: int, gamma: int) -> list[int]:
    """The origins (pipeline/origins.py) of the first ``n`` tokens a row emitted in a step that accepted
    ``accepted`` of γ = ``gamma`` draft tokens (the row's own draft length): the accepted drafts, then the target's
    token: corrected after a rejection, bonus after a full acceptance, target alone where nothing was drafted (the
    engine's own rule)."""
    last = TARGET if gamma == 0 else (BONUS if accepted == gamma else CORRECTED)
    return [ACCEPTED if k < accepted else last for k in range(n)]
