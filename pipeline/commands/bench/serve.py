"""`specsweep bench serve`: `specsweep serve` under load (pipeline/benchmarks/serve.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.commands.bench.common import bench_device, toy_pair
from pipeline.errors import SpecsweepError

HELP = "`specsweep serve` under load: dynamic batching against one request at a time"
DESCRIPTION = ("Starts `specsweep serve` twice on loopback (dynamic batching with --max-batch, "
               "and --max-batch 1) and sends --requests completions per concurrency level "
               "(1, 4, 16 clients), --repeats times, the servers interleaved: requests lost or "
               "failed, p50/p99 latency, requests/s and tokens/s, and the tokens/s of dynamic "
               "batching over one request at a time at the highest concurrency (goal: >= 2x).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default=toy_pair("target"), help="target model (default: the toy text pair)")
    parser.add_argument("--draft", default=toy_pair("draft"), help="draft model (default: the toy text pair)")
    parser.add_argument("--drafter", default="model", choices=("model", "prompt-lookup", "suffix"),
                        help="the servers' --drafter; prompt-lookup and suffix need no --draft (default: model)")
    parser.add_argument("--chat", action="store_true",
                        help="send chat completions (the prompt as the user's message) instead of completions")
    parser.add_argument("--data", default="data/toy/text/test.jsonl",
                    help="JSONL of {prompt} or {article} lines, cycled (default: data/toy/text/test.jsonl)")
    parser.add_argument("--sampler", default="exact", help="acceptance rule (default: exact)")
    parser.add_argument("--gamma", type=int, default=4, help="draft tokens per step (default: 4)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: 1)")
    parser.add_argument("--max-tokens", type=int, default=32, help="max_tokens of every request (default: 32)")
    parser.add_argument("--requests", type=int, default=64,
                    help="requests of one run (a server, a concurrency level, a repeat) (default: 64)")
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated client counts (default: 1,4,16)")
    parser.add_argument("--repeats", type=int, default=3,
                    help="runs per server and concurrency, the servers interleaved (default: 3)")
    parser.add_argument("--max-batch", type=int, default=16, help="the batching server's --max-batch (default: 16)")
    parser.add_argument("--max-wait-ms", type=float, default=10.0, help="both servers' --max-wait-ms (default: 10)")
    parser.add_argument("--threads", type=int, default=None, help="the servers' torch threads (default: theirs)")
    parser.add_argument("--seed", type=int, default=0, help="request i carries seed + i (default: 0)")
    parser.add_argument("--device", default="cpu", help="the servers' device: cpu, cuda, cuda:N or auto (default: cpu)")
    parser.add_argument("--out", type=Path, default=None, help="results JSON (default: "
                                                               "results/bench/serve-<device>.json)")


def main(args: argparse.Namespace) -> int:
    from pipeline.benchmarks import serve  # imports torch: kept out of `specsweep --help`

    try:
        levels = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        raise SpecsweepError(f"--concurrency must be comma-separated integers; got {args.concurrency!r}") from None
    if min(levels) < 1 or min(args.requests, args.max_tokens, args.max_batch, args.repeats, args.gamma + 1) < 1:
        raise SpecsweepError("--concurrency, --requests, --max-tokens, --max-batch and --repeats must be >= 1 and "
                             "--gamma >= 0")
    if not Path(args.data).is_file():
        raise SpecsweepError(f"--data {args.data} does not exist: run `make` for the toy data, or give --data")
    for name in ("target", "draft") if args.drafter == "model" else ("target",):  # toy folders by default
        value = getattr(args, name)
        if value == toy_pair(name) and not Path(value).is_dir():
            raise SpecsweepError(f"--{name} {value} does not exist: run `make` for the toy pair, or give --{name}")
    device = bench_device(args.device)
    out = args.out or Path("results/bench") / f"serve-{device.split(':')[0]}.json"
    result = serve.run(args.target, args.draft, args.data, sampler=args.sampler, gamma=args.gamma,
                       temperature=args.temperature, max_tokens=args.max_tokens, requests=args.requests,
                       concurrency=levels, repeats=args.repeats, max_batch=args.max_batch,
                       max_wait_ms=args.max_wait_ms, device=device, threads=args.threads, seed=args.seed,
                       drafter=args.drafter, chat=args.chat, out=out)
    serve.print_table(result)
    print(f"wrote {out}")
    return 0
