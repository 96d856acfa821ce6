"""`specsweep speak`: synthesise a speech corpus from text with eSpeak NG (pipeline/espeak.py), written in the
``librispeech`` task's source schema (a JSONL manifest beside WAV files), e.g. audio to distil a Whisper draft on."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipeline.data import DATA_FILE
from pipeline.errors import SpecsweepError

HELP = ("synthesise speech from text with eSpeak NG into a folder of WAV clips and a transcripts.jsonl manifest "
        "that --task librispeech reads (e.g. audio to distil a Whisper draft on)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--texts", type=Path, required=True,
                   help="a JSONL file, or a folder written by `specsweep fetch`, whose --field holds prose (e.g. "
                        "CNN/DailyMail's, field article)")
    p.add_argument("--field", default="text", help="the JSON field that holds the text (default: text)")
    p.add_argument("--out", type=Path, required=True, help="the corpus folder (must not exist or be empty)")
    p.add_argument("--clips", type=int, default=100, help="clips to speak (default: 100)")
    p.add_argument("--words", type=int, default=45,
                   help="words per clip, at least (whole sentences; a clip stays within Whisper's 30 s; default: 45)")
    p.add_argument("--seed", type=int, default=0, help="which sentences, voices and rates (default: 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def read_texts(path: Path, field: str) -> list[str]:
    """The ``field`` of each JSON line of ``path``, or of each row of a folder written by `specsweep fetch` (its
    data.parquet); a one-line SpecsweepError when the file or the field is missing."""
    if path.is_dir():
        if not (path / DATA_FILE).is_file():
            raise SpecsweepError(f"--texts {path} is a folder without {DATA_FILE}: give a JSONL file or a folder "
                                 "written by specsweep fetch")
        import pyarrow.parquet as pq

        table = pq.read_table(path / DATA_FILE)
        if field not in table.column_names:
            raise SpecsweepError(f"{path} has no column {field!r} (it has {', '.join(table.column_names)}): name the "
                                 "field with --field")
        return [t for t in table.column(field).to_pylist() if isinstance(t, str)]
    if not path.is_file():
        raise SpecsweepError(f"--texts {path} does not exist: give a JSONL file or a folder written by specsweep "
                             "fetch")
    texts = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line).get(field)
        except (json.JSONDecodeError, AttributeError):
            raise SpecsweepError(f"{path} line {n} is not a JSON object: give a JSONL file") from None
        if not isinstance(value, str):
            raise SpecsweepError(f"{path} line {n} has no text field {field!r}: name the field with --field")
        texts.append(value)
    if not texts:
        raise SpecsweepError(f"{path} has no lines: give a JSONL file with a text field")
    return texts


def main(args: argparse.Namespace) -> int:
    from pipeline.espeak import write_corpus  # kept local: imports numpy and scipy

    if args.clips < 1 or args.words < 1:
        raise SpecsweepError(f"--clips and --words must be >= 1; got {args.clips}, {args.words}")
    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        raise SpecsweepError(f"--out {args.out} exists and is not an empty folder: give a new folder")
    record = write_corpus(read_texts(args.texts, args.field), args.out, args.clips, args.words, args.seed,
                          progress=not args.no_progress)
    print(f"wrote {record['clips']} clips ({record['seconds'] / 60:.1f} min of speech, voices "
          f"{', '.join(record['voices'])}) to {args.out}/transcripts.jsonl")
    return 0
