"""The ASGI app of ``specsweep serve`` (FastAPI).

    POST /predict          {"prompt": str} (optional max_tokens, temperature, seed): the seed project's endpoint;
                           the answer is a JSON string, the prompt followed by its continuation, as its client reads
    POST /v1/completions   OpenAI's completions request (prompt, max_tokens, temperature, seed, stream): a
                           text_completion object, or with "stream": true Server-Sent Events (one chunk per verify
                           step that emitted text, a last chunk with finish_reason and usage, then [DONE]); both
                           carry "specsweep": the token ids, the request's acceptance statistics, batch and timing
    GET  /health           status, the served settings and where they came from, queue depth, limits
    GET  /metrics          Prometheus text format (pipeline/serving/metrics.py)

Errors are JSON, OpenAI's shape {"error": {"message", "type", "param", "code"}}, with a one-line message that says
what is wrong and what to do: 400 for a bad request (missing prompt, wrong types, max_tokens or temperature out of
range, a prompt too long for the target), 503 with Retry-After when the queue is full or the server shuts down, 504
when a request outlives --request-timeout (its row is cancelled), 500 when decoding failed. A client that
disconnects has its row cancelled at the next verify step, which frees its batch slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ConfigDict

from pipeline.origins import encode_origins
from pipeline.serving.batching import Batcher, Closed, Job, QueueFull
from pipeline.serving.decoder import Decoder
from pipeline.serving.metrics import ServerMetrics
from pipeline.serving.settings import Served

log = logging.getLogger("specsweep.serve")

MAX_TEMPERATURE = 2.0
ENDPOINTS = ("/predict", "/v1/completions", "/health", "/metrics")


class PredictRequest(BaseModel):
    """POST /predict. Strict types: "5" is not a number."""

    model_config = ConfigDict(strict=True, extra="ignore")
    prompt: str
    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None


class CompletionRequest(PredictRequest):
    """POST /v1/completions: OpenAI's fields that this server takes; the ones it cannot honour are refused when set
    to anything but their default (n, best_of, echo, stop, logprobs, suffix)."""

    stream: bool = False
    model: str | None = None
    n: Any = 1
    best_of: Any = None
    echo: Any = False
    stop: Any = None
    logprobs: Any = None
    suffix: Any = None


UNSUPPORTED = {"n": 1, "best_of": (None, 1), "echo": False, "stop": None, "logprobs": None, "suffix": None}


class ApiError(Exception):
    """An error answer: HTTP status, one-line message, the parameter at fault, Retry-After seconds for a 503."""

    def __init__(self, status: int, message: str, param: str | None = None, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.retry_after = status, message, param, retry_after


class ServerState:
    """The decoder, the batcher, the metrics and the limits of one app."""

    def __init__(self, decoder: Decoder, served: Served | None, *, max_batch: int, max_wait_ms: float,
                 max_queue: int, request_timeout: float, max_tokens_limit: int, seed: int | None) -> None:
        self.decoder, self.served = decoder, served
        self.max_tokens_limit, self.request_timeout = max_tokens_limit, request_timeout
        self.batcher = Batcher(self._decode, max_batch=max_batch, max_wait_s=max_wait_ms / 1e3, max_queue=max_queue,
                               fits=decoder.fits, on_start=lambda: decoder.threads().apply())
        self.metrics = ServerMetrics(decoder.config.gamma, self.batcher)
        self.seeds = random.Random(seed)
        self.limits = {"max_batch": max_batch, "max_wait_ms": max_wait_ms, "max_queue": max_queue,
                       "request_timeout_s": request_timeout, "max_tokens_limit": max_tokens_limit,
                       "default_max_tokens": decoder.config.max_new_tokens, "positions": decoder.positions}

    def _decode(self, jobs: list[Job]) -> None:
        self.metrics.record_batch(self.decoder.decode(jobs))

    # ---- admission -----------------------------------------------------------------------------------------------

    def admit(self, body: PredictRequest, loop: asyncio.AbstractEventLoop, stream: bool) -> tuple[Job, asyncio.Queue]:
        """Check a request against the server's limits and queue it -> (its job, the queue its events arrive on)."""
        config = self.decoder.config
        if self.batcher.closed:
            raise ApiError(503, "the server is shutting down: retry against another instance", retry_after=5)
        if isinstance(body, CompletionRequest):
            for name, default in UNSUPPORTED.items():
                value = getattr(body, name)
                if value not in (default if isinstance(default, tuple) else (default,)):
                    raise ApiError(400, f"'{name}' is not supported by this server: leave it out (got {value!r})",
                                   name)
        max_tokens = body.max_tokens if body.max_tokens is not None else min(config.max_new_tokens,
                                                                             self.max_tokens_limit)
        if not 1 <= max_tokens <= self.max_tokens_limit:
            raise ApiError(400, f"'max_tokens' must be between 1 and {self.max_tokens_limit}; got {max_tokens}",
                           "max_tokens")
        temperature = body.temperature if body.temperature is not None else config.temperature
        if not (math.isfinite(temperature) and 0 <= temperature <= MAX_TEMPERATURE):
            raise ApiError(400, f"'temperature' must be between 0 and {MAX_TEMPERATURE:g}; got {temperature}",
                           "temperature")
        if self.decoder.rule.needs_sampling and temperature == 0:
            raise ApiError(400, f"the served sampler {config.sampler} needs 'temperature' > 0", "temperature")
        if body.seed is not None and not 0 <= body.seed < 2**63:
            raise ApiError(400, f"'seed' must be between 0 and 2**63 - 1; got {body.seed}", "seed")
        prompt_tokens = len(self.decoder.prompt_ids(body.prompt))
        if prompt_tokens == 0:
            raise ApiError(400, "'prompt' is empty: give at least one token of text", "prompt")
        room = self.decoder.room(prompt_tokens)
        if room is not None and max_tokens > room:
            need = prompt_tokens + max_tokens + config.gamma + 1
            what = (f"ask for at most {room} tokens or shorten the prompt" if room >= 1
                    else "shorten the prompt")
            raise ApiError(400, f"the prompt is {prompt_tokens} tokens: with max_tokens {max_tokens} and γ "
                                f"{config.gamma} it needs {need} positions, the target has {self.decoder.positions}: "
                                f"{what}", "prompt")
        events: asyncio.Queue = asyncio.Queue()
        job = Job(prompt=body.prompt, prompt_tokens=prompt_tokens, max_tokens=max_tokens, temperature=temperature,
                  seed=body.seed if body.seed is not None else self.seeds.randrange(2**31),
                  group=self.decoder.group(temperature), notify=lambda kind, payload: None, stream=stream)
        job.notify = self._notifier(job, events, loop)
        try:
            self.batcher.submit(job)
        except QueueFull as e:
            raise ApiError(503, f"{e}: retry in {e.retry_after} s", retry_after=e.retry_after) from None
        except Closed:
            raise ApiError(503, "the server is shutting down: retry against another instance", retry_after=5) from None
        return job, events

    def _notifier(self, job: Job, events: asyncio.Queue, loop: asyncio.AbstractEventLoop):
        """The job's notify: events to the handler's queue on the event loop (from the worker thread); the job's
        metrics once it has ended."""

        def notify(kind: str, payload) -> None:
            if kind != "tokens":
                self.metrics.record_job(job)
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits for this job any more
                loop.call_soon_threadsafe(events.put_nowait, (kind, payload))

        return notify

    # ---- waiting -------------------------------------------------------------------------------------------------

    async def next_event(self, job: Job, events: asyncio.Queue, request=None) -> tuple[str, object]:
        """The job's next event; cancels the job and raises ApiError 504 past the request timeout, and (with
        ``request``, for answers that are not streamed) cancels it and raises ClientGone when its client left."""
        while True:
            left = job.enqueued + self.request_timeout - time.perf_counter()
            if left <= 0:
                job.cancel("timeout")
                raise ApiError(504, f"the request took longer than the server's request timeout "
                                    f"({self.request_timeout:g} s): ask for fewer tokens or retry later")
            try:
                return await asyncio.wait_for(events.get(), min(left, 0.25))
            except asyncio.TimeoutError:
                if request is not None and await request.is_disconnected():
                    job.cancel("disconnect")
                    raise ClientGone() from None

    async def result(self, job: Job, events: asyncio.Queue, request) -> Job:
        """Wait until ``job`` has ended; ApiError 500 with the decoder's message if decoding failed."""
        while True:
            kind, payload = await self.next_event(job, events, request)
            if kind == "done":
                return job
            if kind == "error":
                raise ApiError(500, f"decoding failed: {payload}")

    # ---- answers -------------------------------------------------------------------------------------------------

    def stats(self, job: Job) -> dict:
        """The "specsweep" part of an answer: token ids, acceptance, batch and timing of the request."""
        config = self.decoder.config
        return {"token_ids": list(job.tokens), "origins": encode_origins(job.origins[: len(job.tokens)]),
                "acceptance": {"accepted": job.accepted, "drafted": job.drafted,
                               "rate": job.accepted / job.drafted if job.drafted else None,
                               "verify_steps": job.steps,
                               "tokens_per_step": len(job.tokens) / job.steps if job.steps else None},
                "batch": {"size": job.batch_size}, "seed": job.seed,
                "timing": {"queue_s": _since(job.enqueued, job.started), "first_token_s": _since(job.enqueued,
                                                                                                 job.first_token),
                           "total_s": _since(job.enqueued, job.ended)},
                "settings": {"sampler": config.sampler, "gamma": config.gamma,
                             "temperature": job.temperature if self.decoder.rule.uses_temperature else None}}

    def completion(self, job: Job, cid: str, created: int) -> dict:
        n = len(job.tokens)
        return {"id": cid, "object": "text_completion", "created": created, "model": self.decoder.config.target,
                "choices": [{"index": 0, "text": self.decoder.text(job.tokens), "logprobs": None,
                             "finish_reason": job.finish_reason}],
                "usage": {"prompt_tokens": job.prompt_tokens, "completion_tokens": n,
                          "total_tokens": job.prompt_tokens + n},
                "specsweep": self.stats(job)}

    async def stream(self, job: Job, events: asyncio.Queue, cid: str, created: int):
        """Server-Sent Events of ``job``: a chunk per batch of new text, a last chunk with finish_reason, usage and
        statistics, then [DONE]; an error event (and the job cancelled) past the timeout or when decoding fails.
        The job is cancelled when the client goes away (Starlette then cancels this generator)."""
        import json

        def chunk(text: str, finish_reason=None, **extra) -> str:
            body = {"id": cid, "object": "text_completion", "created": created, "model": self.decoder.config.target,
                    "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}], **extra}
            return f"data: {json.dumps(body)}\n\n"

        shown, sent = "", 0
        try:
            while True:
                try:
                    kind, payload = await self.next_event(job, events)
                except ApiError as e:
                    yield f"data: {json.dumps(_error_body(e))}\n\n"
                    return
                if kind == "tokens":
                    tokens = list(job.tokens)
                    text = self.decoder.text(tokens)
                    if text.startswith(shown) and len(text) > len(shown) and not text.endswith("\ufffd"):
                        delta, shown = text[len(shown):], text
                        yield chunk(delta, specsweep={"token_ids": tokens[sent:],
                                                      "origins": encode_origins(job.origins[sent: len(tokens)])})
                        sent = len(tokens)
                elif kind == "done":
                    completion = self.completion(job, cid, created)
                    text = completion["choices"][0]["text"]
                    yield chunk(text[len(shown):] if text.startswith(shown) else "", job.finish_reason,
                                usage=completion["usage"], specsweep=completion["specsweep"])
                    yield "data: [DONE]\n\n"
                    return
                else:
                    yield f"data: {json.dumps(_error_body(ApiError(500, f'decoding failed: {payload}')))}\n\n"
                    return
        finally:
            job.cancel("disconnect")  # no effect once the job has ended


class ClientGone(Exception):
    """The client of a request that is not streamed disconnected while it waited."""


def create_app(decoder: Decoder, served: Served | None = None, *, max_batch: int = 8, max_wait_ms: float = 10.0,
               max_queue: int = 64, request_timeout: float = 60.0, max_tokens_limit: int = 512,
               seed: int | None = None, warm_up: bool = True):
    """The FastAPI app serving ``decoder``. Its lifespan starts the batcher (after a warm-up generation) and, at
    shutdown, lets it finish every request it has taken before the app stops."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from prometheus_client import CONTENT_TYPE_LATEST, disable_created_metrics

    disable_created_metrics()  # no *_created series: they double the exposition and say little here

    state = ServerState(decoder, served, max_batch=max_batch, max_wait_ms=max_wait_ms, max_queue=max_queue,
                        request_timeout=request_timeout, max_tokens_limit=max_tokens_limit, seed=seed)

    @asynccontextmanager
    async def lifespan(app):
        if warm_up:
            await asyncio.to_thread(decoder.warm_up)
        state.batcher.start()
        log.info("ready: max batch %d, max wait %g ms, queue %d, timeout %g s", max_batch, max_wait_ms, max_queue,
                 request_timeout)
        yield
        log.info("shutting down: finishing %d request(s) in flight and %d queued", state.batcher.in_flight,
                 state.batcher.depth)
        await asyncio.to_thread(state.batcher.close)

    app = FastAPI(title="specsweep serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    app.add_middleware(_RecordResponses, metrics=state.metrics)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        headers = {"Retry-After": str(e.retry_after)} if e.retry_after is not None else None
        return JSONResponse(_error_body(e), status_code=e.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError):
        message, param = validation_message(e.errors())
        return JSONResponse(_error_body(ApiError(400, message, param)), status_code=400)

    @app.exception_handler(404)
    async def not_found(request: Request, e):
        return JSONResponse(_error_body(ApiError(404, f"no endpoint {request.method} {request.url.path}: the "
                                                      f"endpoints are {', '.join(ENDPOINTS)}")), status_code=404)

    @app.exception_handler(405)
    async def wrong_method(request: Request, e):
        return JSONResponse(_error_body(ApiError(405, f"{request.method} is not allowed on {request.url.path}")),
                            status_code=405)

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, e: ClientGone):
        return Response(status_code=499)  # nginx's "client closed request": nobody reads it

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        job, events = state.admit(body, asyncio.get_running_loop(), body.stream)
        cid, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        if body.stream:
            return StreamingResponse(state.stream(job, events, cid, created), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            await state.result(job, events, request)
        finally:
            job.cancel("disconnect")  # no effect once the job has ended
        return state.completion(job, cid, created)

    @app.post("/predict")
    async def predict(body: PredictRequest, request: Request):
        job, events = state.admit(body, asyncio.get_running_loop(), False)
        await state.result(job, events, request)
        return decoder.text(decoder.prompt_ids(body.prompt) + job.tokens)

    @app.get("/health")
    async def health():
        closing = state.batcher.closed
        body = {"status": "shutting_down" if closing else "ok", "target": decoder.config.target,
                "draft": decoder.config.draft, "settings": served.describe() if served else None,
                "source": served.source if served else None, "queue_depth": state.batcher.depth,
                "in_flight": state.batcher.in_flight, **state.limits}
        return JSONResponse(body, status_code=503 if closing else 200)

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    return app


class _RecordResponses:
    """ASGI middleware: every HTTP answer's status and duration (to its last byte) into the metrics, by endpoint;
    499 where the client left before an answer started."""

    def __init__(self, app, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), [499]

        async def send_and_note(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            path = scope.get("path", "")
            self.metrics.record_response(path if path in ENDPOINTS else "other", status[0],
                                         time.perf_counter() - start)


_TYPES = {"string_type": "a string", "int_type": "an integer", "float_type": "a number", "bool_type": "true or false",
          "int_from_float": "an integer", "finite_number": "a finite number"}


def validation_message(errors) -> tuple[str, str | None]:
    """One line for the first of pydantic's validation errors of a request body -> (message, parameter)."""
    if not errors:
        return "the request is not valid", None
    e = errors[0]
    loc = [str(x) for x in e.get("loc", ()) if x != "body"]
    field, kind = ".".join(loc), e.get("type", "")
    if kind == "json_invalid":
        return f"the request body is not valid JSON ({e.get('ctx', {}).get('error', 'parse error')}): send a JSON " \
               "object such as {\"prompt\": \"...\"}", None
    if not field or kind in ("model_attributes_type", "dict_type", "model_type"):
        return "the request body must be a JSON object with a 'prompt', e.g. {\"prompt\": \"...\"} (and the header " \
               "Content-Type: application/json)", None
    if kind == "missing":
        return f"'{field}' is required", field
    expected = _TYPES.get(kind)
    if expected:
        return f"'{field}' must be {expected}; got {e.get('input')!r}", field
    return f"'{field}': {e.get('msg', 'is not valid')}", field


def _error_body(e: ApiError) -> dict:
    kind = {400: "invalid_request_error", 404: "not_found", 405: "invalid_request_error", 503: "overloaded",
            504: "timeout"}.get(e.status, "server_error")
    return {"error": {"message": e.message, "type": kind, "param": e.param, "code": e.status}}


def _since(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else end - start
