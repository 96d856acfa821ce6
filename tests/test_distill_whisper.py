"""`specsweep distill --task librispeech`: a Whisper draft decoder on its target's encoder
(pipeline/distill/whisper.py), and `specsweep speak` (pipeline/espeak.py), the speech it can be trained on.

A tiny random Whisper target (pipeline/synthetic.py) transcribes noise clips. A one-layer draft decoder (random
weights: the tiny target's first layer alone already agrees with it) distilled on its transcripts for a fixed number
of steps agrees with it (T = 0, per token, on held-out clips) at least 0.2 more than the same draft before its first
step. `specsweep run --draft DIR --draft-decoder-only` decodes with it to the target's own greedy output, with the
whole vocabulary and with a reduced one (the target's suppressed ids masked in the reduced head's rows); without
--draft-decoder-only the run refuses in one line.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pipeline.cli import main
from pipeline.decoding.logit_mask import LogitMask

STEPS = 150
CLIPS = 48
HOLDOUT = 8
EOS = 0                     # the tiny Whisper's end of text (and its pad)


def write_noise_clips(root, n: int, seed: int = 0):
    """n clips of noise of 0.5-1.9 s (each its own loudness, so the target transcribes them differently), in the
    LibriSpeech manifest schema."""
    sf = pytest.importorskip("soundfile")
    rs = np.random.RandomState(seed)
    lines = []
    for i in range(n):
        audio = rs.randn(int(16000 * rs.uniform(0.5, 1.9))) * rs.uniform(0.02, 0.4)
        sf.write(root / f"n{i}.wav", audio.astype("float32"), 16000)
        lines.append(json.dumps({"id": f"n{i}", "file": f"n{i}.wav", "text": "NOISE"}))
    (root / "noise.jsonl").write_text("\n".join(lines) + "\n")
    return root / "noise.jsonl"


@pytest.fixture(scope="module")
def distilled(tmp_path_factory):
    """(target folder, the noise manifest, the draft's folder, the reduced draft's folder)."""
    pytest.importorskip("jiwer")
    from pipeline.synthetic import save_whisper_pair

    root = tmp_path_factory.mktemp("distill-whisper")
    target, _ = save_whisper_pair(root, decoder_layers=2)
    data = write_noise_clips(root, CLIPS)
    common = ["distill", "--target", str(target), "--task", "librispeech", "--data", str(data), "--steps", str(STEPS),
              "--holdout", str(HOLDOUT), "--layers", "1", "--init", "fresh", "--lr", "3e-3", "--max-new-tokens", "12",
              "--threads", "1", "--no-progress"]
    assert main([*common, "--out", str(root / "distilled")]) == 0
    assert main([*common, "--out", str(root / "reduced"), "--steps", "3", "--draft-vocab", "40"]) == 0
    return target, data, root / "distilled", root / "reduced"


@pytest.mark.slow
def test_distilled_whisper_decoder_agrees_with_its_target_more_than_untrained(distilled):
    _, _, draft, _ = distilled
    record = json.loads((draft / "distill.json").read_text())
    start, final = record["start"]["heldout"], record["final"]["heldout"]
    assert record["data"]["heldout"] == HOLDOUT and record["training"]["steps"] == STEPS
    assert final["agreement"] >= start["agreement"] + 0.2, (start, final)
    config = json.loads((draft / "config.json").read_text())
    assert config["architectures"] == ["WhisperForCausalLM"] and config["decoder_layers"] == 1
    assert (draft / "preprocessor_config.json").exists() or (draft / "processor_config.json").exists()
    heldout = [json.loads(line) for line in (draft / "heldout.jsonl").read_text().splitlines()]
    assert len(heldout) == HOLDOUT and all("audio" not in r and r["id"].startswith("n") for r in heldout)


def _run_tokens(target, data, tmp_path, name, *flags):
    out = tmp_path / f"{name}.json"
    assert main(["run", "--target", str(target), "--task", "librispeech", "--data", str(data), "--limit", "6",
                 "--max-new-tokens", "12", "--temperature", "0", "--repeats", "3", "--samples-per-repeat", "1",
                 "--threads", "1", "--no-progress", "--out", str(out), *flags]) == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize("which", ["draft", "reduced"])
def test_run_with_the_distilled_decoder_is_the_targets_greedy_output(distilled, tmp_path, which):
    target, data, draft, reduced = distilled
    folder = draft if which == "draft" else reduced
    base = _run_tokens(target, data, tmp_path, "ar", "--gamma", "0")
    spec = _run_tokens(target, data, tmp_path, which, "--draft", str(folder), "--draft-decoder-only", "--gamma", "3")
    assert [s["token_ids"] for s in spec["samples"]] == [s["token_ids"] for s in base["samples"]]
    assert spec["metrics"]["drafted_tokens"] > 0
    expected = {"drafter": "model"} if which == "draft" else {"drafter": "model", "draft_vocab": 40}
    assert spec["resolved"]["drafter"] == expected


def test_a_decoder_only_draft_without_the_flag_is_refused_in_one_line(distilled, tmp_path, capsys):
    target, data, draft, _ = distilled
    assert main(["run", "--target", str(target), "--draft", str(draft), "--task", "librispeech", "--data", str(data),
                 "--gamma", "2", "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--draft-decoder-only" in err and len(err.splitlines()) == 1


def test_suppressed_ids_are_masked_in_a_reduced_heads_rows():
    mask = LogitMask([3, 7, 50], [9], torch.device("cpu"))
    rows = mask.restricted([1, 3, 9, 50, 60])             # row k is target id ids[k]
    logits = torch.zeros(2, 5)
    rows(logits, first_position=False)
    assert torch.isinf(logits).nonzero()[:, 1].tolist() == [1, 3, 1, 3]
    rows(logits, first_position=True)
    assert torch.isinf(logits[0]).tolist() == [False, True, True, True, False]


def test_the_curves_agreement_masks_the_targets_suppressed_ids_in_the_drafts_rows(monkeypatch):
    """The held-out agreement reads the draft as `specsweep run` decodes with it: Whisper's suppressed ids masked
    in its rows (begin_suppress at the first continuation position only), here over a reduced head."""
    from pipeline.distill import train as train_module
    from pipeline.distill.settings import DistillSettings
    from pipeline.distill.student import Vocabulary
    from pipeline.distill.teacher import TeacherSequence

    vocab = Vocabulary.of([0, 3, 5, 6, 7], 10, True)             # rows 0..4 are target ids 0, 3, 5, 6, 7
    seq = TeacherSequence(ids=torch.tensor([1, 2, 5, 6, 6]), prompt=2, positions=torch.arange(4),
                          top_ids=torch.tensor([[0], [5], [6], [6]]), top_logp=torch.zeros(4, 1))
    # the draft's rows at positions 1 (the first continuation token), 2 and 3: its best is a suppressed id (7), or
    # a begin-suppressed one (3) at the first position, which the mask removes, or 3 where it is allowed
    table = {1: [0, 9, 5, 0, 0], 2: [0, 0, 0, 5, 9], 3: [0, 9, 0, 5, 0]}

    def fake_logits(draft, input_ids, attention_mask, rows, cols, vocab, context=None):
        return torch.tensor([table[int(c)] for c in cols], dtype=torch.float32)

    monkeypatch.setattr(train_module, "student_logits", fake_logits)
    settings = DistillSettings(target="t", data="d", out="o", steps=1)
    draft = torch.nn.Linear(1, 1)
    plain = train_module.evaluate(draft, [seq], vocab, settings, 0, "cpu")
    masked = train_module.evaluate(draft, [seq], vocab, settings, 0, "cpu",
                                   LogitMask([7], [3], torch.device("cpu")))
    assert plain["positions"] == masked["positions"] == 3
    assert plain["agreement"] == 0.0 and masked["agreement"] == pytest.approx(2 / 3)


def test_the_decoder_only_check_reads_a_registry_drafts_converted_folder(distilled, monkeypatch):
    """A draft named from the registry is checked in its converted folder: its name is not a Hub id (offline,
    transformers retried that request for about 20 s before the run loaded anything)."""
    from types import SimpleNamespace

    import transformers

    from pipeline import stack
    from pipeline.errors import SpecsweepError

    draft = str(distilled[2])
    read = []
    original = transformers.AutoConfig.from_pretrained
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained",
                        lambda name, *a, **k: read.append(str(name)) or original(name, *a, **k))
    monkeypatch.setattr(stack, "resolve", lambda name: draft if name == "my-registry-draft" else name)
    with pytest.raises(SpecsweepError, match="add --draft-decoder-only"):
        stack.check_decoder_only(SimpleNamespace(draft="my-registry-draft", draft_decoder_only=False))
    assert read == [draft]


def _whisper_on_policy(target_dir, data, masked: bool, batches: int = 6):
    """The tiny target with suppress lists (half of its ids; first also EOS, the ids its transcripts start with and
    a sixth of its ids), its transcripts of 8 clips, and ``batches`` on-policy batches of 4 from a random one-layer
    draft over a reduced vocabulary (its row k is not target id k), the mask given to on_policy_batch or not:
    (target, the mask, the teacher sequences, the sampled ones)."""
    from pipeline.config import RunConfig
    from pipeline.data import load_task_data
    from pipeline.distill import whisper
    from pipeline.distill.on_policy import on_policy_batch
    from pipeline.distill.recipe import suppress_mask
    from pipeline.distill.settings import DistillSettings
    from pipeline.distill.student import Vocabulary, build_student
    from pipeline.models import load_processor, load_speech_seq2seq
    from pipeline.tasks import get_task

    processor = load_processor(str(target_dir))
    target = load_speech_seq2seq(str(target_dir), torch.float32, "cpu")
    V = target.get_output_embeddings().weight.shape[0]
    config = RunConfig(target=str(target_dir), data=str(data), task="librispeech", max_new_tokens=8)
    encode = get_task("librispeech").encoder(target, processor.tokenizer, processor, config)
    records = load_task_data("librispeech", str(data))[:8]
    gc = target.generation_config
    gc.suppress_tokens = list(range(5, V, 2))
    starts = {int(t.ids[t.prompt]) for t in whisper.teacher_pass(target, encode, records, [EOS], EOS, 8, 5,
                                                                 suppress_mask(target, processor), progress=False)}
    gc.begin_suppress_tokens = sorted(starts | {EOS} | set(range(6, V, 6)))    # half the draft's rows left
    mask = suppress_mask(target, processor)
    teachers = whisper.teacher_pass(target, encode, records, [EOS], EOS, 8, 5, mask, progress=False)
    draft = build_student(target, DistillSettings(target="t", data="d", out="o", steps=1, layers=1, init="fresh"))
    vocab = Vocabulary.of(list(range(0, V, 3)), V, True)
    g = torch.Generator().manual_seed(0)
    sampled = [s for i in range(batches)
               for s in on_policy_batch(draft, target, vocab, teachers[4 * (i % 2): 4 * (i % 2) + 4], 6, [EOS], EOS,
                                        5, g, mask if masked else None)]
    return target, mask, teachers, sampled


def test_whisper_on_policy_laws_are_the_targets_own_and_never_suppressed(distilled):
    """An on-policy batch for a Whisper draft: the draft samples after a prefix reading the clip's encoder output,
    never a suppressed id (nor a begin-suppressed one first), and each kept law is the target's own on prefix +
    sample with that encoder output, its suppress lists applied as the teacher pass applies them."""
    target_dir, data, _, _ = distilled
    target, mask, teachers, sampled = _whisper_on_policy(target_dir, data, masked=True)
    suppress, begin = set(mask.ids), set(mask.begin_ids)
    prompt, starts, unmasked_top = teachers[0].prompt, 0, set()
    for s in sampled:
        assert s.source == "draft" and s.context is not None and s.continuation.all()
        assert any(torch.equal(s.context, t.context) and torch.equal(s.ids[: s.prompt], t.ids[: s.prompt])
                   for t in teachers)
        drawn = s.ids[s.prompt:].tolist()
        assert drawn and not set(drawn) & suppress
        with torch.no_grad():
            logits = target(encoder_outputs=(s.context[None],), decoder_input_ids=s.ids[None]).logits[0].float()
        unmasked_top |= set(torch.log_softmax(logits, -1)[s.positions].topk(5).indices.flatten().tolist())
        logp = torch.log_softmax(mask.at(logits, torch.arange(len(s.ids)) == prompt - 1), -1)[s.positions]
        values, ids = logp.topk(5)
        assert torch.equal(s.top_ids, ids) and torch.allclose(s.top_logp, values, atol=1e-4)
        assert logp[:, sorted(suppress)].exp().sum() == 0 and not set(s.top_ids.flatten().tolist()) & suppress
        if s.prompt == prompt:                          # the sample starts the transcript: begin_suppress too
            starts += 1
            assert drawn[0] not in begin and not set(s.top_ids[0].tolist()) & begin
    assert starts > 0
    # the mask is what keeps them out: unmasked, the target's top 5 and the draft's samples hold suppressed ids
    assert unmasked_top & suppress
    _, _, _, unmasked = _whisper_on_policy(target_dir, data, masked=False, batches=2)
    assert any(set(s.ids[s.prompt:].tolist()) & suppress for s in unmasked)


def test_on_policy_steps_run_for_a_whisper_draft(distilled, tmp_path):
    target, data, _, _ = distilled
    out = tmp_path / "on-policy"
    assert main(["distill", "--target", str(target), "--task", "librispeech", "--data", str(data), "--limit", "12",
                 "--holdout", "2", "--steps", "12", "--layers", "1", "--init", "fresh", "--max-new-tokens", "12",
                 "--on-policy", "0.5", "--on-policy-tokens", "4", "--threads", "1", "--no-progress",
                 "--out", str(out)]) == 0
    record = json.loads((out / "distill.json").read_text())
    training = record["training"]
    assert training["steps"] == 12 and 0 < training["on_policy_steps"] <= 9 and training["on_policy_seconds"] > 0
    assert record["settings"]["on_policy"] == 0.5 and record["final"]["heldout"]["positions"] > 0


def test_bad_speech_settings_fail_in_one_line(distilled, tmp_path, capsys):
    target, data, _, _ = distilled
    for extra, needle in ((["--teacher-temperature", "0.5"], "--teacher-temperature"),
                          (["--width", "32", "--init", "fresh"], "--width")):
        assert main(["distill", "--target", str(target), "--task", "librispeech", "--data", str(data), "--steps", "1",
                     "--out", str(tmp_path / "x"), "--no-progress", *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and "--on-policy" not in err and len(err.splitlines()) == 1
        assert not (tmp_path / "x").exists()


def test_speak_writes_a_librispeech_manifest(tmp_path, capsys):
    pytest.importorskip("espeakng_loader")
    from pipeline.data import load_task_data

    texts = tmp_path / "texts.jsonl"
    texts.write_text(json.dumps({"article": "The cat sat on the mat. It was a sunny day in the town. "
                                            "Nobody knew where the old man had gone."}) + "\n")
    assert main(["speak", "--texts", str(texts), "--field", "article", "--clips", "2", "--words", "8",
                 "--out", str(tmp_path / "speech"), "--no-progress"]) == 0
    records = load_task_data("librispeech", tmp_path / "speech" / "transcripts.jsonl")
    assert len(records) == 2
    for r in records:
        assert 1.0 < r["duration"] <= 30.0 and len(r["text"].split()) >= 8
        assert float(np.abs(r["audio"]).max()) > 0.05          # speech, not silence
    assert main(["speak", "--texts", str(texts), "--out", str(tmp_path / "again")]) == 2
    assert "--field" in capsys.readouterr().err
    # a folder written by `specsweep fetch` reads the same
    articles = tmp_path / "articles.jsonl"
    articles.write_text(json.dumps({"id": "a1", "article": json.loads(texts.read_text())["article"],
                                    "highlights": "A cat."}) + "\n")
    assert main(["fetch", "--task", "cnn_dailymail", "--source", str(articles), "--out", str(tmp_path / "fetched"),
                 "--no-progress"]) == 0
    assert main(["speak", "--texts", str(tmp_path / "fetched"), "--field", "article", "--clips", "1", "--words", "8",
                 "--out", str(tmp_path / "speech2"), "--no-progress"]) == 0
    again = load_task_data("librispeech", tmp_path / "speech2" / "transcripts.jsonl")
    assert len(again) == 1 and len(again[0]["text"].split()) >= 8
