"""`specsweep bench {samplers,engine,kernels}`: benchmarks that print a table and write JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.errors import SpecsweepError

HELP = "benchmarks: print a table and write JSON (speed goals are judged here)"


def _device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SpecsweepError(f"--device {name} asked for, but torch sees no CUDA GPU: use --device cpu")
    return name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", required=True, metavar="{samplers}")
    p = sub.add_parser("samplers", help="every (sampler, backend) against HF's _speculative_sampling",
                       description="Median time per verify call of every available (sampler, backend) and of HF's "
                                   "_speculative_sampling (B = 1), over B x γ x V x dtype.")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    p.add_argument("--repeats", type=int, default=20, help="timed calls per configuration (default: 20)")
    p.add_argument("--quick", action="store_true", help="one small configuration (a smoke run)")
    p.add_argument("--out", type=Path, default=None,
                   help="results JSON (default: results/bench/samplers-<device>.json)")


def main(args: argparse.Namespace) -> int:
    if args.bench == "samplers":
        from pipeline.benchmarks import samplers

        if args.repeats < 1:
            raise SpecsweepError(f"--repeats must be >= 1; got {args.repeats}")
        device = _device(args.device)
        out = args.out or Path("results/bench") / f"samplers-{device.split(':')[0]}.json"
        sizes = samplers.QUICK if args.quick else samplers.FULL
        result = samplers.run(device=device, repeats=args.repeats, out=out, **sizes)
        samplers.print_table(result)
        print(f"wrote {out}")
        return 0
    raise SpecsweepError(f"unknown benchmark {args.bench!r}")
