"""One projection y = x @ W.T of a draft's shapes, bfloat16 F.linear against torch's int8 and int4 CPU kernels and
the int8-by-int8 product (pipeline/decoding/static/quant.py, ``--draft-quant``, ``+a8``): whether each pays, and at
how many rows.

    python -m pipeline.benchmarks.quant_linear [--shapes 896x896,128x896,4864x896,896x4864,32768x896]
        [--rows 1,2,3,4,5,16] [--threads 2] [--rounds 9] [--calls 15] [--out results/bench/quant-linear-cpu.json]

Shapes are N x K (out x in features; the defaults are Qwen2.5-Coder-0.5B's: q and o, k and v, gate and up, down,
and the head cut to 32768 tokens by --draft-vocab); rows M are the tokens times batch rows of one forward (a draft
step reads 1 or 2; a prompt's prefill hundreds: ``--rows 64,128,440``). W is random normal (timings do not depend
on the values), x too. The ways: bfloat16 F.linear; the int8 and int4 weight-only kernels; a8, the input quantised
per row and multiplied int8 by int8 with the int8 weight (``int8_product``, rescaling included). In each round every
(shape, M) is timed the four ways, in an order that rotates from round to round, each as the median of ``calls`` calls
after warm-up; a round's ratio (bfloat16's time over the kernel's) gives the speedup as the median over rounds with
its order-statistic interval (pipeline/measure.py). The kernels are timed alone (``kernel()``: no switch to the
dequantised weight past KERNEL_ROWS). Each row also gives the kernel's relative error against the float32 product
over the bfloat16 weight, ||y - y_ref|| / ||y_ref||, and bfloat16 F.linear's own for scale. Writes the table's rows,
the settings, the machine's load before and after and the provenance to ``--out``.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from pipeline.benchmarks.timing import format_table, time_calls
from pipeline.decoding.static.quant import Int4Linear, Int8Linear, int8_product
from pipeline.env_info import provenance
from pipeline.errors import OneLineParser
from pipeline.io import write_json_atomic
from pipeline.measure import median_ci

SHAPES = ((896, 896), (128, 896), (4864, 896), (896, 4864), (32768, 896))
WAYS = ("bfloat16", "int8", "int4", "a8")
FASTER = WAYS[1:]
"""The ways timed against bfloat16's F.linear."""


def run(shapes=SHAPES, rows=(1, 2, 3, 4, 5, 16), threads: int = 2, rounds: int = 9, calls: int = 15,
        out: Path | None = None) -> dict:
    """Time every (shape, rows) the four ways (see the module docstring); torch's thread count is put back
    afterwards. Returns the results dict (also written to ``out``)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            load = os.getloadavg()
            table = _measure(shapes, rows, rounds, calls)
    finally:
        torch.set_num_threads(previous)
    result = {"benchmark": "quant_linear", "provenance": provenance("cpu"),
              "settings": {"shapes": [list(s) for s in shapes], "rows": list(rows), "threads": threads,
                           "rounds": rounds, "calls": calls, "dtype": "bfloat16"},
              "load_average": {"before": list(load), "after": list(os.getloadavg())}, "results": table}
    if out is not None:
        write_json_atomic(out, result)
    return result


def _measure(shapes, rows, rounds: int, calls: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    cases = []
    for n, k in shapes:
        weight = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
        quantized = {"int8": Int8Linear(weight, None), "int4": Int4Linear(weight, None)}
        for m in rows:
            x = torch.randn(m, k, generator=g).to(torch.bfloat16)
            q8 = quantized["int8"]
            ways = {"bfloat16": lambda _, x=x, w=weight: F.linear(x, w),
                    **{name: lambda _, x=x, q=q: q.kernel(x) for name, q in quantized.items()},
                    "a8": lambda _, x=x, q8=q8: int8_product(x, q8.q, q8.scales)}
            reference = x.float() @ weight.float().T
            errors = {name: _relative_error(fn(0), reference) for name, fn in ways.items()}
            cases.append({"n": n, "k": k, "m": m, "ways": ways, "errors": errors,
                          "times": {name: [] for name in WAYS}})
    for r in range(rounds):
        for case in cases:
            order = WAYS[r % len(WAYS):] + WAYS[: r % len(WAYS)]
            for name in order:
                case["times"][name].append(statistics.median(time_calls(case["ways"][name], "cpu", calls, warmup=2)))
    table = []
    for case in cases:
        t = case["times"]
        row = {"shape": f"{case['n']}x{case['k']}", "rows": case["m"],
               **{f"{name}_us": statistics.median(t[name]) * 1e6 for name in WAYS}}
        for name in FASTER:
            ci = median_ci([a / b for a, b in zip(t["bfloat16"], t[name])])
            row[f"{name}_speedup"] = ci.median
            row[f"{name}_speedup_ci"] = [ci.low, ci.high]
            row["ci_coverage"] = ci.coverage
        row.update({f"{name}_error": case["errors"][name] for name in WAYS})
        row["rounds_us"] = {name: [v * 1e6 for v in t[name]] for name in WAYS}
        table.append(row)
    return table


def _relative_error(y: torch.Tensor, reference: torch.Tensor) -> float:
    return float((y.float() - reference).norm() / reference.norm())


def _print(result: dict) -> None:
    rows = [{"N x K": r["shape"], "M": r["rows"], "bf16 µs": f"{r['bfloat16_us']:.0f}",
             "int8 µs": f"{r['int8_us']:.0f}", "int4 µs": f"{r['int4_us']:.0f}",
             "int8 x": f"{r['int8_speedup']:.2f} [{r['int8_speedup_ci'][0]:.2f}, {r['int8_speedup_ci'][1]:.2f}]",
             "int4 x": f"{r['int4_speedup']:.2f} [{r['int4_speedup_ci'][0]:.2f}, {r['int4_speedup_ci'][1]:.2f}]",
             "a8 µs": f"{r['a8_us']:.0f}",
             "a8 x": f"{r['a8_speedup']:.2f} [{r['a8_speedup_ci'][0]:.2f}, {r['a8_speedup_ci'][1]:.2f}]",
             "err bf16/int8/int4/a8": f"{r['bfloat16_error']:.4f}/{r['int8_error']:.4f}/{r['int4_error']:.3f}/"
                                      f"{r['a8_error']:.4f}"}
            for r in result["results"]]
    print(format_table(rows, list(rows[0])))
    s = result["settings"]
    print(f"\nbfloat16 x on one CPU, {s['threads']} threads, median of {s['rounds']} rounds of {s['calls']} calls; "
          f"x: bfloat16's time over the kernel's (> 1: the kernel is faster), with its interval; load average "
          f"{result['load_average']['before'][0]:.2f} -> {result['load_average']['after'][0]:.2f}")


def main(argv: list[str] | None = None) -> None:
    p = OneLineParser(prog="python -m pipeline.benchmarks.quant_linear", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES), help="N x K, comma-separated")
    p.add_argument("--rows", default="1,2,3,4,5,16", help="rows M per call, comma-separated")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--calls", type=int, default=15)
    p.add_argument("--out", type=Path, default=Path("results/bench/quant-linear-cpu.json"))
    args = p.parse_args(argv)
    shapes = tuple(tuple(int(v) for v in s.split("x")) for s in args.shapes.split(","))
    rows = tuple(int(v) for v in args.rows.split(","))
    result = run(shapes, rows, args.threads, args.rounds, args.calls, args.out)
    _print(result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
