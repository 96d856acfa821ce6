"""What each endpoint of ``specsweep serve`` accepts and answers: the pydantic models behind validation and the OpenAPI
schema (GET /openapi.json, GET /docs).

Requests are OpenAI's (``/v1/completions``, ``/v1/chat/completions``) and our own (``/predict``). Types are strict
("5" is not an integer, 1.0 is not an integer, true is not a number); fields a request model does not name are
ignored, as OpenAI ignores them, except inside ``speculative``, our own object, where a misspelt setting is an
error. Ranges that depend on the server (max_tokens up to --max-tokens-limit, n, γ up to the served one, the
drafters it allows, a text prompt the tokenizer gives a token, the served model's id) are checked when a request is
admitted (pipeline/serving/admission.py) and written into the served schema by the app (pipeline/serving/app.py),
so that what the schema allows is accepted and what it refuses is a 4xx. Fields of OpenAI's that this server
cannot honour are here with the one value it accepts (e.g. top_p 1, logprobs null; :data:`ONLY` says why): any
other value is refused with a 400 that names it.

The answers' models document the responses; the app builds them as plain dicts (pipeline/serving/answers.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag

from pipeline.config import DRAFTERS

MAX_TEMPERATURE = 2.0
MAX_SEED = 2**63 - 1
MAX_STOPS = 16

ONLY = {
    "top_p": "must be 1 or left out: the verify step samples from the model's whole distribution",
    "frequency_penalty": "must be 0 or left out: this server applies no penalties",
    "presence_penalty": "must be 0 or left out: this server applies no penalties",
    "logit_bias": "must be empty or left out: this server applies no logit bias",
    "logprobs": "must be null (false) or left out: the engine computes no log-probabilities (they would cost every "
                "request of a batch a softmax per token)",
    "top_logprobs": "must be 0 or left out: the engine computes no log-probabilities",
    "suffix": "must be empty or left out: this server has no insertion mode",
    "tools": "must be empty or left out: this server does not call tools",
    "response_format.type": "must be \"text\": this server has no constrained decoding",
}
"""OpenAI's fields that this server takes at one neutral value only, and why: the message of a 400 for another."""


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


def _integral(v):
    """3.0 is the integer 3, as JSON Schema's "integer" has it; 3.5, "3" and true are not integers."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def integer(**bounds):
    """An integer field within ``bounds`` (ge, le): a JSON integer, or a number with no fraction. (The bounds go
    inside, before the conversion, so that the JSON schema states them.)"""
    return Annotated[int, Field(**bounds), BeforeValidator(_integral)]


TokenId = integer(ge=0)


# ---- unions told apart by what the value is, so that a wrong value gets one error, not one per branch ------------

PROMPT_KINDS = ("one text", "texts", "token ids", "token id lists")
CONTENT_KINDS = ("text", "parts")
UNION_TAGS = frozenset((*PROMPT_KINDS, *CONTENT_KINDS))
"""The tags of the unions below: pydantic puts them into an error's location, which the app's messages leave out."""
CUSTOM_ERRORS = frozenset(("prompt_type", "content_type"))
"""The unions' error types; their messages follow the field's name ("'prompt' must be ...")."""


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def prompt_kind(v) -> str | None:
    if isinstance(v, str):
        return "one text"
    if not isinstance(v, list) or not v:
        return "texts" if isinstance(v, list) else None   # [] is too short: a list holds at least one prompt
    if all(isinstance(x, str) for x in v):
        return "texts"
    if all(_is_int(x) or isinstance(x, float) for x in v):
        return "token ids"
    if all(isinstance(x, list) for x in v):
        return "token id lists"
    return None


def _content_kind(v) -> str | None:
    if isinstance(v, str):
        return "text"
    return "parts" if isinstance(v, list) else None


Prompt = Annotated[
    Annotated[str, Tag("one text")] | Annotated[list[str], Field(min_length=1), Tag("texts")]
    | Annotated[list[TokenId], Field(min_length=1), Tag("token ids")]
    | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1), Tag("token id lists")],
    Discriminator(prompt_kind, custom_error_type="prompt_type",
                  custom_error_message="must be a string, a list of strings, a list of token ids or a list of lists "
                                       "of token ids")]


class TextPart(_Strict):
    """A part of a message's content; this server takes text only."""

    type: Literal["text"]
    text: str


Content = Annotated[
    Annotated[str, Tag("text")] | Annotated[list[TextPart], Tag("parts")],
    Discriminator(_content_kind, custom_error_type="content_type",
                  custom_error_message='must be a string or a list of {"type": "text", "text": ...} parts')]


# ---- requests ----------------------------------------------------------------------------------------------------

class Speculative(BaseModel):
    """Speculative-decoding settings of one request, within what the server was started with: a drafter it allows
    (the draft model only where it loaded one) and γ at most its own."""

    model_config = ConfigDict(strict=True, extra="forbid")
    drafter: Literal[DRAFTERS] | None = Field(None, description="model, prompt-lookup, suffix or lookup-model "
                                                                "(default: the server's --drafter)")
    gamma: integer(ge=0) | None = Field(None, description="draft tokens per step, at most the server's γ; 0: "
                                                      "autoregressive (default: the server's γ)")


