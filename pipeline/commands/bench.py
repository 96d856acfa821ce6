"""`specsweep bench {samplers,engine,kernels}`: benchmarks that print a table and write JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.errors import SpecsweepError

HELP = "benchmarks: print a table and write JSON (speed goals are judged here)"


def _device(name: str) -> str:
    """cpu, cuda, cuda:N or auto (CUDA when there is one): the run's own rules, minus the dtype check (the
    benchmarks choose their dtypes)."""
    from pipeline.models import resolve_device

    return resolve_device(name)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", required=True, metavar="{samplers,engine,kernels}")
    p = sub.add_parser("samplers", help="every (sampler, backend) against HF's _speculative_sampling",
                       description="Median time per verify call of every available (sampler, backend) and of HF's "
                                   "_speculative_sampling (B = 1), over B x γ x V x dtype.")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    p.add_argument("--repeats", type=int, default=20, help="timed calls per configuration (default: 20)")
    p.add_argument("--quick", action="store_true", help="one small configuration (a smoke run)")
    p.add_argument("--out", type=Path, default=None,
                   help="results JSON (default: results/bench/samplers-<device>.json)")
    e = sub.add_parser("engine", help="our decoding loop against HF's generate, side by side",
                       description="Tokens/s of our speculative loop against HF generate(assistant_model=...) and of "
                                   "our γ = 0 loop against HF's plain generate, same models, prompts and γ, batch 1. "
                                   "Without --target/--draft a synthetic random-init pair is built.")
    e.add_argument("--target", help="target model (default: a synthetic pair built locally)")
    e.add_argument("--draft", help="draft model (with --target)")
    e.add_argument("--data", help="JSONL of {prompt} lines (default: built-in prompts for the synthetic pair)")
    e.add_argument("--gamma", type=int, default=4, help="draft tokens per step (default: 4)")
    e.add_argument("--max-new-tokens", type=int, default=64, help="tokens per prompt (default: 64)")
    e.add_argument("--repeats", type=int, default=3, help="interleaved repetitions; the median counts (default: 3)")
    e.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    e.add_argument("--out", type=Path, default=None, help="results JSON (default: results/bench/engine-<device>.json)")
    k = sub.add_parser("kernels", help="the cupy CUDA verify kernels vs HF, torch, FlashInfer and the floor (GPU)",
                       description="Time per verify call of the cupy kernels (exact, sigmoid, greedy), the torch "
                                   "reference, HF's _speculative_sampling (B = 1), FlashInfer's softmax + "
                                   "chain_speculative_sampling (if installed) and the memory/launch floor, over "
                                   "B x γ x V x dtype (B 1, 8, 32, 128; γ 1, 3, 5, 8; V 32000, 128256; bf16, fp32, "
                                   "fp16). Each is timed eagerly (CUDA events around each call) and under CUDA "
                                   "graph replay (device time); goals are judged on graph replay where both "
                                   "sides have it. Needs a CUDA GPU.")
    k.add_argument("--repeats", type=int, default=50,
                   help="eager timed calls per configuration; torch and HF get a fifth (default: 50)")
    k.add_argument("--graph-calls", type=int, default=16,
                   help="calls captured in one CUDA graph, rotating over the input sets (default: 16)")
    k.add_argument("--graph-replays", type=int, default=10, help="timed replays of that graph (default: 10)")
    k.add_argument("--max-seconds", type=float, default=240,
                   help="start no configuration after this many seconds, so the run ends in time with a table "
                        "and its JSON saying which configurations were not run; 0: no limit (default: 240, "
                        "inside the 300 s that kernels/gpu_validate.sh gives this step)")
    k.add_argument("--quick", action="store_true", help="B in {1, 16}, γ = 5, V = 128256, bf16 (a smoke run)")
    k.add_argument("--out", type=Path, default=None,
                   help="results JSON (default: kernels/results/kernels-<gpu>.json)")


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
    if args.bench == "engine":
        from pipeline.benchmarks import engine

        if args.repeats < 1 or args.gamma < 1 or args.max_new_tokens < 1:
            raise SpecsweepError("--repeats, --gamma and --max-new-tokens must be >= 1")
        if (args.target is None) != (args.draft is None):
            raise SpecsweepError("give both --target and --draft, or neither (a synthetic pair)")
        device = _device(args.device)
        out = args.out or Path("results/bench") / f"engine-{device.split(':')[0]}.json"
        result = engine.run(args.target, args.draft, args.data, gamma=args.gamma, max_new_tokens=args.max_new_tokens,
                            repeats=args.repeats, device=device, out=out)
        engine.print_table(result)
        print(f"wrote {out}")
        return 0
    if args.bench == "kernels":
        from pipeline.kernels import bench as kernel_bench

        if min(args.repeats, args.graph_calls, args.graph_replays) < 1 or args.max_seconds < 0:
            raise SpecsweepError("--repeats, --graph-calls and --graph-replays must be >= 1 and --max-seconds "
                                 f">= 0; got {args.repeats}, {args.graph_calls}, {args.graph_replays}, "
                                 f"{args.max_seconds:g}")
        kernel_bench._require_gpu()
        out = args.out or Path("kernels/results") / f"kernels-{_gpu_slug()}.json"
        sizes = kernel_bench.QUICK if args.quick else kernel_bench.FULL
        result = kernel_bench.run(repeats=args.repeats, graph_calls=args.graph_calls,
                                  graph_replays=args.graph_replays, max_seconds=args.max_seconds or None, out=out,
                                  **sizes)
        kernel_bench.print_table(result)
        print(f"wrote {out}")
        return 0
    raise SpecsweepError(f"unknown benchmark {args.bench!r}")


def _gpu_slug() -> str:
    import re

    import torch

    return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name().lower()).strip("-")
