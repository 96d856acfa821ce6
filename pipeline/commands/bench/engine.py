"""`specsweep bench engine`: our loop against HF's generate, side by side (pipeline/benchmarks/engine.py)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from pipeline.commands.bench.common import bench_device, run_help
from pipeline.config import DRAFT_QUANTS, DRAFTERS, RunConfig
from pipeline.decoding.draft_policy import SCHEDULES
from pipeline.dtypes import DTYPE_CHOICES
from pipeline.errors import SpecsweepError

HELP = "our decoding loop against HF's generate, side by side"
DESCRIPTION = ("Tokens/s of our speculative loop against HF generate(assistant_model=...) at equal γ and with "
               "transformers' own draft schedule (out of the box), and of our γ = 0 loop against HF's plain "
               "generate, same models, dtype and prompts, batch 1; paired per repeat, median with its interval. "
               "Without --target/--draft a synthetic random-init pair is built.")
TASKS = ("prompts", "cnn_dailymail")
"""The tasks whose prompts the bench decodes: one text prompt per record (pipeline/benchmarks/prompts.py)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", help="target model (default: a synthetic pair built locally)")
    parser.add_argument("--draft", help="draft model (with --target)")
    parser.add_argument("--data", help="the task's data: a JSONL of {prompt} lines for --task prompts, of {article, "
                                       "highlights} for cnn_dailymail, or a folder written by `specsweep fetch` "
                                       "(default: built-in prompts for the synthetic pair)")
    parser.add_argument("--task", default="prompts",
                        help=f"how --data becomes prompts, as `specsweep run --task` builds them: {', '.join(TASKS)} "
                             "(default: prompts)")
    parser.add_argument("--chat-template", action="store_true", help=run_help("chat_template"))
    parser.add_argument("--max-prompt-tokens", type=int, help=run_help("max_prompt_tokens"))
    parser.add_argument("--limit", type=int, help=run_help("limit") + " (--seed 0, as `specsweep run`'s default)")
    parser.add_argument("--gamma", type=int, default=4, help="draft tokens per step, ours and HF's assisted loop at "
                                                             "equal γ (default: 4)")
    parser.add_argument("--drafter", default="model", choices=DRAFTERS,
                        help="our loop only (HF's assisted loops draft with the draft model): "
                             + run_help("drafter") + " (default: model; another drafter makes the comparison at "
                             "equal γ one of settings, not of loops)")
    parser.add_argument("--lookup-min", type=int, default=1, help="our loop only: " + run_help("lookup_min"))
    parser.add_argument("--lookup-max", type=int, default=3, help="our loop only: " + run_help("lookup_max"))
    parser.add_argument("--draft-vocab", type=int, help="our loop only (HF's keeps the whole head): "
                        + run_help("draft_vocab"))
    parser.add_argument("--draft-quant", default="none", choices=DRAFT_QUANTS,
                        help="our static-cache loop only (HF's loops and ours on transformers' forward keep the "
                             "draft's own weights): " + run_help("draft_quant"))
    parser.add_argument("--draft-schedule", default="constant", help="our loop only: " + run_help("draft_schedule")
                        + f" (one of {', '.join(SCHEDULES)}; default: constant)")
    parser.add_argument("--draft-confidence", type=float, default=0.0,
                        help="our loop only: " + run_help("draft_confidence"))
    parser.add_argument("--gamma-max", type=int, help="our loop only: " + run_help("gamma_max"))
    parser.add_argument("--dtype", default="float32",
                        help=f"both loops' models: one of {', '.join(DTYPE_CHOICES)}; auto as `specsweep run` "
                             "resolves it (default: float32)")
    parser.add_argument("--temperature", default="0,1",
                        help="comma-separated temperatures, each timed in turn (default: 0,1)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per prompt (default: 64)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repetitions; the median counts (default: "
                                                               "3)")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    parser.add_argument("--out", type=Path, default=None, help="results JSON (default: "
                                                               "results/bench/engine-<device>.json)")


def _temperatures(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(t) for t in text.split(","))
    except ValueError:
        values = ()
    if not values or any(not t >= 0 for t in values):
        raise SpecsweepError(f"--temperature {text!r}: give comma-separated temperatures >= 0, e.g. 0,1")
    return values


def settings_of(args: argparse.Namespace) -> RunConfig:
    """The bench's settings as a RunConfig (the prompts' and our loop's, as `specsweep run` reads them), checked
    by `specsweep run`'s own rules; a one-line SpecsweepError for the first problem."""
    if args.repeats < 1 or args.gamma < 1 or args.max_new_tokens < 1:
        raise SpecsweepError("--repeats, --gamma and --max-new-tokens must be >= 1")
    if (args.target is None) != (args.draft is None):
        raise SpecsweepError("give both --target and --draft, or neither (a synthetic pair)")
    if args.task not in TASKS:
        raise SpecsweepError(f"--task {args.task!r}: bench engine decodes one text prompt per record: use "
                             f"{' or '.join(TASKS)}")
    if args.dtype not in DTYPE_CHOICES:
        raise SpecsweepError(f"--dtype {args.dtype!r} is not one of {list(DTYPE_CHOICES)}")
    if args.data is None and args.task != "prompts":
        raise SpecsweepError(f"--task {args.task} reads --data: give its file (e.g. a CNN/DailyMail JSONL of "
                             "{article, highlights} lines)")
    if args.data is not None and not Path(args.data).exists():
        raise SpecsweepError(f"--data {args.data} does not exist: give a JSONL file or a folder written by "
                             "specsweep fetch")
    if args.limit is not None and args.limit < 1:
        raise SpecsweepError(f"--limit must be >= 1; got {args.limit}")
    config = RunConfig(target=args.target, draft=args.draft, data=args.data, task=args.task,
                       chat_template=args.chat_template, max_prompt_tokens=args.max_prompt_tokens, limit=args.limit,
                       gamma=args.gamma, drafter=args.drafter, lookup_min=args.lookup_min,
                       lookup_max=args.lookup_max, draft_vocab=args.draft_vocab,
                       draft_quant=args.draft_quant, draft_schedule=args.draft_schedule,
                       draft_confidence=args.draft_confidence, gamma_max=args.gamma_max, dtype=args.dtype,
                       max_new_tokens=args.max_new_tokens)
    # `specsweep run`'s checks need a target and draft; the synthetic pair is built later, so stand-in names here
    dataclasses.replace(config, target=config.target or "synthetic", draft=config.draft or "synthetic",
                        data=config.data or "built-in").validate_decoding()
    return config


def main(args: argparse.Namespace) -> int:
    from pipeline.benchmarks import engine  # imports torch: kept out of `specsweep --help`

    config = settings_of(args)
    temperatures = _temperatures(args.temperature)
    device = bench_device(args.device)
    out = args.out or Path("results/bench") / f"engine-{device.split(':')[0]}.json"
    result = engine.run(dataclasses.replace(config, device=device), repeats=args.repeats, temperatures=temperatures,
                        out=out)
    engine.print_table(result)
    print(f"wrote {out}")
    return 0
