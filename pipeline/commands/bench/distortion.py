"""`specsweep bench distortion`: a lossy rule's distance from the target's distribution over a grid of its parameters
(pipeline/benchmarks/distortion.py)."""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

from pipeline.commands.bench.common import bench_device, run_help
from pipeline.commands.bench.engine import TASKS
from pipeline.config import DRAFT_QUANTS, RunConfig
from pipeline.dtypes import DTYPE_CHOICES
from pipeline.errors import SpecsweepError

HELP = "a lossy rule's distortion and acceptance over its parameters, from one exact run of the pair"
DESCRIPTION = ("Decodes the pair's prompts with exact verification at T > 0 and, at every position that emits a "
               "token, compares each setting's closed-form distribution (sigmoid over --alphas x --betas, typical "
               "and sigmoid at the registry's parameters, exact as the zero check) with the target's: total "
               "variation per token with a 95 %% bootstrap interval, and the acceptance rate. Chooses the sigmoid "
               "setting that accepts most within --max-distortion and writes it as a settings file for "
               "`specsweep run --from-config`. Writes JSON and a figure (.png beside it).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, help="target model")
    parser.add_argument("--draft", required=True, help="draft model (its logits are what the lossy rules read)")
    parser.add_argument("--data", required=True, help="the task's data: a JSONL file or a folder written by "
                                                      "`specsweep fetch`")
    parser.add_argument("--task", default="cnn_dailymail", help=f"one of {', '.join(TASKS)} (default: cnn_dailymail)")
    parser.add_argument("--chat-template", action="store_true", help=run_help("chat_template"))
    parser.add_argument("--max-prompt-tokens", type=int, help=run_help("max_prompt_tokens"))
    parser.add_argument("--limit", type=int, help=run_help("limit"))
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per prompt (default: 64)")
    parser.add_argument("--gamma", type=int, default=4, help="draft tokens per step (default: 4)")
    parser.add_argument("--temperature", type=float, default=1.0, help="decoding temperature, > 0 (default: 1)")
    parser.add_argument("--dtype", default="auto", help=f"one of {', '.join(DTYPE_CHOICES)} (default: auto)")
    parser.add_argument("--draft-vocab", type=int, help=run_help("draft_vocab"))
    parser.add_argument("--draft-quant", default="none", choices=DRAFT_QUANTS, help=run_help("draft_quant"))
    parser.add_argument("--threads", type=int, help=run_help("threads"))
    parser.add_argument("--seed", type=int, default=0, help="the run's seed (default: 0)")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    parser.add_argument("--alphas", default=None, help="comma-separated sigmoid α values (default: 0.5 ... 2, 7 "
                                                       "values)")
    parser.add_argument("--betas", default=None,
                        help="comma-separated sigmoid β values, written --betas=-30,-10 (argparse reads a separate "
                             "value that starts with - as a flag; default: -60 ... 0, 10 values)")
    parser.add_argument("--max-distortion", type=float, default=0.05,
                        help="the most total variation per token the chosen setting may have (default: 0.05)")
    parser.add_argument("--out", type=Path, default=Path("results/bench/distortion.json"),
                        help="results JSON (default: results/bench/distortion.json)")
    parser.add_argument("--settings-out", type=Path, default=None,
                        help="write the chosen setting here as `specsweep export --format json` does (nothing is "
                             "written when no setting is within --max-distortion, and a file already there is left "
                             "as it was)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _floats(text: str | None, name: str, default, positive: bool = False) -> tuple[float, ...]:
    if text is None:
        return tuple(default)
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or not all(math.isfinite(v) and (v > 0 or not positive) for v in values):
        raise SpecsweepError(f"--{name} {text!r}: give comma-separated finite numbers{' > 0' if positive else ''}")
    return values


def settings_of(args: argparse.Namespace) -> RunConfig:
    """The run's settings as a RunConfig, checked by `specsweep run`'s own rules (one line for the first problem)."""
    if args.gamma < 1 or args.max_new_tokens < 1 or (args.limit is not None and args.limit < 1):
        raise SpecsweepError("--gamma, --max-new-tokens and --limit must be >= 1")
    if not args.temperature > 0:
        raise SpecsweepError(f"--temperature {args.temperature}: give T > 0 (at T = 0 every rule verifies greedily "
                             "and none distorts)")
    if not 0 <= args.max_distortion <= 1:
        raise SpecsweepError(f"--max-distortion {args.max_distortion}: a total variation, in [0, 1]")
    if args.task not in TASKS:
        raise SpecsweepError(f"--task {args.task!r}: one text prompt per record: use {' or '.join(TASKS)}")
    if args.dtype not in DTYPE_CHOICES:
        raise SpecsweepError(f"--dtype {args.dtype!r} is not one of {list(DTYPE_CHOICES)}")
    if not Path(args.data).exists():
        raise SpecsweepError(f"--data {args.data} does not exist: give a JSONL file or a folder written by "
                             "specsweep fetch")
    config = RunConfig(target=args.target, draft=args.draft, data=args.data, task=args.task, drafter="model",
                       chat_template=args.chat_template, max_prompt_tokens=args.max_prompt_tokens, limit=args.limit,
                       gamma=args.gamma, draft_vocab=args.draft_vocab, draft_quant=args.draft_quant, dtype=args.dtype,
                       temperature=args.temperature, max_new_tokens=args.max_new_tokens, threads=args.threads,
                       seed=args.seed, sampler="exact")
    return config.validate_decoding()


def main(args: argparse.Namespace) -> int:
    from pipeline.benchmarks import distortion  # imports torch: kept out of `specsweep --help`

    config = settings_of(args)
    grid = distortion.settings_grid(_floats(args.alphas, "alphas", distortion.ALPHAS, positive=True),
                                    _floats(args.betas, "betas", distortion.BETAS))
    config = dataclasses.replace(config, device=bench_device(args.device))
    result = distortion.run(config, grid, max_distortion=args.max_distortion, out=args.out,
                            settings_out=args.settings_out, progress=not args.no_progress)
    distortion.print_table(result)
    written = [str(args.out), str(args.out.with_suffix(".png"))]
    if args.settings_out is not None and result["choice"] is not None:
        written.append(str(args.settings_out))
    print(f"wrote {', '.join(written)}")
    if args.settings_out is not None and result["choice"] is None:
        kept = " (the file there is an earlier run's, left as it was)" if args.settings_out.exists() else ""
        print(f"no settings file written to {args.settings_out}{kept}")
    return 0
