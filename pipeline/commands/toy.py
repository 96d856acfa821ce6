"""`specsweep toy {data,train}`: generated toy tasks and trained toy draft/target pairs, with no network."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.env_info import usable_cores
from pipeline.errors import SpecsweepError
from pipeline.toy import speech_data, text_data

HELP = "offline toy tasks: generate text/speech data and train small draft/target pairs on it"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="toy", required=True, metavar="{data,train}")
    d = sub.add_parser("data", help="generate the toy text and speech tasks (train and test splits)",
                       description="Write <out>/text/{train,test}.jsonl ({id, article, highlights}, as CNN/DailyMail) "
                                   "and <out>/speech/{train,test}/manifest.jsonl with WAV files ({id, file, text}, as "
                                   "LibriSpeech). The same seed writes the same bytes.")
    d.add_argument("--out", type=Path, default=Path("data/toy"), help="output folder (default: data/toy)")
    d.add_argument("--seed", type=int, default=0, help="generator seed (default: 0)")
    d.add_argument("--quick", action="store_true", help="a few examples per split (for tests)")
    d.add_argument("--no-progress", action="store_true", help="no progress bars")
    t = sub.add_parser("train", help="train a toy draft/target pair on data from `specsweep toy data`",
                       description="text: a GPT-2 target, a much cheaper GPT-2 draft and a draft of the same shape "
                                   "with a byte-level BPE tokenizer (draft-bpe); speech: a small Whisper target and "
                                   "a distil-Whisper-style draft. Writes <out>/<task>/{target,draft[,draft-bpe]} "
                                   "(save_pretrained, with tokenizer/processor) and <out>/<task>/training.json.")
    t.add_argument("--task", required=True, type=_tasks,
                   help="which pair to train: text, speech, or both as text,speech (then each in its own process, "
                        "at the same time, with the cores split between them)")
    t.add_argument("--data", type=Path, default=Path("data/toy"), help="folder written by `specsweep toy data` "
                                                                       "(default: data/toy)")
    t.add_argument("--out", type=Path, default=Path("models/toy"), help="output folder (default: models/toy)")
    t.add_argument("--seed", type=int, default=0, help="initialisation and batch-order seed (default: 0)")
    t.add_argument("--threads", type=int,
                   help="torch CPU threads per pair (default: the usable cores, at most 8, split between the pairs "
                        "trained at once). On a 2-core machine two pairs with one thread each side by side took 196 s, "
                        "one after the other with two threads 259 s (single timings, not a paired measurement): these "
                        "small models use a second thread poorly. The thread count changes the trained weights "
                        "(summation order)")
    t.add_argument("--quick", action="store_true", help="tiny models, a few steps (for tests)")
    t.add_argument("--no-progress", action="store_true", help="no progress bars")


def main(args: argparse.Namespace) -> int:
    if args.toy == "data":
        return _data(args)
    if args.toy == "train":
        return _train(args)
    raise SpecsweepError(f"unknown toy command {args.toy!r}")


def _data(args: argparse.Namespace) -> int:
    import time

    t0 = time.perf_counter()
    text = text_data.generate(args.out / "text", seed=args.seed, quick=args.quick)
    speech = speech_data.generate(args.out / "speech", seed=args.seed, quick=args.quick,
                                  progress=not args.no_progress)
    print(f"wrote {text['train']['examples']} + {text['test']['examples']} text examples to {args.out / 'text'}; "
          f"{speech['train']['clips']} + {speech['test']['clips']} speech clips "
          f"({speech['train']['total_seconds'] + speech['test']['total_seconds']:.0f} s of audio) to "
          f"{args.out / 'speech'} in {time.perf_counter() - t0:.1f} s")
    return 0


TOY_TASKS = ("text", "speech")


def _tasks(value: str) -> list[str]:
    """--task: one toy pair or a comma-separated list of them."""
    tasks = [t.strip() for t in value.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in TOY_TASKS]
    if not tasks or unknown or len(set(tasks)) != len(tasks):
        raise argparse.ArgumentTypeError(f"expected one or more of {', '.join(TOY_TASKS)} (comma-separated, each "
                                         f"once); got {value!r}")
    return tasks


def _train(args: argparse.Namespace) -> int:
    if args.threads is not None and args.threads < 1:
        raise SpecsweepError(f"--threads must be >= 1; got {args.threads}")
    if len(args.task) > 1:
        threads = args.threads or max(1, min(8, usable_cores()) // len(args.task))
        return _train_side_by_side(args, threads)
    return _train_one(args, args.task[0], args.threads or min(8, usable_cores()))


def _train_side_by_side(args: argparse.Namespace, threads: int) -> int:
    """Train several pairs at once, each in its own ``specsweep toy train`` process with ``threads`` threads; their
    output is kept in <out>/<task>/train.log and a pair's last lines are printed when it ends. A pair that fails
    fails the command (after the others end), naming it and its log."""
    import subprocess
    import sys

    procs = {}
    for task in args.task:
        (args.out / task).mkdir(parents=True, exist_ok=True)
        log = open(args.out / task / "train.log", "w", encoding="utf-8")  # noqa: SIM115 (closed below)
        cmd = [sys.executable, "-m", "pipeline", "toy", "train", "--task", task, "--data", str(args.data), "--out",
               str(args.out), "--seed", str(args.seed), "--threads", str(threads), "--no-progress",
               *(["--quick"] if args.quick else [])]
        procs[task] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log)
    print(f"training {', '.join(args.task)} side by side, {threads} thread(s) each (logs: <out>/<task>/train.log)")
    failed = []
    for task, (proc, log) in procs.items():
        code = proc.wait()
        log.close()
        lines = (args.out / task / "train.log").read_text(encoding="utf-8").strip().splitlines()
        if code != 0:
            failed.append(f"{task} (exit {code}: {lines[-1] if lines else 'no output'}; log {log.name})")
        else:
            print("\n".join(lines[-2:]))
    if failed:
        raise SpecsweepError(f"training failed for {'; '.join(failed)}")
    return 0


def _train_one(args: argparse.Namespace, task: str, threads: int) -> int:
    import torch

    torch.set_num_threads(threads)
    if task == "text":
        from pipeline.toy import train_text as trainer  # imports torch: kept out of `specsweep --help`

        needed = args.data / "text" / "train.jsonl"
    else:
        from pipeline.toy import train_speech as trainer  # imports torch: kept out of `specsweep --help`

        needed = args.data / "speech" / "train" / "manifest.jsonl"
    if not needed.is_file():
        raise SpecsweepError(f"{needed} does not exist: run `specsweep toy data --out {args.data}` first")
    torch.manual_seed(args.seed)
    record = trainer.run(args.data, args.out, seed=args.seed, quick=args.quick, progress=not args.no_progress)
    m = record["models"]
    cost = record["cost"]
    line = (f"trained {task} pair in {record['train_seconds']:.1f} s: target {m['target']['parameters']:,} "
            f"params (loss {m['target']['training']['final_loss']:.3f}), draft {m['draft']['parameters']:,} params "
            f"(loss {m['draft']['training']['final_loss']:.3f}); draft/target per-token cost: "
            f"{cost['flop_ratio']:.3f} in FLOPs, {cost['time_ratio']:.3f} in time")
    if "target_growth" in record:
        grown = record["target_growth"]
        line += (f"; target grown from {grown['from_layers']} to {grown['to_layers']} layers "
                 f"(fine-tune loss {grown['fine_tune']['final_loss']:.3f})")
    if "draft-bpe" in m:
        bpe, tok = m["draft-bpe"], record["draft_bpe_tokenizer"]
        line += (f"; BPE draft {bpe['parameters']:,} params (loss {bpe['training']['final_loss']:.3f}, "
                 f"{tok['vocab_size']} tokens, {tok['tokens_per_word']:.2f} per word)")
    if "eval_greedy" in record:
        ev = record["eval_greedy"]
        line += f"; greedy WER target {_pct(ev['target']['wer'])}, draft {_pct(ev['draft']['wer'])}"
    print(line)
    print(f"wrote {args.out / task} (training.json, {', '.join(name + '/' for name in m)})")
    return 0


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"
