"""`specsweep fetch` through pipeline.cli.main: outputs, one-line errors with exit code 2, and the Hub path
failing fast with the network made unreachable (a loopback port nothing listens on: no outbound request)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import soundfile as sf

from pipeline.cli import main


def run(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code, err, *needles):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("specsweep fetch: error: ")
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture
def offline_hub(monkeypatch):
    """The Hub endpoint points at a closed loopback port, as when there is no network."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)


@pytest.mark.parametrize("task", ["cnn_dailymail", "librispeech"])
def test_hub_unreachable_fails_fast_with_one_line(offline_hub, tmp_path, capsys, task):
    start = time.monotonic()
    code, _, err = run(["fetch", "--task", task, "--limit", "3", "--out", str(tmp_path / "out")], capsys)
    assert time.monotonic() - start < 10
    assert_one_line_error(code, err, "cannot reach the Hugging Face Hub", "http://127.0.0.1:9", "--source")
    assert not (tmp_path / "out").exists()


def test_hub_offline_mode_fails_with_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = run(["fetch", "--task", "cnn_dailymail", "--out", str(tmp_path / "out")], capsys)
    assert_one_line_error(code, err, "offline", "--source")


def test_fetch_cnn_from_source(tmp_path, capsys):
    src = tmp_path / "cnn.jsonl"
    src.write_text("".join(json.dumps({"id": f"n{i}", "article": f"a {i}", "highlights": f"h {i}"}) + "\n"
                           for i in range(20)), encoding="utf-8")
    out = tmp_path / "out"
    code, stdout, _ = run(["fetch", "--task", "cnn_dailymail", "--source", str(src), "--limit", "5", "--seed", "3",
                           "--out", str(out), "--no-progress"], capsys)
    assert code == 0 and "5 of 20 examples" in stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["selection"] == {"limit": 5, "seed": 3, "pool": None, "rule": manifest["selection"]["rule"]}
    assert len(manifest["ids"]) == 5 and set(manifest["ids"]) <= {f"n{i}" for i in range(20)}
    # the same command again picks the same ids; another seed picks others
    run(["fetch", "--task", "cnn_dailymail", "--source", str(src), "--limit", "5", "--seed", "3",
         "--out", str(tmp_path / "again"), "--no-progress"], capsys)
    run(["fetch", "--task", "cnn_dailymail", "--source", str(src), "--limit", "5", "--seed", "4",
         "--out", str(tmp_path / "other"), "--no-progress"], capsys)
    assert json.loads((tmp_path / "again" / "manifest.json").read_text())["ids"] == manifest["ids"]
    assert json.loads((tmp_path / "other" / "manifest.json").read_text())["ids"] != manifest["ids"]


def test_fetch_real_fixtures(fixtures_dir, tmp_path, capsys):
    code, stdout, _ = run(["fetch", "--task", "librispeech", "--source", str(fixtures_dir / "librispeech" /
                                                                             "transcripts.jsonl"),
                           "--out", str(tmp_path / "ls"), "--no-progress"], capsys)
    assert code == 0 and "4 of 4 examples" in stdout
    code, stdout, _ = run(["fetch", "--task", "cnn_dailymail", "--source", str(fixtures_dir / "cnn_dailymail" /
                                                                               "test.jsonl"),
                           "--limit", "8", "--out", str(tmp_path / "cnn"), "--no-progress"], capsys)
    assert code == 0 and "8 of 80 examples" in stdout


# ------------------------------------------------------------------------------------------- bad input


def cnn_error(tmp_path, capsys, text):
    src = tmp_path / "bad.jsonl"
    src.write_text(text, encoding="utf-8")
    code, _, err = run(["fetch", "--task", "cnn_dailymail", "--source", str(src), "--out", str(tmp_path / "o"),
                        "--no-progress"], capsys)
    return code, err


def test_missing_article(tmp_path, capsys):
    code, err = cnn_error(tmp_path, capsys, '{"article": "a", "highlights": "h"}\n{"id": "2", "highlights": "h"}\n')
    assert_one_line_error(code, err, "bad.jsonl line 2", "'article'")


def test_missing_highlights(tmp_path, capsys):
    code, err = cnn_error(tmp_path, capsys, '{"article": "a"}\n')
    assert_one_line_error(code, err, "line 1", "'highlights'")


def test_invalid_json(tmp_path, capsys):
    code, err = cnn_error(tmp_path, capsys, '{"article": "a", "highlights": "h"}\n\n{"article": "b",\n')
    assert_one_line_error(code, err, "bad.jsonl line 3", "invalid JSON")


def test_empty_data_file(tmp_path, capsys):
    code, err = cnn_error(tmp_path, capsys, "\n")
    assert_one_line_error(code, err, "bad.jsonl", "empty")


