"""`specsweep fetch`: download (or copy from a local file) a task's data once, for offline runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.errors import SpecsweepError
from pipeline.tasks import FETCHABLE, get_task

HELP = (f"fetch a task's data ({', '.join(get_task(name).display for name in FETCHABLE)}) from the Hub or a local "
        "file into local Parquet")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", required=True, choices=FETCHABLE,
                        help=" or ".join(f"{name} ({get_task(name).hub.repo_id} {get_task(name).hub.config})"
                                         for name in FETCHABLE))
    parser.add_argument("--split", default="test", help="dataset split (default: test)")
    parser.add_argument("--limit", type=int, default=None, help="keep N examples (default: all)")
    parser.add_argument("--seed", type=int, default=0,
                        help="which N: the N smallest sha256('<seed>:<id>') keys; the same seed always picks "
                             "the same examples (default: 0)")
    parser.add_argument("--pool", type=int, default=None,
                        help="choose among the first K rows only (reads less of a streamed split; "
                             "default: the whole split)")
    parser.add_argument("--source", type=Path, default=None,
                        help="read a local file instead of the Hub: "
                             + " or ".join(f"{get_task(name).source_hint} ({name})" for name in FETCHABLE))
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder for data.parquet and manifest.json (default: data/<task>/<split>)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def main(args: argparse.Namespace) -> int:
    from pipeline import data

    if args.limit is not None and args.limit < 1:
        raise SpecsweepError(f"--limit must be >= 1; got {args.limit}")
    out = args.out or Path("data") / args.task / args.split
    manifest = data.fetch(args.task, out, split=args.split, limit=args.limit, seed=args.seed, pool=args.pool,
                          source=args.source, progress=not args.no_progress)
    origin = manifest["origin"]
    where = (f"{origin['repo_id']}@{origin['revision'][:12]}" if origin["kind"] == "hub" else origin["path"])
    print(f"wrote {out / data.DATA_FILE}: {manifest['n_records']} of {manifest['n_candidates']} examples "
          f"from {where}{get_task(args.task).fetch_summary(manifest)}; ids in {out / data.MANIFEST_FILE}")
    return 0
