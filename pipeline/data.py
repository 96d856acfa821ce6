"""The paper's two tasks' data: fetch once (Hugging Face Hub or a local file), then read offline for runs.

Tasks and their records (what :func:`load_task_data` returns, one dict per example):

* ``cnn_dailymail`` (``abisee/cnn_dailymail``, config ``3.0.0``):
  ``{"id": str, "article": str, "highlights": str}``. ``highlights`` keeps the dataset's newlines between
  reference sentences (ROUGE-Lsum splits on them, see :mod:`pipeline.metrics`).
* ``librispeech`` (``openslr/librispeech_asr``, config ``clean``):
  ``{"id": str, "text": str, "audio": numpy.float32 [N], "duration": float}``: mono samples at
  :data:`SAMPLE_RATE` (16 kHz) in [-1, 1], ``duration = N / SAMPLE_RATE`` seconds. Whisper reads at most
  30 s: :func:`truncate_audio` cuts longer clips and says that it did.

Where data comes from:

* the Hub: ``datasets.load_dataset(..., streaming=True)``, so only the rows read are downloaded. Audio is
  read undecoded (``datasets.Audio(decode=False)``) and decoded here with soundfile (libsndfile ships in its
  wheel, so no FFmpeg or torchcodec is needed), downmixed to mono and resampled to 16 kHz with
  ``scipy.signal.resample_poly``. Before streaming, one metadata request (:data:`HUB_PROBE_TIMEOUT_S`)
  checks that the Hub answers and pins the dataset commit, so that no network fails in seconds with one
  line, not in a retry loop.
* a local file (``--source``): for ``cnn_dailymail`` a JSONL file of ``{"id", "article", "highlights"}``
  objects; for ``librispeech`` a JSONL manifest of ``{"id", "file", "text"}`` objects whose ``file`` (WAV,
  FLAC or anything else libsndfile reads) is relative to the manifest's folder (or absolute). ``id`` is
  optional in both (default: ``line-<n>`` / the file name's stem).

:func:`fetch` writes ``<out>/data.parquet`` (the records above; audio as a list<float32> column) and
``<out>/manifest.json`` (task, origin, selection rule, chosen ids), both atomically. :func:`load_task_data`
reads such a folder, the Parquet file itself, or a ``--source`` file directly.

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
import io
import json
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from pipeline.env_info import versions
from pipeline.errors import SpecsweepError
from pipeline.io import atomic_file, write_json_atomic

SAMPLE_RATE = 16_000
"""Sample rate (Hz) of every decoded audio array."""

MAX_AUDIO_SECONDS = 30.0
"""Whisper's input window: :func:`truncate_audio` cuts clips to this by default."""

HUB_PROBE_TIMEOUT_S = 5.0
"""Timeout of the one metadata request made before streaming from the Hub."""

DATA_FILE = "data.parquet"
MANIFEST_FILE = "manifest.json"


@dataclass(frozen=True)
class TaskSpec:
    """Where a task's data lives on the Hub and which fields its records carry."""

    name: str
    repo_id: str
    config: str
    hub_columns: tuple[str, ...]       # columns read from the Hub
    source_fields: tuple[str, ...]     # required keys of a --source JSONL line
    source_hint: str                   # the --source shape, for error messages


TASKS: dict[str, TaskSpec] = {
    "cnn_dailymail": TaskSpec("cnn_dailymail", "abisee/cnn_dailymail", "3.0.0", ("id", "article", "highlights"),
                              ("article", "highlights"), 'a JSONL file of {"id", "article", "highlights"} lines'),
    "librispeech": TaskSpec("librispeech", "openslr/librispeech_asr", "clean", ("id", "audio", "text"),
                            ("file", "text"), 'a JSONL manifest of {"id", "file", "text"} lines, audio files '
                                              'relative to it'),
}


def task_spec(task: str) -> TaskSpec:
    """The :class:`TaskSpec` of ``task``; a :class:`SpecsweepError` naming the known tasks otherwise."""
    try:
        return TASKS[task]
    except KeyError:
        raise SpecsweepError(f"unknown task {task!r}; known: {', '.join(TASKS)}") from None


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


# ------------------------------------------------------------------------------------------------ audio

