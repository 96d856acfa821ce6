"""Quality metrics of the paper's two tasks: ROUGE (CNN/DailyMail) and WER (LibriSpeech).

ROUGE (:func:`rouge`) is computed as Hugging Face ``evaluate``'s ``rouge`` metric computes it by default,
which is what the paper reported: ``rouge_score``'s ``RougeScorer`` with rouge1, rouge2, rougeL and
rougeLsum, no stemmer, its default tokenizer (lower-case, non-alphanumerics to spaces), one reference
per prediction, each pair scored as ``scorer.score(reference, prediction)``, aggregated with
``rouge_score.scoring.BootstrapAggregator`` (1000 resamples, 95 % interval) and reported as the
aggregate's **mid F-measure**. ``evaluate.load("rouge")`` itself is not used: it fetches the metric's code
from the Hub at run time, which fails offline.

* Sentence splitting for ROUGE-Lsum: none is added, as in ``evaluate``. rougeLsum splits both texts on
  ``"\\n"`` (the scorer's own rule, ``split_summaries=False``): CNN/DailyMail highlights are already one
  sentence per line; a prediction is split where the model wrote newlines (a one-line prediction is one
  "sentence", so its rougeLsum is the summary-level LCS of that line against every reference sentence).
  Callers that want sentence-per-line predictions must insert the newlines themselves, before scoring.
* Reproducibility: the aggregator draws its resamples from NumPy's global generator; :func:`rouge` seeds
  it (``seed``) for the aggregation and restores the global state afterwards. ``evaluate`` does not seed,
  so its mid value (the median of the bootstrap means, not the plain mean) moves slightly between runs;
  the plain mean is reported too.
* Empty strings: scored by ``rouge_score`` as they are: an empty prediction or reference (no tokens)
  scores 0 on every type.

WER (:func:`wer`) is the corpus-level word error rate as ``evaluate``'s ``wer`` computes it: the sum over
utterances of (substitutions + deletions + insertions) over the sum of reference words (substitutions +
deletions + hits), with the alignments from ``jiwer.process_words``. Both sides are normalised first:

* with Whisper's English normaliser (``transformers``' ``EnglishTextNormalizer`` with the tokenizer's
  English spelling map, i.e. ``WhisperTokenizer.normalize``) when a tokenizer (or a processor holding one)
  with an ``english_spelling_normalizer`` map is given — the ``.en`` Whisper checkpoints ship one;
* otherwise with ``transformers``' ``BasicTextNormalizer`` (lower-case, symbols and brackets removed).

The result records which (``normalizer``). Empty texts after normalisation: an utterance whose reference
has no words adds its prediction's words as insertions to the corpus numerator and nothing to the
denominator; its own ``wer`` is 0.0 when the prediction is empty too and ``None`` (undefined) otherwise.
The corpus ``wer`` is ``None`` when no reference has any word. An empty prediction against a non-empty
reference is all deletions (per-utterance WER 1.0).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")
BOOTSTRAP_SAMPLES = 1000          # rouge_score's BootstrapAggregator default, as evaluate uses it
CONFIDENCE_INTERVAL = 0.95        # idem


@dataclass
class RougeResult:
    """ROUGE of a set of predictions. Every score is an F-measure in [0, 1].

    ``scores``: ``{rouge_type: mid}`` (the reported numbers, as ``evaluate`` returns them);
    ``low``/``high``: the bootstrap 95 % interval; ``mean``: the plain mean over samples;
    ``per_sample``: one ``{rouge_type: F}`` per prediction, in input order.
    """

    scores: dict[str, float]
    low: dict[str, float]
    high: dict[str, float]
    mean: dict[str, float]
    per_sample: list[dict[str, float]]
    settings: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def rouge(predictions: Sequence[str], references: Sequence[str], *, seed: int = 0,
          rouge_types: Sequence[str] = ROUGE_TYPES) -> RougeResult:
    """ROUGE F-measures of ``predictions`` against ``references`` (one reference string per prediction)
    as ``evaluate``'s ``rouge`` computes them by default; ``seed`` makes the bootstrap aggregate
    reproducible. See the module docstring for splitting and empty strings."""
    from rouge_score import rouge_scorer, scoring

    _check_pairs(predictions, references)
    scorer = rouge_scorer.RougeScorer(rouge_types=list(rouge_types), use_stemmer=False)
    aggregator = scoring.BootstrapAggregator(confidence_interval=CONFIDENCE_INTERVAL, n_samples=BOOTSTRAP_SAMPLES)
    per_sample = []
    for prediction, reference in zip(predictions, references):
        score = scorer.score(reference, prediction)
        aggregator.add_scores(score)
        per_sample.append({k: float(score[k].fmeasure) for k in rouge_types})
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        aggregate = aggregator.aggregate()
    finally:
        np.random.set_state(state)
    return RougeResult(
        scores={k: float(aggregate[k].mid.fmeasure) for k in rouge_types},
        low={k: float(aggregate[k].low.fmeasure) for k in rouge_types},
        high={k: float(aggregate[k].high.fmeasure) for k in rouge_types},
        mean={k: float(np.mean([s[k] for s in per_sample])) for k in rouge_types},
        per_sample=per_sample,
        settings={"rouge_types": list(rouge_types), "use_stemmer": False, "measure": "fmeasure",
                  "aggregator": "rouge_score BootstrapAggregator (mid)", "n_samples": BOOTSTRAP_SAMPLES,
                  "confidence_interval": CONFIDENCE_INTERVAL, "seed": seed,
                  "lsum_split": "on existing newlines only (as evaluate)"},
    )


@dataclass
class WerResult:
    """WER of a set of predictions.

    ``wer``: corpus WER (errors / reference words; ``None`` when there are no reference words);
    ``substitutions``/``deletions``/``insertions``/``hits``/``reference_words``: corpus totals;
    ``per_sample``: per utterance ``{"wer", "substitutions", "deletions", "insertions", "hits",
    "reference_words", "reference", "prediction"}`` (the two texts after normalisation);
    ``normalizer``: ``"whisper_english"`` or ``"basic"``.
    """

    wer: float | None
    substitutions: int
    deletions: int
    insertions: int
    hits: int
    reference_words: int
    normalizer: str
    per_sample: list[dict[str, Any]]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def text_normalizer(tokenizer: Any = None) -> tuple[Callable[[str], str], str]:
    """The normaliser WER applies and its name: ``(EnglishTextNormalizer(map), "whisper_english")`` when
    ``tokenizer`` (a ``WhisperTokenizer``, or a processor whose ``.tokenizer`` is one) carries an English
    spelling map, else ``(BasicTextNormalizer(), "basic")``."""
    from transformers.models.whisper.english_normalizer import BasicTextNormalizer, EnglishTextNormalizer

    tok = getattr(tokenizer, "tokenizer", tokenizer)
    mapping = getattr(tok, "english_spelling_normalizer", None) if tok is not None else None
    if isinstance(mapping, dict):
        return EnglishTextNormalizer(mapping), "whisper_english"
    return BasicTextNormalizer(), "basic"


def wer(predictions: Sequence[str], references: Sequence[str], *, tokenizer: Any = None) -> WerResult:
    """Corpus and per-utterance WER after normalising both sides (see the module docstring)."""
    import jiwer

    _check_pairs(predictions, references)
    normalize, name = text_normalizer(tokenizer)
    totals = {"substitutions": 0, "deletions": 0, "insertions": 0, "hits": 0}
    per_sample = []
    for prediction, reference in zip(predictions, references):
        ref, hyp = normalize(reference).strip(), normalize(prediction).strip()
        if ref.split():
            out = jiwer.process_words(ref, hyp)
            counts = {"substitutions": out.substitutions, "deletions": out.deletions,
                      "insertions": out.insertions, "hits": out.hits}
        else:
            counts = {"substitutions": 0, "deletions": 0, "insertions": len(hyp.split()), "hits": 0}
        n_ref = counts["substitutions"] + counts["deletions"] + counts["hits"]
        errors = counts["substitutions"] + counts["deletions"] + counts["insertions"]
        sample_wer = errors / n_ref if n_ref else (0.0 if errors == 0 else None)
        per_sample.append({"wer": sample_wer, **counts, "reference_words": n_ref,
                           "reference": ref, "prediction": hyp})
        for k in totals:
            totals[k] += counts[k]
    n_ref = totals["substitutions"] + totals["deletions"] + totals["hits"]
    errors = totals["substitutions"] + totals["deletions"] + totals["insertions"]
    return WerResult(wer=errors / n_ref if n_ref else None, **totals, reference_words=n_ref,
                     normalizer=name, per_sample=per_sample)


def _check_pairs(predictions: Sequence[str], references: Sequence[str]) -> None:
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
    if not predictions:
        raise ValueError("no predictions to score")
    for what, texts in (("prediction", predictions), ("reference", references)):
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"{what} {i} is {type(t).__name__}, not str")


def greedy_agreement(samples: Sequence[dict], reference: Sequence[dict]) -> dict:
    """How far a greedy run's tokens follow the target alone's (``reference``: the samples of a γ = 0 run of the same
    target, dtype and data, matched by id): for each sample the number of leading tokens the two share, the
    position of the first difference (None: identical), and in all, the samples identical and the share of tokens
    before each sample's first difference. Exact arithmetic makes a lossless rule identical on every sample, and so does
    the Llama family's packed static forward on a CPU in bfloat16 up to 9 tokens a forward (a verify forward's logits
    are the one-token forwards' bit for bit: pipeline/decoding/static/base.py's KEY_BLOCK, bf16_linear). Elsewhere
    (wider verify forwards, transformers' forward, a GPU) a forward over γ + 1 tokens and a one-token forward may
    round a near tie differently, after which the two texts go their own (equally greedy) ways."""
    by_id = {r["id"]: r["token_ids"] for r in reference}
    rows = []
    for s in samples:
        ours, theirs = s["token_ids"], by_id.get(s["id"])
        if theirs is None:
            continue
        same = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        first = None if ours == theirs else same
        rows.append({"id": s["id"], "shared_prefix": same, "first_difference": first, "tokens": len(ours)})
    tokens = sum(r["tokens"] for r in rows)
    return {"samples": len(rows), "identical": sum(r["first_difference"] is None for r in rows),
            "shared_prefix_tokens": sum(r["shared_prefix"] for r in rows), "tokens": tokens,
            "shared_prefix_share": sum(r["shared_prefix"] for r in rows) / tokens if tokens else None,
            "per_sample": rows}
