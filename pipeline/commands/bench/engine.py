"""`specsweep bench engine`: our loop against HF's generate, side by side (pipeline/benchmarks/engine.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.commands.bench.common import bench_device
from pipeline.errors import SpecsweepError

HELP = "our decoding loop against HF's generate, side by side"
DESCRIPTION = ("Tokens/s of our speculative loop against HF generate(assistant_model=...) and of "
               "our γ = 0 loop against HF's plain generate, same models, prompts and γ, batch 1. "
               "Without --target/--draft a synthetic random-init pair is built.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", help="target model (default: a synthetic pair built locally)")
    parser.add_argument("--draft", help="draft model (with --target)")
    parser.add_argument("--data", help="JSONL of {prompt} lines (default: built-in prompts for the synthetic pair)")
    parser.add_argument("--gamma", type=int, default=4, help="draft tokens per step (default: 4)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per prompt (default: 64)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repetitions; the median counts (default: "
                                                               "3)")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    parser.add_argument("--out", type=Path, default=None, help="results JSON (default: "
                                                               "results/bench/engine-<device>.json)")


def main(args: argparse.Namespace) -> int:
    from pipeline.benchmarks import engine  # imports torch: kept out of `specsweep --help`

    if args.repeats < 1 or args.gamma < 1 or args.max_new_tokens < 1:
        raise SpecsweepError("--repeats, --gamma and --max-new-tokens must be >= 1")
    if (args.target is None) != (args.draft is None):
        raise SpecsweepError("give both --target and --draft, or neither (a synthetic pair)")
    device = bench_device(args.device)
    out = args.out or Path("results/bench") / f"engine-{device.split(':')[0]}.json"
    result = engine.run(args.target, args.draft, args.data, gamma=args.gamma, max_new_tokens=args.max_new_tokens,
                        repeats=args.repeats, device=device, out=out)
    engine.print_table(result)
    print(f"wrote {out}")
    return 0
