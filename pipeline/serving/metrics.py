"""The Prometheus metrics of ``specsweep serve`` (GET /metrics, the text exposition format of prometheus_client).

Per request (updated when a request ends):
  specsweep_requests_total{endpoint, status}         requests answered, by HTTP status (503: queue full or
                                                     shutting down; 504: timed out)
  specsweep_request_latency_seconds{endpoint}        histogram: arrival to the response's end (a stream's last
                                                     event)
  specsweep_queue_wait_seconds                       histogram: arrival to the start of the request's batch
  specsweep_time_to_first_token_seconds              histogram: arrival to the request's first new token
  specsweep_prompt_tokens_total, specsweep_generated_tokens_total
  specsweep_cancelled_requests_total{reason}         decoding stopped early: disconnect, timeout
Per batch:
  specsweep_batch_size                               histogram: requests decoded together
  specsweep_batch_seconds                            histogram: the engine's seconds per batch
  specsweep_verify_steps_total, specsweep_draft_tokens_total, specsweep_accepted_draft_tokens_total
Live (read when scraped):
  specsweep_queue_depth                              requests waiting for a batch
  specsweep_requests_in_flight                       requests of the batch being decoded
  specsweep_tokens_per_second                        tokens of the requests that ended in the last
                                                     ``window_s`` seconds, per second
  specsweep_acceptance_rate                          accepted / drafted draft tokens since the start
  specsweep_accepted_per_step                        histogram over full-γ verify steps (one per row) of the
                                                     draft tokens accepted, le = 0..γ
  specsweep_position_acceptance_rate{position}       P(draft position i accepted | reached), from that histogram
"""

from __future__ import annotations

import threading
import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from pipeline.objectives import position_acceptance
from pipeline.serving.batching import Batcher, Job
from pipeline.serving.decoder import BatchReport

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128)


class ServerMetrics:
    """Every metric of one server, in its own registry (several apps in one process do not mix)."""

    def __init__(self, gamma: int, batcher: Batcher, window_s: float = 10.0) -> None:
        self.gamma, self.batcher, self.window_s = gamma, batcher, window_s
        self.registry = r = CollectorRegistry()
        self.requests = Counter("specsweep_requests", "HTTP requests answered, by endpoint and status code",
                                ["endpoint", "status"], registry=r)
        self.latency = Histogram("specsweep_request_latency_seconds", "Seconds from a request's arrival to the end "
                                 "of its response", ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("specsweep_queue_wait_seconds", "Seconds a request waited for its batch to "
                                    "start", buckets=LATENCY_BUCKETS, registry=r)
        self.first_token = Histogram("specsweep_time_to_first_token_seconds", "Seconds from a request's arrival to "
                                     "its first new token", buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("specsweep_prompt_tokens", "Prompt tokens of decoded requests", registry=r)
        self.generated_tokens = Counter("specsweep_generated_tokens", "New tokens of decoded requests (returned, or "
                                        "decoded before a cancellation)", registry=r)
        self.cancelled = Counter("specsweep_cancelled_requests", "Requests whose decoding stopped early, by reason",
                                 ["reason"], registry=r)
        self.batch_size = Histogram("specsweep_batch_size", "Requests decoded together in one batch",
                                    buckets=BATCH_BUCKETS, registry=r)
        self.batch_seconds = Histogram("specsweep_batch_seconds", "Seconds the engine spent on one batch",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.verify_steps = Counter("specsweep_verify_steps", "Verify steps of the engine (one per batch step)",
                                    registry=r)
        self._lock = threading.Lock()
        self._drafted = self._accepted = 0
        self._hist = [0] * (gamma + 1)
        self._recent: deque[tuple[float, int]] = deque()   # (time a request ended, its new tokens)
        self._started = time.monotonic()
        r.register(_Live(self))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def record_batch(self, report: BatchReport) -> None:
        self.batch_size.observe(report.size)
        self.batch_seconds.observe(report.seconds)
        self.verify_steps.inc(report.verify_steps)
        with self._lock:
            self._drafted += report.drafted
            self._accepted += report.accepted
            for k, n in enumerate(report.accepted_histogram[: len(self._hist)]):
                self._hist[k] += n

    def record_job(self, job: Job) -> None:
        """A request that reached the engine's queue, once it has ended (done, cancelled, timed out, failed)."""
        if job.started is not None:
            self.queue_wait.observe(job.started - job.enqueued)
            self.prompt_tokens.inc(job.prompt_tokens)
        if job.first_token is not None:
            self.first_token.observe(job.first_token - job.enqueued)
        self.generated_tokens.inc(len(job.tokens))
        if job.cancelled:
            self.cancelled.labels(job.cancelled).inc()
        with self._lock:
            self._recent.append((time.monotonic(), len(job.tokens)))

    def record_response(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def tokens_per_second(self) -> float:
        now = time.monotonic()
        with self._lock:
            while self._recent and self._recent[0][0] < now - self.window_s:
                self._recent.popleft()
            tokens = sum(n for _, n in self._recent)
        return tokens / max(1e-9, min(self.window_s, now - self._started))

    def acceptance(self) -> tuple[int, int, list[int]]:
        """(accepted, drafted, accepted-count histogram [γ+1]) since the start."""
        with self._lock:
            return self._accepted, self._drafted, list(self._hist)


class _Live:
    """The metrics computed when scraped: queue, in-flight, throughput and acceptance."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.m = metrics

    def collect(self):
        m = self.m
        yield GaugeMetricFamily("specsweep_queue_depth", "Requests waiting for a batch", value=m.batcher.depth)
        yield GaugeMetricFamily("specsweep_requests_in_flight", "Requests of the batch being decoded",
                                value=m.batcher.in_flight)
        yield GaugeMetricFamily("specsweep_tokens_per_second", f"New tokens of the requests that ended in the last "
                                f"{m.window_s:g} s, per second", value=m.tokens_per_second())
        accepted, drafted, hist = m.acceptance()
        yield CounterMetricFamily("specsweep_draft_tokens", "Draft tokens proposed", value=drafted)
        yield CounterMetricFamily("specsweep_accepted_draft_tokens", "Draft tokens accepted", value=accepted)
        yield GaugeMetricFamily("specsweep_acceptance_rate", "Accepted / drafted draft tokens since the start "
                                "(NaN before the first draft)", value=accepted / drafted if drafted else float("nan"))
        if m.gamma > 0:
            cumulative, buckets = 0, []
            for k, n in enumerate(hist):
                cumulative += n
                buckets.append((str(float(k)), cumulative))
            buckets.append(("+Inf", cumulative))
            yield HistogramMetricFamily("specsweep_accepted_per_step", "Draft tokens accepted per full-γ verify step "
                                        "(one observation per row and step)", buckets=buckets,
                                        sum_value=sum(k * n for k, n in enumerate(hist)))
            rates = GaugeMetricFamily("specsweep_position_acceptance_rate", "Rate at which draft position i is "
                                      "accepted once reached (NaN: never reached)", labels=["position"])
            for i, rate in enumerate(position_acceptance(hist) or []):
                rates.add_metric([str(i)], float("nan") if rate is None else rate)
            yield rates
