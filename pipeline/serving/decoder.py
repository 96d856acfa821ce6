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
from dataclasses import dataclass, field

from pipeline import stack
from pipeline.config import DRAFTERS, MODEL_DRAFTERS, RunConfig
from pipeline.decoding.draft_policy import DraftPolicy
from pipeline.dtypes import AUTO, resolve_dtype
from pipeline.env_info import ThreadSettings, default_threads
from pipeline.errors import SpecsweepError
from pipeline.models import auto_dtype, eos_token_ids, max_positions, parse_dtype, resolve_device
from pipeline.origins import ACCEPTED, BONUS, CORRECTED, TARGET
from pipeline.rng import RowGenerators
from pipeline.rules import get_rule
from pipeline.serving import stops
from pipeline.serving.batching import Job
from pipeline.tasks import get_task

log = logging.getLogger("specsweep.serve")

ENGINES_KEPT = 8
"""Engines (one per key: temperature, drafter, γ) kept at once; the least recently used is dropped beyond it."""


@dataclass
class StepCounts:
    """Draft statistics over row-steps (one row in one verify step), with ``positions`` draft positions (the served
    γ, or its ceiling with an adaptive draft length).

    drafts         row-steps that proposed at least one token; draft_tokens and accepted their proposed and
                   accepted tokens (vLLM's num_drafts, num_draft_tokens, num_accepted_tokens)
    per_position   [positions]: accepted tokens at draft position i (vLLM's num_accepted_tokens_per_pos)
    reached        [positions]: row-steps that proposed position i and accepted every position before it
    full_steps     [positions + 1]: row-steps that proposed all ``positions`` tokens, by tokens accepted
    """

    positions: int
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_position: list[int] = field(default_factory=list)
    reached: list[int] = field(default_factory=list)
    full_steps: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.per_position = self.per_position or [0] * self.positions
        self.reached = self.reached or [0] * self.positions
        self.full_steps = self.full_steps or [0] * (self.positions + 1)

    def add(self, accepted: int, proposed: int) -> None:
        """One row-step that accepted ``accepted`` of its ``proposed`` tokens."""
        if proposed <= 0:
            return
        self.drafts += 1
        self.draft_tokens += proposed
        self.accepted += accepted
        for i in range(min(accepted, self.positions)):
            self.per_position[i] += 1
        for i in range(min(proposed, accepted + 1, self.positions)):
            self.reached[i] += 1
        if proposed == self.positions:
            self.full_steps[accepted] += 1

    def merge(self, other: StepCounts) -> None:
        self.drafts += other.drafts
        self.draft_tokens += other.draft_tokens
        self.accepted += other.accepted
        for mine, theirs in ((self.per_position, other.per_position), (self.reached, other.reached),
                             (self.full_steps, other.full_steps)):
            for i, n in enumerate(theirs[: len(mine)]):
                mine[i] += n


@dataclass
class BatchReport:
    """What one batch did: its size, new tokens (kept in responses), the engine's seconds and verify steps, and its
    rows' draft statistics."""

    size: int
    new_tokens: int
    seconds: float
    verify_steps: int
    counts: StepCounts


class RequestError(ValueError):
    """A request the served model cannot take (no chat template, a template that refuses the messages, token ids
    outside the vocabulary): one line for a 400."""


@dataclass(frozen=True)
class Key:
    """What an engine is built for: the temperature (None where the rule ignores it), the drafter and γ."""

    temperature: float | None
    drafter: str
    gamma: int


