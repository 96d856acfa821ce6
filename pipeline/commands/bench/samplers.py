"""`specsweep bench samplers`: every sampler against HF's verify step (pipeline/benchmarks/samplers.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.commands.bench.common import bench_device
from pipeline.errors import SpecsweepError

HELP = "every (sampler, backend) against HF's _speculative_sampling"
DESCRIPTION = ("Median time per verify call of every available (sampler, backend) and of HF's "
               "_speculative_sampling (B = 1), over B x γ x V x dtype; and a deterministic draft "
               "(draft_logits=None) against one-hot draft logits, paired.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per configuration (default: 20)")
    parser.add_argument("--quick", action="store_true", help="one small configuration (a smoke run)")
    parser.add_argument("--deterministic-only", action="store_true",
                   help="only the deterministic-draft comparison (draft_logits=None against one-hot logits, as string "
                        "mode builds them), over B 1, 16 x γ 4, 8 x V 32000, 128256 x fp32, bf16")
    parser.add_argument("--out", type=Path, default=None,
                   help="results JSON (default: results/bench/samplers-<device>.json, "
                        "samplers-deterministic-<device>.json with --deterministic-only)")


def main(args: argparse.Namespace) -> int:
    from pipeline.benchmarks import samplers  # imports torch: kept out of `specsweep --help`

    if args.repeats < 1:
        raise SpecsweepError(f"--repeats must be >= 1; got {args.repeats}")
    device = bench_device(args.device)
    kind = "samplers-deterministic" if args.deterministic_only else "samplers"
    out = args.out or Path("results/bench") / f"{kind}-{device.split(':')[0]}.json"
    sizes = samplers.QUICK if args.quick else samplers.DETERMINISTIC if args.deterministic_only else samplers.FULL
    result = samplers.run(device=device, repeats=args.repeats, out=out, deterministic_only=args.deterministic_only,
                          **sizes)
    samplers.print_table(result)
    print(f"wrote {out}")
    return 0
