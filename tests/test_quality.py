"""pipeline.quality: ROUGE against hand-computed values and against evaluate's definition (rouge_score's own
API, used the way evaluate's rouge metric uses it), WER counts, normalisers, empty strings."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import numpy as np
import pytest

from pipeline import quality

# ------------------------------------------------------------------------------------------- ROUGE


def test_rouge_hand_computed_pair():
    # tokens: the cat sat on the mat  vs  the cat is on the mat (6 tokens each)
    # ROUGE-1: clipped overlap the x2, cat, on, mat = 5 -> P = R = F = 5/6
    # ROUGE-2: shared bigrams "the cat", "on the", "the mat" = 3 of 5 -> F = 3/5
    # ROUGE-L: LCS "the cat on the mat" = 5 -> F = 5/6; one line, so Lsum = L
    result = quality.rouge(["The cat sat on the mat."], ["the cat is on the mat"])
    expected = {"rouge1": 5 / 6, "rouge2": 3 / 5, "rougeL": 5 / 6, "rougeLsum": 5 / 6}
    for key, value in expected.items():
        assert result.scores[key] == pytest.approx(value)  # a single sample: every bootstrap mean is that sample
        assert result.per_sample[0][key] == pytest.approx(value)
        assert result.mean[key] == pytest.approx(value)


def test_rouge_lsum_splits_on_newlines_only():
    # reference "a b" / "c d" on two lines, prediction "c d a b" on one line:
    # ROUGE-L over the whole text: LCS([a b c d], [c d a b]) = 2 -> P = R = 1/2 -> F = 1/2
    # ROUGE-Lsum: sentence "a b" shares a, b and sentence "c d" shares c, d with the prediction: union hits
    # 4 -> P = R = 1 -> F = 1
    result = quality.rouge(["c d a b"], ["a b\nc d"])
    assert result.per_sample[0]["rougeL"] == pytest.approx(0.5)
    assert result.per_sample[0]["rougeLsum"] == pytest.approx(1.0)
    # without the newline the reference is one sentence and Lsum falls back to L's value
    assert quality.rouge(["c d a b"], ["a b c d"]).per_sample[0]["rougeLsum"] == pytest.approx(0.5)


def test_rouge_no_stemming():
    # "cats"/"cat" and "running"/"run" differ without a stemmer: ROUGE-1 overlap is "the" only -> 1/3
    result = quality.rouge(["the cats running"], ["the cat run"])
    assert result.per_sample[0]["rouge1"] == pytest.approx(1 / 3)
    assert result.settings["use_stemmer"] is False


def test_rouge_empty_strings_score_zero():
    result = quality.rouge(["", "a b", ""], ["a b", "", ""])
    assert all(v == 0.0 for sample in result.per_sample for v in sample.values())


def test_rouge_seeded_and_leaves_global_rng_alone():
    preds = ["a b c", "a x", "d e f g", "q", "a b"]
    refs = ["a b d", "a y", "d e f", "q r", "b a"]
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    r1 = quality.rouge(preds, refs, seed=5)
    assert np.array_equal(np.random.get_state()[1], before)
    r2 = quality.rouge(preds, refs, seed=5)
    assert r1.as_dict() == r2.as_dict()
    assert all(r1.low[k] <= r1.scores[k] <= r1.high[k] for k in quality.ROUGE_TYPES)


def evaluate_style_rouge(predictions, references, seed):
    """evaluate's rouge metric with its defaults, written against rouge_score's API (evaluate.load needs the Hub):
    rouge_types rouge1/2/L/Lsum, use_stemmer False, score(reference, prediction), BootstrapAggregator,
    mid F-measure; plus its use_aggregator=False per-sample F-measures."""
    from rouge_score import rouge_scorer, scoring

    types = ["rouge1", "rouge2", "rougeL", "rougeLsum"]
    scorer = rouge_scorer.RougeScorer(rouge_types=types, use_stemmer=False, tokenizer=None)
    aggregator = scoring.BootstrapAggregator()
    per_sample = {k: [] for k in types}
    for ref, pred in zip(references, predictions):
        score = scorer.score(ref, pred)
        aggregator.add_scores(score)
        for k in types:
            per_sample[k].append(score[k].fmeasure)
    np.random.seed(seed)
    aggregate = aggregator.aggregate()
    return {k: aggregate[k].mid.fmeasure for k in aggregate}, per_sample


def _sentences(text: str) -> list[str]:
    return re.split(r"(?<=[.!?'])\s+(?=[A-Z'\"])", text.strip())


@pytest.mark.parametrize("lines", ["as_stored", "sentence_per_line"])
def test_rouge_matches_evaluate_definition_on_real_articles(fixtures_dir, lines):
    # The sample's highlights are stored on one line (the Hub's copy separates them with newlines), so the
    # second variant puts one sentence per line on both sides to exercise rougeLsum's newline split.
    rows = [json.loads(line) for line in (fixtures_dir / "cnn_dailymail" / "test.jsonl").read_text().splitlines()]
    if lines == "as_stored":
        predictions = [_sentences(r["article"])[0] for r in rows]  # lead-1
        references = [r["highlights"] for r in rows]
    else:
        predictions = ["\n".join(_sentences(r["article"])[:3]) for r in rows]  # lead-3
        references = ["\n".join(_sentences(r["highlights"])) for r in rows]
        assert sum("\n" in ref for ref in references) > 60
    ours = quality.rouge(predictions, references, seed=2024)
    expected, per_sample = evaluate_style_rouge(predictions, references, seed=2024)
    assert set(ours.scores) == set(expected)
    for k in expected:
        assert ours.scores[k] == pytest.approx(expected[k], abs=1e-12)
        assert [s[k] for s in ours.per_sample] == pytest.approx(per_sample[k], abs=1e-12)
        assert ours.mean[k] == pytest.approx(np.mean(per_sample[k]))
    assert 0.05 < ours.scores["rouge1"] < 0.8  # a lead overlaps its highlights, but not entirely
    if lines == "sentence_per_line":
        assert ours.scores["rougeLsum"] > ours.scores["rougeL"]  # summary-level LCS over sentences


# ------------------------------------------------------------------------------------------- WER


def test_wer_counts_and_corpus_definition():
    refs = ["the cat sat on the mat", "hello world"]
    preds = ["the cat sit on mat", "hello big world"]
    result = quality.wer(preds, refs)
    # pair 1: sat->sit (S), "the" dropped (D): 2 errors / 6 words; pair 2: "big" inserted (I): 1 / 2
    a, b = result.per_sample
    assert (a["substitutions"], a["deletions"], a["insertions"], a["hits"]) == (1, 1, 0, 4)
    assert (b["substitutions"], b["deletions"], b["insertions"], b["hits"]) == (0, 0, 1, 2)
    assert a["wer"] == pytest.approx(2 / 6) and b["wer"] == pytest.approx(1 / 2)
    # corpus WER is total errors over total reference words (3 / 8), not the mean of per-sample WERs
    assert result.wer == pytest.approx(3 / 8)
    assert (result.substitutions, result.deletions, result.insertions, result.hits) == (1, 1, 1, 6)
    assert result.reference_words == 8 and result.normalizer == "basic"


def whisper_tokenizer(tmp_path, spelling: dict[str, str] | None):
    """A WhisperTokenizer built offline: a two-entry vocabulary and a small English spelling map (the real
    whisper-small.en map has ~1700 British->American entries; building it needs the Hub)."""
    from transformers import WhisperTokenizer

    normalizer_file = None
    if spelling is not None:
        normalizer_file = tmp_path / "normalizer.json"
        normalizer_file.write_text(json.dumps(spelling), encoding="utf-8")
    return WhisperTokenizer(vocab={"<|endoftext|>": 0, "a": 1}, merges=[], normalizer_file=normalizer_file)


def test_wer_whisper_english_normaliser(tmp_path):
    tok = whisper_tokenizer(tmp_path, {"colour": "color"})
    normalize, name = quality.text_normalizer(tok)
    assert name == "whisper_english"
    for text in ("Mr. Smith's 2 cats", "mister smith's two cats", "The COLOUR, uh, is red!"):
        assert normalize(text) == tok.normalize(text)  # the tokenizer's own normaliser
    pred, ref = "Mr. Smith's 2 cats", "mister smith's two cats"
    english = quality.wer([pred, "the colour"], [ref, "the color"], tokenizer=tok)
    assert english.wer == 0.0 and english.normalizer == "whisper_english"
    # the basic normaliser only lower-cases and strips symbols: "mr smith s 2 cats" vs "mister smith s two cats"
    # -> 2 substitutions of 5 words; "colour" vs "color" -> 1 of 2
    basic = quality.wer([pred, "the colour"], [ref, "the color"])
    assert basic.normalizer == "basic"
    assert [s["substitutions"] for s in basic.per_sample] == [2, 1]
    assert basic.wer == pytest.approx(3 / 7)
    # a processor holding the tokenizer works too
    assert quality.text_normalizer(SimpleNamespace(tokenizer=tok))[1] == "whisper_english"


def test_wer_tokenizer_without_spelling_map_uses_basic(tmp_path):
    tok = whisper_tokenizer(tmp_path, None)
    assert quality.wer(["Hello, World"], ["hello world"], tokenizer=tok).normalizer == "basic"
    assert quality.text_normalizer(object())[1] == "basic"


def test_wer_empty_texts():
    result = quality.wer(["", "a b", "", "x y z"], ["", "", "one two", "x y z"])
    both_empty, ref_empty, pred_empty, exact = result.per_sample
    assert both_empty["wer"] == 0.0 and both_empty["reference_words"] == 0
    assert ref_empty["wer"] is None and ref_empty["insertions"] == 2
    assert pred_empty["wer"] == 1.0 and pred_empty["deletions"] == 2
    assert exact["wer"] == 0.0
    assert result.wer == pytest.approx((2 + 2) / (2 + 3))  # insertions count, empty references add no words
    assert quality.wer([""], [""]).wer is None


def test_metric_input_errors():
    with pytest.raises(ValueError, match="2 predictions but 1"):
        quality.wer(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="no predictions"):
        quality.rouge([], [])
    with pytest.raises(TypeError):
        quality.rouge([None], ["a"])


def test_greedy_agreement_counts_the_tokens_before_each_first_difference():
    from pipeline.quality import greedy_agreement

    ours = [{"id": "a", "token_ids": [1, 2, 3, 4]}, {"id": "b", "token_ids": [5, 6, 9, 9]},
            {"id": "c", "token_ids": [7]}, {"id": "z", "token_ids": [1]}]
    theirs = [{"id": "b", "token_ids": [5, 6, 7, 8]}, {"id": "a", "token_ids": [1, 2, 3, 4]},
              {"id": "c", "token_ids": [7, 8]}]
    got = greedy_agreement(ours, theirs)
    assert (got["samples"], got["identical"], got["shared_prefix_tokens"], got["tokens"]) == (3, 1, 7, 9)
    assert [r["first_difference"] for r in got["per_sample"]] == [None, 2, 1]   # "c" stopped early: differs at 1
    assert got["shared_prefix_share"] == 7 / 9
