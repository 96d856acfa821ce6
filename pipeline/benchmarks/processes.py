"""Data-parallel runs: examples/s of the quality pass with 1 and N processes (``specsweep run --processes N``).

    python -m pipeline.benchmarks.processes --target T --draft D --data test.jsonl [--settings 1x1,2x1,1x2]

Each setting ``PxT`` is one ``specsweep run`` in a fresh process tree: P processes (``--processes P``, started by
accelerate) with T torch threads each, every one with per-example randomness (so all settings decode the same
tokens, which is checked). The figure that counts is the quality pass's examples/s: samples / the slowest rank's
seconds inside ``generate`` (``metrics.wall_time_s`` of a data-parallel run). The command's own wall time
(process start, model loading, the gather, rank 0's paired speed measurement, scoring) is recorded beside it.
Settings are run ``--repeats`` times, interleaved (every setting once per repeat, in turn), so a load change
affects them alike; each figure is the median over repeats with its order-statistic interval, and a setting's
speedup over the base (the first single-process setting) is the median of the per-repeat ratios. Writes a table
and ``results/bench/processes-<device>.json``; the scaling efficiency is speedup / P.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pipeline.benchmarks.timing import format_table
from pipeline.env_info import provenance
from pipeline.errors import OneLineParser, SpecsweepError
from pipeline.io import write_json_atomic
from pipeline.measure import median_ci


def parse_settings(text: str) -> list[tuple[int, int]]:
    """"1x1,2x1" -> [(processes, threads), ...]."""
    out = []
    for item in text.split(","):
        try:
            processes, threads = (int(v) for v in item.strip().lower().split("x"))
        except ValueError:
            raise SpecsweepError(f"--settings {item.strip()!r}: expected PROCESSESxTHREADS, e.g. 2x1") from None
        if processes < 1 or threads < 1:
            raise SpecsweepError(f"--settings {item.strip()!r}: processes and threads must be >= 1")
        out.append((processes, threads))
    return out


def shown_path(path: str) -> str:
    """A path as the JSON records it: relative to the working directory when inside it, else its last three parts
    (a results file names the pair, not the machine's folders)."""
    resolved = Path(path).resolve()
    try:
        return str(resolved.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(Path(*resolved.parts[-3:]))


def run_setting(args: argparse.Namespace, processes: int, threads: int, out: Path) -> dict:
    """One `specsweep run` of the setting; its figures."""
    cmd = [sys.executable, "-m", "pipeline", "run", "--target", args.target, "--draft", args.draft, "--data",
           args.data, "--task", args.task, "--device", args.device, "--gamma", str(args.gamma), "--max-new-tokens",
           str(args.max_new_tokens), "--batch-size", str(args.batch_size), "--limit", str(args.limit), "--seed",
           str(args.seed), "--seed-per-example", "--processes", str(processes), "--threads", str(threads),
           "--repeats", "3", "--samples-per-repeat", "1", "--no-progress", "--wandb-mode", "disabled",
           "--out", str(out)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    command_s = time.perf_counter() - start
    if proc.returncode != 0:
        raise SpecsweepError(f"setting {processes}x{threads} failed: {proc.stderr.strip().splitlines()[-1:]}")
    result = json.loads(out.read_text())
    m = result["metrics"]
    samples = len(result["samples"])
    return {"setting": f"{processes}x{threads}", "processes": processes, "threads": threads, "samples": samples,
            "new_tokens": m["new_tokens"], "pass_wall_s": m["wall_time_s"],
            "rank_wall_s": result["resolved"].get("rank_wall_time_s", [m["wall_time_s"]]),
            "examples_per_s": samples / m["wall_time_s"], "tokens_per_s": m["pass_tokens_per_second"],
            "command_s": command_s, "tokens": [s["token_ids"] for s in result["samples"]]}


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m pipeline.benchmarks.processes", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="target model")
    p.add_argument("--draft", required=True, help="draft model")
    p.add_argument("--data", required=True, help="JSONL of the task's records")
    p.add_argument("--task", default="cnn_dailymail", help="the run's task (default: cnn_dailymail)")
    p.add_argument("--settings", default="1x1,2x1,1x2",
                   help="PROCESSESxTHREADS, comma-separated (default: 1x1,2x1,1x2)")
    p.add_argument("--limit", type=int, default=32, help="examples (default: 32)")
    p.add_argument("--gamma", type=int, default=4, help="draft tokens per step (default: 4)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per example at most (default: 64)")
    p.add_argument("--batch-size", type=int, default=1, help="examples decoded together (default: 1)")
    p.add_argument("--seed", type=int, default=0, help="seed (default: 0)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--out", type=Path, default=None, help="JSON (default: results/bench/processes-<device>.json)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats of every setting (default: 3)")
    args = p.parse_args(argv)
    settings = parse_settings(args.settings)
    if args.repeats < 1:
        raise SpecsweepError(f"--repeats must be >= 1; got {args.repeats}")
    runs: dict[str, list[dict]] = {f"{pr}x{th}": [] for pr, th in settings}
    with tempfile.TemporaryDirectory(prefix="specsweep-bench-processes-") as tmp:
        for rep in range(args.repeats):
            for processes, threads in settings:
                run = run_setting(args, processes, threads, Path(tmp) / f"{processes}x{threads}.json")
                runs[run["setting"]].append(run)
                print(f"repeat {rep + 1}/{args.repeats}, {run['setting']}: {run['examples_per_s']:.2f} examples/s",
                      file=sys.stderr)
    first = next(iter(runs.values()))[0]["tokens"]
    same_tokens = all(r["tokens"] == first for reps in runs.values() for r in reps)
    base = next((k for k, (pr, _) in zip(runs, settings) if pr == 1), next(iter(runs)))
    rows = []
    for (name, reps), (processes, threads) in zip(runs.items(), settings):
        ratios = [r["examples_per_s"] / b["examples_per_s"] for r, b in zip(reps, runs[base])]   # paired by repeat
        speedup = median_ci(ratios).to_dict()
        rows.append({"setting": name, "processes": processes, "threads": threads, "samples": reps[0]["samples"],
                     "new_tokens": reps[0]["new_tokens"],
                     "examples_per_s": median_ci([r["examples_per_s"] for r in reps]).to_dict(),
                     "tokens_per_s": median_ci([r["tokens_per_s"] for r in reps]).to_dict(),
                     f"speedup_vs_{base}": speedup,
                     "scaling_efficiency": speedup["median"] / processes if threads == runs[base][0]["threads"]
                     else None,
                     "repeats": [{k: v for k, v in r.items() if k != "tokens"} for r in reps]})

    def cell(d):
        return f"{d['median']:.3f} [{d['ci_low']:.3f}, {d['ci_high']:.3f}]"

    table = format_table([{"setting": r["setting"], "samples": r["samples"], "new_tokens": r["new_tokens"],
                           "examples_per_s": cell(r["examples_per_s"]), "tokens_per_s": cell(r["tokens_per_s"]),
                           f"speedup_vs_{base}": cell(r[f"speedup_vs_{base}"]),
                           "scaling_efficiency": "-" if r["scaling_efficiency"] is None
                           else f"{r['scaling_efficiency']:.2f}"} for r in rows],
                         ["setting", "samples", "new_tokens", "examples_per_s", "tokens_per_s", f"speedup_vs_{base}",
                          "scaling_efficiency"])
    print(table)
    print(f"median over {args.repeats} interleaved repeats [order-statistic interval, "
          f"{rows[0]['examples_per_s']['ci_coverage']:.0%} coverage]; same tokens in every run: {same_tokens}")
    out = args.out or Path("results/bench") / f"processes-{args.device.split(':')[0]}.json"
    shown = {k: shown_path(getattr(args, k)) for k in ("target", "draft", "data")}
    write_json_atomic(out, {"benchmark": "processes", "settings": vars(args) | shown | {"out": str(out)}, "rows": rows,
                            "same_tokens": same_tokens, "provenance": provenance(args.device)})
    print(f"wrote {out}")
    return 0 if same_tokens else 1


if __name__ == "__main__":
    sys.exit(main())
