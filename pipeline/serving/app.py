"""The ASGI app of ``specsweep serve`` (FastAPI): its routes, error handlers and served OpenAPI schema.

    POST /v1/completions        OpenAI's completions: a prompt or a list of prompts (or token ids), n, stop, echo,
                                max_tokens, temperature, seed, stream (Server-Sent Events) with stream_options
    POST /v1/chat/completions   OpenAI's chat completions: messages through the served model's chat template
    GET  /v1/models             OpenAI's list of models: the served one; GET /v1/models/{id} that one
    POST /predict               {"prompt": str}: the prompt followed by its continuation, as a JSON string
    GET  /health                status, the served settings and where they came from, queue depth, limits
    GET  /metrics               Prometheus text format (pipeline/serving/metrics.py)
    GET  /openapi.json, /docs   the OpenAPI schema of the request models (pipeline/serving/schemas.py), with this
                                server's limits written in, and its Swagger UI

Every completion choice carries "specsweep": its token ids and their origins, its acceptance statistics, batch,
timing and settings (pipeline/serving/answers.py). A request may ask for its own drafter and γ ("speculative")
within the server's limits (pipeline/serving/admission.py).

Errors are JSON, OpenAI's shape, with a one-line message (pipeline/serving/errors.py): 400 for a bad request (a
wrong type, a value out of range, an option this server cannot honour, a prompt too long for the target), 404 and
405, 503 with Retry-After when the queue is full or the server shuts down, 504 when a request outlives
--request-timeout (its rows are cancelled), 500 when decoding failed. A client that disconnects has its rows
cancelled at the next verify step, which frees their batch slots.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import Request

from pipeline.serving import answers
from pipeline.serving.decoder import Decoder
from pipeline.serving.errors import ApiError, ClientGone, error_body, validation_message
from pipeline.serving.metrics import ServerMetrics
from pipeline.serving.schemas import (
    MAX_SEED,
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ErrorResponse,
    ModelCard,
    ModelList,
    PredictRequest,
)
from pipeline.serving.settings import Served
from pipeline.serving.state import ServerState

log = logging.getLogger("specsweep.serve")

ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/predict", "/health", "/metrics",
             "/openapi.json", "/docs")
MODEL_PATH = "/v1/models/{model}"

_ERRORS = {400: {"model": ErrorResponse, "description": "a bad request: the message says what and what to do"},
           503: {"model": ErrorResponse, "description": "the queue is full (Retry-After) or the server shuts down"},
           504: {"model": ErrorResponse, "description": "the request outlived --request-timeout"},
           500: {"model": ErrorResponse, "description": "decoding failed"}}
_STREAM = {"text/event-stream": {"schema": {
    "type": "object", "required": ["data"], "description": "with \"stream\": true, each Server-Sent Event: data is a "
    "chunk (JSON: text_completion or chat.completion.chunk), an error object, or [DONE] at the end",
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}}}}}


def create_app(decoder: Decoder, served: Served | None = None, *, max_batch: int = 8, max_wait_ms: float = 10.0,
               max_queue: int = 64, request_timeout: float = 60.0, max_tokens_limit: int = 512,
               seed: int | None = None, warm_up: bool = True):
    """The FastAPI app serving ``decoder``. Its lifespan starts the batcher (after a warm-up generation) and, at
    shutdown, lets it finish every request it has taken before the app stops."""
    from fastapi import FastAPI
    from prometheus_client import disable_created_metrics

    disable_created_metrics()  # no *_created series: they double the exposition and say little here

    state = ServerState(decoder, served, max_batch=max_batch, max_wait_ms=max_wait_ms, max_queue=max_queue,
                        request_timeout=request_timeout, max_tokens_limit=max_tokens_limit, seed=seed)

    lifespan = _lifespan(state, warm_up)
    app = FastAPI(title="specsweep serve", summary="speculative decoding behind OpenAI's completions and chat "
                  "completions (docs/serve.md)", version="1", lifespan=lifespan, docs_url="/docs", redoc_url=None,
                  openapi_url="/openapi.json")
    app.state.server = state
    app.add_middleware(_RecordResponses, metrics=state.metrics)
    app.openapi = lambda: _served_schema(app, state)

    _error_handlers(app)
    _openai_routes(app, state)
    _service_routes(app, state, served)
    return app


def _lifespan(state: ServerState, warm_up: bool):
    """Start the batcher (after a warm-up generation); at shutdown, let it finish every request it has taken."""
    decoder, limits = state.decoder, state.limits

    @asynccontextmanager
    async def lifespan(app):
        if warm_up:
            await asyncio.to_thread(decoder.warm_up)
        state.batcher.start()
        log.info("ready: %s", ", ".join(f"{k} {v}" for k, v in limits.items()))
        yield
        log.info("shutting down: finishing %d request(s) in flight and %d queued", state.batcher.in_flight,
                 state.batcher.depth)
        await asyncio.to_thread(state.batcher.close)

    return lifespan


def _error_handlers(app) -> None:
    """Every error in OpenAI's shape: ours, FastAPI's validation (as 400) and Starlette's own."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        headers = {"Retry-After": str(e.retry_after)} if e.retry_after is not None else None
        return JSONResponse(error_body(e), status_code=e.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError):
        message, param = validation_message(e.errors())
        return JSONResponse(error_body(ApiError(400, message, param)), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        """Starlette's and FastAPI's own errors in our shape: an unknown path or method, a body that is not
        readable."""
        if e.status_code == 404:
            message = f"no endpoint {request.method} {request.url.path}: the endpoints are {', '.join(ENDPOINTS)}"
        elif e.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        elif e.status_code == 400:
            message = "the request body could not be read (not UTF-8 JSON): send a JSON object such as " \
                      "{\"prompt\": \"...\"} with Content-Type: application/json"
        else:
            message = " ".join(str(e.detail).split()) or f"HTTP {e.status_code}"
        return JSONResponse(error_body(ApiError(e.status_code, message)), status_code=e.status_code,
                            headers=getattr(e, "headers", None))

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, e: ClientGone):
        return Response(status_code=499)  # nginx's "client closed request": nobody reads it



