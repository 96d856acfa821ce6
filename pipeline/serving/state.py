"""One server's state: the decoder, the admission checks, the batcher and the metrics, and a request's way through
them: its plan's jobs queued together (:meth:`ServerState.submit`), then their events awaited on the event loop
(:meth:`ServerState.next_event`) with the request timeout and the client's disconnect watched.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from pipeline.serving.admission import Admission, Plan
from pipeline.serving.batching import Batcher, Closed, Job, QueueFull
from pipeline.serving.decoder import Decoder
from pipeline.serving.errors import ApiError, ClientGone
from pipeline.serving.metrics import ServerMetrics
from pipeline.serving.settings import Served


@dataclass
class Pending:
    """A request's plan in the batcher, and the queue its jobs' events arrive on: (choice index, kind, payload)."""

    plan: Plan
    events: asyncio.Queue
    enqueued: float

    @property
    def jobs(self) -> list[Job]:
        return self.plan.jobs

    def cancel(self, reason: str) -> None:
        for job in self.jobs:
            job.cancel(reason)   # no effect on a job that has ended


class ServerState:
    """The decoder, the admission checks, the batcher, the metrics and the limits of one app."""

    def __init__(self, decoder: Decoder, served: Served | None, *, max_batch: int, max_wait_ms: float,
                 max_queue: int, request_timeout: float, max_tokens_limit: int, seed: int | None) -> None:
        self.decoder, self.served = decoder, served
        self.request_timeout = request_timeout
        self.model_id = decoder.config.target
        self.started = int(time.time())
        self.admission = Admission(decoder, max_tokens_limit=max_tokens_limit, max_choices=max_queue, seed=seed)
        self.batcher = Batcher(self._decode, max_batch=max_batch, max_wait_s=max_wait_ms / 1e3, max_queue=max_queue,
                               fits=decoder.fits, on_start=lambda: decoder.threads().apply())
        self.metrics = ServerMetrics(decoder.gamma_ceiling, self.batcher, self.model_id)
        self.limits = {"max_batch": max_batch, "max_wait_ms": max_wait_ms, "max_queue": max_queue,
                       "request_timeout_s": request_timeout, "max_tokens_limit": max_tokens_limit,
                       "max_choices": max_queue, "default_max_tokens": decoder.config.max_new_tokens,
                       "positions": decoder.positions}

    def _decode(self, jobs: list[Job]) -> None:
        self.metrics.record_batch(self.decoder.decode(jobs))

    def check_open(self) -> None:
        if self.batcher.closed:
            raise ApiError(503, "the server is shutting down: retry against another instance", retry_after=5)

    def submit(self, plan: Plan, loop: asyncio.AbstractEventLoop) -> Pending:
        """Queue the plan's jobs, all or none (503 when the queue has no room or the server shuts down)."""
        events: asyncio.Queue = asyncio.Queue()
        for job in plan.jobs:
            job.notify = self._notifier(job, events, loop)
        try:
            self.batcher.submit(plan.jobs)
        except QueueFull as e:
            raise ApiError(503, f"{e}: retry in {e.retry_after} s", retry_after=e.retry_after) from None
        except Closed:
            raise ApiError(503, "the server is shutting down: retry against another instance", retry_after=5) from None
        return Pending(plan, events, min(j.enqueued for j in plan.jobs))

    def _notifier(self, job: Job, events: asyncio.Queue, loop: asyncio.AbstractEventLoop):
        """The job's notify: events to the handler's queue on the event loop (from the worker thread); the job's
        metrics once it has ended."""

        def notify(kind: str, payload) -> None:
            if kind != "tokens":
                self.metrics.record_job(job)
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits for this job any more
                loop.call_soon_threadsafe(events.put_nowait, (job.index, kind, payload))

        return notify

    async def next_event(self, pending: Pending, request=None) -> tuple[int, str, object]:
        """The next event of the request's jobs; cancels them and raises ApiError 504 past the request timeout, and
        (with ``request``, for answers that are not streamed) cancels them and raises ClientGone when the client
        left."""
        while True:
            left = pending.enqueued + self.request_timeout - time.perf_counter()
            if left <= 0:
                pending.cancel("timeout")
                raise ApiError(504, f"the request took longer than the server's request timeout "
                                    f"({self.request_timeout:g} s): ask for fewer tokens or retry later")
            try:
                return await asyncio.wait_for(pending.events.get(), min(left, 0.25))
            except asyncio.TimeoutError:
                if request is not None and await request.is_disconnected():
                    pending.cancel("disconnect")
                    raise ClientGone() from None

    async def wait(self, pending: Pending, request) -> list[Job]:
        """Wait until every job of the request has ended; ApiError 500 with the decoder's message if decoding
        failed. The jobs are cancelled if the handler is left early."""
        left = len(pending.jobs)
        try:
            while left:
                _, kind, payload = await self.next_event(pending, request)
                if kind == "error":
                    raise ApiError(500, f"decoding failed: {payload}")
                if kind == "done":
                    left -= 1
        finally:
            pending.cancel("disconnect")
        return pending.jobs
