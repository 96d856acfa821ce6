"""Speculative decoding of Whisper (encoder-decoder) on tiny random-init models, offline (CPU, and CUDA where
there is a GPU).

Greedy verification reproduces HF's own Whisper greedy decoding token for token, with a full Whisper draft
(own encoder, like distil-small.en) and with a decoder-only draft reading the target's encoder outputs (like
distil-large-v2 as an assistant); `exact` at T = 1 emits first tokens distributed as the target's; the
librispeech task runs end to end from a manifest of WAV/FLAC files and scores WER.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from stat_utils import assert_fits, counts

from pipeline.config import RunConfig
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.runner import run
from pipeline.samplers import get_sampler
from pipeline.synthetic import save_whisper_pair

EOS = 0


_GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module", params=[("seq2seq", "cpu"), ("decoder_only", "cpu"),
                                        pytest.param(("seq2seq", "cuda"), marks=_GPU),
                                        pytest.param(("decoder_only", "cuda"), marks=_GPU)], ids="-".join)
def whisper(request, tmp_path_factory):
    """(target, draft, processor, draft kind, target path, draft path, device): on the CPU and, where there is
    one, a GPU."""
    from transformers import AutoModelForCausalLM, AutoProcessor, WhisperForConditionalGeneration

    kind, dev = request.param
    root = tmp_path_factory.mktemp(kind)
    tp, dp = save_whisper_pair(root, draft_kind=kind)
    draft_cls = WhisperForConditionalGeneration if kind == "seq2seq" else AutoModelForCausalLM
    return (WhisperForConditionalGeneration.from_pretrained(tp).eval().to(dev),
            draft_cls.from_pretrained(dp).eval().to(dev), AutoProcessor.from_pretrained(tp), kind, tp, dp, dev)


def features(processor, n=4, seed=0):
    rs = np.random.RandomState(seed)
    audio = [(rs.randn(int(16000 * (0.5 + i * 0.4))) * (0.05 + 0.3 * i)).astype("float32") for i in range(n)]
    return processor.feature_extractor(audio, sampling_rate=16000, return_tensors="pt").input_features


def hf_greedy(model, feats, prompt, max_new):
    out = []
    for i in range(feats.shape[0]):
        seq = model.generate(feats[i: i + 1].to(model.device), max_new_tokens=max_new)[0].tolist()
        while seq and seq[0] in prompt:  # HF may return (part of) its decoder prompt
            seq = seq[1:]
        out.append(seq)
    return out


_REFERENCE: dict[str, list] = {}  # HF's greedy output per model pair, computed once


@pytest.mark.parametrize("gamma", [0, 1, 3])
def test_greedy_speculative_whisper_equals_hf_greedy(whisper, gamma):
    target, draft, processor, kind, _, _, dev = whisper
    feats = features(processor)
    prompt = processor.tokenizer.prefix_tokens
    if (kind, dev) not in _REFERENCE:
        _REFERENCE[kind, dev] = hf_greedy(target, feats, prompt, 16)
    reference = _REFERENCE[kind, dev]
    ids = torch.tensor([prompt] * feats.shape[0])
    engine = SpeculativeEngine(target, draft, get_sampler("greedy"), gamma=gamma, device=dev, eos_token_ids=[EOS],
                               pad_token_id=EOS)
    batched = engine.generate(ids, torch.ones_like(ids), 16, encoder_inputs={"input_features": feats})
    assert batched.tokens == reference
    one = engine.generate(ids[:1], torch.ones_like(ids[:1]), 16, encoder_inputs={"input_features": feats[:1]})
    assert one.tokens == reference[:1]
    if gamma:
        assert 0 < sum(s["accepted"] for s in batched.row_stats) < sum(s["drafted"] for s in batched.row_stats)
        # the target's encoder runs once per batch; a seq2seq draft runs its own once more, a decoder-only draft
        # reads the target's
        assert batched.phase_calls["encode"] == (2 if kind == "seq2seq" else 1)


@pytest.mark.parametrize("static_cache", [True, False], ids=["static", "hf-forward"])
def test_exact_sampling_of_whisper_follows_the_target(whisper, static_cache):
    """The first token of 2000 rows at T = 1 follows the target's law, with our static decoder forward and with
    transformers' (on an H200 the seq2seq pair on CUDA failed with the static forward, 2026-11-28, not yet with
    transformers' tried: the two ids tell them apart)."""
    target, draft, processor, _, _, _, dev = whisper
    n = 2000
    feats = features(processor, n=1).expand(n, -1, -1)
    prompt = processor.tokenizer.prefix_tokens
    ids = torch.tensor([prompt] * n)
    engine = SpeculativeEngine(target, draft, get_sampler("exact", temperature=1.0), gamma=3, device=dev,
                               eos_token_ids=[], pad_token_id=EOS, static_cache=static_cache)
    res = engine.generate(ids, torch.ones_like(ids), 1, torch.Generator(dev).manual_seed(0),
                          encoder_inputs={"input_features": feats})
    with torch.no_grad():
        logits = target(input_features=feats[:1].to(dev), decoder_input_ids=ids[:1].to(dev)).logits[0, -1].double()
    p = torch.softmax(logits, -1).cpu().numpy()
    assert_fits(counts(np.array([t[0] for t in res.tokens]), p.shape[0]), p, "whisper first token")


