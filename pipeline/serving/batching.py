"""The request queue and the dynamic batcher of ``specsweep serve``.

A request becomes one :class:`Job` per choice (per prompt and per sample of ``n``), queued together, all or none,
in the :class:`Batcher`'s queue (at most ``max_queue`` jobs: a full queue refuses them with :class:`QueueFull`,
which the app answers with 503 and Retry-After). One worker thread takes the oldest job and, in queue order, every
waiting job that may share its batch (the same group: the same engine, i.e. temperature, drafter and γ; and a batch
that still fits the target's positions), up to ``max_batch``; it waits at most
``max_wait_s`` for the batch to fill, then hands the batch to ``decode`` (pipeline/serving/decoder.py). Jobs
that arrive while a batch decodes join the next batch. A job cancelled while it waits (its client went away or
timed out) is dropped from the queue; one cancelled while it decodes is dropped at the next verify step.

``close()`` stops taking new jobs and lets the worker finish every job already taken (queued or decoding): the
server's graceful shutdown.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("specsweep.serve")


class QueueFull(Exception):
    """The queue holds ``max_queue`` jobs; ``retry_after``: seconds after which a retry may find room."""

    def __init__(self, depth: int, retry_after: int) -> None:
        super().__init__(f"the request queue is full ({depth} waiting)")
        self.retry_after = retry_after


class Closed(Exception):
    """The batcher is shutting down and takes no new jobs."""


@dataclass(eq=False)
class Job:
    """One sequence to decode (a request has one per choice: per prompt and per sample of ``n``), and what decoding
    it has produced so far.

    What to decode: prompt_ids (the prompt's token ids as the engine gets them), max_tokens, temperature, seed (its
    own generator's: pipeline/serving/decoder.py), group (jobs with equal groups may share a batch: the engine's key,
    pipeline/serving/decoder.py ``Decoder.key``), stream (whether the client reads tokens as they come), stop (strings
    that end the text: the decoder cuts the tokens after the first one and ends the row) and index (the choice it
    answers). ``notify(kind, payload)`` is called from the worker thread: ("tokens", list[int]) as tokens come
    (streaming jobs only), then once ("done", None) or ("error", message).

    Filled while decoding (times are time.perf_counter()): tokens and their origins (pipeline/origins.py codes:
    accepted draft, corrected, bonus, target alone), the row's accepted and drafted tokens and verify steps (and
    draft_steps: (accepted, proposed) per verify step, which the server's counters take when the job ends), when
    its batch started, its first token and its end, why it ended (finish_reason: "stop" at EOS or a stop string,
    "length" at max_tokens, "cancelled", "error"), and its batch's size.
    """

    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    seed: int
    group: object
    notify: Callable[[str, object], None] = lambda kind, payload: None
    stream: bool = False
    stop: tuple[str, ...] = ()
    index: int = 0
    enqueued: float = field(default_factory=time.perf_counter)
    cancelled: str | None = None
    tokens: list[int] = field(default_factory=list)
    origins: list[int] = field(default_factory=list)
    accepted: int = 0
    drafted: int = 0
    steps: int = 0
    draft_steps: list[tuple[int, int]] = field(default_factory=list)
    started: float | None = None
    first_token: float | None = None
    ended: float | None = None
    finish_reason: str | None = None
    batch_size: int = 0

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    def cancel(self, reason: str) -> None:
        """Ask for this job to stop (any thread): the batcher drops it from the queue, or the decoder cancels its
        row at the next verify step. No effect once it has ended."""
        if self.finish_reason is None and self.cancelled is None:
            self.cancelled = reason

    def finish(self, reason: str, error: str | None = None) -> None:
        """Record the end (worker thread) and notify the waiting handler, once."""
        if self.finish_reason is not None:
            return
        self.finish_reason, self.ended = reason, time.perf_counter()
        self.notify("error", error) if reason == "error" else self.notify("done", None)


class Batcher:
    """The queue and its worker thread.

    decode      decode(batch: list[Job]) -> None: decodes a batch and finishes every job of it (worker thread)
    fits        fits(batch, job) -> bool: whether ``job`` may join ``batch`` (its group is already checked)
    on_start    called first in the worker thread (e.g. to set torch's threads there)
    """

    def __init__(self, decode: Callable[[list[Job]], None], *, max_batch: int, max_wait_s: float, max_queue: int,
                 fits: Callable[[list[Job], Job], bool] | None = None,
                 on_start: Callable[[], None] | None = None) -> None:
        if max_batch < 1 or max_queue < 1 or not max_wait_s >= 0:
            raise ValueError("max_batch and max_queue must be >= 1 and max_wait_s >= 0")
        self.decode, self.fits, self.on_start = decode, fits, on_start
        self.max_batch, self.max_wait_s, self.max_queue = max_batch, max_wait_s, max_queue
        self._cond = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._decoding: list[Job] = []
        self._closed = False
        self._last_batch_s = 1.0
        self._thread: threading.Thread | None = None

    # ---- the app's side ------------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="specsweep-batcher", daemon=True)
        self._thread.start()

    def submit(self, jobs: list[Job]) -> None:
        """Queue ``jobs`` (a request's choices), all or none: QueueFull when the queue has no room for all of them,
        Closed while shutting down."""
        with self._cond:
            if self._closed:
                raise Closed()
            self._drop_cancelled()
            if len(self._waiting) + len(jobs) > self.max_queue:
                batches = math.ceil((len(self._waiting) + len(jobs)) / self.max_batch)
                raise QueueFull(len(self._waiting), max(1, math.ceil(batches * self._last_batch_s)))
            self._waiting.extend(jobs)
            self._cond.notify_all()

    def close(self, timeout: float | None = None) -> bool:
        """Take no new jobs; let the worker finish those it has (queued and decoding), then stop it. Returns
        whether the worker stopped within ``timeout`` seconds (None: wait as long as it takes)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def depth(self) -> int:
        """Jobs waiting for a batch."""
        return len(self._waiting)

    @property
    def in_flight(self) -> int:
        """Jobs of the batch being decoded that have not ended."""
        return sum(1 for j in list(self._decoding) if j.finish_reason is None)

    # ---- the worker ----------------------------------------------------------------------------------------------

    def _run(self) -> None:
        if self.on_start is not None:
            self.on_start()
        while (batch := self._next_batch()) is not None:
            t0 = time.perf_counter()
            try:
                self.decode(batch)
            except Exception as e:  # decode finishes its jobs itself; this is the last line of defence
                log.exception("decoding a batch failed")
                for job in batch:
                    job.finish("error", f"the server failed to decode this batch ({type(e).__name__})")
            finally:
                with self._cond:
                    self._decoding = []
            self._last_batch_s = time.perf_counter() - t0

    def _next_batch(self) -> list[Job] | None:
        """The next batch (oldest job first), or None once closed with nothing left."""
        with self._cond:
            while True:
                self._drop_cancelled()
                if self._waiting:
                    break
                if self._closed:
                    return None
                self._cond.wait()
            batch = [self._waiting.popleft()]
            deadline = time.monotonic() + self.max_wait_s
            while True:
                self._fill(batch)
                left = deadline - time.monotonic()
                if len(batch) >= self.max_batch or left <= 0 or self._closed:
                    break
                self._cond.wait(left)
            self._decoding = batch
            return batch

    def _fill(self, batch: list[Job]) -> None:
        """Move waiting jobs that may join ``batch`` into it, in queue order, up to max_batch."""
        for job in list(self._waiting):
            if len(batch) >= self.max_batch:
                return
            if not job.cancelled and job.group == batch[0].group and (self.fits is None or self.fits(batch, job)):
                self._waiting.remove(job)
                batch.append(job)

    def _drop_cancelled(self) -> None:
        for job in [j for j in self._waiting if j.cancelled]:
            self._waiting.remove(job)
            job.finish("cancelled")
