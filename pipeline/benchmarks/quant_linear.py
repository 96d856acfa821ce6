"""One projection y = x @ W.T of a draft's shapes, bfloat16 (as the model stores it, and packed) against the int8 and
int4 weight-only kernels and the int8-by-int8 product (pipeline/decoding/static/quant.py, ``--draft-quant``, ``+a8``):
whether each pays, and at how many rows.

    python -m pipeline.benchmarks.quant_linear [--shapes 1152x896,896x896,9728x896,896x4864,151936x896,32768x896]
        [--rows 1,2,3,4,5,16] [--threads 2] [--rounds 9] [--calls 15] [--out results/bench/quant-linear-cpu.json]
    python -m pipeline.benchmarks.quant_linear --model qwen2.5-coder-0.5b-instruct [--context 450 --new-tokens 1,2]

With ``--model``: the model's whole static forward (a draft step: every projection, the head, attention, norms)
in bfloat16 over packed weights, in int4 with torch's kernel, in int4 with ours operator by operator
(``int4_linear``: llama.py's forward) and in int4 with ours in one call per forward (``int4_layers``: a one-token
forward through pipeline/decoding/static/int4_row.py, kernels/int4_layers.cpp; over 2 tokens it is int4_linear's
forward), appending 1 or 2 tokens after ``--context`` cached ones, in rotating rounds (cpu.turned_off builds the
first int4 forward with torch's); each pair of ways gives the slower one's time over the faster one's per round, with
its interval. Writes results/bench/quant-forward-<model>-cpu.json.

Shapes are N x K (out x in features; the defaults are what Qwen2.5-Coder-0.5B's static forward multiplies: q, k and v
stacked, o, gate and up stacked, down, the whole head and the head cut to 32768 tokens by --draft-vocab); rows M are the
tokens times batch rows of one forward (a draft step reads 1 or 2; a prompt's prefill hundreds: ``--rows 64,128,440``).
W is random normal (timings do not depend on the values), x too. The ways (``--ways``: which of them): bfloat16 F.linear
over W as stored; ``packed``, the same product from oneDNN's packed copy (pipeline/decoding/static/packed.py: what the
target and a quantised draft's prefill multiply past 9 rows); ``bf16_linear``, ours from its own packed copy
(kernels/bf16_linear.cpp: what packed.py multiplies over up to 9 rows, where it runs); torch's int8 and int4
weight-only kernels; ``int4_linear``, our int4 kernel (kernels/int4_linear.cpp; up to 4 rows, where it runs); a8, the
input quantised per row and multiplied int8 by int8 with the int8 weight (``int8_product``, rescaling included);
``dequantised``, the int8 weight dequantised for the call and F.linear over it (what a projection that keeps no dense
copy, a quantised target's, ``--target-quant``, could run instead of its kernel over many rows; int4's would add its
unpacking to the same F.linear).
In each round every (shape, M) is timed every way, in an order that rotates from round to round, each as the median of
``calls`` calls after warm-up; a round's ratio (bfloat16's time over the way's) gives the speedup as the median over
rounds with its order-statistic interval (pipeline/measure.py), and ``int4_linear_over_int4`` is torch's int4 time
over ours the same way, ``bf16_linear_over_packed`` oneDNN's packed time over bf16_linear's. The kernels are timed
alone (``kernel()``: no switch to the dequantised weight past KERNEL_ROWS). Each row also gives each way's relative
error against the float32 product over the bfloat16 weight, ||y - y_ref|| / ||y_ref||. Writes the table's rows, the
settings, the machine's load before and after and the provenance to ``--out``.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from pipeline.benchmarks.timing import format_table, time_calls
from pipeline.decoding.static.packed import PackedLinear, available
from pipeline.decoding.static.quant import Int4Linear, Int8Linear, int8_product
from pipeline.env_info import provenance
from pipeline.errors import OneLineParser
from pipeline.io import write_json_atomic
from pipeline.kernels import cpu
from pipeline.measure import median_ci

SHAPES = ((1152, 896), (896, 896), (9728, 896), (896, 4864), (151936, 896), (32768, 896))
WAYS = ("bfloat16", "packed", "bf16_linear", "int8", "int4", "int4_linear", "a8", "dequantised")
FASTER = WAYS[1:]
"""The ways timed against bfloat16's F.linear (a way that cannot run here, or at a row count, is left out of a row)."""


