"""`specsweep bench drafters`: prompt lookup and suffix decoding against transformers' prompt lookup and the target
alone (pipeline/benchmarks/drafters.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.commands.bench.common import bench_device
from pipeline.config import RunConfig
from pipeline.errors import SpecsweepError
from pipeline.tasks import TASK_NAMES

HELP = "drafters without a draft model against transformers' prompt lookup, greedy, same tokens"
DESCRIPTION = ("Tokens/s of our prompt lookup and suffix decoding at each lookup length against transformers' "
               "prompt lookup (generate(prompt_lookup_num_tokens=K)) and against the target alone, batch 1, "
               "T = 0, every loop's tokens compared with the target's; paired per repeat, median with its "
               "interval.")
FIXTURE = Path(__file__).resolve().parents[3].parent / "shared" / "fixtures" / "cnn_dailymail" / "test.jsonl"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default="smollm2-135m-instruct",
                        help="target model: a registry name, hub id or folder (default: smollm2-135m-instruct)")
    parser.add_argument("--data", default=None,
                        help="the task's data (default: the CNN/DailyMail sample beside the checkout, if there)")
    parser.add_argument("--task", default="cnn_dailymail", choices=TASK_NAMES, help="task (default: cnn_dailymail)")
    parser.add_argument("--no-chat-template", action="store_true", help="prompts without the chat template")
    parser.add_argument("--limit", type=int, default=4, help="prompts (default: 4)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="most new tokens per prompt (default: 64)")
    parser.add_argument("--max-prompt-tokens", type=int, default=1024,
                        help="prompts cut to their last N tokens (default: 1024)")
    parser.add_argument("--lookup-tokens", default="2,3,5,10",
                        help="comma-separated tokens per proposal, K (default: 2,3,5,10)")
    parser.add_argument("--lookup-max", type=int, default=2,
                        help="longest n-gram matched, both implementations (transformers' default: 2)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats (default: 3)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default: cpu)")
    parser.add_argument("--out", type=Path, default=None,
                        help="results JSON (default: results/bench/drafters-<device>.json)")


def main(args: argparse.Namespace) -> int:
    from pipeline.benchmarks import drafters  # imports torch: kept out of `specsweep --help`

    try:
        lookup_tokens = [int(k) for k in args.lookup_tokens.split(",")]
    except ValueError:
        raise SpecsweepError(f"--lookup-tokens must be comma-separated integers; got {args.lookup_tokens!r}") from None
    if min(lookup_tokens) < 1 or args.lookup_max < 1 or args.repeats < 3 or args.limit < 1:
        raise SpecsweepError("--lookup-tokens and --lookup-max must be >= 1, --limit >= 1 and --repeats >= 3 (the "
                             "paired ratios' interval needs several repeats)")
    data = args.data or (str(FIXTURE) if FIXTURE.is_file() else None)
    if data is None or not Path(data).exists():
        raise SpecsweepError(f"--data {data}: no such file; give the task's data (e.g. `specsweep fetch --task "
                             "cnn_dailymail --limit 8`)")
    config = RunConfig(target=args.target, data=data, task=args.task, chat_template=not args.no_chat_template,
                       max_new_tokens=args.max_new_tokens, max_prompt_tokens=args.max_prompt_tokens, limit=args.limit,
                       gamma=0)
    device = bench_device(args.device)
    out = args.out or Path("results/bench") / f"drafters-{device.split(':')[0]}.json"
    result = drafters.run(config, lookup_tokens=lookup_tokens, lookup_max=args.lookup_max, repeats=args.repeats,
                          device=device, out=out)
    drafters.print_table(result)
    print(f"wrote {out}")
    return 0