def decode_audio(data: bytes | str | os.PathLike, *, name: str | None = None) -> np.ndarray:
    """Decode an audio file (path or its bytes) to mono float32 [N] at :data:`SAMPLE_RATE`.

    Channels are averaged; any other rate is resampled with ``scipy.signal.resample_poly`` (polyphase
    FIR, the exact rational ratio). ``name`` is used in error messages. An unreadable or empty file is a
    :class:`SpecsweepError`.
    """
    import soundfile as sf

    label = name or (str(data) if not isinstance(data, bytes) else "audio bytes")
    try:
        samples, rate = sf.read(io.BytesIO(data) if isinstance(data, bytes) else os.fspath(data),
                                dtype="float32", always_2d=True)
    except (sf.SoundFileError, RuntimeError, OSError) as e:
        raise SpecsweepError(f"{label}: cannot read audio ({_one_line(e)})") from None
    if samples.shape[0] == 0:
        raise SpecsweepError(f"{label}: audio file is empty (0 samples)")
    mono = samples.mean(axis=1, dtype=np.float32) if samples.shape[1] > 1 else samples[:, 0]
    if rate != SAMPLE_RATE:
        from scipy.signal import resample_poly

        g = math.gcd(int(rate), SAMPLE_RATE)
        mono = resample_poly(mono, SAMPLE_RATE // g, int(rate) // g).astype(np.float32, copy=False)
    return np.ascontiguousarray(mono, dtype=np.float32)


class TruncatedAudio(NamedTuple):
    """What :func:`truncate_audio` returns."""

    audio: np.ndarray         # float32 [min(N, max_seconds * sample_rate)]
    truncated: bool           # True when samples were cut off
    original_seconds: float   # duration before truncation


def truncate_audio(audio: np.ndarray, max_seconds: float = MAX_AUDIO_SECONDS,
                   sample_rate: int = SAMPLE_RATE) -> TruncatedAudio:
    """Cut ``audio`` (float32 [N]) to its first ``max_seconds`` (Whisper's 30 s window by default).

    Returns the (possibly shortened) array, whether it was cut, and the original duration, so the
    caller can count and report truncated examples. A clip of at most ``max_seconds`` is returned as is.
    """
    max_samples = round(max_seconds * sample_rate)
    original = audio.shape[0] / sample_rate
    if audio.shape[0] <= max_samples:
        return TruncatedAudio(audio, False, original)
    return TruncatedAudio(audio[:max_samples], True, original)


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


def _source_candidates(spec: TaskSpec, path: Path) -> Iterator[tuple[str, dict]]:
    """(id, undecoded row) for each line of a --source file. Audio rows carry ``audio_path``, checked to exist."""
    for n, obj in read_jsonl(path, spec.source_fields):
        if spec.name == "cnn_dailymail":
            example_id = obj.get("id", f"line-{n}")
            yield example_id, {"id": example_id, "article": obj["article"], "highlights": obj["highlights"]}
        else:
            audio_path = Path(obj["file"])
            if not audio_path.is_absolute():
                audio_path = path.parent / audio_path
            if not audio_path.is_file():
                raise SpecsweepError(f"{path} line {n}: audio file {obj['file']!r} does not exist "
                                     f"(looked for {audio_path})")
            example_id = obj.get("id", audio_path.stem)
            yield example_id, {"id": example_id, "text": obj["text"], "audio_path": audio_path}


def _finish_rows(spec: TaskSpec, rows: list[dict], progress: bool) -> list[dict]:
    """Undecoded rows -> records (decodes audio: ``audio_path`` or ``audio_bytes``)."""
    if spec.name != "librispeech":
        return rows
    from tqdm.auto import tqdm

    records = []
    for row in tqdm(rows, desc="decoding audio", unit="clip", disable=not progress or None, leave=False):
        if "audio_path" in row:
            audio = decode_audio(row["audio_path"])
        else:
            audio = decode_audio(row["audio_bytes"], name=f"audio of example {row['id']!r}")
        records.append({"id": row["id"], "text": row["text"], "audio": audio,
                        "duration": audio.shape[0] / SAMPLE_RATE})
    return records


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


def _hub_candidates(spec: TaskSpec, split: str, revision: str) -> tuple[Iterable[dict], int | None]:
    """The split streamed from the Hub (rows with :attr:`TaskSpec.hub_columns`) and its size when known."""
    import datasets

    try:
        ds = datasets.load_dataset(spec.repo_id, spec.config, split=split, streaming=True, revision=revision)
        if spec.name == "librispeech":
            ds = ds.cast_column("audio", datasets.Audio(decode=False))
        ds = ds.select_columns(list(spec.hub_columns))
    except Exception as e:
        raise SpecsweepError(f"cannot open {spec.repo_id} ({spec.config}, split {split!r}) on the Hub "
                             f"({type(e).__name__}: {_one_line(e)}); use --source PATH for local data") from None
    total = None
    with contextlib.suppress(AttributeError, KeyError, TypeError):
        total = ds.info.splits[split].num_examples
    return ds, total


def _hub_rows(spec: TaskSpec, rows: Iterable[dict]) -> Iterator[tuple[str, dict]]:
    """Hub rows -> (id, undecoded row); a dropped connection mid-stream becomes one line."""
    iterator = iter(rows)
    while True:
        try:
            row = next(iterator)
        except StopIteration:
            return
        except Exception as e:
            raise SpecsweepError(f"lost the Hub while streaming {spec.repo_id} ({type(e).__name__}: "
                                 f"{_one_line(e)}); use --source PATH for local data") from None
        example_id = str(row["id"])
        if spec.name == "cnn_dailymail":
            yield example_id, {"id": example_id, "article": row["article"], "highlights": row["highlights"]}
        else:
            audio = row["audio"] or {}
            data = audio.get("bytes")
            if data is None and audio.get("path") and Path(audio["path"]).is_file():
                data = Path(audio["path"]).read_bytes()
            if not data:
                raise SpecsweepError(f"{spec.repo_id}: example {example_id!r} has no audio bytes")
            yield example_id, {"id": example_id, "text": row["text"], "audio_bytes": data}


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
    spec = task_spec(task)
    out_dir = Path(out_dir)
    if source is not None:
        source = Path(source)
        if not source.is_file():
            raise SpecsweepError(f"--source {source} does not exist (or is not a file)")
        origin = {"kind": "local", "path": str(source.resolve()), "sha256": _sha256_file(source)}
        candidates, total = _source_candidates(spec, source), None
    else:
        revision = hub_probe(spec.repo_id)
        origin = {"kind": "hub", "repo_id": spec.repo_id, "config": spec.config, "split": split,
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
        raise SpecsweepError(f"{source or spec.repo_id}: no examples found (empty data file?)")
    records = _finish_rows(spec, [row for _, _, row in kept], progress)
    _write_parquet_atomic(out_dir / DATA_FILE, _records_to_table(spec, records))
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
    }
    if spec.name == "librispeech":
        durations = [r["duration"] for r in records]
        manifest.update(sample_rate=SAMPLE_RATE, total_seconds=round(sum(durations), 3),
                        max_seconds=round(max(durations), 3),
                        n_over_max_seconds=sum(d > MAX_AUDIO_SECONDS for d in durations))
    write_json_atomic(out_dir / MANIFEST_FILE, manifest)
    return manifest


# ------------------------------------------------------------------------------------------------ load

def load_task_data(task: str, path: str | os.PathLike, limit: int | None = None, seed: int | None = None,
                   *, progress: bool = False) -> list[dict]:
    """The records of ``task`` (see the module docstring for their fields) read without a network from:

    * a folder written by :func:`fetch` (its ``data.parquet``; its ``manifest.json`` must name ``task``),
    * a ``.parquet`` file written by :func:`fetch`,
    * a ``--source`` JSONL file / manifest (``.jsonl`` or ``.json``).

    ``limit``/``seed`` pick a subset by the same rule as :func:`fetch` (``seed=None``: the first ``limit``).
    Records come in the file's order. Bad or empty input is a one-line :class:`SpecsweepError`.
    """
    spec = task_spec(task)
    path = Path(path)
    if not path.exists():
        raise SpecsweepError(f"{path} does not exist")
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
        kept, _ = select_subset(((r["id"], r) for r in records), limit, seed)
        return [r for _, _, r in kept]
    if path.suffix in (".jsonl", ".json"):
        kept, _ = select_subset(_source_candidates(spec, path), limit, seed)
        if not kept:
            raise SpecsweepError(f"{path}: no examples (empty data file)")
        return _finish_rows(spec, [row for _, _, row in kept], progress)
    raise SpecsweepError(f"{path}: expected a folder written by `specsweep fetch`, a .parquet file, or "
                         f"{spec.source_hint}")


# --------------------------------------------------------------------------------------------- parquet

def _records_to_table(spec: TaskSpec, records: list[dict]):
    import pyarrow as pa

    if spec.name == "cnn_dailymail":
        return pa.table({k: pa.array([r[k] for r in records], pa.string()) for k in ("id", "article", "highlights")})
    lengths = np.array([r["audio"].shape[0] for r in records], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = np.concatenate([r["audio"] for r in records]).astype(np.float32, copy=False)
    audio = pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), pa.array(values, pa.float32()))
    return pa.table({
        "id": pa.array([r["id"] for r in records], pa.string()),
        "text": pa.array([r["text"] for r in records], pa.string()),
        "audio": audio,
        "duration": pa.array([r["duration"] for r in records], pa.float64()),
    })


def _read_parquet(spec: TaskSpec, path: Path) -> list[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise SpecsweepError(f"{path}: cannot read Parquet ({_one_line(e)})") from None
    needed = ("id", "article", "highlights") if spec.name == "cnn_dailymail" else ("id", "text", "audio")
    missing = [c for c in needed if c not in table.column_names]
    if missing:
        raise SpecsweepError(f"{path}: not {spec.name} data (missing column(s) {', '.join(missing)})")
    if spec.name == "cnn_dailymail":
        columns = {c: table.column(c).to_pylist() for c in needed}
        return [dict(zip(needed, values)) for values in zip(*columns.values())]
    ids, texts = table.column("id").to_pylist(), table.column("text").to_pylist()
    audios: list[np.ndarray] = []
    for chunk in table.column("audio").chunks:
        offsets = chunk.offsets.to_numpy()
        values = chunk.values.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
        audios.extend(values[offsets[i]:offsets[i + 1]].copy() for i in range(len(chunk)))
    return [{"id": i, "text": t, "audio": a, "duration": a.shape[0] / SAMPLE_RATE}
            for i, t, a in zip(ids, texts, audios)]


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
