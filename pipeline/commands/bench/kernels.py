"""`specsweep bench kernels`: the CUDA verify kernels against HF, torch, FlashInfer and the floor (GPU; "
"pipeline/benchmarks/kernels.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.commands.bench.common import gpu_slug, require_cupy
from pipeline.errors import SpecsweepError

HELP = "the cupy CUDA verify kernels vs HF, torch, FlashInfer and the floor (GPU)"
DESCRIPTION = ("Time per verify call of the cupy kernels (exact, sigmoid, greedy), the torch "
               "reference, HF's _speculative_sampling (B = 1), FlashInfer's softmax + "
               "chain_speculative_sampling (if installed) and the memory/launch floor, over "
               "B x γ x V x dtype (B 1, 8, 32, 128; γ 1, 3, 5, 8; V 32000, 128256; bf16, fp32, "
               "fp16), and of the token-tree kernel tree_verify beside its torch reference "
               "(trees 2,2,1 and 3,2,1 at B 1, 8, 32, V 128256, bf16). Each is timed eagerly "
               "(CUDA events around each call) and under CUDA graph replay (device time); goals "
               "are judged on graph replay where both sides have it. Needs a CUDA GPU.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=50,
                   help="eager timed calls per configuration; torch and HF get a fifth (default: 50)")
    parser.add_argument("--graph-calls", type=int, default=16,
                   help="calls captured in one CUDA graph, rotating over the input sets (default: 16)")
    parser.add_argument("--graph-replays", type=int, default=10, help="timed replays of that graph (default: 10)")
    parser.add_argument("--max-seconds", type=float, default=240,
                   help="start no configuration after this many seconds, so the run ends in time with a table "
                        "and its JSON saying which configurations were not run; 0: no limit (default: 240, "
                        "inside the 300 s that kernels/gpu_validate.sh gives this step)")
    parser.add_argument("--quick", action="store_true",
                        help="B in {1, 16}, γ = 5, V = 128256, bf16, and the tree 2,2,1 at B = 1 (a smoke run)")
    parser.add_argument("--out", type=Path, default=None,
                   help="results JSON (default: kernels/results/kernels-<gpu>.json)")


def main(args: argparse.Namespace) -> int:
    from pipeline.benchmarks import kernels as kernel_bench  # imports torch: kept out of `specsweep --help`

    if min(args.repeats, args.graph_calls, args.graph_replays) < 1 or args.max_seconds < 0:
        raise SpecsweepError("--repeats, --graph-calls and --graph-replays must be >= 1 and --max-seconds "
                             f">= 0; got {args.repeats}, {args.graph_calls}, {args.graph_replays}, "
                             f"{args.max_seconds:g}")
    require_cupy("bench kernels")   # before gpu_slug, which needs CUDA
    out = args.out or Path("kernels/results") / f"kernels-{gpu_slug()}.json"
    sizes = kernel_bench.QUICK if args.quick else kernel_bench.FULL
    trees = kernel_bench.TREE_QUICK if args.quick else kernel_bench.TREE_FULL
    result = kernel_bench.run(repeats=args.repeats, graph_calls=args.graph_calls,
                              graph_replays=args.graph_replays, max_seconds=args.max_seconds or None, out=out,
                              **sizes, **trees)
    kernel_bench.print_table(result)
    print(f"wrote {out}")
    return 0