class StreamOptions(_Strict):
    include_usage: bool = Field(False, description="a last chunk with the request's usage and no choices")


class PredictRequest(_Strict):
    """POST /predict."""

    prompt: str
    max_tokens: integer(ge=1) | None = Field(None, description="new tokens at most (default: the server's "
                                                           "--max-new-tokens)")
    temperature: float | None = Field(None, ge=0, le=MAX_TEMPERATURE, description="default: the server's")
    seed: integer(ge=0, le=MAX_SEED) | None = Field(None, description="default: drawn from the server's stream of "
                                                                     "seeds")


class _Sampling(_Strict):
    """The fields the two OpenAI endpoints share."""

    model: str | None = Field(None, description="accepted and ignored: the server serves one model (GET /v1/models)")
    max_tokens: integer(ge=1) | None = Field(None, description="new tokens at most per choice (default: the server's "
                                                           "--max-new-tokens)")
    temperature: float | None = Field(None, ge=0, le=MAX_TEMPERATURE, description="default: the server's")
    seed: integer(ge=0, le=MAX_SEED) | None = Field(None, description="choice i (prompt by prompt, then sample by "
                                                                     "sample) is decoded with seed + i (default: "
                                                                     "drawn)")
    n: integer(ge=1) = Field(1, description="samples per prompt, each with its own seed")
    stop: Annotated[str, Field(min_length=1)] | Annotated[list[Annotated[str, Field(min_length=1)]],
                                                          Field(max_length=MAX_STOPS)] | None = Field(
        None, description="strings that end a choice's text (not included; finish_reason stop)")
    stream: bool = Field(False, description="Server-Sent Events")
    stream_options: StreamOptions | None = Field(None, description="with stream only")
    top_p: float | None = Field(None, ge=1, le=1, description=ONLY["top_p"])
    frequency_penalty: float | None = Field(None, ge=0, le=0, description=ONLY["frequency_penalty"])
    presence_penalty: float | None = Field(None, ge=0, le=0, description=ONLY["presence_penalty"])
    logit_bias: dict[str, float] | None = Field(None, max_length=0, description=ONLY["logit_bias"])
    user: str | None = Field(None, description="accepted and ignored")
    speculative: Speculative | None = Field(None, description="this request's drafter and γ (specsweep's own field)")


class CompletionRequest(_Sampling):
    """POST /v1/completions."""

    prompt: Prompt = Field(description="a string, a list of strings (a choice each), token ids, or lists of token "
                                       "ids")
    echo: bool = Field(False, description="the prompt's text before each choice's text")
    logprobs: None = Field(None, description=ONLY["logprobs"])
    best_of: integer(ge=1) | None = Field(None, description="null or n only: choosing the best of several samples "
                                                            "needs log-probabilities")
    suffix: str | None = Field(None, max_length=0, description=ONLY["suffix"])


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Content | None = Field(None, description="a string, or text parts (joined with newlines)")
    name: str | None = None


class ResponseFormat(_Strict):
    type: Literal["text"] = Field(description=ONLY["response_format.type"])


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: list[Message] = Field(min_length=1, description="the conversation, rendered with the served model's "
                                                              "chat template and its generation prompt")
    max_completion_tokens: integer(ge=1) | None = Field(None, description="the same as max_tokens, which it overrides")
    logprobs: Literal[False] | None = Field(None, description=ONLY["logprobs"])
    top_logprobs: integer(ge=0, le=0) | None = Field(None, description=ONLY["top_logprobs"])
    tools: list[dict[str, Any]] | None = Field(None, max_length=0, description=ONLY["tools"])
    response_format: ResponseFormat | None = Field(None, description='{"type": "text"} only')


# ---- answers (documentation of the JSON the app writes) ----------------------------------------------------------

class Usage(BaseModel):
    prompt_tokens: int = Field(description="each prompt's tokens once, whatever n")
    completion_tokens: int
    total_tokens: int


class Stats(BaseModel):
    """specsweep's record of a choice: its tokens, where each came from, its acceptance, batch, timing and the
    settings it was decoded with."""

    model_config = ConfigDict(extra="allow")
    token_ids: list[int]
    origins: str = Field(description="a letter per token: A accepted draft, C corrected, B bonus, T target alone")
    acceptance: dict[str, Any]
    batch: dict[str, Any]
    seed: int
    timing: dict[str, Any]
    settings: dict[str, Any]


class _Choice(BaseModel):
    index: int = Field(description="prompt by prompt, then sample by sample")
    logprobs: None = None
    finish_reason: Literal["stop", "length", "cancelled"] | None
    specsweep: Stats


class CompletionChoice(_Choice):
    text: str


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(_Choice):
    message: AssistantMessage


class _Answer(BaseModel):
    id: str
    created: int
    model: str
    usage: Usage


class Completion(_Answer):
    object: Literal["text_completion"]
    choices: list[CompletionChoice]


class ChatCompletion(_Answer):
    object: Literal["chat.completion"]
    choices: list[ChatChoice]


class ModelCard(BaseModel):
    id: str = Field(description="the served target as --model/--target named it")
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int | None = Field(description="the target's positions (null: no known limit)")


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str = Field(description="one line: what is wrong and what to do")
    type: str
    param: str | None
    code: int


class ErrorResponse(BaseModel):
    error: ErrorDetail
