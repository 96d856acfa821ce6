"""pipeline.data and pipeline.audio: local sources, audio decoding, deterministic subsets, Parquet round trips,
the Hub path (mocked: no network), and the real sample data when present."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from pipeline import audio, data
from pipeline.errors import SpecsweepError
from pipeline.tasks import get_task

# ------------------------------------------------------------------------------------------- helpers


def write_cnn_jsonl(path: Path, n: int = 12) -> list[dict]:
    rows = [{"id": f"{i:04x}", "article": f"Article number {i}. It has words.", "highlights": f"Point {i}.\nMore {i}."}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return rows


def sine(freq: float, seconds: float, rate: int, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def write_asr_manifest(folder: Path, clips: dict[str, tuple[np.ndarray, int, str]]) -> Path:
    """clips: id -> (samples [N] or [N, C], rate, file name). Writes the files and transcripts.jsonl."""
    lines = []
    for clip_id, (samples, rate, name) in clips.items():
        sf.write(folder / name, samples, rate)
        lines.append(json.dumps({"id": clip_id, "file": name, "text": f"TEXT OF {clip_id.upper()}"}))
    manifest = folder / "transcripts.jsonl"
    manifest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return manifest


def peak_frequency(audio: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(audio * np.hanning(audio.shape[0])))
    return float(np.fft.rfftfreq(audio.shape[0], 1 / rate)[np.argmax(spectrum)])


# ------------------------------------------------------------------------------------------- sources


def test_cnn_jsonl_records(tmp_path):
    rows = write_cnn_jsonl(tmp_path / "cnn.jsonl")
    records = data.load_task_data("cnn_dailymail", tmp_path / "cnn.jsonl")
    assert records == rows  # same fields, same order, newlines in highlights kept


def test_cnn_jsonl_default_ids_and_blank_lines(tmp_path):
    path = tmp_path / "cnn.jsonl"
    path.write_text('{"article": "a", "highlights": "h"}\n\n{"article": "b", "highlights": "i"}\n', encoding="utf-8")
    assert [r["id"] for r in data.load_task_data("cnn_dailymail", path)] == ["line-1", "line-3"]


def test_wav_16k_mono_decodes_to_the_same_samples(tmp_path):
    audio = sine(440, 1.0, 16_000)
    manifest = write_asr_manifest(tmp_path, {"a": (audio, 16_000, "a.wav")})
    (record,) = data.load_task_data("librispeech", manifest)
    assert set(record) == {"id", "text", "audio", "duration"}
    assert record["audio"].dtype == np.float32 and record["audio"].ndim == 1
    expected, _ = sf.read(tmp_path / "a.wav", dtype="float32")  # 16-bit PCM as soundfile reads it
    np.testing.assert_array_equal(record["audio"], expected)
    assert record["duration"] == pytest.approx(1.0)
    assert record["text"] == "TEXT OF A"


def test_22k_stereo_is_resampled_and_downmixed(tmp_path):
    rate, seconds = 22_050, 2.0
    left, right = sine(440, seconds, rate, 0.6), sine(440, seconds, rate, 0.2)
    manifest = write_asr_manifest(tmp_path, {
        "st": (np.stack([left, right], axis=1), rate, "st.wav"),
        "cancel": (np.stack([left, -left], axis=1), rate, "cancel.flac"),
    })
    st, cancel = data.load_task_data("librispeech", manifest)
    n_in = left.shape[0]
    assert st["audio"].shape[0] == -(-n_in * 16_000 // rate)  # ceil(N * 16000 / 22050)
    assert st["duration"] == pytest.approx(seconds, abs=1e-3)
    assert peak_frequency(st["audio"], 16_000) == pytest.approx(440, abs=1)
    core = st["audio"][1000:-1000]  # away from the filter's edge effects
    assert np.sqrt(np.mean(core**2)) == pytest.approx(0.4 / np.sqrt(2), rel=0.01)  # mean of 0.6 and 0.2 amplitudes
    assert np.max(np.abs(cancel["audio"])) < 1e-3  # opposite channels average to silence


def test_truncate_audio():
    sr = audio.SAMPLE_RATE
    long = np.ones(31 * sr, dtype=np.float32)
    cut = audio.truncate_audio(long)
    assert cut.truncated and cut.audio.shape == (30 * sr,) and cut.original_seconds == pytest.approx(31.0)
    short = np.ones(10 * sr, dtype=np.float32)
    same = audio.truncate_audio(short)
    assert not same.truncated and same.audio is short and same.original_seconds == pytest.approx(10.0)
    assert audio.truncate_audio(long, max_seconds=5).audio.shape == (5 * sr,)


# ------------------------------------------------------------------------------------------- subsets


def test_subset_same_seed_same_ids_different_seed_different_ids():
    items = [(f"id{i}", i) for i in range(200)]
    pick = lambda seed, limit=10: [i for _, i, _ in data.select_subset(items, limit, seed)[0]]  # noqa: E731
    assert pick(1) == pick(1)
    assert pick(1) != pick(2)
    assert set(pick(1, 5)) <= set(pick(1, 20))  # a larger limit keeps what a smaller one kept


def test_subset_follows_the_documented_rule_and_ignores_order():
    ids = [f"ex-{i}" for i in range(50)]
    seed, limit = 7, 6
    keys = {i: int.from_bytes(hashlib.sha256(f"{seed}:{i}".encode()).digest()[:8], "big") for i in ids}
    expected = sorted(sorted(ids, key=keys.__getitem__)[:limit], key=ids.index)
    kept, seen = data.select_subset(((i, None) for i in ids), limit, seed)
    assert [i for _, i, _ in kept] == expected and seen == 50
    assert [p for p, _, _ in kept] == [ids.index(i) for i in expected]
    shuffled = ids[:]
    random.Random(0).shuffle(shuffled)
    assert {i for _, i, _ in data.select_subset(((i, None) for i in shuffled), limit, seed)[0]} == set(expected)


def test_subset_first_n_pool_and_all():
    items = [(f"id{i}", i) for i in range(30)]
    assert [i for _, i, _ in data.select_subset(items, 4, None)[0]] == ["id0", "id1", "id2", "id3"]
    kept, seen = data.select_subset(items, 3, 5, pool=8)
    assert seen == 8 and all(p < 8 for p, _, _ in kept) and len(kept) == 3
    assert len(data.select_subset(items, None, 5)[0]) == 30
    with pytest.raises(SpecsweepError, match="--limit"):
        data.select_subset(items, 0, 1)


def test_load_with_limit_and_seed_matches_fetch(tmp_path):
    write_cnn_jsonl(tmp_path / "cnn.jsonl", n=40)
    manifest = data.fetch("cnn_dailymail", tmp_path / "out", source=tmp_path / "cnn.jsonl", limit=7, seed=3,
                          progress=False)
    direct = data.load_task_data("cnn_dailymail", tmp_path / "cnn.jsonl", limit=7, seed=3)
    assert manifest["ids"] == [r["id"] for r in direct]
    assert [r["id"] for r in data.load_task_data("cnn_dailymail", tmp_path / "out")] == manifest["ids"]


# ------------------------------------------------------------------------------------------- fetch / Parquet


def test_fetch_local_audio_round_trip(tmp_path):
    clips = {f"c{i}": (sine(200 + 50 * i, 0.5 + 0.25 * i, 16_000), 16_000, f"c{i}.wav") for i in range(5)}
    source = write_asr_manifest(tmp_path, clips)
    out = tmp_path / "out"
    manifest = data.fetch("librispeech", out, source=source, limit=3, seed=0, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["data.parquet", "manifest.json"]  # no temporary files left
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert manifest["origin"]["kind"] == "local" and manifest["n_candidates"] == 5 and manifest["n_records"] == 3
    assert manifest["sample_rate"] == 16_000 and manifest["n_over_max_seconds"] == 0
    loaded = data.load_task_data("librispeech", out)
    direct = {r["id"]: r for r in data.load_task_data("librispeech", source)}
    assert [r["id"] for r in loaded] == manifest["ids"]
    for r in loaded:
        assert r["audio"].dtype == np.float32
        np.testing.assert_array_equal(r["audio"], direct[r["id"]]["audio"])
        assert r["text"] == direct[r["id"]]["text"] and r["duration"] == direct[r["id"]]["duration"]
    assert data.load_task_data("librispeech", out / "data.parquet", limit=1, seed=None)[0]["id"] == manifest["ids"][0]


def test_load_rejects_wrong_task_folder_and_missing_data(tmp_path):
    write_cnn_jsonl(tmp_path / "cnn.jsonl")
    data.fetch("cnn_dailymail", tmp_path / "out", source=tmp_path / "cnn.jsonl", progress=False)
    with pytest.raises(SpecsweepError, match="cnn_dailymail"):
        data.load_task_data("librispeech", tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecsweepError, match=r"no data\.parquet"):
        data.load_task_data("cnn_dailymail", tmp_path / "empty")
    with pytest.raises(SpecsweepError, match="does not exist"):
        data.load_task_data("cnn_dailymail", tmp_path / "nope.jsonl")


class _FakeHub:
    """Stands in for datasets.load_dataset: an in-memory streamed split in the Hub's schema."""

    def __init__(self, task: str, n: int, rate: int = 16_000):
        import io

        from datasets import Audio, Dataset

        if task == "cnn_dailymail":
            self.ds = Dataset.from_dict({"article": [f"art {i}" for i in range(n)],
                                         "highlights": [f"hl {i}" for i in range(n)],
                                         "id": [f"{i:040x}" for i in range(n)]})
        else:
            blobs = []
            for i in range(n):
                buf = io.BytesIO()
                sf.write(buf, sine(300, 0.2 + 0.1 * i, rate), rate, format="FLAC")
                blobs.append({"bytes": buf.getvalue(), "path": f"{i}.flac"})
            ds = Dataset.from_dict({"file": [b["path"] for b in blobs], "audio": blobs,
                                    "text": [f"WORDS {i}" for i in range(n)], "speaker_id": list(range(n)),
                                    "chapter_id": list(range(n)), "id": [f"1-2-{i:04d}" for i in range(n)]})
            self.ds = ds.cast_column("audio", Audio(sampling_rate=rate))  # decodes on access, as on the Hub
        self.calls: list[tuple] = []

    def __call__(self, path, name=None, **kwargs):
        self.calls.append((path, name, kwargs))
        return self.ds.to_iterable_dataset()


