"""Task data: fetch once (Hugging Face Hub or a local file), then read offline for runs.

Generic over tasks: each task (pipeline/tasks/) says where its data lives on the Hub, what a ``--source`` JSONL
line holds, how a Hub row or a source line becomes a record, and how records become a Parquet table and back;
its module documents its records. This module reads, picks the subset, writes and keeps the manifest.

Where data comes from:

* the Hub: ``datasets.load_dataset(..., streaming=True)``, so only the rows read are downloaded (the task may
  prepare the stream, e.g. leave audio undecoded). Before streaming, one metadata request
  (:data:`HUB_PROBE_TIMEOUT_S`) checks that the Hub answers and pins the dataset commit, so that no network
  fails in seconds with one line, not in a retry loop.
* a published file (a task's ``url``, e.g. Spec-Bench's question.jsonl pinned at a commit): one GET
  (:data:`URL_TIMEOUT_S`), read as a ``--source`` file; no network fails in seconds with one line.
* a local file (``--source``): a JSONL file of the task's ``source_fields`` (``id`` optional in each line).

:func:`fetch` writes ``<out>/data.parquet`` (the records) and ``<out>/manifest.json`` (task, origin, selection
rule, chosen ids), both atomically. :func:`load_task_data` reads such a folder, the Parquet file itself, or a
``--source`` file directly (a task without Hub data, such as ``prompts``, reads its JSONL file only); a task with
categories (``spec_bench``) keeps the ones asked for, and the first N of each, before any ``limit``.

Deterministic subsets (``limit`` with ``seed``): every candidate row gets the key
``sha256(f"{seed}:{id}")`` (first 8 bytes, big-endian); the ``limit`` rows with the smallest keys are kept
(ties, i.e. duplicate ids, broken by position) and returned in their original order. This is bottom-k
sampling: one pass over the candidates, memory O(limit), the same rows whatever order the rows arrive in,
the same rows from the Hub and from a local copy holding the same ids, and with a fixed seed a larger
``limit`` keeps every row a smaller one kept. Candidates are the whole split, or its first ``pool`` rows
when ``pool`` is given (which reads less of a streamed split). ``limit`` without ``seed`` keeps the first
``limit`` rows.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pipeline.env_info import versions
from pipeline.errors import SpecsweepError
from pipeline.io import atomic_file, write_json_atomic
from pipeline.tasks import Task, get_task

HUB_PROBE_TIMEOUT_S = 5.0
"""Timeout of the one metadata request made before streaming from the Hub."""

URL_TIMEOUT_S = 10.0
"""Timeout of the connection to (and of each read from) a task's published file."""

DATA_FILE = "data.parquet"
MANIFEST_FILE = "manifest.json"


# ---------------------------------------------------------------------------------------------- subsets

def subset_key(seed: int, example_id: str) -> int:
    """The selection key of one example: the first 8 bytes of ``sha256(f"{seed}:{id}")`` as an int."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{example_id}".encode()).digest()[:8], "big")


def select_subset(items: Iterable[tuple[str, Any]], limit: int | None, seed: int | None,
                  pool: int | None = None) -> tuple[list[tuple[int, str, Any]], int]:
    """Pick the rows to keep from ``(id, payload)`` pairs, in one pass (see the module docstring).

    Returns ``([(position, id, payload), ...] in position order, number of candidates seen)``.
    ``limit=None`` keeps every candidate; ``seed=None`` keeps the first ``limit``; ``pool`` caps the
    candidates to the first ``pool`` items.
    """
    if limit is not None and limit < 1:
        raise SpecsweepError(f"--limit must be >= 1; got {limit}")
    if pool is not None and pool < 1:
        raise SpecsweepError(f"--pool must be >= 1; got {pool}")
    kept: list[tuple[int, str, Any]] = []
    heap: list[tuple[int, int, str, Any]] = []  # max-heap on (key, position) via negation
    seen = 0
    for position, (example_id, payload) in enumerate(items):
        if pool is not None and position >= pool:
            break
        seen += 1
        if limit is None:
            kept.append((position, example_id, payload))
        elif seed is None:
            kept.append((position, example_id, payload))
            if len(kept) >= limit:
                break
        else:
            entry = (-subset_key(seed, example_id), -position, example_id, payload)
            if len(heap) < limit:
                heapq.heappush(heap, entry)
            elif entry[:2] > heap[0][:2]:
                heapq.heapreplace(heap, entry)
    if heap:
        kept = sorted(((-neg_pos, example_id, payload) for _, neg_pos, example_id, payload in heap),
                      key=lambda t: t[0])
    return kept, seen


# -------------------------------------------------------------------------------------- local sources

def read_jsonl(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a JSONL file, checked to hold ``required`` strings."""
    try:
        f = path.open(encoding="utf-8")
    except OSError as e:
        raise SpecsweepError(f"{path}: cannot open ({_one_line(e)})") from None
    with f:
        try:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SpecsweepError(f"{path} line {n}: invalid JSON ({e.msg} at column {e.colno})") from None
                if not isinstance(obj, dict):
                    raise SpecsweepError(f"{path} line {n}: expected a JSON object, got {type(obj).__name__}")
                missing = [k for k in required if k not in obj]
                if missing:
                    raise SpecsweepError(f"{path} line {n}: missing field(s) {', '.join(map(repr, missing))}; "
                                         f"each line needs {', '.join(map(repr, required))}")
                for k in (*required, "id"):
                    if k in obj and not isinstance(obj[k], str):
                        raise SpecsweepError(f"{path} line {n}: field {k!r} must be a string, "
                                             f"got {type(obj[k]).__name__}")
                yield n, obj
        except UnicodeDecodeError as e:
            raise SpecsweepError(f"{path}: not UTF-8 text ({_one_line(e)})") from None