def run(shapes=SHAPES, rows=(1, 2, 3, 4, 5, 16), threads: int = 2, rounds: int = 9, calls: int = 15,
        out: Path | None = None, ways: tuple[str, ...] = WAYS) -> dict:
    """Time every (shape, rows) each of ``ways`` (bfloat16, the reference, always; see the module docstring); torch's
    thread count is put back afterwards. Returns the results dict (also written to ``out``)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            load = os.getloadavg()
            table = _measure(shapes, rows, rounds, calls, ways)
    finally:
        torch.set_num_threads(previous)
    result = {"benchmark": "quant_linear", "provenance": provenance("cpu"),
              "settings": {"shapes": [list(s) for s in shapes], "rows": list(rows), "threads": threads,
                           "rounds": rounds, "calls": calls, "dtype": "bfloat16", "ways": ["bfloat16", *ways]},
              "load_average": {"before": list(load), "after": list(os.getloadavg())}, "results": table}
    if out is not None:
        write_json_atomic(out, result)
    return result


def _ways(weight: torch.Tensor, x: torch.Tensor, quantized: dict) -> dict:
    """name -> fn(_) for every way that runs here at x's rows (of those ``quantized`` holds a weight for, and
    bfloat16 and packed)."""
    ways = {"bfloat16": lambda _: F.linear(x, weight)}
    if available(weight.device, weight.dtype):
        with cpu.turned_off():                      # oneDNN's packed product over every number of rows
            packed = PackedLinear([weight], [None])
        ways["packed"] = lambda _: packed(x)
    if "bf16_linear" in quantized and x.shape[0] <= cpu.BF16_ROWS:
        ways["bf16_linear"] = lambda _: cpu.bf16_linear(x, quantized["bf16_linear"])
    for name in ("int8", "int4"):
        if name in quantized:
            ways[name] = lambda _, q=quantized[name]: q.kernel(x)
    if "int4_linear" in quantized and x.shape[0] <= cpu.MAX_ROWS:
        ways["int4_linear"] = lambda _: quantized["int4_linear"].kernel(x)
    if "int8" in quantized:
        ways["a8"] = lambda _, q8=quantized["int8"]: int8_product(x, q8.q, q8.scales)
        ways["dequantised"] = lambda _, q8=quantized["int8"]: F.linear(x, q8.q.to(x.dtype) * q8.scales[:, None])
    return ways


def _measure(shapes, rows, rounds: int, calls: int, wanted: tuple[str, ...] = WAYS) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    cases = []
    for n, k in shapes:
        weight = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
        quantized = {}
        if {"int8", "a8", "dequantised"} & set(wanted):
            quantized["int8"] = Int8Linear(weight, None)
        if "int4" in wanted:
            quantized["int4"] = Int4Linear(weight, None, ours=False)
        if cpu.available() and "int4_linear" in wanted:
            quantized["int4_linear"] = Int4Linear(weight, None, ours=True)
        if cpu.available() and "bf16_linear" in wanted:
            quantized["bf16_linear"] = cpu.pack_bf16(weight)
        for m in rows:
            x = torch.randn(m, k, generator=g).to(torch.bfloat16)
            ways = {name: fn for name, fn in _ways(weight, x, quantized).items()
                    if name == "bfloat16" or name in wanted}
            reference = x.float() @ weight.float().T
            errors = {name: _relative_error(fn(0), reference) for name, fn in ways.items()}
            cases.append({"n": n, "k": k, "m": m, "ways": ways, "errors": errors,
                          "times": {name: [] for name in ways}})
    for r in range(rounds):
        for case in cases:
            names = list(case["ways"])
            for name in names[r % len(names):] + names[: r % len(names)]:
                case["times"][name].append(statistics.median(time_calls(case["ways"][name], "cpu", calls, warmup=2)))
    return [_row(case) for case in cases]


def _row(case: dict) -> dict:
    """One (shape, rows) of the table: µs per way, speedups over bfloat16 (and ours over torch's int4) with their
    intervals, errors, and every round's µs."""
    t = case["times"]
    row = {"shape": f"{case['n']}x{case['k']}", "rows": case["m"],
           **{f"{name}_us": statistics.median(t[name]) * 1e6 for name in t}}
    ratios = {f"{name}_speedup": ("bfloat16", name) for name in FASTER if name in t}
    if "int4_linear" in t:
        ratios["int4_linear_over_int4"] = ("int4", "int4_linear")
    if "bf16_linear" in t and "packed" in t:
        ratios["bf16_linear_over_packed"] = ("packed", "bf16_linear")
    for key, (slow, fast) in ratios.items():
        ci = median_ci([a / b for a, b in zip(t[slow], t[fast])])
        row[key], row[f"{key}_ci"], row["ci_coverage"] = ci.median, [ci.low, ci.high], ci.coverage
    row.update({f"{name}_error": case["errors"][name] for name in t})
    row["rounds_us"] = {name: [v * 1e6 for v in t[name]] for name in t}
    return row


def _relative_error(y: torch.Tensor, reference: torch.Tensor) -> float:
    return float((y.float() - reference).norm() / reference.norm())


def _print(result: dict) -> None:
    def cell(r: dict, w: str) -> str:
        if f"{w}_speedup" not in r:
            return ""
        low, high = r[f"{w}_speedup_ci"]
        return f"{r[f'{w}_us']:.0f} µs, {r[f'{w}_speedup']:.2f} [{low:.2f}, {high:.2f}]"

    ways = [w for w in FASTER if any(f"{w}_us" in r for r in result["results"])]
    rows = [{"N x K": r["shape"], "M": r["rows"], "bf16 µs": f"{r['bfloat16_us']:.0f}", **{w: cell(r, w) for w in ways},
             "ours / torch int4": (f"{r['int4_linear_over_int4']:.2f}" if "int4_linear_over_int4" in r else ""),
             "ours / oneDNN": (f"{r['bf16_linear_over_packed']:.2f}" if "bf16_linear_over_packed" in r else ""),
             "errors": "/".join(f"{r[f'{w}_error']:.3f}" for w in ("bfloat16", *ways) if f"{w}_error" in r)}
            for r in result["results"]]
    print(format_table(rows, list(rows[0])))
    s = result["settings"]
    print(f"\nbfloat16 x on one CPU, {s['threads']} threads, median of {s['rounds']} rounds of {s['calls']} calls; "
          f"x: bfloat16's time over the way's (> 1: faster), with its interval; errors in the order "
          f"{'/'.join(('bfloat16', *ways))}; load average "
          f"{result['load_average']['before'][0]:.2f} -> {result['load_average']['after'][0]:.2f}")
    if not cpu.available():
        print(f"int4_linear and bf16_linear not timed: {cpu.unavailable_reason()}")


FORWARD_WAYS = ("bfloat16", "int4", "int4_linear", "int4_layers")
"""A whole draft forward (``--model``): bfloat16 over packed weights, int4 with torch's kernel, int4 with ours
operator by operator, int4 with ours in one call (a one-token forward)."""


def run_model(name: str, context: int = 450, new_tokens: tuple[int, ...] = (1, 2), threads: int = 2,
              rounds: int = 9, calls: int = 10, out: Path | None = None) -> dict:
    """A Llama-family model's whole static forward (``name``: a registry name or a local model) appending
    ``new_tokens`` after ``context`` cached ones, FORWARD_WAYS in the same rotating rounds (int4_linear only where
    it runs): what a draft step costs each way, paired by round."""
    from pipeline.benchmarks.forward import load_model  # kept local: the projection benchmark loads no model
    from pipeline.decoding.static.llama import LlamaStaticForward  # kept local: as above

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            model = load_model(name, "cpu", torch.bfloat16)
            if not LlamaStaticForward.supports(model):
                raise SystemExit(f"{name}: not a Llama-family model the static forward runs (quant.py)")
            forwards = {"bfloat16": LlamaStaticForward(model, "none", packed=True)}
            with cpu.turned_off():
                forwards["int4"] = LlamaStaticForward(model, "int4", packed=True)
            if cpu.available():
                forwards["int4_linear"] = LlamaStaticForward(model, "int4", packed=True)
                forwards["int4_linear"].row_forward = None          # llama.py's forward, operator by operator
                forwards["int4_layers"] = LlamaStaticForward(model, "int4", packed=True)
            load = os.getloadavg()
            rows = _measure_forwards(forwards, model.config.vocab_size, context, new_tokens, rounds, calls)
    finally:
        torch.set_num_threads(previous)
    result = {"benchmark": "quant_forward", "provenance": provenance("cpu"), "model": name,
              "settings": {"context": context, "new_tokens": list(new_tokens), "threads": threads, "rounds": rounds,
                           "calls": calls, "dtype": "bfloat16", "batch": 1},
              "load_average": {"before": list(load), "after": list(os.getloadavg())}, "results": rows}
    if out is not None:
        write_json_atomic(out, result)
    return result


def _measure_forwards(forwards: dict, vocab: int, context: int, new_tokens, rounds: int, calls: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, context), generator=g)
    tokens = {q: torch.randint(0, vocab, (1, q), generator=g) for q in new_tokens}
    logits = {}
    for name, f in forwards.items():
        f.allocate(1, context + max(new_tokens) + 8, torch.device("cpu"))
        f(prompt, 0, None, None, 1)
        for q in new_tokens:
            logits[name, q] = f(tokens[q], context, None, None, q).float()
    ways = [(name, q) for name in forwards for q in new_tokens]
    times: dict[tuple, list[float]] = {w: [] for w in ways}

    def step(f, q: int):
        return lambda _: f(tokens[q], context, None, None, q)      # the same cache positions each call

    for r in range(rounds):
        for name, q in ways[r % len(ways):] + ways[: r % len(ways)]:
            times[name, q].append(statistics.median(time_calls(step(forwards[name], q), "cpu", calls, warmup=1)))
    rows = []
    for q in new_tokens:
        row = {"new_tokens": q, **{f"{name}_ms": statistics.median(times[name, q]) * 1e3 for name in forwards}}
        pairs = [("int4", "bfloat16"), ("int4_linear", "bfloat16"), ("int4_linear", "int4"),
                 ("int4_layers", "bfloat16"), ("int4_layers", "int4_linear")]
        for fast, slow in [p for p in pairs if p[0] in forwards]:
            ci = median_ci([a / b for a, b in zip(times[slow, q], times[fast, q])])
            row[f"{fast}_over_{slow}"], row[f"{fast}_over_{slow}_ci"] = ci.median, [ci.low, ci.high]
            row["ci_coverage"] = ci.coverage
        for name in forwards.keys() - {"bfloat16"}:      # the quantised forwards' logits against bfloat16's
            row[f"{name}_max_abs_logit_diff"] = float((logits[name, q] - logits["bfloat16", q]).abs().max())
        if "int4_linear" in forwards:
            # the same int4 weights, two kernels (torch's rounds each group's scale and zero to bfloat16; ours keeps
            # them in float32)
            row["kernels_max_abs_logit_diff"] = float((logits["int4_linear", q] - logits["int4", q]).abs().max())
        if "int4_layers" in forwards:       # the same kernel and weights, the layers in one call (int4_row.py)
            row["layers_max_abs_logit_diff"] = float((logits["int4_layers", q] - logits["int4_linear", q]).abs().max())
        rows.append(row)
    return rows