@pytest.mark.parametrize("task,rate", [("cnn_dailymail", None), ("librispeech", 22_050)])
def test_fetch_from_hub_mocked(tmp_path, monkeypatch, task, rate):
    import datasets

    fake = _FakeHub(task, n=9, rate=rate or 16_000)
    monkeypatch.setattr(data, "hub_probe", lambda repo_id, **kw: "0123456789abcdef")
    monkeypatch.setattr(datasets, "load_dataset", fake)
    manifest = data.fetch(task, tmp_path / "out", split="test", limit=4, seed=11, progress=False)
    hub = get_task(task).hub
    assert fake.calls == [(hub.repo_id, hub.config, {"split": "test", "streaming": True,
                                                       "revision": "0123456789abcdef"})]
    assert manifest["origin"] == {"kind": "hub", "repo_id": hub.repo_id, "config": hub.config, "split": "test",
                                  "revision": "0123456789abcdef", "endpoint": data._hub_endpoint()}
    all_ids = list(fake.ds["id"])
    expected, _ = data.select_subset(((i, None) for i in all_ids), 4, 11)
    assert manifest["ids"] == [i for _, i, _ in expected]
    records = data.load_task_data(task, tmp_path / "out")
    assert [r["id"] for r in records] == manifest["ids"]
    if task == "librispeech":
        for r in records:
            n = all_ids.index(r["id"])
            assert r["audio"].dtype == np.float32
            assert r["duration"] == pytest.approx(0.2 + 0.1 * n, abs=1e-3)  # resampled from 22.05 kHz
            assert r["text"] == f"WORDS {n}"


