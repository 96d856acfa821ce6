"""The Prometheus metrics of ``specsweep serve`` (GET /metrics, the text exposition format of prometheus_client).

Per request (updated when a request ends):
  specsweep_requests_total{endpoint, status}         requests answered, by HTTP status (503: queue full or
                                                     shutting down; 504: timed out)
  specsweep_request_latency_seconds{endpoint}        histogram: arrival to the response's end (a stream's last
                                                     event)
  specsweep_queue_wait_seconds                       histogram: arrival to the start of the request's batch
  specsweep_time_to_first_token_seconds              histogram: arrival to the request's first new token
  specsweep_prompt_tokens_total, specsweep_generated_tokens_total
  specsweep_draft_tokens_total, specsweep_accepted_draft_tokens_total and the acceptance and vLLM counters below
                                                     count the request's verify steps before its answer is
                                                     released: a client that has its answer finds them here
  specsweep_cancelled_requests_total{reason}         decoding stopped early: disconnect, timeout
Per batch:
  specsweep_batch_size                               histogram: requests decoded together
  specsweep_batch_seconds                            histogram: the engine's seconds per batch
  specsweep_verify_steps_total
Live (read when scraped):
  specsweep_queue_depth                              requests waiting for a batch
  specsweep_requests_in_flight                       requests of the batch being decoded
  specsweep_tokens_per_second                        tokens of the requests that ended in the last
                                                     ``window_s`` seconds, per second
  specsweep_acceptance_rate                          accepted / drafted draft tokens since the start
  specsweep_accepted_per_step                        histogram over full-γ verify steps (one per row) of the
                                                     draft tokens accepted, le = 0..γ
  specsweep_position_acceptance_rate{position}       P(draft position i accepted | proposed and every position
                                                     before it accepted), over every row-step
vLLM's speculative-decoding counters, under vLLM's names and labels (model_name: the served model's id, engine:
"0"), so that dashboards made for vLLM read them (vllm/v1/spec_decode/metrics.py); a row-step is one row in one
verify step:
  vllm:spec_decode_num_drafts_total                  row-steps that proposed at least one draft token
  vllm:spec_decode_num_draft_tokens_total            draft tokens proposed
  vllm:spec_decode_num_accepted_tokens_total         draft tokens accepted
  vllm:spec_decode_num_accepted_tokens_per_pos_total{position}   draft tokens accepted at position i (0..γ-1)
"""

from __future__ import annotations

import threading
import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from pipeline.serving.batching import Batcher, Job
from pipeline.serving.decoder import BatchReport, StepCounts

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128)


class ServerMetrics:
    """Every metric of one server, in its own registry (several apps in one process do not mix)."""

    def __init__(self, gamma: int, batcher: Batcher, model_name: str = "", window_s: float = 10.0) -> None:
        self.gamma, self.batcher, self.window_s, self.model_name = gamma, batcher, window_s, model_name
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
        self._counts = StepCounts(gamma)
        self._recent: deque[tuple[float, int]] = deque()   # (time a request ended, its new tokens)
        self._started = time.monotonic()
        r.register(_Live(self))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def record_batch(self, report: BatchReport) -> None:
        self.batch_size.observe(report.size)
        self.batch_seconds.observe(report.seconds)
        self.verify_steps.inc(report.verify_steps)

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
            for accepted, proposed in job.draft_steps:   # here, not per batch: before the job's answer goes out
                self._counts.add(accepted, proposed)

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

    def counts(self) -> StepCounts:
        """The draft statistics since the start (a copy)."""
        with self._lock:
            c = self._counts
            return StepCounts(c.positions, c.drafts, c.draft_tokens, c.accepted, list(c.per_position),
                              list(c.reached), list(c.full_steps))


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
        c = m.counts()
        yield CounterMetricFamily("specsweep_draft_tokens", "Draft tokens proposed", value=c.draft_tokens)
        yield CounterMetricFamily("specsweep_accepted_draft_tokens", "Draft tokens accepted", value=c.accepted)
        yield GaugeMetricFamily("specsweep_acceptance_rate", "Accepted / drafted draft tokens since the start "
                                "(NaN before the first draft)",
                                value=c.accepted / c.draft_tokens if c.draft_tokens else float("nan"))
        if m.gamma > 0:
            cumulative, buckets = 0, []
            for k, n in enumerate(c.full_steps):
                cumulative += n
                buckets.append((str(float(k)), cumulative))
            buckets.append(("+Inf", cumulative))
            yield HistogramMetricFamily("specsweep_accepted_per_step", "Draft tokens accepted per full-γ verify step "
                                        "(one observation per row and step)", buckets=buckets,
                                        sum_value=sum(k * n for k, n in enumerate(c.full_steps)))
            rates = GaugeMetricFamily("specsweep_position_acceptance_rate", "Rate at which draft position i is "
                                      "accepted once proposed and reached (NaN: never reached)", labels=["position"])
            for i, (accepted, reached) in enumerate(zip(c.per_position, c.reached)):
                rates.add_metric([str(i)], accepted / reached if reached else float("nan"))
            yield rates
        yield from _vllm(c, [m.model_name, "0"])


def _vllm(c: StepCounts, labels: list[str]):
    """vLLM's speculative-decoding counters (vllm/v1/spec_decode/metrics.py: SpecDecodingProm), labels model_name
    and engine."""
    names = ["model_name", "engine"]
    for name, help_text, value in (
            ("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", c.drafts),
            ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", c.draft_tokens),
            ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", c.accepted)):
        family = CounterMetricFamily(name, help_text, labels=names)
        family.add_metric(labels, value)
        yield family
    per_position = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                       "Accepted tokens per draft position.", labels=[*names, "position"])
    for i, n in enumerate(c.per_position):
        per_position.add_metric([*labels, str(i)], n)
    yield per_position
