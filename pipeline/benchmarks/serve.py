"""`specsweep bench serve`: ``specsweep serve`` under load, with dynamic batching and one request at a time.

Two servers of the same model, drafter and settings (a draft model, or ``--drafter prompt-lookup`` / ``suffix``
without one), each a ``specsweep serve`` process on loopback (port 0), both up for the whole benchmark: dynamic
batching (``--max-batch``, default 16) and one request at a time (``--max-batch 1``). Against a server, in this
process, N concurrent clients (httpx, asyncio; N = 1, 4, 16) send a fixed number of ``POST /v1/completions``
requests between them (``chat``: ``POST /v1/chat/completions``, the prompt as the user's message, through the
model's chat template), each client sending its next request when its last one is answered. The prompts cycle
through the data file (a {"prompt"} line, or an {"article"} line + " Summary:" as the summarisation task builds it);
request i carries seed + i and the same max_tokens. Each concurrency level is
measured ``repeats`` times, the two servers interleaved (dynamic, one at a time, dynamic, ...), so a change of the
machine's load between repeats hits both alike; each run starts with a few untimed warm-up requests.

Per server and concurrency: requests sent, answered with 200 and a completion (ok), answered otherwise (failed),
never answered (lost: a connection error or the client's timeout), all summed over the repeats; latency p50/p99
over every ok request; throughput in requests/s and new tokens/s (a run's new tokens over its wall time), the
median over the repeats; and the mean batch size the server's /metrics recorded. Dynamic batching over one at a
time: per repeat, the ratio of the two servers' tokens/s, and the median over repeats. The goal: at least 2x at
concurrency 16, with no request lost or failed. Tokens/s is the fair measure: batched rows share a random stream,
so their lengths (where EOS ends them) differ from the one-at-a-time server's.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pipeline.benchmarks.block_gain import load_prompts
from pipeline.benchmarks.timing import format_table
from pipeline.env_info import provenance
from pipeline.errors import SpecsweepError
from pipeline.io import write_json_atomic

CONCURRENCY = (1, 4, 16)
ENDPOINTS = {False: "/v1/completions", True: "/v1/chat/completions"}
GOAL = 2.0
WARMUP_REQUESTS = 2
SERVERS = ("dynamic", "one_at_a_time")


def run(target: str, draft: str | None, data: str, *, sampler: str = "exact", gamma: int = 4,
        temperature: float = 1.0, max_tokens: int = 32, requests: int = 64, concurrency=CONCURRENCY, repeats: int = 3,
        max_batch: int = 16, max_wait_ms: float = 10.0, device: str = "cpu", threads: int | None = None,
        seed: int = 0, timeout: float = 120.0, drafter: str = "model", chat: bool = False,
        out: Path | None = None) -> dict:
    """Start both servers and measure every concurrency level; returns the results JSON (also written to
    ``out``). ``drafter`` other than "model" serves the target with that drafter and no draft model."""
    prompts = load_prompts(data)
    if not prompts:
        raise SpecsweepError(f"--data {data} holds no prompts")
    if drafter != "model":
        draft = None
    settings = {"target": target, "draft": draft, "drafter": drafter, "endpoint": ENDPOINTS[chat], "data": data,
                "prompts": len(prompts), "sampler": sampler,
                "gamma": gamma, "temperature": temperature, "max_tokens": max_tokens, "requests": requests,
                "concurrency": list(concurrency), "repeats": repeats, "max_batch": max_batch,
                "max_wait_ms": max_wait_ms, "device": device, "threads": threads, "seed": seed,
                "client_timeout_s": timeout,
                "clients": "httpx.AsyncClient in the benchmark process, one connection per client",
                "servers": "a `specsweep serve` process each, on 127.0.0.1, both up throughout"}
    model = ["--draft", draft] if drafter == "model" else ["--drafter", drafter]
    common = ["--target", target, *model, "--sampler", sampler, "--gamma", str(gamma),
              "--temperature", str(temperature), "--device", device, "--max-wait-ms", str(max_wait_ms),
              "--max-queue", str(max(64, 2 * max(concurrency))), "--request-timeout", str(timeout),
              "--max-tokens-limit", str(max_tokens), "--max-new-tokens", str(max_tokens)]
    if threads is not None:
        common += ["--threads", str(threads)]
    batches = {"dynamic": max_batch, "one_at_a_time": 1}
    results, ratios = [], []
    with _Server([*common, "--max-batch", str(max_batch)]) as dynamic, _Server([*common, "--max-batch", "1"]) as one:
        urls = {"dynamic": dynamic.url, "one_at_a_time": one.url}
        for c in concurrency:
            runs: dict[str, list[dict]] = {kind: [] for kind in SERVERS}
            for r in range(repeats):
                for kind in SERVERS:
                    runs[kind].append(asyncio.run(_level(urls[kind], prompts, concurrency=c, requests=requests,
                                                         max_tokens=max_tokens, seed=seed, timeout=timeout, chat=chat)))
                    print(f"  {kind} (max batch {batches[kind]}), concurrency {c}, repeat {r + 1}/{repeats}: "
                          f"{runs[kind][-1]['ok']}/{requests} ok, {runs[kind][-1]['tokens_per_second']:.1f} tok/s",
                          file=sys.stderr)
            results += [_summary(kind, batches[kind], c, runs[kind]) for kind in SERVERS]
            per_repeat = [d["tokens_per_second"] / o["tokens_per_second"] if o["tokens_per_second"] else None
                          for d, o in zip(runs["dynamic"], runs["one_at_a_time"])]
            known = [x for x in per_repeat if x is not None]
            ratios.append({"concurrency": c, "per_repeat": per_repeat,
                           "median": statistics.median(known) if known else None})
    result = {"benchmark": "serve", "provenance": provenance(device), "settings": settings, "results": results,
              "dynamic_over_one_at_a_time": ratios, "goals": _goals(results, ratios, max(concurrency))}
    if out is not None:
        write_json_atomic(out, result)
    return result


def _summary(kind: str, max_batch: int, concurrency: int, runs: list[dict]) -> dict:
    """One server's row at one concurrency from its repeats: counts summed, latencies pooled, throughput medians."""
    latencies = sorted(x for r in runs for x in r["latencies"])
    requests, batches = sum(r["batch_requests"] for r in runs), sum(r["batches"] for r in runs)
    return {"server": kind, "max_batch": max_batch, "concurrency": concurrency, "repeats": len(runs),
            **{k: sum(r[k] for r in runs) for k in ("sent", "answered", "ok", "failed", "lost", "new_tokens")},
            "statuses": sorted({s for r in runs for s in r["statuses"]}),
            "errors": sorted({e for r in runs for e in r["errors"]}),
            "latency_p50_s": _percentile(latencies, 50), "latency_p99_s": _percentile(latencies, 99),
            "latency_mean_s": statistics.fmean(latencies) if latencies else None,
            "tokens_per_second": statistics.median(r["tokens_per_second"] for r in runs),
            "requests_per_second": statistics.median(r["requests_per_second"] for r in runs),
            "tokens_per_second_per_repeat": [r["tokens_per_second"] for r in runs],
            "wall_s_per_repeat": [r["wall_s"] for r in runs],
            "mean_batch_size": requests / batches if batches else None, "batches": batches,
            "loadavg_per_repeat": [r["loadavg"] for r in runs]}