def _print_model(result: dict) -> None:
    rows = [{"new tokens": r["new_tokens"], **{f"{w} ms": f"{r[f'{w}_ms']:.2f}" for w in FORWARD_WAYS
                                                 if f"{w}_ms" in r},
             **{key.replace("_over_", " over "): f"{r[key]:.2f} [{r[key + '_ci'][0]:.2f}, {r[key + '_ci'][1]:.2f}]"
                for key in r if key.endswith(("_over_int4", "_over_bfloat16", "_over_int4_linear"))}}
            for r in result["results"]]
    print(format_table(rows, list(rows[0])))
    s = result["settings"]
    print(f"\n{result['model']}, one forward after {s['context']} cached tokens, {s['threads']} threads, median of "
          f"{s['rounds']} rounds of {s['calls']} calls; a over b: b's time over a's per round, with its interval")


def main(argv: list[str] | None = None) -> None:
    p = OneLineParser(prog="python -m pipeline.benchmarks.quant_linear", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES), help="N x K, comma-separated")
    p.add_argument("--rows", default="1,2,3,4,5,16", help="rows M per call, comma-separated")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--calls", type=int, default=15)
    p.add_argument("--ways", default=",".join(FASTER), help=f"the ways timed against bfloat16, comma-separated (of "
                                                             f"{', '.join(FASTER)})")
    p.add_argument("--model", help="time a Llama-family model's whole forward instead (a registry name or a local "
                                    "model): bfloat16 packed, int4 with torch's kernel, int4 with ours")
    p.add_argument("--context", type=int, default=450, help="with --model: cached tokens")
    p.add_argument("--new-tokens", default="1,2", help="with --model: tokens per forward, comma-separated")
    p.add_argument("--out", type=Path, help="default: results/bench/quant-linear-cpu.json, with --model "
                                            "results/bench/quant-forward-<model>-cpu.json")
    args = p.parse_args(argv)
    if args.model:
        out = args.out or Path(f"results/bench/quant-forward-{Path(args.model).name}-cpu.json")
        new_tokens = tuple(int(v) for v in args.new_tokens.split(","))
        _print_model(run_model(args.model, args.context, new_tokens, args.threads, args.rounds, args.calls, out))
        print(f"wrote {out}")
        return
    args.out = args.out or Path("results/bench/quant-linear-cpu.json")
    shapes = tuple(tuple(int(v) for v in s.split("x")) for s in args.shapes.split(","))
    rows = tuple(int(v) for v in args.rows.split(","))
    ways = tuple(args.ways.split(","))
    if bad := [w for w in ways if w not in FASTER]:
        p.error(f"--ways: unknown way {bad[0]!r}: choose from {', '.join(FASTER)}")
    result = run(shapes, rows, args.threads, args.rounds, args.calls, args.out, ways)
    _print(result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