def test_hub_probe_offline_mode_fails_at_once(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SpecsweepError, match=r"offline.*--source"):
        data.hub_probe("abisee/cnn_dailymail")


# ------------------------------------------------------------------------------------------- real samples


def test_real_cnn_dailymail_fixture(fixtures_dir):
    path = fixtures_dir / "cnn_dailymail" / "test.jsonl"
    records = data.load_task_data("cnn_dailymail", path)
    raw = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(records) == len(raw) == 80
    assert records == [{"id": r["id"], "article": r["article"], "highlights": r["highlights"]} for r in raw]
    assert len({r["id"] for r in records}) == 80
    a = data.load_task_data("cnn_dailymail", path, limit=10, seed=0)
    assert [r["id"] for r in a] == [r["id"] for r in data.load_task_data("cnn_dailymail", path, limit=10, seed=0)]
    assert [r["id"] for r in a] != [r["id"] for r in data.load_task_data("cnn_dailymail", path, limit=10, seed=1)]


def test_real_librispeech_fixture(fixtures_dir, tmp_path):
    folder = fixtures_dir / "librispeech"
    lines = [json.loads(line) for line in (folder / "transcripts.jsonl").read_text().splitlines() if line.strip()]
    records = data.load_task_data("librispeech", folder / "transcripts.jsonl")
    assert [r["id"] for r in records] == [x["id"] for x in lines] and len(records) == 4
    assert sorted(Path(x["file"]).suffix for x in lines) == [".flac", ".wav", ".wav", ".wav"]
    for r, x in zip(records, lines):
        info = sf.info(folder / x["file"])
        assert info.samplerate == 16_000 and info.channels == 1
        assert r["audio"].shape == (info.frames,) and r["audio"].dtype == np.float32
        assert r["duration"] == pytest.approx(info.duration)
        assert r["text"] == x["text"]
        assert 0 < np.max(np.abs(r["audio"])) <= 1.0
    manifest = data.fetch("librispeech", tmp_path / "ls", source=folder / "transcripts.jsonl", progress=False)
    assert manifest["total_seconds"] == pytest.approx(sum(r["duration"] for r in records), abs=1e-3)
    for a, b in zip(data.load_task_data("librispeech", tmp_path / "ls"), records):
        np.testing.assert_array_equal(a["audio"], b["audio"])
