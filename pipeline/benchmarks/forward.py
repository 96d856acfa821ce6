"""One decode forward of a small GPT-2, three ways, in one process: why the engine has its own static-cache forward.

    python -m pipeline.benchmarks.forward [--layers 2 --width 32 --context 256 --rounds 6 --no-compile]

  transformers  the model's own forward over a DynamicCache (what the engine runs with --no-static-cache)
  static        the engine's static-cache forward (pipeline/decoding/static/, through CachedModel)
  compiled      torch.compile(model.forward, dynamic=False) over transformers' StaticCache, the route of
                transformers' static-cache generation; its first call's compile time is reported apart

Each call appends one token after ``context`` cached tokens and rolls it back, so the context stays fixed. The
three run in interleaved rounds (a change of machine load lands on all of them); each round's figure is the
median of ``calls`` calls, and the table gives the median over rounds with the rounds' range. Batch 1, fp32,
torch's threads as set (1 by default here, as `specsweep run` uses on 2 cores). Writes
results/bench/forward-<device>.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from pipeline.benchmarks.timing import format_table, time_calls
from pipeline.env_info import provenance
from pipeline.io import write_json_atomic


def run(layers: int = 2, width: int = 32, heads: int = 2, vocab: int = 269, context: int = 256, rounds: int = 6,
        calls: int = 200, compile: bool = True, threads: int = 1, out: Path | None = None) -> dict:
    """Time the three forwards (see the module docstring); torch's thread count is put back afterwards."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            return _run(layers, width, heads, vocab, context, rounds, calls, compile, threads, out)
    finally:
        torch.set_num_threads(previous)


def _run(layers, width, heads, vocab, context, rounds, calls, compile, threads, out) -> dict:
    from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel, StaticCache

    from pipeline.decoding.cache import CachedModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=vocab, n_positions=context + 64, n_embd=width, n_layer=layers, n_head=heads,
                        bos_token_id=1, eos_token_id=1)
    model = GPT2LMHeadModel(config).eval()
    prompt = torch.randint(0, vocab, (1, context))
    token = torch.randint(0, vocab, (1, 1))

    dynamic = DynamicCache(config=config)
    model(prompt, past_key_values=dynamic, use_cache=True)

    def transformers_forward(_):
        model(token, past_key_values=dynamic, use_cache=True)
        dynamic.crop(-1)

    cached = CachedModel(model, static=True)
    cached.reset(1, torch.device("cpu"), capacity=context + 8)
    cached.forward(prompt, last=1)
    keep_none = torch.zeros(1, dtype=torch.int64)

    def static_forward(_):
        cached.forward(token, last=1)
        cached.retain(1, keep_none, 0, 0)

    ways = {"transformers": transformers_forward, "static": static_forward}
    compile_seconds = None
    if compile:
        static_cache = StaticCache(config=config, max_cache_len=context + 8)
        model(prompt, past_key_values=static_cache, use_cache=True, cache_position=torch.arange(context))
        compiled = torch.compile(model.forward, dynamic=False)
        position = torch.arange(context, context + 1)

        def compiled_forward(_):
            compiled(input_ids=token, past_key_values=static_cache, use_cache=True, cache_position=position)
            for layer in static_cache.layers:
                layer.cumulative_length.sub_(1)

        t0 = time.perf_counter()
        compiled_forward(0)
        compile_seconds = time.perf_counter() - t0
        ways["compiled"] = compiled_forward

    per_round: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, fn in ways.items():
            per_round[name].append(statistics.median(time_calls(fn, "cpu", calls, warmup=20)))
    rows = [{"forward": name, "median_ms": statistics.median(r) * 1e3, "min_round_ms": min(r) * 1e3,
             "max_round_ms": max(r) * 1e3, "rounds_ms": [x * 1e3 for x in r]} for name, r in per_round.items()]
    result = {"benchmark": "forward", "provenance": provenance("cpu"),
              "settings": {"layers": layers, "width": width, "heads": heads, "vocab": vocab, "context": context,
                           "rounds": rounds, "calls": calls, "threads": threads, "batch": 1, "dtype": "float32"},
              "compile_seconds": compile_seconds, "results": rows}
    if out is not None:
        write_json_atomic(out, result)
    return result


def print_table(result: dict) -> None:
    table = [{"forward": r["forward"], "median ms": f"{r['median_ms']:.3f}",
              "rounds ms": f"{r['min_round_ms']:.3f}-{r['max_round_ms']:.3f}"} for r in result["results"]]
    print(format_table(table, list(table[0])))
    if result["compile_seconds"] is not None:
        print(f"torch.compile, first call: {result['compile_seconds']:.1f} s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--out", type=Path, default=Path("results/bench/forward-cpu.json"))
    args = p.parse_args(argv)
    result = run(layers=args.layers, width=args.width, heads=args.heads, context=args.context, rounds=args.rounds,
                 calls=args.calls, compile=args.compile, threads=args.threads, out=args.out)
    print_table(result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
