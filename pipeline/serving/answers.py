"""The answers of ``specsweep serve``: OpenAI's ``text_completion`` and ``chat.completion`` objects, and their
Server-Sent Events streams (``text_completion`` chunks; ``chat.completion.chunk`` chunks), built from a request's
ended or running jobs.

Each choice carries ``specsweep``: its token ids, each token's origin, its acceptance, batch, seed, timing and the
settings it was decoded with (:func:`stats`). A choice's text is its tokens' text cut at its first stop string
(pipeline/serving/stops.py), after the prompt's text with ``echo``.

A stream sends, per choice, its text as the verify steps bring it (never the start of a stop string that later
tokens may complete; the chunks' texts concatenate to the text of the same request answered whole), then a chunk
with its finish_reason and its ``specsweep``; then, with ``stream_options.include_usage``, a chunk with no choices
and the usage (else the usage rides on the last finish chunk), then ``data: [DONE]``. A chat stream starts each
choice with a chunk whose delta is the assistant's role. An error after the stream started (the timeout, a
decoding failure) is a last ``data: {"error": ...}`` event.
"""

from __future__ import annotations

import json

from pipeline.origins import encode_origins
from pipeline.serving import stops
from pipeline.serving.admission import Plan
from pipeline.serving.batching import Job
from pipeline.serving.errors import ApiError, error_body


def stats(job: Job, settings: dict) -> dict:
    """The "specsweep" part of a choice: token ids, origins, acceptance, batch, seed, timing and settings."""
    n = len(job.tokens)
    return {"token_ids": list(job.tokens), "origins": encode_origins(job.origins[:n]),
            "acceptance": {"accepted": job.accepted, "drafted": job.drafted,
                           "rate": job.accepted / job.drafted if job.drafted else None, "verify_steps": job.steps,
                           "tokens_per_step": n / job.steps if job.steps else None},
            "batch": {"size": job.batch_size}, "seed": job.seed,
            "timing": {"queue_s": _since(job.enqueued, job.started),
                       "first_token_s": _since(job.enqueued, job.first_token), "total_s": _since(job.enqueued,
                                                                                                 job.ended)},
            "settings": settings}


def usage(plan: Plan) -> dict:
    """Each prompt's tokens once (whatever n), every choice's new tokens."""
    prompt, completion = sum(plan.prompt_tokens), sum(len(j.tokens) for j in plan.jobs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def text_of(job: Job, decoder) -> str:
    """A choice's text: its tokens' text up to its first stop string."""
    return stops.cut(decoder.text(job.tokens), job.stop)


def completion(plan: Plan, decoder, model: str, cid: str, created: int) -> dict:
    choices = [{"index": job.index, "text": _echo(plan, job) + text_of(job, decoder), "logprobs": None,
                "finish_reason": job.finish_reason, "specsweep": stats(job, plan.settings)} for job in plan.jobs]
    return {"id": cid, "object": "text_completion", "created": created, "model": model, "choices": choices,
            "usage": usage(plan)}


def chat_completion(plan: Plan, decoder, model: str, cid: str, created: int) -> dict:
    choices = [{"index": job.index, "message": {"role": "assistant", "content": text_of(job, decoder)},
                "logprobs": None, "finish_reason": job.finish_reason, "specsweep": stats(job, plan.settings)}
               for job in plan.jobs]
    return {"id": cid, "object": "chat.completion", "created": created, "model": model, "choices": choices,
            "usage": usage(plan)}


# ---- streams -----------------------------------------------------------------------------------------------------

async def stream(state, pending, cid: str, created: int, chat: bool):
    """The SSE stream of a completion (``chat`` False) or chat completion request (see the module docstring)."""
    plan, model = pending.plan, state.model_id
    kind = "chat.completion.chunk" if chat else "text_completion"
    none = {"usage": None} if plan.include_usage else {}

    def chunk(index: int, text: str | None, finish_reason=None, extra: dict = none, **choice) -> str:
        """A chunk of one choice: its new text (a chat delta: None, no content; "role": the assistant's role)."""
        if chat:
            choice["delta"] = {} if text is None else {"role": "assistant", "content": ""} if text == "role" \
                else {"content": text}
        else:
            choice["text"] = text or ""
        return _event({"id": cid, "object": kind, "created": created, "model": model,
                       "choices": [{"index": index, "logprobs": None, "finish_reason": finish_reason, **choice}],
                       **extra})

    for job in plan.jobs:
        if chat or plan.echo:
            yield chunk(job.index, "role" if chat else _echo(plan, job))
    async for what, job, text, since in _choice_texts(state, pending):
        if what == "text":
            yield chunk(job.index, text, specsweep=since)
        elif what == "finish":
            if chat and text:
                yield chunk(job.index, text)
            last = {"usage": usage(plan)} if since and not plan.include_usage else none
            yield chunk(job.index, None if chat else text, job.finish_reason, last,
                        specsweep=stats(job, plan.settings))
        else:
            yield text
            return
    if plan.include_usage:
        yield _event({"id": cid, "object": kind, "created": created, "model": model, "choices": [],
                      "usage": usage(plan)})
    yield "data: [DONE]\n\n"


async def _choice_texts(state, pending):
    """Each choice's new text as its tokens come: ("text", job, the new text, {token_ids, origins} since the last
    text), ("finish", job, the rest of its text, whether it is the request's last choice to end), or ("error",
    None, an SSE error event, None) past the timeout or when decoding failed. The jobs are cancelled when the client
    goes away (Starlette then closes this generator) or the stream ends early."""
    decoder = state.decoder
    shown = {job.index: "" for job in pending.jobs}
    sent = dict.fromkeys(shown, 0)
    upto = dict.fromkeys(shown, 0)  # the job's tokens as of its latest event (the worker may be further on)
    jobs = {job.index: job for job in pending.jobs}
    left = len(jobs)
    try:
        while left:
            try:
                index, kind, payload = await state.next_event(pending)
            except ApiError as e:
                yield "error", None, _event(error_body(e)), None
                return
            job = jobs[index]
            if kind == "tokens":
                upto[index] += len(payload)   # one chunk per decoding step, however far the worker has got
                tokens = list(job.tokens[:upto[index]])
                text = stops.shown(decoder.text(tokens), job.stop, final=False)
                if text.startswith(shown[index]) and len(text) > len(shown[index]) and not text.endswith("\ufffd"):
                    delta, shown[index] = text[len(shown[index]):], text
                    yield "text", job, delta, {"token_ids": tokens[sent[index]:],
                                               "origins": encode_origins(job.origins[sent[index]: len(tokens)])}
                    sent[index] = len(tokens)
            elif kind == "done":
                left -= 1
                text = text_of(job, decoder)
                yield "finish", job, text[len(shown[index]):] if text.startswith(shown[index]) else "", left == 0
            else:
                yield "error", None, _event(error_body(ApiError(500, f"decoding failed: {payload}"))), None
                return
    finally:
        pending.cancel("disconnect")  # no effect on jobs that have ended


def _echo(plan: Plan, job: Job) -> str:
    return plan.prompt_texts[job.index // plan.n] if plan.echo else ""


def _event(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"


def _since(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else end - start
