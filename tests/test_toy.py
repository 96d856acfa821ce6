"""The offline toy tasks and pairs: deterministic generators, schemas the task loaders read, audio properties,
training that learns, and quick pairs that reload with from_pretrained and decode (text through `specsweep run`)."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from pipeline.audio import SAMPLE_RATE
from pipeline.cli import main
from pipeline.data import load_task_data
from pipeline.toy import speech_data, speech_synth, text_data, train_speech, train_text
from pipeline.toy.vocab import (
    BPE_VOCAB_SIZE,
    WHISPER_SPECIAL_TOKENS,
    bpe_stats,
    bpe_tokenizer,
    text_tokenizer,
    whisper_tokenizer,
)


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("toy") / "data"
    assert main(["toy", "data", "--out", str(out), "--quick", "--no-progress"]) == 0
    return out


# ------------------------------------------------------------------------------------------------ generators

def test_generators_are_deterministic_per_seed(toy_data, tmp_path):
    again, other = tmp_path / "again", tmp_path / "other"
    assert main(["toy", "data", "--out", str(again), "--quick", "--no-progress"]) == 0
    assert main(["toy", "data", "--out", str(other), "--quick", "--seed", "1", "--no-progress"]) == 0
    first, second, third = _tree_bytes(toy_data), _tree_bytes(again), _tree_bytes(other)
    assert first == second
    assert "text/train.jsonl" in first and "speech/test/manifest.jsonl" in first
    assert sum(k.endswith(".wav") for k in first) == speech_data.QUICK_TRAIN_CLIPS + speech_data.QUICK_TEST_CLIPS
    assert first.keys() == third.keys()
    for name in ("text/train.jsonl", "text/test.jsonl", "speech/train/manifest.jsonl",
                 "speech/test/wav/test-00000.wav"):
        assert first[name] != third[name], name


def test_text_records_load_as_cnn_dailymail_and_summaries_copy_the_key_facts(toy_data):
    records = load_task_data("cnn_dailymail", toy_data / "text" / "test.jsonl")
    assert len(records) == text_data.QUICK_TEST_EXAMPLES
    train = load_task_data("cnn_dailymail", toy_data / "text" / "train.jsonl")
    assert {r["id"] for r in records}.isdisjoint({r["id"] for r in train})
    for r in records:
        assert set(r) == {"id", "article", "highlights"}
        article = set(r["article"].split())
        facts = [w for w in r["highlights"].split() if w not in text_data.FUNCTION_WORDS + text_data.PUNCTUATION]
        assert len(facts) >= 8 and all(w in article for w in facts)  # every fact is in the article
        cities = [w for w in r["article"].split() if w in text_data.CITIES]
        assert len(set(cities)) >= 2  # distractors: the summary's city is not the only one


def test_text_tokenizer_covers_the_generated_text_and_the_prompt_is_a_prefix(toy_data):
    tok = text_tokenizer(text_data.vocabulary())
    records = load_task_data("cnn_dailymail", toy_data / "text" / "train.jsonl")
    for ids, _ in train_text.encode(tok, records):
        assert tok.unk_token_id not in ids and ids[-1] == tok.eos_token_id
    r = records[0]
    prompt = tok(r["article"] + " Summary:").input_ids  # what a cnn_dailymail run feeds the model
    assert train_text.encode(tok, [r])[0][0][:len(prompt)] == prompt
    assert tok.decode(tok(r["highlights"]).input_ids) == r["highlights"]


def test_bpe_tokenizer_round_trips_the_toy_text_and_is_not_the_targets(toy_data):
    records = load_task_data("cnn_dailymail", toy_data / "text" / "train.jsonl")
    texts = train_text.training_texts(records)
    tok = bpe_tokenizer(texts)
    assert (tok.pad_token, tok.pad_token_id, tok.eos_token, tok.eos_token_id) == ("<pad>", 0, "<eos>", 1)
    assert tok.padding_side == "left" and tok.unk_token is None and len(tok) <= BPE_VOCAB_SIZE
    test = load_task_data("cnn_dailymail", toy_data / "text" / "test.jsonl")
    for r in records[:8] + test:
        for text in (r["article"] + " Summary:", " " + r["highlights"], r["article"] + " Summary: " + r["highlights"]):
            ids = tok(text).input_ids
            assert ids == tok(text, add_special_tokens=False).input_ids  # nothing added around a prompt
            assert tok.decode(ids) == text
    assert tok.decode(tok("Any text, ÜNICODE — and\ttabs.").input_ids) == "Any text, ÜNICODE — and\ttabs."
    for ids, n_prompt in train_text.encode(tok, records, positions=None):
        assert ids[-1] == tok.eos_token_id and tok.eos_token_id not in ids[:-1] and 0 < n_prompt < len(ids)
    word = text_tokenizer(text_data.vocabulary())
    assert tok.get_vocab() != word.get_vocab() and len(tok) != len(word)
    assert tok.convert_ids_to_tokens(tok(" Summary:").input_ids) == ["ĠSummary", ":"]
    assert bpe_tokenizer(texts[::-1]).get_vocab() == tok.get_vocab()  # the same texts, the same vocabulary


def test_bpe_tokenizer_at_its_size_keeps_template_words_whole_and_splits_entities():
    """On the full train split: the numbers docs/results.md and pipeline/toy/vocab.py give."""
    records = text_data.make_split(0, "train", text_data.TRAIN_EXAMPLES)
    tok = bpe_tokenizer(train_text.training_texts(records))
    assert len(tok) == BPE_VOCAB_SIZE

    def single(w: str) -> bool:
        return len(tok(" " + w).input_ids) == 1

    assert all(single(w) for w in ("the", "said", "they", "were", "in", "on", ".", ",", "Summary"))
    assert all(single(w) for w in text_data.CITIES + text_data.VERBS + text_data.DAYS)
    assert sum(single(w) for w in text_data.FIRST) <= 2 and sum(single(w) for w in text_data.NUMBERS) <= 6
    stats = bpe_stats(tok, text_data.vocabulary(), [r["highlights"] for r in text_data.make_split(0, "test", 100)])
    assert (stats["single_token_words"], stats["words"]) == (145, 266)
    assert stats["tokens_per_word"] == pytest.approx(1.29)


def test_speech_manifest_loads_as_librispeech_with_the_documented_audio(toy_data):
    records = load_task_data("librispeech", toy_data / "speech" / "test" / "manifest.jsonl")
    assert len(records) == speech_data.QUICK_TEST_CLIPS
    for r in records:
        words = r["text"].split()
        assert speech_data.MIN_WORDS <= len(words) <= speech_data.MAX_WORDS
        assert all(w in speech_data.WORDS for w in words)
        assert r["audio"].dtype == np.float32 and r["audio"].ndim == 1
        assert 0.3 <= r["duration"] <= speech_data.MAX_SECONDS <= speech_data.CHUNK_SECONDS
    for line in (toy_data / "speech" / "test" / "manifest.jsonl").read_text().splitlines():
        info = sf.info(str(toy_data / "speech" / "test" / json.loads(line)["file"]))
        assert (info.samplerate, info.channels, info.subtype) == (SAMPLE_RATE, 1, "PCM_16")


def test_audio_has_background_noise_and_speech_much_louder_than_it():
    rng = np.random.default_rng(0)
    audio = speech_synth.render(["red", "fox"], speech_synth.Speaker.draw(rng), rng)
    frames = audio[: len(audio) // 160 * 160].reshape(-1, 160)  # 10 ms frames
    rms = np.sqrt((frames.astype(np.float64) ** 2).mean(axis=1))
    assert rms.min() > 0  # noise everywhere, even in the leading silence
    assert np.percentile(rms, 90) > 5 * rms[:5].mean()  # speech stands well above the noise floor
    assert np.abs(audio).max() <= 1.0


def test_the_same_words_sound_different_per_speaker_and_speed_changes_duration():
    rng = np.random.default_rng(1)
    words = ["tiger", "jump"]
    base = speech_synth.Speaker(f0=120, formant_scale=1.0, speed=1.0, level=0.5, snr_db=30)
    slow = speech_synth.render(words, speech_synth.Speaker(**{**base.__dict__, "speed": 0.85}), rng)
    fast = speech_synth.render(words, speech_synth.Speaker(**{**base.__dict__, "speed": 1.2}), rng)
    assert len(slow) > 1.2 * len(fast)
    a = speech_synth.render(words, speech_synth.Speaker.draw(rng), rng)
    b = speech_synth.render(words, speech_synth.Speaker.draw(rng), rng)
    assert a.shape != b.shape or not np.allclose(a, b)


def test_every_word_has_its_own_signature_two_segments_away_from_any_other():
    sigs = [speech_synth.SIGNATURES[w] for w in speech_data.WORDS]
    assert len(set(sigs)) == len(speech_data.WORDS) == len(speech_synth.LEXICON)
    for i, a in enumerate(sigs):
        for b in sigs[i + 1:]:
            assert sum(x != y for x, y in zip(a, b)) >= 2
    assert all(0 <= k < len(speech_synth.SEGMENTS) for sig in sigs for k in sig)
    with pytest.raises(ValueError, match="LEXICON"):
        speech_synth.render(["zebra"], speech_synth.Speaker.draw(np.random.default_rng(0)), np.random.default_rng(0))


def test_words_sound_different_from_each_other_and_alike_across_speakers():
    """Spectra of a word by two speakers are closer than those of two different words by one speaker."""
    def spectrum(word: str, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        speaker = speech_synth.Speaker(**{**speech_synth.Speaker.draw(rng).__dict__, "snr_db": 40.0})
        mag = np.abs(np.fft.rfft(speech_synth.render_word(word, speaker, rng), n=4096))
        bands = np.log1p(mag[: 4096 // 2].reshape(64, -1).mean(axis=1))
        return bands / np.linalg.norm(bands)

    same = float(spectrum("tiger", 1) @ spectrum("tiger", 2))
    for other in ("red", "jump", "piano"):
        assert same > float(spectrum("tiger", 1) @ spectrum(other, 1))


def test_ctc_targets_map_words_to_classes_and_drop_special_tokens():
    from pipeline.toy import train_speech

    tok = whisper_tokenizer(speech_data.WORDS)
    classes = train_speech.word_classes(tok)
    assert sorted(classes.values()) == list(range(1, len(speech_data.WORDS) + 1))
    y, lengths = train_speech.ctc_targets([tok(" red fox").input_ids, tok(" cat").input_ids], classes)
    red, fox, cat = (speech_data.WORDS.index(w) + 1 for w in ("red", "fox", "cat"))
    assert y.tolist() == [[red, fox], [cat, 0]] and lengths.tolist() == [2, 1]


def test_whisper_tokenizer_has_one_token_per_word_and_whisper_specials():
    tok = whisper_tokenizer(speech_data.WORDS)
    for w in speech_data.WORDS:
        assert len(tok(" " + w, add_special_tokens=False).input_ids) == 1, w
    special = [tok.convert_tokens_to_ids(t) for t in WHISPER_SPECIAL_TOKENS]
    assert special == list(range(special[0], special[0] + len(special)))  # Whisper's order, <|en|> after sot
    sot, nots, eot = special[1], special[-1], special[0]
    ids = tok(" red fox").input_ids
    assert ids[:2] == [sot, nots] and ids[-1] == eot == tok.eos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == " red fox"


# -------------------------------------------------------------------------------------------------- training

def _trained_text_model(n_examples: int, spec):
    """A toy text model of shape ``spec`` trained on ``n_examples`` generated examples: (model, training log,
    encoded data, tokenizer)."""
    rng = random.Random(0)
    records = [text_data.make_example(rng, f"x{i}") for i in range(n_examples)]
    tok = text_tokenizer(text_data.vocabulary())
    model = train_text.build_model(spec, tok, seed=0)
    data = train_text.encode(tok, records)
    log = train_text.train(model, data, spec, tok.pad_token_id, seed=0, desc="t", progress=False)
    return model, log, data, tok


def test_text_training_steps_decrease_the_loss():
    spec = train_text.TextModelSpec(n_layer=1, n_embd=32, n_head=2, steps=25, batch_size=8, lr=3e-3)
    _, log, _, _ = _trained_text_model(32, spec)
    assert len(log["losses"]) == 25
    assert log["final_loss"] < 0.8 * log["first_loss"]


def test_growing_a_model_deeper_keeps_its_outputs_and_the_new_blocks_then_train():
    spec = train_text.TextModelSpec(n_layer=2, n_embd=32, n_head=2, steps=10, batch_size=8, lr=3e-3)
    shallow, _, data, tok = _trained_text_model(16, spec)
    grown = train_text.grow_deeper(shallow, 5).eval()
    assert grown.config.n_layer == 5 and shallow.config.n_layer == 2
    ids = torch.tensor([data[0][0]])
    with torch.no_grad():
        assert torch.equal(grown(ids).logits, shallow(ids).logits)  # the new blocks add exact zeros
    new_block = grown.transformer.h[3]
    assert torch.equal(new_block.attn.c_attn.weight, shallow.transformer.h[1].attn.c_attn.weight)
    assert not new_block.mlp.c_proj.weight.any()
    fine = dataclasses.replace(spec, n_layer=5, steps=3, lr=1e-3)
    train_text.train(grown, data, fine, tok.pad_token_id, seed=1, desc="t", progress=False)
    assert new_block.mlp.c_proj.weight.any() and new_block.attn.c_proj.weight.any()
    with pytest.raises(ValueError, match="n_layer must exceed"):
        train_text.grow_deeper(shallow, 2)


def test_quick_text_pair_reloads_and_runs_through_specsweep_run(toy_data, tmp_path, capsys):
    models = tmp_path / "models"
    assert main(["toy", "train", "--task", "text", "--data", str(toy_data), "--out", str(models), "--quick",
                 "--no-progress"]) == 0
    record = json.loads((models / "text" / "training.json").read_text())
    assert record["models"]["draft"]["parameters"] < record["models"]["target"]["parameters"]
    assert 0 < record["cost"]["flop_ratio"] < 1 and record["cost"]["time_ratio"] > 0
    assert len(record["models"]["target"]["training"]["losses"]) == train_text.QUICK_TARGET.steps
    growth = record["target_growth"]
    assert record["models"]["target"]["n_layer"] == train_text.QUICK_TARGET_GROWN.n_layer
    assert growth["max_abs_logit_change_at_growth"] < 1e-5
    assert len(growth["fine_tune"]["losses"]) == train_text.QUICK_TARGET_GROWN.steps
    _check_bpe_draft(models / "text", record, toy_data)
    out = tmp_path / "run.json"
    assert main(["run", "--task", "cnn_dailymail", "--target", str(models / "text" / "target"), "--draft",
                 str(models / "text" / "draft"), "--data", str(toy_data / "text" / "test.jsonl"), "--gamma", "2",
                 "--max-new-tokens", "6", "--device", "cpu", "--no-progress", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert len(res["samples"]) == text_data.QUICK_TEST_EXAMPLES
    for k in ("rouge1", "rouge2", "rougeL", "rougeLsum"):
        assert 0.0 <= res["quality"][k] <= 1.0
    assert res["metrics"]["drafted_tokens"] > 0
    assert "trained text pair" in capsys.readouterr().out


def _check_bpe_draft(root: Path, record: dict, toy_data: Path) -> None:
    """The quick BPE draft in ``root``/draft-bpe: recorded, loaded by the Auto classes, and it writes a summary
    after the prompt, in its own tokens, that its tokenizer decodes."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    entry, stats = record["models"]["draft-bpe"], record["draft_bpe_tokenizer"]
    assert entry["path"] == str(root / "draft-bpe") and entry["spec"] == dataclasses.asdict(train_text.QUICK_DRAFT_BPE)
    assert len(entry["training"]["losses"]) == train_text.QUICK_DRAFT_BPE.steps
    assert entry["parameters"] < record["models"]["target"]["parameters"]
    assert 0 < stats["single_token_share"] <= 1 and stats["tokens_per_word"] >= 1
    assert stats["tokens_per_word_split"] == "test" and stats["longest_train_sequence"] <= stats["n_positions"]
    model = AutoModelForCausalLM.from_pretrained(root / "draft-bpe").eval()
    tok = AutoTokenizer.from_pretrained(root / "draft-bpe")
    assert (tok.pad_token_id, tok.eos_token_id, tok.padding_side) == (0, 1, "left")
    assert model.config.vocab_size == len(tok) == stats["vocab_size"]
    assert model.config.n_positions == train_text.BPE_N_POSITIONS
    assert model.generation_config.eos_token_id == tok.eos_token_id
    word = AutoTokenizer.from_pretrained(root / "target")
    assert tok.get_vocab() != word.get_vocab()
    r = load_task_data("cnn_dailymail", toy_data / "text" / "test.jsonl")[0]
    prompt = r["article"] + " Summary:"
    enc = tok(prompt, return_tensors="pt")
    assert tok.decode(enc.input_ids[0]) == prompt
    with torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=5, do_sample=False)
    assert out.shape[1] <= enc.input_ids.shape[1] + 5 and torch.equal(out[0, :enc.input_ids.shape[1]], enc.input_ids[0])
    assert isinstance(tok.decode(out[0, enc.input_ids.shape[1]:], skip_special_tokens=True), str)


