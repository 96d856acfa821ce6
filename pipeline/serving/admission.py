"""From a validated request body (pipeline/serving/schemas.py) to the jobs the batcher decodes: the checks that
depend on the server and the model, each a 400 with one line (:class:`~pipeline.serving.errors.ApiError`).

A request becomes a :class:`Plan`: one :class:`~pipeline.serving.batching.Job` per choice, prompt by prompt and,
within a prompt, sample by sample (choice i = prompt i // n, sample i % n), each decoded with seed + i (the
request's seed, or one drawn from the server's stream of seeds), so choice 0 of a request with seed S gets the tokens
a lone request with seed S gets. Every job of a plan has the same max_tokens, temperature, stop strings and engine
(drafter and γ: the served ones, or the request's ``speculative`` within the server's limits).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from pipeline.serving.batching import Job
from pipeline.serving.decoder import Decoder, Key, RequestError
from pipeline.serving.errors import ApiError
from pipeline.serving.schemas import (
    MAX_SEED,
    MAX_TEMPERATURE,
    ChatCompletionRequest,
    CompletionRequest,
    PredictRequest,
    prompt_kind,
)


@dataclass
class Plan:
    """A request's jobs (choice i is jobs[i]) and what its answer needs besides them: each prompt's text (echo) and
    token count (usage), n, echo, streaming and the usage chunk, and the settings its choices were decoded with."""

    jobs: list[Job]
    prompt_texts: list[str]
    prompt_tokens: list[int]
    n: int = 1
    echo: bool = False
    stream: bool = False
    include_usage: bool = False
    settings: dict | None = None


class Admission:
    """The checks of one server: ``max_tokens_limit`` (--max-tokens-limit), ``max_choices`` (prompts × n of one
    request; the queue's size), ``seed`` (of the stream of seeds for requests without one)."""

    def __init__(self, decoder: Decoder, *, max_tokens_limit: int, max_choices: int, seed: int | None) -> None:
        self.decoder, self.max_tokens_limit, self.max_choices = decoder, max_tokens_limit, max_choices
        self.seeds = random.Random(seed)

    # ---- the endpoints -------------------------------------------------------------------------------------------

    def predict(self, body: PredictRequest) -> Plan:
        ids = self._text_prompt(body.prompt, None)
        return self._plan(body, [body.prompt], [ids], self._max_tokens(body.max_tokens), n=1, stops=())

    def completion(self, body: CompletionRequest) -> Plan:
        self._stream_options(body)
        if body.best_of not in (None, body.n):
            raise ApiError(400, f"'best_of' {body.best_of} is not supported: choosing the best of several samples "
                                "needs log-probabilities; leave it out or set it to n", "best_of")
        texts, prompts = self._prompts(body.prompt)
        return self._plan(body, texts, prompts, self._max_tokens(body.max_tokens), n=body.n, stops=_stops(body.stop),
                          echo=body.echo)

    def chat(self, body: ChatCompletionRequest) -> Plan:
        self._stream_options(body)
        messages = [{"role": m.role, "content": _content(m.content), **({"name": m.name} if m.name else {})}
                    for m in body.messages]
        try:
            ids = self.decoder.chat_ids(messages)
        except RequestError as e:
            raise ApiError(400, str(e), "messages") from None
        if not ids:
            raise ApiError(400, "the messages are empty in the chat template: give some text", "messages")
        max_tokens = self._max_tokens(body.max_completion_tokens if body.max_completion_tokens is not None
                                      else body.max_tokens, "max_completion_tokens" if body.max_completion_tokens
                                      is not None else "max_tokens")
        return self._plan(body, [""], [ids], max_tokens, n=body.n, stops=_stops(body.stop), chat=True)

    # ---- shared checks -------------------------------------------------------------------------------------------

    @staticmethod
    def _stream_options(body) -> None:
        if body.stream_options is not None and not body.stream:
            raise ApiError(400, "'stream_options' is only allowed with \"stream\": true", "stream_options")

    def _max_tokens(self, value: int | None, name: str = "max_tokens") -> int:
        config = self.decoder.config
        max_tokens = value if value is not None else min(config.max_new_tokens, self.max_tokens_limit)
        if not 1 <= max_tokens <= self.max_tokens_limit:
            raise ApiError(400, f"'{name}' must be between 1 and {self.max_tokens_limit}; got {max_tokens}", name)
        return max_tokens

    def _key(self, body, temperature: float) -> Key:
        """The engine of the request: the served drafter and γ, or those of its ``speculative`` within the server's
        limits."""
        config, decoder = self.decoder.config, self.decoder
        spec = getattr(body, "speculative", None)
        drafter = spec.drafter if spec is not None and spec.drafter is not None else config.drafter
        gamma = spec.gamma if spec is not None and spec.gamma is not None else config.gamma
        if (drafter, gamma) != (config.drafter, config.gamma):
            if gamma > config.gamma:
                raise ApiError(400, f"'speculative.gamma' must be at most the server's γ ({config.gamma}); got "
                                    f"{gamma}", "speculative.gamma")
            if gamma > 0 and drafter not in decoder.allowed_drafters():
                raise ApiError(400, f"'speculative.drafter' {drafter} needs a draft model and this server loaded "
                                    f"none: use one of {', '.join(decoder.allowed_drafters())}", "speculative.drafter")
            reason = decoder.check(decoder.key(config.temperature, drafter, gamma))
            if reason is not None:
                raise ApiError(400, f"'speculative' {drafter} at γ {gamma} cannot run with the served settings: "
                                    f"{reason}", "speculative")
        return decoder.key(temperature, drafter, gamma)

    def _prompts(self, prompt) -> tuple[list[str], list[list[int]]]:
        """A completion's prompts -> (their texts, their token ids)."""
        kind = prompt_kind(prompt)
        many = kind in ("texts", "token id lists")
        items = prompt if many else [prompt]
        if not items:
            raise ApiError(400, "'prompt' is empty: give at least one prompt", "prompt")
        if len(items) > self.max_choices:
            raise ApiError(400, f"'prompt' holds {len(items)} prompts: this server takes at most {self.max_choices} "
                                "choices per request; send fewer", "prompt")
        texts, prompts = [], []
        for i, item in enumerate(items):
            where = f"prompt {i}" if many else None
            if isinstance(item, str):
                ids = self._text_prompt(item, where)
                texts.append(item)
            else:
                try:
                    ids = self.decoder.token_prompt(item)
                except RequestError as e:
                    raise ApiError(400, f"'prompt': {e}{f' ({where})' if where else ''}", "prompt") from None
                texts.append(self.decoder.text(ids))
            prompts.append(ids)
        return texts, prompts

    def _text_prompt(self, text: str, where: str | None) -> list[int]:
        ids = self.decoder.prompt_ids(text)
        if not ids:
            raise ApiError(400, f"'prompt' is empty{f' ({where})' if where else ''}: give at least one token of text",
                           "prompt")
        return ids

    def _plan(self, body, texts: list[str], prompts: list[list[int]], max_tokens: int, *, n: int,
              stops: tuple[str, ...], echo: bool = False, chat: bool = False) -> Plan:
        """The checks every request shares (temperature, seed, the engine, the prompts' room, the number of choices)
        and its jobs."""
        config, decoder = self.decoder.config, self.decoder
        temperature = body.temperature if body.temperature is not None else config.temperature
        if not (math.isfinite(temperature) and 0 <= temperature <= MAX_TEMPERATURE):
            raise ApiError(400, f"'temperature' must be between 0 and {MAX_TEMPERATURE:g}; got {temperature}",
                           "temperature")
        if decoder.rule.needs_sampling and temperature == 0:
            raise ApiError(400, f"the served sampler {config.sampler} needs 'temperature' > 0", "temperature")
        key = self._key(body, temperature)
        choices = len(prompts) * n
        if choices > self.max_choices:
            raise ApiError(400, f"{len(prompts)} prompt(s) × n {n} = {choices} choices: this server takes at most "
                                f"{self.max_choices} per request; ask for fewer", "n")
        if body.seed is not None and body.seed + choices - 1 > MAX_SEED:
            raise ApiError(400, f"'seed' must be between 0 and 2**63 - {choices} for {choices} choices; got "
                                f"{body.seed}", "seed")
        for i, ids in enumerate(prompts):
            room = decoder.room(len(ids), key)
            if room is not None and max_tokens > room:
                need = len(ids) + max_tokens + decoder.gamma_of(key) + 1
                shorten = "shorten the messages" if chat else "shorten the prompt"
                what = f"ask for at most {room} tokens or {shorten}" if room >= 1 else shorten
                which = "the conversation" if chat else f"prompt {i}" if len(prompts) > 1 else "the prompt"
                raise ApiError(400, f"{which} is {len(ids)} tokens: with max_tokens {max_tokens} and γ "
                                    f"{decoder.gamma_of(key)} it needs {need} positions, the target has "
                                    f"{decoder.positions}: {what}", "messages" if chat else "prompt")
        seed = body.seed if body.seed is not None else self.seeds.randrange(2**31)
        stream = bool(getattr(body, "stream", False))
        jobs = [Job(prompt_ids=prompts[i // n], max_tokens=max_tokens, temperature=temperature, seed=seed + i,
                    group=key, stream=stream, stop=stops, index=i) for i in range(choices)]
        options = getattr(body, "stream_options", None)
        settings = {"sampler": config.sampler, "drafter": key.drafter if key.gamma else None, "gamma": key.gamma,
                    "temperature": temperature if decoder.rule.uses_temperature else None}
        return Plan(jobs, texts, [len(p) for p in prompts], n=n, echo=echo, stream=stream,
                    include_usage=bool(options and options.include_usage), settings=settings)


def _stops(stop) -> tuple[str, ...]:
    """The stop strings (none empty: the request model refuses an empty one)."""
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def _content(content) -> str:
    """A message's content as text: text parts joined with newlines; none is empty."""
    if content is None:
        return ""
    return content if isinstance(content, str) else "\n".join(part.text for part in content)
