"""Data-parallel runs: examples/s of the quality pass with 1 and N processes (``specsweep run --processes N``).

    python -m pipeline.benchmarks.processes --target T --draft D --data test.jsonl [--settings 1x1,2x1,1x2]

Each setting ``PxT`` is one ``specsweep run`` in a fresh process tree: P processes (``--processes P``, started by
accelerate) with T torch threads each, every one with per-example randomness (so all settings decode the same
tokens, which is checked). The figure that counts is the quality pass's examples/s: samples / the slowest rank's
seconds inside ``generate`` (``metrics.wall_time_s`` of a data-parallel run). The command's own wall time
(process start, model loading, the gather, rank 0's paired speed measurement, scoring) is recorded beside it.
Writes a table and ``results/bench/processes-<device>.json``; the scaling efficiency is rate(P) / (P x rate(1)).
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
from pipeline.errors import SpecsweepError
from pipeline.io import write_json_atomic


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
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    args = p.parse_args(argv)
    settings = parse_settings(args.settings)
    rows = []
    with tempfile.TemporaryDirectory(prefix="specsweep-bench-processes-") as tmp:
        for processes, threads in settings:
            rows.append(run_setting(args, processes, threads, Path(tmp) / f"{processes}x{threads}.json"))
            print(f"{rows[-1]['setting']}: {rows[-1]['examples_per_s']:.2f} examples/s", file=sys.stderr)
    same_tokens = all(r["tokens"] == rows[0]["tokens"] for r in rows)
    base = next((r for r in rows if r["processes"] == 1), rows[0])
    for r in rows:
        r["speedup_vs_" + base["setting"]] = r["examples_per_s"] / base["examples_per_s"]
        r["scaling_efficiency"] = r["examples_per_s"] / (r["processes"] * base["examples_per_s"]) \
            if base["threads"] == r["threads"] else None
        del r["tokens"]
    table = format_table([{**r, **{k: f"{v:.3f}" if isinstance(v, float) else v for k, v in r.items()},
                           "rank_wall_s": " ".join(f"{w:.2f}" for w in r["rank_wall_s"])} for r in rows],
                         ["setting", "samples", "new_tokens", "pass_wall_s", "rank_wall_s", "examples_per_s",
                          "tokens_per_s", f"speedup_vs_{base['setting']}", "scaling_efficiency", "command_s"])
    print(table)
    print(f"same tokens in every setting: {same_tokens}")
    out = args.out or Path("results/bench") / f"processes-{args.device.split(':')[0]}.json"
    shown = {k: shown_path(getattr(args, k)) for k in ("target", "draft", "data")}
    write_json_atomic(out, {"benchmark": "processes", "settings": vars(args) | shown | {"out": str(out)}, "rows": rows,
                            "same_tokens": same_tokens, "provenance": provenance(args.device)})
    print(f"wrote {out}")
    return 0 if same_tokens else 1


if __name__ == "__main__":
    sys.exit(main())