def _goals(results: list[dict], ratios: list[dict], c: int) -> dict:
    ratio = next((r["median"] for r in ratios if r["concurrency"] == c), None)
    lost, failed = sum(r["lost"] for r in results), sum(r["failed"] for r in results)
    return {"concurrency": c, "dynamic_over_one_at_a_time_tokens_per_second": ratio, "goal": GOAL,
            "met": ratio is not None and ratio >= GOAL and lost == 0 and failed == 0,
            "requests_sent": sum(r["sent"] for r in results), "requests_lost": lost, "requests_failed": failed}


async def _level(url: str, prompts: list[str], *, concurrency: int, requests: int, max_tokens: int, seed: int,
                 timeout: float, chat: bool = False) -> dict:
    """``requests`` requests by ``concurrency`` clients against the server at ``url`` -> the run's counts,
    latencies and throughput."""
    import httpx

    endpoint = ENDPOINTS[chat]

    def body(i: int) -> dict:
        prompt = prompts[i % len(prompts)]
        content = {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
        return {**content, "max_tokens": max_tokens, "seed": seed + i}

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        for i in range(WARMUP_REQUESTS):
            await client.post(endpoint, json=body(i))
        before = await _batch_counts(client)
        queue = list(range(requests))
        outcomes: list[dict] = []

        async def worker() -> None:
            while queue:
                i = queue.pop(0)
                t0 = time.perf_counter()
                try:
                    r = await client.post(endpoint, json=body(i))
                except httpx.HTTPError as e:
                    outcomes.append({"answered": False, "error": type(e).__name__})
                    continue
                seconds = time.perf_counter() - t0
                tokens = _completion_tokens(r)
                outcomes.append({"answered": True, "ok": r.status_code == 200 and tokens is not None,
                                 "status": r.status_code, "seconds": seconds, "tokens": tokens or 0})

        load = os.getloadavg()[0]
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
        after = await _batch_counts(client)
    ok = [o for o in outcomes if o.get("ok")]
    tokens = sum(o["tokens"] for o in ok)
    answered = sum(o["answered"] for o in outcomes)
    return {"sent": requests, "answered": answered, "ok": len(ok),
            "failed": sum(o["answered"] and not o["ok"] for o in outcomes), "lost": requests - answered,
            "statuses": sorted({o["status"] for o in outcomes if o["answered"]}),
            "errors": sorted({o["error"] for o in outcomes if not o["answered"]}),
            "latencies": [o["seconds"] for o in ok], "wall_s": wall, "new_tokens": tokens,
            "tokens_per_second": tokens / wall, "requests_per_second": len(ok) / wall,
            "batch_requests": after[0] - before[0], "batches": after[1] - before[1],
            "loadavg": [load, os.getloadavg()[0]]}


def _completion_tokens(r) -> int | None:
    """usage.completion_tokens of a completion or chat completion answer; None unless it is one with at least one
    new token."""
    try:
        body = r.json()
        n = body["usage"]["completion_tokens"]
        choice = body["choices"][0]
        text = choice["message"]["content"] if "message" in choice else choice["text"]
        return n if isinstance(text, str) and n >= 1 else None
    except (ValueError, KeyError, IndexError, TypeError):
        return None


async def _batch_counts(client) -> tuple[float, float]:
    """(sum, count) of the server's specsweep_batch_size histogram: requests and batches decoded so far."""
    from prometheus_client.parser import text_string_to_metric_families

    text = (await client.get("/metrics")).text
    found = {s.name: s.value for family in text_string_to_metric_families(text) if family.name ==
             "specsweep_batch_size" for s in family.samples}
    return found.get("specsweep_batch_size_sum", 0.0), found.get("specsweep_batch_size_count", 0.0)


def _percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile of sorted ``values`` (linear interpolation, numpy's default); None when empty."""
    if not values:
        return None
    k = (len(values) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


class _Server:
    """A ``specsweep serve`` process on 127.0.0.1, port 0: started on enter (ready when /health answers), shut
    down with SIGTERM on exit. Its log goes to a temporary file, shown when it fails to start."""

    def __init__(self, flags: list[str], start_timeout: float = 180.0) -> None:
        self.flags, self.start_timeout = flags, start_timeout
        self.url = ""

    def __enter__(self) -> _Server:
        import httpx

        self.log = tempfile.NamedTemporaryFile("w+", prefix="specsweep-serve-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "pipeline", "serve", *self.flags, "--host", "127.0.0.1", "--port", "0",
               "--log-level", "warning"]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=os.environ.copy())
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            text = Path(self.log.name).read_text(encoding="utf-8", errors="replace")
            if "listening on " in text and not self.url:
                self.url = text.split("listening on ", 1)[1].split()[0]
            if self.url:
                try:
                    if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
            time.sleep(0.2)
        tail = self._tail()
        self.__exit__()
        raise SpecsweepError(f"`{' '.join(cmd)}` did not start: {tail}")

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)

    def _tail(self) -> str:
        lines = Path(self.log.name).read_text(encoding="utf-8", errors="replace").strip().splitlines()
        return " | ".join(lines[-3:]) or "no output"


def print_table(result: dict) -> None:
    def ms(v):
        return "-" if v is None else f"{1e3 * v:.0f}"

    rows = [{"server": r["server"], "max batch": r["max_batch"], "clients": r["concurrency"],
             "ok/sent": f"{r['ok']}/{r['sent']}", "failed": r["failed"], "lost": r["lost"],
             "p50 ms": ms(r["latency_p50_s"]), "p99 ms": ms(r["latency_p99_s"]),
             "req/s": f"{r['requests_per_second']:.2f}", "tok/s": f"{r['tokens_per_second']:.1f}",
             "mean batch": "-" if r["mean_batch_size"] is None else f"{r['mean_batch_size']:.1f}"}
            for r in result["results"]]
    print(format_table(rows, list(rows[0])))
    for r in result["dynamic_over_one_at_a_time"]:
        each = ", ".join("-" if x is None else f"{x:.2f}" for x in r["per_repeat"])
        median = "-" if r["median"] is None else f"{r['median']:.2f}x"
        print(f"dynamic over one at a time, tokens/s, concurrency {r['concurrency']}: {median} (median; repeats "
              f"{each})")
    g = result["goals"]
    ratio = g["dynamic_over_one_at_a_time_tokens_per_second"]
    print(f"goal: >= {g['goal']:g}x at concurrency {g['concurrency']} with no request lost or failed: "
          f"{'met' if g['met'] else 'NOT met'} ({'-' if ratio is None else f'{ratio:.2f}x'}; "
          f"{g['requests_lost']} of {g['requests_sent']} request(s) lost, {g['requests_failed']} failed)")
