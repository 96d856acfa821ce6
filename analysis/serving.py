"""The report's serving section: ``specsweep bench serve`` (results/bench/serve-*.json), the server under load.

:func:`load_serving` makes one row (``kind`` "serving") per (file, server, concurrency): requests sent, ok, failed
and lost, latency p50/p99, requests/s and tokens/s, the mean batch size, and dynamic batching's tokens/s over one
request at a time at that concurrency. :func:`section` is the report's table of them and the goal's verdict.
"""

from __future__ import annotations

from pathlib import Path

from .document import Heading, Para, Table
from .recommend import of_kind, to_number


def load_serving(files):
    """Rows from ``files``: (path, data, provenance columns) of each serve benchmark JSON (analysis/tables.py walks
    the folder and supplies them)."""
    import pandas as pd

    rows: list[dict] = []
    for path, data, where in files:
        settings = data.get("settings", {})
        ratios = {r.get("concurrency"): r.get("median") for r in data.get("dynamic_over_one_at_a_time", [])}
        goals = data.get("goals", {})
        for r in data.get("results", []):
            c = r.get("concurrency")
            rows.append({"run": f"{Path(path).stem}:{r.get('server')}:c{c}", "kind": "serving", "benchmark": "serve",
                         "pair": settings.get("target"), "sampler": settings.get("sampler"),
                         "gamma": settings.get("gamma"), "temperature": settings.get("temperature"),
                         "server": r.get("server"), "max_batch": r.get("max_batch"), "concurrency": c,
                         "repeats": r.get("repeats"), "sent": r.get("sent"), "ok": r.get("ok"),
                         "failed": r.get("failed"), "lost": r.get("lost"),
                         "latency_p50_s": r.get("latency_p50_s"), "latency_p99_s": r.get("latency_p99_s"),
                         "requests_per_second": r.get("requests_per_second"),
                         "tokens_per_second": r.get("tokens_per_second"), "mean_batch_size": r.get("mean_batch_size"),
                         "batching_gain": ratios.get(c), "goal_concurrency": goals.get("concurrency"),
                         "goal": goals.get("goal"), "goal_met": goals.get("met"), **where})
    return pd.DataFrame(rows)


def section(table) -> list:
    """The serving section: a row per (file, server, concurrency) and, per file, the goal's verdict."""
    blocks = [Heading(2, "Serving under load (`specsweep bench serve`)")]
    rows = of_kind(table, "serving")
    if rows.empty:
        return [*blocks, Para("The serving benchmark has not been run (no results/bench/serve-*.json): `specsweep "
                              "bench serve` writes it.")]

    def ms(v):
        v = to_number(v)
        return "-" if v is None else f"{1e3 * v:.0f}"

    def num(v, spec):
        v = to_number(v)
        return "-" if v is None else format(v, spec)

    out = [[Path(str(r["source"])).name, r.get("device_name"), r["pair"], r["server"], _int(r["max_batch"]),
            _int(r["concurrency"]), f"{_int(r['ok'])}/{_int(r['sent'])}", _int(r["failed"]), _int(r["lost"]),
            ms(r["latency_p50_s"]), ms(r["latency_p99_s"]), num(r["requests_per_second"], ".2f"),
            num(r["tokens_per_second"], ".1f"), num(r["mean_batch_size"], ".1f"),
            _gain(r)]
           for _, r in rows.sort_values(["source", "server", "concurrency"], kind="stable").iterrows()]
    blocks.append(Table(["file", "device", "pair", "server", "max batch", "clients", "ok/sent", "failed", "lost",
                         "p50 ms", "p99 ms", "req/s", "tok/s", "mean batch", "dynamic / one at a time"], out))
    for source, group in rows.groupby("source", sort=True):
        first = group.iloc[0]
        gain = to_number(group[group["concurrency"] == first["goal_concurrency"]]["batching_gain"].iloc[0]) \
            if (group["concurrency"] == first["goal_concurrency"]).any() else None
        verdict = "met" if bool(first["goal_met"]) else "not met"
        blocks.append(Para(f"**{Path(str(source)).name}**: dynamic batching gives "
                           f"{'-' if gain is None else f'{gain:.2f}x'} the tokens/s of one request at a time at "
                           f"{_int(first['goal_concurrency'])} clients (goal ≥ {num(first['goal'], 'g')}x with no "
                           f"request lost or failed: {verdict}); {_int(group['sent'].sum())} requests sent, "
                           f"{_int(group['lost'].sum())} lost, {_int(group['failed'].sum())} failed."))
    blocks.append(Para("Each server is a `specsweep serve` process on loopback; N clients send a fixed number of "
                       "completions, each sending its next when its last is answered; every level is repeated with "
                       "the two servers interleaved. Latency percentiles are over every answered request; "
                       "throughput is the median over the repeats; the ratio is the median of the per-repeat ratios "
                       "of tokens/s. Requests join the next batch (not a running one), and rows of one batch share "
                       "its random stream."))
    return blocks


def _gain(r) -> str:
    """Dynamic batching over one at a time, on the dynamic server's row."""
    gain = to_number(r["batching_gain"])
    return f"{gain:.2f}x" if gain is not None and r["server"] == "dynamic" else "-"


def _int(v):
    f = to_number(v)
    return None if f is None else int(f)