def _openai_routes(app, state: ServerState) -> None:
    """/v1/completions, /v1/chat/completions, /v1/models."""
    from fastapi.responses import StreamingResponse

    decoder = state.decoder

    async def answer(plan, request: Request, chat: bool):
        """Queue the plan; its answer whole, or as a stream."""
        pending = state.submit(plan, asyncio.get_running_loop())
        cid, created = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}", int(time.time())
        if plan.stream:
            return StreamingResponse(answers.stream(state, pending, cid, created, chat),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        await state.wait(pending, request)
        build = answers.chat_completion if chat else answers.completion
        return build(pending.plan, decoder, state.model_id, cid, created)

    @app.post("/v1/completions", response_model=None, tags=["OpenAI"],
              responses={200: {"model": Completion, "content": _STREAM}, **_ERRORS})
    async def completions(body: CompletionRequest, request: Request):
        """OpenAI's completions: a choice per prompt and per sample of n."""
        state.check_open()
        return await answer(state.admission.completion(body), request, chat=False)

    @app.post("/v1/chat/completions", response_model=None, tags=["OpenAI"],
              responses={200: {"model": ChatCompletion, "content": _STREAM}, **_ERRORS})
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        """OpenAI's chat completions: the messages through the served model's chat template."""
        state.check_open()
        return await answer(state.admission.chat(body), request, chat=True)

    def card() -> dict:
        return {"id": state.model_id, "object": "model", "created": state.started, "owned_by": "specsweep",
                "max_model_len": decoder.positions}

    @app.get("/v1/models", response_model=ModelList, tags=["OpenAI"])
    async def models():
        """The served model."""
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model:path}", response_model=ModelCard, tags=["OpenAI"],
             responses={404: {"model": ErrorResponse, "description": "not the served model"}})
    async def model(model: str):
        """The served model, by its id."""
        if model != state.model_id:
            raise ApiError(404, f"no model {model!r}: this server serves {state.model_id!r} (GET /v1/models)",
                           "model")
        return card()



def _service_routes(app, state: ServerState, served: Served | None) -> None:
    """/predict, /health, /metrics."""
    from fastapi.responses import JSONResponse, Response
    from prometheus_client import CONTENT_TYPE_LATEST

    decoder = state.decoder

    @app.post("/predict", response_model=str, responses=_ERRORS)
    async def predict(body: PredictRequest, request: Request):
        """The prompt followed by its continuation, decoded together, as one JSON string."""
        state.check_open()
        pending = state.submit(state.admission.predict(body), asyncio.get_running_loop())
        (job,) = await state.wait(pending, request)
        return decoder.text(job.prompt_ids + job.tokens)

    @app.get("/health")
    async def health():
        """Status (ok, or 503 shutting_down), the served settings and where they came from, queue and limits."""
        closing = state.batcher.closed
        body = {"status": "shutting_down" if closing else "ok", "model": state.model_id,
                "target": decoder.config.target, "draft": decoder.config.draft,
                "settings": served.describe() if served else None, "source": served.source if served else None,
                "speculative": {"drafter": decoder.config.drafter, "gamma": decoder.config.gamma,
                                "drafters": list(decoder.allowed_drafters())},
                "queue_depth": state.batcher.depth, "in_flight": state.batcher.in_flight, **state.limits}
        return JSONResponse(body, status_code=503 if closing else 200)

    @app.get("/metrics", response_class=Response,
             responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}},
                              "description": "Prometheus text format"}})
    async def metrics():
        """Prometheus metrics, ours and vLLM's speculative-decoding counters."""
        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


