"""Error answers of ``specsweep serve``: OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``, with a
one-line message that says what is wrong and what to do.

:class:`ApiError` carries the status, the message, the parameter at fault and a 503's Retry-After;
:func:`validation_message` turns pydantic's first validation error of a request body into such a line.
"""

from __future__ import annotations

from pipeline.serving.schemas import CUSTOM_ERRORS, ONLY, UNION_TAGS


class ApiError(Exception):
    """An error answer: HTTP status, one-line message, the parameter at fault, Retry-After seconds for a 503."""

    def __init__(self, status: int, message: str, param: str | None = None, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.retry_after = status, message, param, retry_after


class ClientGone(Exception):
    """The client of a request that is not streamed disconnected while it waited."""


KINDS = {400: "invalid_request_error", 404: "not_found", 405: "invalid_request_error", 503: "overloaded",
         504: "timeout"}


def error_body(e: ApiError) -> dict:
    return {"error": {"message": e.message, "type": KINDS.get(e.status, "server_error"), "param": e.param,
                      "code": e.status}}


_TYPES = {"string_type": "a string", "int_type": "an integer", "float_type": "a number", "bool_type": "true or false",
          "int_from_float": "an integer", "finite_number": "a finite number", "list_type": "a list",
          "model_type": "an object", "dict_type": "an object", "model_attributes_type": "an object"}
_BOUNDS = {"greater_than_equal": ("ge", "at least"), "less_than_equal": ("le", "at most"),
           "greater_than": ("gt", "greater than"), "less_than": ("lt", "less than")}


def validation_message(errors) -> tuple[str, str | None]:
    """One line for the first of pydantic's validation errors of a request body -> (message, parameter)."""
    if not errors:
        return "the request is not valid", None
    e = errors[0]
    loc = [str(x) for x in e.get("loc", ()) if x != "body" and x not in UNION_TAGS]
    field, kind, ctx = ".".join(loc), e.get("type", ""), e.get("ctx") or {}
    got = _shown(e.get("input"))
    if kind == "json_invalid":
        return f"the request body is not valid JSON ({ctx.get('error', 'parse error')}): send a JSON object such as " \
               "{\"prompt\": \"...\"}", None
    if not field:
        return "the request body must be a JSON object, e.g. {\"prompt\": \"...\"} (and the header Content-Type: " \
               "application/json)", None
    if kind == "missing":
        return f"'{field}' is required", field
    if field in ONLY:
        return f"'{field}' {ONLY[field]}; got {got}", field
    if kind == "extra_forbidden":
        return f"'{field}' is not a setting here: leave it out (see GET /docs)", field
    if kind in _BOUNDS:
        key, words = _BOUNDS[kind]
        return f"'{field}' must be {words} {_number(ctx.get(key))}; got {got}", field
    if kind == "too_short" and field == "prompt":   # [] (a list of prompts holds at least one), as admission says it
        return "'prompt' is empty: give at least one prompt", field
    if kind in ("too_short", "too_long"):
        words = "at least" if kind == "too_short" else "at most"
        size = ctx.get("min_length") if kind == "too_short" else ctx.get("max_length")
        return f"'{field}' must have {words} {size} item(s) or character(s)", field
    if kind == "literal_error":
        return f"'{field}' must be {ctx.get('expected', 'one of the documented values')}; got {got}", field
    expected = _TYPES.get(kind)
    if expected:
        return f"'{field}' must be {expected}; got {got}", field
    message = " ".join(str(e.get("msg", "is not valid")).split())
    if kind in CUSTOM_ERRORS:   # the unions' own messages, written to follow the field's name
        return f"'{field}' {message}; got {got}", field
    return f"'{field}': {message}", field


def _number(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _shown(value) -> str:
    """A short, one-line repr of a value a client sent."""
    text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= 60 else text[:57] + "..."