def soundfile():
    """The librispeech task's tests need what it runs on: soundfile to read (and here write) audio files and
    jiwer to score WER. An environment without them (a bare GPU image) still runs the engine tests above."""
    pytest.importorskip("jiwer")
    return pytest.importorskip("soundfile")


def write_manifest(root, durations=(1.0, 1.5, 3.0)):
    """WAV and FLAC clips of noise with transcripts, in the LibriSpeech manifest schema."""
    sf = soundfile()
    rs = np.random.RandomState(1)
    lines = []
    for i, seconds in enumerate(durations):
        name = f"clip{i}.{'flac' if i == 1 else 'wav'}"
        sf.write(root / name, (rs.randn(int(16000 * seconds)) * 0.1).astype("float32"), 16000)
        lines.append(json.dumps({"id": f"u{i}", "file": name, "text": ["HELLO WORLD", "A TEST", "LONG ONE"][i]}))
    (root / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    return root / "manifest.jsonl"


def test_librispeech_task_end_to_end_with_both_engines(whisper, tmp_path, capsys):
    _, _, _, kind, tp, dp, dev = whisper
    manifest = write_manifest(tmp_path)
    tokens = {}
    for engine, batch in (("specsweep", 2), ("hf", 1)):
        cfg = RunConfig(target=str(tp), draft=str(dp), data=str(manifest), task="librispeech", gamma=3,
                        temperature=0.0, sampler="greedy", max_new_tokens=10, device=dev, batch_size=batch,
                        engine=engine, draft_decoder_only=kind == "decoder_only", out=str(tmp_path / f"{engine}.json"))
        res = run(cfg, progress=False)
        tokens[engine] = [s["token_ids"] for s in res["samples"]]
        assert res["quality"]["wer"] is not None and res["quality"]["normalizer"] in ("basic", "whisper_english")
        assert res["resolved"]["audio_truncated"] == 1  # the 3 s clip against the 2 s window
        assert [s["reference"] for s in res["samples"]] == ["HELLO WORLD", "A TEST", "LONG ONE"]
        assert all("wer" in s["quality"] for s in res["samples"])
        assert json.loads((tmp_path / f"{engine}.json").read_text())["config"]["task"] == "librispeech"
    assert tokens["specsweep"] == tokens["hf"]
    assert "cut to it" in capsys.readouterr().err


def test_real_librispeech_fixtures_run(whisper, fixtures_dir, tmp_path):
    """The four real utterances (3 WAV, 1 FLAC) go through the task; the tiny model's WER is meaningless, but
    every clip must be read, decoded and scored."""
    _, _, _, kind, tp, dp, dev = whisper
    soundfile()
    manifest = fixtures_dir / "librispeech" / "transcripts.jsonl"
    cfg = RunConfig(target=str(tp), draft=str(dp), data=str(manifest), task="librispeech", gamma=2,
                    temperature=0.0, sampler="greedy", max_new_tokens=4, device=dev, batch_size=4,
                    draft_decoder_only=kind == "decoder_only", out=str(tmp_path / "fixtures.json"))
    res = run(cfg, progress=False)
    assert len(res["samples"]) == 4 and res["quality"]["reference_words"] > 20
    assert res["resolved"]["audio_truncated"] == 4  # every real clip is longer than the tiny model's 2 s window


def test_librispeech_through_the_cli_and_bad_manifests(whisper, tmp_path, capsys):
    from pipeline.cli import main

    _, _, _, kind, tp, dp, dev = whisper
    manifest = write_manifest(tmp_path, durations=(1.0, 1.2))
    args = ["run", "--task", "librispeech", "--target", str(tp), "--draft", str(dp), "--gamma", "2",
            "--max-new-tokens", "6", "--device", dev, "--no-progress", "--out", str(tmp_path / "cli.json")]
    if kind == "decoder_only":
        args.append("--draft-decoder-only")
    assert main([*args, "--data", str(manifest)]) == 0
    assert "wer" in json.loads((tmp_path / "cli.json").read_text())["quality"]
    missing = tmp_path / "missing.jsonl"
    missing.write_text(json.dumps({"id": "x", "file": "nope.wav", "text": "HI"}) + "\n")
    empty_audio = tmp_path / "empty.wav"
    soundfile().write(empty_audio, np.zeros(0, dtype="float32"), 16000)
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"id": "e", "file": "empty.wav", "text": "HI"}) + "\n")
    no_text = tmp_path / "notext.jsonl"
    no_text.write_text(json.dumps({"id": "n", "file": "clip0.wav"}) + "\n")
    capsys.readouterr()
    for bad, message in ((missing, "does not exist"), (empty, "empty"), (no_text, "missing field(s) 'text'")):
        assert main([*args, "--data", str(bad)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
