"""`specsweep bench host`: the host side of one verify call of every kernel sampler (pipeline/benchmarks/host.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.commands.bench.common import bench_device
from pipeline.errors import SpecsweepError

HELP = "host µs, torch dispatches and Python memory of one verify call of each kernel sampler"
DESCRIPTION = ("The host side of one eager verify call of the kernel samplers (exact, sigmoid, greedy and the tree "
               "sampler): µs per call with its interval, torch operator dispatches and Python-level memory per "
               "call, at B 1 γ 5 V 128256 bf16 and a few other shapes. On a CPU the launches are recorded and "
               "skipped (CPU-side costs, not GPU launch times); on CUDA the production launcher runs them.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto",
                        help="cpu (launches skipped), cuda, cuda:N or auto (default: auto)")
    parser.add_argument("--repeats", type=int, default=21, help="timed blocks per sampler and shape (default: 21)")
    parser.add_argument("--calls", type=int, default=200, help="calls per timed block (default: 200)")
    parser.add_argument("--quick", action="store_true", help="the goal shape only (B 1, γ 5, V 128256, bf16)")
    parser.add_argument("--out", type=Path, default=None, help="results JSON (default: "
                                                               "results/bench/host-<device>.json)")


def main(args: argparse.Namespace) -> int:
    from pipeline.benchmarks import host  # imports torch: kept out of `specsweep --help`

    if args.repeats < 1 or args.calls < 1:
        raise SpecsweepError(f"--repeats and --calls must be >= 1; got {args.repeats}, {args.calls}")
    device = bench_device(args.device)
    if device.startswith("cuda"):
        host.require_kernels()
    out = args.out or Path("results/bench") / f"host-{device.split(':')[0]}.json"
    result = host.run(device=device, configs=host.QUICK if args.quick else host.FULL, repeats=args.repeats,
                      calls=args.calls, out=out)
    host.print_table(result)
    print(f"wrote {out}")
    return 0