class Decoder:
    """The loaded pair and its engines. ``models``: (target, draft or None, tokenizer) already loaded (tests);
    None loads them from ``config`` as a run does."""

    def __init__(self, config: RunConfig, models: tuple | None = None) -> None:
        import torch


        # --dtype auto: the device's fastest native dtype (pipeline/dtypes.py), fixed here for the server's life
        if config.dtype == AUTO:
            size = None if models is None else sum(p.numel() for p in models[0].parameters())
            used = (auto_dtype(config.target, config.device)[0] if models is None else
                    resolve_dtype(AUTO, resolve_device(config.device), size)[0])
            config = dataclasses.replace(config, dtype=used)
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
        self.vocabulary = target.get_input_embeddings().num_embeddings
        self.eos = set() if config.ignore_eos else set(eos_token_ids(target, tokenizer))
        policy = DraftPolicy.of(config)
        self.gamma_ceiling = policy.ceiling(config.gamma) if policy is not None else config.gamma
        self._engines: OrderedDict = OrderedDict()
        self._checked: dict[Key, str | None] = {}     # per key: why it cannot decode (None: it can)
        self._gammas: dict[Key, int] = {}
        self._torch = torch
        # A fast tokenizer is not safe to share between threads while one of them pads (padding mutates its
        # settings: "Already borrowed"): the handlers and the worker take turns.
        self._tokenizer_lock = threading.Lock()

    # ---- requests ------------------------------------------------------------------------------------------------

    def key(self, temperature: float, drafter: str | None = None, gamma: int | None = None) -> Key:
        """The engine a job decodes with, and so its batch group (one sampler, one temperature, one drafter, one γ):
        the temperature, or None where the rule verifies by argmax whatever the temperature (greedy, relaxed); the
        served drafter and γ unless given."""
        return Key(float(temperature) if self.rule.uses_temperature else None,
                   self.config.drafter if drafter is None else drafter, self.config.gamma if gamma is None else gamma)

    def allowed_drafters(self) -> tuple[str, ...]:
        """The drafters a request may ask for: those that run the draft model (model, lookup-model) only where the
        server loaded one; prompt lookup and suffix decoding always."""
        return tuple(d for d in DRAFTERS if d not in MODEL_DRAFTERS or self.draft is not None)

    def check(self, key: Key) -> str | None:
        """Why the served settings cannot decode with ``key``'s drafter and γ (one line), or None."""
        if key not in self._checked:
            try:
                self.config_for(key).validate_decoding()
                self._checked[key] = None
            except SpecsweepError as e:
                self._checked[key] = str(e)
        return self._checked[key]

    def config_for(self, key: Key) -> RunConfig:
        """The served settings with ``key``'s temperature, drafter and γ (a drafter without a model has no draft
        and a constant γ: the adaptive draft length is the draft model's, and lookup-model's)."""
        changes: dict = {"drafter": key.drafter, "gamma": key.gamma}
        if key.temperature is not None:
            changes["temperature"] = key.temperature
        if key.drafter not in MODEL_DRAFTERS:
            changes.update(draft=None, draft_schedule="constant", draft_confidence=0.0, gamma_max=None)
        return dataclasses.replace(self.config, **changes)

    def gamma_of(self, key: Key) -> int:
        """The most draft tokens a step of ``key``'s engine proposes (γ, or the ceiling of an adaptive length)."""
        if key not in self._gammas:
            policy = DraftPolicy.of(self.config_for(key))
            self._gammas[key] = policy.ceiling(key.gamma) if policy is not None else key.gamma
        return self._gammas[key]

    def prompt_ids(self, prompt: str) -> list[int]:
        """The token ids of ``prompt`` as the engine gets them (cut to --max-prompt-tokens, in the chat template if
        asked)."""
        with self._tokenizer_lock:
            return self.encode([{"prompt": prompt}])[0]["input_ids"][0].tolist()

    def token_prompt(self, ids: list[int]) -> list[int]:
        """A prompt given as token ids, cut to --max-prompt-tokens; RequestError for ids outside the vocabulary."""
        bad = next((t for t in ids if not 0 <= t < self.vocabulary), None)
        if bad is not None:
            raise RequestError(f"token id {bad} is outside the model's vocabulary (0..{self.vocabulary - 1})")
        limit = self.config.max_prompt_tokens
        return list(ids if limit is None else ids[:limit])

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def chat_ids(self, messages: list[dict]) -> list[int]:
        """The token ids of a conversation in the tokenizer's chat template, ending with the assistant's generation
        prompt; RequestError without a template or where the template refuses the messages."""
        if not self.has_chat_template:
            raise RequestError("the served model has no chat template (its tokenizer defines none): send the text "
                               "to /v1/completions as a prompt, or serve a model with a chat template")
        with self._tokenizer_lock:
            try:
                text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            except Exception as e:  # the template's own checks (jinja's raise_exception), or a template error
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise RequestError(f"the chat template refused the messages: {first}") from None
            return self.tokenizer(text, add_special_tokens=False).input_ids

    def room(self, prompt_tokens: int, key: Key | None = None) -> int | None:
        """The most new tokens a prompt of this length may ask for: the target's positions less the prompt, γ + 1
        (the engine's own check, with ``key``'s γ); None where the target has no known limit."""
        if self.positions is None:
            return None
        return self.positions - prompt_tokens - self.gamma_of(key or self.key(self.config.temperature)) - 1

    def fits(self, batch: list[Job], job: Job) -> bool:
        """Whether ``job`` may join ``batch``: the batch is left-padded to its longest prompt and decodes to its
        largest max_tokens, and that must still fit the target's positions."""
        if self.positions is None:
            return True
        longest = max(job.prompt_tokens, *(j.prompt_tokens for j in batch))
        most = max(job.max_tokens, *(j.max_tokens for j in batch))
        return longest + most + self.gamma_of(job.group) + 1 <= self.positions

    def text(self, tokens: list[int]) -> str:
        with self._tokenizer_lock:
            return self.tokenizer.decode(tokens, skip_special_tokens=True)

    # ---- engines -------------------------------------------------------------------------------------------------

    def engine(self, key: Key | None = None):
        """The engine for ``key`` (default: the served settings), built on first use through pipeline/stack.py."""
        key = key or self.key(self.config.temperature)
        if key in self._engines:
            self._engines.move_to_end(key)
            return self._engines[key]
        config = self.config_for(key)
        engine = stack.build_engine(config, stack.build_sampler(config), self.target,
                                    self.draft if key.drafter in MODEL_DRAFTERS else None, self.tokenizer, self.device)
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
        self.engine().generate(inputs["input_ids"], inputs["attention_mask"], 4, generator)

    def threads(self):
        """torch's thread settings for the decoding thread (--threads, else the run's default)."""

        return ThreadSettings(self.config.threads or default_threads(), None)

    # ---- a batch -------------------------------------------------------------------------------------------------

    def decode(self, jobs: list[Job]) -> BatchReport:
        """Decode ``jobs`` together and finish each (done, or error with a one-line message)."""

        start = time.perf_counter()
        counts = StepCounts(self.gamma_ceiling)
        for job in jobs:
            job.started, job.batch_size = start, len(jobs)
        try:
            engine = self.engine(jobs[0].group)
            input_ids, attention_mask = self._left_padded([j.prompt_ids for j in jobs])
            generator = RowGenerators.from_seeds([j.seed for j in jobs], self.device)
            result = engine.generate(input_ids, attention_mask, max(j.max_tokens for j in jobs), generator,
                                     on_step=lambda *step: self._on_step(jobs, counts, *step))
        except SpecsweepError as e:
            for job in jobs:
                job.finish("error", str(e))
            return BatchReport(len(jobs), 0, time.perf_counter() - start, 0, counts)
        for job in jobs:  # every row ends in a step (EOS, length or cancelled); this is for safety only
            job.finish("cancelled" if job.cancelled else "length")
        return BatchReport(size=len(jobs), new_tokens=sum(len(j.tokens) for j in jobs), seconds=result.wall_time_s,
                           verify_steps=result.verify_steps, counts=counts)

    def _left_padded(self, prompts: list[list[int]]):
        """int64 [B, L] ids and attention mask, left-padded with the pad id, as the ``prompts`` task pads a batch."""
        torch = self._torch
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.tokenizer.pad_token_id, dtype=torch.int64)
        mask = torch.zeros((len(prompts), width), dtype=torch.int64)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.int64)
            mask[i, width - len(p):] = 1
        return ids, mask

    def _on_step(self, jobs: list[Job], counts: StepCounts, rows: list[int], tokens: list[list[int]],
                 accepted: list[int], finished: list[bool], lengths: list[int]) -> list[int]:
        """The engine's per-step callback: hand each row's new tokens to its job; finish jobs at EOS, a stop string or
        their own max_tokens; return the rows to cancel (done early, or cancelled by their client)."""
        now = time.perf_counter()
        cancel = []
        for r, new, acc, fin, gamma in zip(rows, tokens, accepted, finished, lengths):
            job = jobs[r]
            new = new[: job.max_tokens - len(job.tokens)]
            job.steps += 1
            job.accepted += acc
            job.drafted += gamma
            job.draft_steps.append((acc, gamma))
            counts.add(acc, gamma)
            stopped = False
            if new:
                job.first_token = job.first_token or now
                job.origins.extend(step_origins(len(new), acc, gamma))  # before the tokens: readers slice by them
                before = len(job.tokens)
                job.tokens.extend(new)
                if job.stop:
                    keep = stops.tokens_to_stop(job.tokens, before, job.stop, self.text)
                    if keep is not None:
                        del job.tokens[keep:]
                        del job.origins[keep:]
                        stopped = True
                if job.stream and not stopped:
                    job.notify("tokens", new)
            if stopped:
                job.finish("stop")
                if not fin:
                    cancel.append(r)
            elif fin or len(job.tokens) >= job.max_tokens:
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
