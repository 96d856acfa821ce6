"""`specsweep export`: write a study's or a report's chosen setting as transformers', vLLM's or TensorRT-LLM's
configuration, or as our own settings JSON (pipeline/tuning/export.py)."""

from __future__ import annotations

import argparse

from pipeline.rules import tunable
from pipeline.tuning.export import FORMATS, PICK_OF, export, load_source
from pipeline.tuning.schedule import MAX_QUALITY_LOSS, PENALTY, PICKS

HELP = ("write the tuned setting (a study's schedule, or a report's recommendation) as a transformers generation "
        "config, vLLM speculative_config, TensorRT-LLM options, or our settings JSON")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from", dest="source", required=True,
                   help="a schedule JSON written by `specsweep tune` (next to its front, e.g. "
                        "results/tune/text-schedule.json), a study folder (--study-dir of `specsweep tune`), or a "
                        "report folder or its results.csv (`specsweep report --out`)")
    p.add_argument("--format", required=True, choices=FORMATS,
                   help="hf: <out>/generation_config.json of the assistant (num_assistant_tokens, "
                        "num_assistant_tokens_schedule, assistant_confidence_threshold); vllm: speculative_config JSON "
                        "(draft_model, num_speculative_tokens and its per-batch-size schedule); trtllm: LLM API "
                        "options YAML (Draft_Target speculative_config with draft_len_schedule); json: our settings, "
                        "read by `specsweep run --from-config`")
    p.add_argument("--out", required=True,
                   help="file to write (a folder for --format hf, as transformers' save_pretrained), atomically")
    p.add_argument("--pick", choices=PICKS,
                   help="which of the schedule's picks per cell: choice (any rule within the quality loss), standard "
                        "(exact/hf, or greedy at T = 0: what the serving tools verify with), standard_fixed (that with "
                        "a fixed γ) (default: " + ", ".join(f"{f} {p}" for f, p in PICK_OF.items()) + ")")
    p.add_argument("--context-bucket", "--context_bucket",
                   help="LOW-HIGH: the prompt-length bucket to export when the schedule has several")
    p.add_argument("--no-batch-schedule", "--no_batch_schedule", action="store_true",
                   help="vllm: leave out num_speculative_tokens_per_batch_size (releases without Dynamic Speculative "
                        "Decoding reject it); vLLM then drafts the smallest batch size's γ at every batch size")
    p.add_argument("--max-batch-size", "--max_batch_size", type=int,
                   help="trtllm: carry the largest measured batch size's γ up to this batch size (TensorRT-LLM turns "
                        "speculation off above the schedule's largest key)")
    p.add_argument("--tree-as-chain", "--tree_as_chain", action="store_true",
                   help="hf, vllm, trtllm: export a token-tree pick (--draft-tree) as the chain of its depth, which "
                        "those tools can draft (it was not measured: a note says so); without it a tree is refused")
    p.add_argument("--task", help="with a report holding several tasks: the task whose recommendation to export")
    p.add_argument("--spread-penalty", "--spread_penalty", type=float, default=PENALTY,
                   help=f"from a study folder: the schedule's penalty on the spread of the repeats (default: "
                        f"{PENALTY:g})")
    p.add_argument("--max-quality-loss", "--max_quality_loss", type=float, default=MAX_QUALITY_LOSS,
                   help=f"from a study folder or a report: the quality loss a lossy rule may have (default: "
                        f"{MAX_QUALITY_LOSS:g})")
    p.add_argument("--sampler", choices=tunable(),
                   help="from a study folder: the choice among this acceptance rule's trials only (e.g. sigmoid's "
                        "tuned alpha and beta), not against other rules or the target alone; an error when none is "
                        "within --max-quality-loss")


def main(args: argparse.Namespace) -> int:
    schedule = load_source(args.source, task=args.task, penalty=args.spread_penalty,
                           max_quality_loss=args.max_quality_loss, rule=args.sampler)
    path, notes = export(schedule, args.format, args.out, pick=args.pick, context=args.context_bucket,
                         batch_schedule=not args.no_batch_schedule, max_batch_size=args.max_batch_size,
                         tree_as_chain=args.tree_as_chain)
    for note in notes:
        print(f"note: {note}")
    print(f"wrote {path}")
    return 0