def test_source_does_not_exist(tmp_path, capsys):
    code, _, err = run(["fetch", "--task", "cnn_dailymail", "--source", str(tmp_path / "nope.jsonl"),
                        "--out", str(tmp_path / "o")], capsys)
    assert_one_line_error(code, err, "nope.jsonl", "does not exist")


def asr_error(tmp_path, capsys, lines, files=None):
    for name, content in (files or {}).items():
        if isinstance(content, bytes):
            (tmp_path / name).write_bytes(content)
        else:
            sf.write(tmp_path / name, content, 16_000)
    src = tmp_path / "manifest.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    code, _, err = run(["fetch", "--task", "librispeech", "--source", str(src), "--out", str(tmp_path / "o"),
                        "--no-progress"], capsys)
    return code, err


def test_missing_file_field(tmp_path, capsys):
    code, err = asr_error(tmp_path, capsys, [{"id": "x", "text": "HELLO"}])
    assert_one_line_error(code, err, "manifest.jsonl line 1", "'file'")


def test_missing_text_field(tmp_path, capsys):
    code, err = asr_error(tmp_path, capsys, [{"file": "a.wav", "text": "A"}, {"file": "a.wav"}],
                          {"a.wav": np.zeros(1600, dtype=np.float32)})
    assert_one_line_error(code, err, "manifest.jsonl line 2", "'text'")


def test_manifest_audio_path_does_not_exist(tmp_path, capsys):
    code, err = asr_error(tmp_path, capsys, [{"id": "x", "file": "missing.flac", "text": "HELLO"}])
    assert_one_line_error(code, err, "manifest.jsonl line 1", "missing.flac", "does not exist")


def test_unreadable_audio(tmp_path, capsys):
    code, err = asr_error(tmp_path, capsys, [{"id": "x", "file": "junk.wav", "text": "HELLO"}],
                          {"junk.wav": b"this is not a wav file at all"})
    assert_one_line_error(code, err, "junk.wav", "cannot read audio")


def test_empty_audio(tmp_path, capsys):
    code, err = asr_error(tmp_path, capsys, [{"id": "x", "file": "empty.wav", "text": "HELLO"}],
                          {"empty.wav": np.zeros(0, dtype=np.float32)})
    assert_one_line_error(code, err, "empty.wav", "empty")


def test_bad_limit(tmp_path, capsys):
    code, _, err = run(["fetch", "--task", "cnn_dailymail", "--limit", "0", "--out", str(tmp_path / "o")], capsys)
    assert_one_line_error(code, err, "--limit")


def test_prefer_source_reads_the_file_when_it_exists_else_goes_to_the_usual_origin(offline_hub, tmp_path, capsys):
    """The real profile's data stage: the fixtures when present, else the Hub (here unreachable: its one line)."""
    src = tmp_path / "cnn.jsonl"
    src.write_text("".join(json.dumps({"id": f"n{i}", "article": f"a {i}", "highlights": f"h {i}"}) + "\n"
                           for i in range(6)), encoding="utf-8")
    code, stdout, err = run(["fetch", "--task", "cnn_dailymail", "--prefer-source", str(src), "--limit", "4",
                             "--out", str(tmp_path / "local"), "--no-progress"], capsys)
    assert code == 0 and "4 of 6 examples" in stdout and f"reading the local file {src}" in err
    origin = json.loads((tmp_path / "local" / "manifest.json").read_text())["origin"]
    assert origin["kind"] == "local" and origin["path"].endswith("cnn.jsonl"), origin
    missing = tmp_path / "absent.jsonl"
    code, _, err = run(["fetch", "--task", "cnn_dailymail", "--prefer-source", str(missing), "--limit", "4",
                        "--out", str(tmp_path / "hub")], capsys)
    first, *rest = err.strip().splitlines()
    assert first == f"--prefer-source: {missing} does not exist; fetching from abisee/cnn_dailymail 3.0.0"
    assert_one_line_error(code, "\n".join(rest), "cannot reach the Hugging Face Hub")
    assert not (tmp_path / "hub").exists()


@pytest.mark.parametrize("extra, needle", [(["--source", "x.jsonl"], "exclude each other"),
                                           (["--prefer-source", "."], "is not a file")])
def test_prefer_source_refusals_are_one_line(tmp_path, capsys, extra, needle):
    argv = ["fetch", "--task", "cnn_dailymail", "--out", str(tmp_path / "o"), *extra]
    if "--source" in extra:
        argv += ["--prefer-source", str(tmp_path)]
    code, _, err = run(argv, capsys)
    assert_one_line_error(code, err, needle)
