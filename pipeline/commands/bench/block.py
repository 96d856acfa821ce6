"""`specsweep bench block`: accepted tokens per step, block verification against exact "
"(pipeline/benchmarks/block_gain.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.commands.bench.common import bench_device
from pipeline.errors import SpecsweepError

HELP = "accepted tokens per step: block verification against exact, per γ"
DESCRIPTION = ("Accepted draft tokens per verify step of the block rule and of exact in our "
               "speculative loop (batch 1), each prompt decoded with both from the same seed, "
               "for each γ; the difference paired over prompts with a 95 % interval. Writes "
               "JSON and a figure (.png beside it).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default="models/toy/text/target", help="target model (default: the toy text pair)")
    parser.add_argument("--draft", default="models/toy/text/draft", help="draft model (default: the toy text pair)")
    parser.add_argument("--data", default="data/toy/text/test.jsonl",
                   help="JSONL of {prompt} or {article} lines (default: data/toy/text/test.jsonl)")
    parser.add_argument("--gammas", default="2,3,4,5,6,8", help="comma-separated γ values (default: 2,3,4,5,6,8)")
    parser.add_argument("--steps", type=int, default=64, help="most new tokens per prompt (default: 64)")
    parser.add_argument("--limit", type=int, default=None, help="the first N prompts only (default: all)")
    parser.add_argument("--temperature", type=float, default=1.0, help="decoding temperature, > 0 (default: 1)")
    parser.add_argument("--seed", type=int, default=0, help="prompt i decodes from seed + i with both rules (default: "
                                                            "0)")
    parser.add_argument("--ignore-eos", action="store_true", help="decode --steps tokens per prompt, past EOS")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    parser.add_argument("--out", type=Path, default=None,
                   help="results JSON (default: results/bench/block-gain-<device>.json)")


def main(args: argparse.Namespace) -> int:
    from pipeline.benchmarks import block_gain  # imports torch: kept out of `specsweep --help`

    try:
        gammas = [int(g) for g in args.gammas.split(",")]
    except ValueError:
        raise SpecsweepError(f"--gammas must be comma-separated integers; got {args.gammas!r}") from None
    if min(gammas) < 1 or args.steps < 1 or not args.temperature > 0 or (args.limit is not None and args.limit < 1):
        raise SpecsweepError("--gammas and --steps must be >= 1, --limit >= 1 and --temperature > 0 (at T = 0 "
                             "block verification is greedy verification, as exact's)")
    device = bench_device(args.device)
    out = args.out or Path("results/bench") / f"block-gain-{device.split(':')[0]}.json"
    result = block_gain.run(args.target, args.draft, args.data, gammas=gammas, steps=args.steps, seed=args.seed,
                            out=out, temperature=args.temperature, limit=args.limit, device=device,
                            ignore_eos=args.ignore_eos)
    block_gain.print_table(result)
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0