def test_quick_speech_pair_reloads_with_from_pretrained_and_transcribes(toy_data, tmp_path):
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    models = tmp_path / "models"
    assert main(["toy", "train", "--task", "speech", "--data", str(toy_data), "--out", str(models), "--quick",
                 "--no-progress"]) == 0
    record = json.loads((models / "speech" / "training.json").read_text())
    assert record["models"]["draft"]["spec"]["decoder_layers"] == 1
    growth = record["target_growth"]   # the target's decoder grown, its output unchanged at growth, then fine-tuned
    assert (growth["from_layers"], growth["to_layers"]) == (2, train_speech.QUICK_TARGET_GROWN.decoder_layers)
    assert growth["max_abs_logit_change_at_growth"] < 1e-5
    assert len(growth["fine_tune"]["losses"]) == train_speech.QUICK_TARGET_GROWN.steps
    assert record["eval_greedy"]["clips"] == speech_data.QUICK_TEST_CLIPS
    target = WhisperForConditionalGeneration.from_pretrained(models / "speech" / "target").eval()
    draft = WhisperForConditionalGeneration.from_pretrained(models / "speech" / "draft").eval()
    assert target.config.decoder_layers == train_speech.QUICK_TARGET_GROWN.decoder_layers
    # the grown layers were trained: their zeroed output projections moved
    assert target.model.decoder.layers[2].fc2.weight.any()
    processor = WhisperProcessor.from_pretrained(models / "speech" / "target")
    fe, tok = processor.feature_extractor, processor.tokenizer
    assert fe.chunk_length == speech_data.CHUNK_SECONDS
    assert target.config.max_source_positions * 2 == fe.nb_max_frames
    # the draft's encoder is the target's
    for (k, a), b in zip(target.model.encoder.state_dict().items(), draft.model.encoder.state_dict().values()):
        assert torch.equal(a, b), k
    clip = load_task_data("librispeech", toy_data / "speech" / "test" / "manifest.jsonl")[0]
    features = processor(clip["audio"], sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
    assert features.shape == (1, 80, fe.nb_max_frames)
    sot, nots = tok.convert_tokens_to_ids("<|startoftranscript|>"), tok.convert_tokens_to_ids("<|notimestamps|>")
    tok.set_prefix_tokens(predict_timestamps=False)
    assert tok.prefix_tokens == [sot, nots] == record["decoder_prompt"]
    for model in (target, draft):
        out = model.generate(features, max_new_tokens=5, return_dict_in_generate=True)
        assert out.sequences[0, :2].tolist() == [sot, nots]  # the English-only Whisper prompt
        assert 3 <= out.sequences.shape[1] <= 7
        assert isinstance(processor.batch_decode(out.sequences, skip_special_tokens=True)[0], str)


@pytest.mark.slow
def test_pairs_trained_side_by_side_are_the_pairs_trained_alone(toy_data, tmp_path, capsys):
    from safetensors.torch import load_file

    both, alone = tmp_path / "both", tmp_path / "alone"
    assert main(["toy", "train", "--task", "text,speech", "--data", str(toy_data), "--out", str(both), "--quick",
                 "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "trained text pair" in out and "trained speech pair" in out and "1 thread(s) each" in out
    for task in ("text", "speech"):
        assert (both / task / "train.log").is_file()
        assert main(["toy", "train", "--task", task, "--data", str(toy_data), "--out", str(alone), "--quick",
                     "--threads", "1", "--no-progress"]) == 0
        for model in ("target", "draft", "draft-bpe") if task == "text" else ("target", "draft"):
            a, b = (load_file(root / task / model / "model.safetensors") for root in (both, alone))
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), (task, model)


@pytest.mark.slow
def test_side_by_side_training_names_the_pair_that_failed(toy_data, tmp_path, capsys):
    data = tmp_path / "data"
    (data / "text").mkdir(parents=True)
    (data / "text" / "train.jsonl").write_text((toy_data / "text" / "train.jsonl").read_text())
    (data / "text" / "test.jsonl").write_text((toy_data / "text" / "test.jsonl").read_text())
    assert main(["toy", "train", "--task", "text,speech", "--data", str(data), "--out", str(tmp_path / "m"),
                 "--quick"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "training failed for speech (exit 2" in err[0] and "text (exit" not in err[0]
    assert "toy data" in err[0]   # the speech pair's own one-line error: generate the data first
    with pytest.raises(SystemExit) as bad:   # argparse: a pair named twice
        main(["toy", "train", "--task", "text,text", "--data", str(data)])
    assert bad.value.code == 2