def _served_schema(app, state: ServerState) -> dict:
    """FastAPI's OpenAPI schema with what this server accepts written in, so that a request the schema allows is
    admitted and one it refuses is a 4xx: max_tokens up to --max-tokens-limit, n and the prompts of a list up to the
    choices a request may have, token ids within the vocabulary, γ up to the served one, the drafters it allows, seeds
    up to 2**63 - 1 exactly (FastAPI writes bounds as floats), a text prompt with a token in it (:func:`_prompts`), a
    temperature above 0 where the sampler needs one, GET /v1/models/{model} for the served model's id (any other is a
    404), no POST /v1/chat/completions without a chat template (each is a 400 there); and 400 in place of FastAPI's
    422: this server answers a body that fails validation with 400."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    from fastapi.openapi.utils import get_openapi

    schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
    components = schema.get("components", {}).get("schemas", {})
    limits, decoder = state.limits, state.decoder
    for model in ("CompletionRequest", "ChatCompletionRequest", "PredictRequest"):
        for name in ("max_tokens", "max_completion_tokens"):
            _bound(components, model, name, maximum=limits["max_tokens_limit"])
        _bound(components, model, "n", maximum=limits["max_choices"])
        _bound(components, model, "seed", maximum=MAX_SEED)
        if decoder.rule.needs_sampling:
            _bound(components, model, "temperature", exclusiveMinimum=0)
    text = _prompts(decoder)
    _bound(components, "PredictRequest", "prompt", **text)
    for branch in components.get("CompletionRequest", {}).get("properties", {}).get("prompt", {}).get("oneOf", []):
        if branch.get("type") == "string":
            branch.update(text)
        if branch.get("type") == "array":     # a list of prompts: a choice each; token ids within the vocabulary
            branch["maxItems"] = limits["max_choices"]
            if branch["items"].get("type") == "string":
                branch["items"].update(text)
            ids = branch["items"] if branch["items"].get("type") == "integer" else branch["items"].get("items", {})
            if ids.get("type") == "integer":
                ids["maximum"] = decoder.vocabulary - 1
    _bound(components, "Speculative", "gamma", maximum=decoder.config.gamma)
    _bound(components, "Speculative", "drafter", enum=list(decoder.allowed_drafters()))
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    paths = schema.get("paths", {})
    if not decoder.has_chat_template:
        paths.pop("/v1/chat/completions", None)
    for parameter in paths.get(MODEL_PATH, {}).get("get", {}).get("parameters", []):
        if parameter.get("in") == "path" and parameter.get("name") == "model":
            parameter["schema"] = {**parameter.get("schema", {}), "type": "string", "enum": [state.model_id]}
            parameter["description"] = "the served model's id (GET /v1/models); another is a 404"
    for path in paths.values():
        for operation in path.values():
            responses = operation.get("responses", {})
            if responses.pop("422", None) is not None and "400" not in responses:
                responses["400"] = {"description": "a bad request",
                                    "content": {"application/json": {"schema": {"$ref":
                                                "#/components/schemas/ErrorResponse"}}}}
    app.openapi_schema = schema
    return schema


def _prompts(decoder: Decoder) -> dict:
    """What a text prompt must hold for the served tokenizer to give it a token (admission refuses one without):
    a character where "" has none (no BOS token), a character other than white space where white space alone has
    none (a tokenizer that splits on it)."""
    constraints = {}
    if not decoder.prompt_ids(""):
        constraints["minLength"] = 1
    if not decoder.prompt_ids(" \t\n"):
        constraints["pattern"] = r"\S"
    return constraints


def _bound(components: dict, model: str, field: str, **bounds) -> None:
    """Write ``bounds`` (maximum, enum) into a field of a component, into its non-null branch if it is optional."""
    prop = components.get(model, {}).get("properties", {}).get(field)
    if prop is None:
        return
    for branch in prop.get("anyOf", [prop]):
        if branch.get("type") != "null":
            branch.update(bounds)


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
            endpoint = path if path in ENDPOINTS else MODEL_PATH if path.startswith("/v1/models/") else "other"
            self.metrics.record_response(endpoint, status[0], time.perf_counter() - start)
