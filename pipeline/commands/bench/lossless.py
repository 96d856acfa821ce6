"""`specsweep bench lossless`: do the lossless rules keep the target's output, per dtype "
"(pipeline/benchmarks/lossless.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.commands.bench.common import bench_device
from pipeline.dtypes import DTYPES
from pipeline.errors import SpecsweepError

HELP = "per dtype: do the lossless rules keep the target's output?"
DESCRIPTION = ("For each lossless rule of the registry (pipeline/rules.py) and each dtype: at "
               "T = 0, the rule's output against the target's own greedy output (γ = 0, same "
               "engine and dtype) on every prompt, token for token, with the first diverging "
               "position of each mismatch; at T = 1, a chi-square test of homogeneity of N "
               "short continuations drawn with the rule against N drawn with γ = 0 (first "
               "token, first two tokens). Default pair: the toy text pair when it exists, "
               "else a synthetic one.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rules", default=None,
                    help="comma-separated rule[:preset] to check, e.g. exact,sigmoid:paper (default: every rule "
                         "the registry calls lossless at any temperature)")
    parser.add_argument("--dtypes", default=None,
                    help="comma-separated dtypes (default: float32,bfloat16; float16 too on CUDA)")
    parser.add_argument("--target", help="target model (default: models/toy/text/target if it exists, else a synthetic "
                                     "pair built locally)")
    parser.add_argument("--draft", help="draft model (with --target)")
    parser.add_argument("--synthetic", action="store_true",
                    help="the synthetic random-init pair of `bench engine` and its prompts, even where the toy pair "
                         "exists")
    parser.add_argument("--data", help="JSONL of {prompt} or {article} lines (default: data/toy/text/test.jsonl with "
                                       "the "
                                   "toy pair, built-in prompts with the synthetic one)")
    parser.add_argument("--gamma", type=int, default=4, help="draft tokens per step (default: 4)")
    parser.add_argument("--greedy-tokens", type=int, default=32, help="greedy part: most new tokens per prompt "
                                                                  "(default: 32)")
    parser.add_argument("--limit", type=int, default=None, help="greedy part: the first N prompts only (default: all)")
    parser.add_argument("--samples", type=int, default=400,
                    help="sampled part: continuations per rule and per reference, per prompt (default: 400)")
    parser.add_argument("--max-new-tokens", type=int, default=3,
                    help="sampled part: tokens per continuation, >= 2 (default: 3)")
    parser.add_argument("--sample-prompts", type=int, default=1,
                    help="sampled part: the first N prompts (default: 1)")
    parser.add_argument("--sample-prompt-tokens", type=int, default=None,
                    help="sampled part: each prompt cut to its first N tokens (default: the prefix whose next token "
                         "the target is least sure of, the strongest test)")
    parser.add_argument("--alpha", type=float, default=0.01,
                    help="sampled part: test level, Bonferroni-corrected over a row's tests (default: 0.01)")
    parser.add_argument("--seed", type=int, default=0, help="sampled part: seed (default: 0)")
    parser.add_argument("--ignore-eos", action="store_true", help="decode past EOS")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    parser.add_argument("--out", type=Path, default=None,
                    help="results JSON (default: results/bench/lossless-<device>.json)")


def main(args: argparse.Namespace) -> int:
    from pipeline.benchmarks import lossless  # imports torch: kept out of `specsweep --help`

    if min(args.gamma, args.greedy_tokens, args.sample_prompts, args.sample_prompt_tokens or 1) < 1 \
            or args.samples < 10 or args.max_new_tokens < 2 or (args.limit is not None and args.limit < 1):
        raise SpecsweepError("--gamma, --greedy-tokens, --limit, --sample-prompts and --sample-prompt-tokens must be "
                             ">= 1, --samples >= 10 and --max-new-tokens >= 2 (the joint test needs two tokens)")
    if not 0 < args.alpha < 1:
        raise SpecsweepError(f"--alpha must be in (0, 1); got {args.alpha:g}")
    if (args.target is None) != (args.draft is None):
        raise SpecsweepError("give both --target and --draft, or neither (the toy text pair, else a synthetic pair)")
    if args.synthetic and (args.target is not None or args.data is not None):
        raise SpecsweepError("--synthetic builds its own pair and prompts: leave out --target, --draft and --data")
    if args.data is not None and not Path(args.data).is_file():
        raise SpecsweepError(f"--data {args.data} does not exist: give a JSONL of {{prompt}} or {{article}} lines")
    rules = lossless.parse_rules(args.rules) if args.rules is not None else None
    device = bench_device(args.device)
    dtypes = [d.strip() for d in args.dtypes.split(",")] if args.dtypes else lossless.default_dtypes(device)
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown or not dtypes or len(set(dtypes)) != len(dtypes):
        raise SpecsweepError(f"--dtypes must name each of {', '.join(DTYPES)} at most once; got {args.dtypes!r}")
    target, draft, data = args.target, args.draft, args.data
    if target is None and not args.synthetic and (toy := lossless.default_pair()) is not None:
        target, draft = toy[:2]
        data = data or toy[2]
    out = args.out or Path("results/bench") / f"lossless-{device.split(':')[0]}.json"
    result = lossless.run(target=target, draft=draft, data=data, rules=rules, dtypes=dtypes, gamma=args.gamma,
                          greedy_tokens=args.greedy_tokens, limit=args.limit, samples=args.samples,
                          max_new_tokens=args.max_new_tokens, sample_prompts=args.sample_prompts,
                          sample_prompt_tokens=args.sample_prompt_tokens, seed=args.seed, alpha=args.alpha,
                          ignore_eos=args.ignore_eos, device=device, out=out)
    lossless.print_table(result)
    print(f"wrote {out}")
    return 0