def _source_candidates(task: Task, path: Path) -> Iterator[tuple[str, dict]]:
    """(id, undecoded row) for each line of a --source file (the task's ``source_row``)."""
    for n, obj in read_jsonl(path, task.source_fields):
        row = task.source_row(obj, n, path)
        yield row["id"], row


# ------------------------------------------------------------------------------------------------- hub

def _hub_offline() -> bool:
    truthy = {"1", "ON", "YES", "TRUE"}
    if any(os.environ.get(v, "").upper() in truthy for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        return True
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _hub_endpoint() -> str:
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def hub_probe(repo_id: str, *, timeout: float = HUB_PROBE_TIMEOUT_S) -> str:
    """One metadata request: the dataset's current commit sha, or a one-line :class:`SpecsweepError` (offline
    mode, Hub unreachable, dataset missing or gated) naming ``--source`` as the offline alternative.

    Reads ``HF_ENDPOINT`` and ``HF_HUB_OFFLINE`` at call time; never retries.
    """
    task_hint = "use --source PATH (a local copy) instead"
    if _hub_offline():
        raise SpecsweepError(f"offline mode is on (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE): cannot fetch {repo_id} "
                             f"from the Hugging Face Hub; {task_hint}")
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    endpoint = _hub_endpoint()
    try:
        info = HfApi(endpoint=endpoint).dataset_info(repo_id, timeout=timeout)
    except HfHubHTTPError as e:
        raise SpecsweepError(f"the Hugging Face Hub refused {repo_id} ({_one_line(e)}); {task_hint}") from None
    except Exception as e:  # connection refused, DNS failure, timeout: whatever the HTTP client raises
        raise SpecsweepError(f"cannot reach the Hugging Face Hub at {endpoint} to fetch {repo_id} "
                             f"({type(e).__name__}: {_one_line(e)}); no network? {task_hint}") from None
    return info.sha or "main"


def _hub_candidates(task: Task, split: str, revision: str) -> tuple[Iterable[dict], int | None]:
    """The split streamed from the Hub (rows with the task's Hub columns) and its size when known."""
    import datasets

    hub = task.hub
    try:
        ds = datasets.load_dataset(hub.repo_id, hub.config, split=split, streaming=True, revision=revision)
        ds = task.hub_stream(ds).select_columns(list(hub.columns))
    except Exception as e:
        raise SpecsweepError(f"cannot open {hub.repo_id} ({hub.config}, split {split!r}) on the Hub "
                             f"({type(e).__name__}: {_one_line(e)}); use --source PATH for local data") from None
    total = None
    with contextlib.suppress(AttributeError, KeyError, TypeError):
        total = ds.info.splits[split].num_examples
    return ds, total


def _hub_rows(task: Task, rows: Iterable[dict]) -> Iterator[tuple[str, dict]]:
    """Hub rows -> (id, undecoded row) (the task's ``hub_row``); a dropped connection mid-stream becomes one
    line."""
    iterator = iter(rows)
    while True:
        try:
            row = next(iterator)
        except StopIteration:
            return
        except Exception as e:
            raise SpecsweepError(f"lost the Hub while streaming {task.hub.repo_id} ({type(e).__name__}: "
                                 f"{_one_line(e)}); use --source PATH for local data") from None
        row = task.hub_row(row)
        yield row["id"], row


# ------------------------------------------------------------------------------------------ published file

def download(url: str, *, timeout: float = URL_TIMEOUT_S) -> bytes:
    """The bytes at ``url`` (one GET, no retries), or a one-line :class:`SpecsweepError` naming ``--source`` as the
    offline alternative."""
    import urllib.error
    import urllib.request

    hint = "use --source PATH (a local copy) instead"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read()
    except urllib.error.HTTPError as e:
        raise SpecsweepError(f"{url} answered HTTP {e.code} ({_one_line(e.reason)}); {hint}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise SpecsweepError(f"cannot download {url} ({type(e).__name__}: {_one_line(reason)}); no network? "
                             f"{hint}") from None


def _url_candidates(task: Task, folder: Path) -> tuple[Iterator[tuple[str, dict]], dict]:
    """The task's published file, downloaded into ``folder`` -> (its candidates, as a --source file's; its origin
    record for the manifest)."""
    data = download(task.url)
    path = folder / Path(task.url.split("?")[0]).name
    path.write_bytes(data)
    return _source_candidates(task, path), {"kind": "url", "url": task.url,
                                            "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


# ----------------------------------------------------------------------------------------------- fetch

def fetch(task: str, out_dir: str | os.PathLike, *, split: str = "test", limit: int | None = None,
          seed: int | None = 0, pool: int | None = None, source: str | os.PathLike | None = None,
          progress: bool = True) -> dict:
    """Fetch ``task``'s ``split`` (from the Hub, or from ``source``) and write it for offline runs.

    Writes ``<out_dir>/data.parquet`` and ``<out_dir>/manifest.json`` atomically and returns the manifest:
    ``{"task", "split", "origin": {...}, "selection": {...}, "n_candidates", "n_records", "ids", "positions",
    "created", "versions", ...}`` (``positions``: each chosen row's 0-based position among the candidates).
    See the module docstring for the subset rule.
    """
    spec = get_task(task)
    if not spec.fetchable:
        raise SpecsweepError(f"task {task!r} has no data to fetch: it reads {spec.source_hint} directly")
    out_dir = Path(out_dir)
    with tempfile.TemporaryDirectory(prefix="specsweep-fetch-") as scratch:
        return _fetch(spec, out_dir, split, limit, seed, pool, source, progress, Path(scratch))


def _fetch(spec: Task, out_dir: Path, split: str, limit: int | None, seed: int | None, pool: int | None,
           source: str | os.PathLike | None, progress: bool, scratch: Path) -> dict:
    """:func:`fetch` of the task ``spec``; ``scratch``: a folder for a downloaded file."""
    task = spec.name
    if source is not None:
        source = Path(source)
        if not source.is_file():
            raise SpecsweepError(f"--source {source} does not exist (or is not a file)")
        origin = {"kind": "local", "path": str(source.resolve()), "sha256": _sha256_file(source)}
        candidates, total = _source_candidates(spec, source), None
    elif spec.hub is None:
        candidates, origin = _url_candidates(spec, scratch)
        total = None
    else:
        revision = hub_probe(spec.hub.repo_id)
        origin = {"kind": "hub", "repo_id": spec.hub.repo_id, "config": spec.hub.config, "split": split,
                  "revision": revision, "endpoint": _hub_endpoint()}
        rows, total = _hub_candidates(spec, split, revision)
        candidates = _hub_rows(spec, rows)
    from tqdm.auto import tqdm

    if pool is not None and total is not None:
        total = min(total, pool)
    bar = tqdm(candidates, total=total, desc=f"reading {task}", unit="row", disable=not progress or None)
    kept, seen = select_subset(bar, limit, seed, pool)
    bar.close()
    if not kept:
        where = source or (spec.hub.repo_id if spec.hub is not None else spec.url)
        raise SpecsweepError(f"{where}: no examples found (empty data file?)")
    records = spec.finish([row for _, _, row in kept], progress)
    _write_parquet_atomic(out_dir / DATA_FILE, spec.to_table(records))
    manifest = {
        "task": task,
        "split": split,
        "origin": origin,
        "selection": {"limit": limit, "seed": seed if limit is not None else None, "pool": pool,
                      "rule": ("all candidates" if limit is None else
                               f"first {limit}" if seed is None else
                               f"the {limit} smallest keys sha256('<seed>:<id>')[:8], in candidate order")},
        "n_candidates": seen,
        "n_records": len(records),
        "ids": [example_id for _, example_id, _ in kept],
        "positions": [position for position, _, _ in kept],
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": versions(),
        "data_file": DATA_FILE,
        **spec.manifest_extra(records),
    }
    write_json_atomic(out_dir / MANIFEST_FILE, manifest)
    return manifest


# ------------------------------------------------------------------------------------------------ load

def load_task_data(task: str, path: str | os.PathLike, limit: int | None = None, seed: int | None = None,
                   *, progress: bool = False, categories: list[str] | None = None,
                   per_category: int | None = None) -> list[dict]:
    """The records of ``task`` (its module in pipeline/tasks/ documents their fields) read without a network from:

    * a folder written by :func:`fetch` (its ``data.parquet``; its ``manifest.json`` must name ``task``),
    * a ``.parquet`` file written by :func:`fetch`,
    * a ``--source`` JSONL file / manifest (``.jsonl`` or ``.json``), the only input of a task without Hub data.

    ``categories``/``per_category`` keep those categories and the first N records of each (a task with categories,
    :meth:`pipeline.tasks.base.Task.select`); then ``limit``/``seed`` pick a subset by the same rule as
    :func:`fetch` (``seed=None``: the first ``limit``). Records come in the file's order. Bad or empty input is a
    one-line :class:`SpecsweepError`.
    """
    spec = get_task(task)
    path = Path(path)
    if not path.exists():
        raise SpecsweepError(f"{path} does not exist")
    if not spec.fetchable and (path.is_dir() or path.suffix not in (".jsonl", ".json")):
        raise SpecsweepError(f"--task {task} reads {spec.source_hint}; got {path}")
    if path.is_dir():
        manifest_path = path / MANIFEST_FILE
        if manifest_path.is_file():
            try:
                recorded = json.loads(manifest_path.read_text(encoding="utf-8")).get("task")
            except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
                raise SpecsweepError(f"{manifest_path}: not a valid manifest ({_one_line(e)})") from None
            if recorded != task:
                raise SpecsweepError(f"{path} holds data of task {recorded!r}, not {task!r}")
        if not (path / DATA_FILE).is_file():
            raise SpecsweepError(f"{path} has no {DATA_FILE}: run `specsweep fetch --task {task} --out {path}`")
        path = path / DATA_FILE
    if path.suffix == ".parquet":
        records = _read_parquet(spec, path)
        if not records:
            raise SpecsweepError(f"{path}: no examples (empty data file)")
        records = spec.select(records, categories, per_category)
        kept, _ = select_subset(((r["id"], r) for r in records), limit, seed)
        return [r for _, _, r in kept]
    if path.suffix in (".jsonl", ".json"):
        candidates: Iterable[tuple[str, dict]] = _source_candidates(spec, path)
        if categories is not None or per_category is not None:
            rows = [row for _, row in candidates]
            candidates = ((row["id"], row) for row in spec.select(rows, categories, per_category))
        kept, _ = select_subset(candidates, limit, seed)
        if not kept:
            raise SpecsweepError(f"{path}: no examples (empty data file)")
        return spec.finish([row for _, _, row in kept], progress)
    raise SpecsweepError(f"{path}: expected a folder written by `specsweep fetch`, a .parquet file, or "
                         f"{spec.source_hint}")


# --------------------------------------------------------------------------------------------- parquet

def _read_parquet(task: Task, path: Path) -> list[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise SpecsweepError(f"{path}: cannot read Parquet ({_one_line(e)})") from None
    missing = [c for c in task.columns if c not in table.column_names]
    if missing:
        raise SpecsweepError(f"{path}: not {task.name} data (missing column(s) {', '.join(missing)})")
    return task.from_table(table)


def _write_parquet_atomic(path: Path, table) -> Path:
    """Write a pyarrow table to ``path`` atomically (see pipeline.io.atomic_file)."""
    import pyarrow.parquet as pq

    with atomic_file(path, "wb") as f:
        pq.write_table(table, f)
    return path


# ----------------------------------------------------------------------------------------------- misc

def _one_line(e: BaseException | str, limit: int = 200) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
