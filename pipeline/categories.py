"""Per-category results of a run whose samples have categories (``spec_bench``, pipeline/tasks/spec_bench.py): how
far its outputs agree with the γ = 0 loop's, and per category, per group of categories and overall the quality
pass's tokens and mean accepted tokens and the paired timing's tokens/s and speedup.

Definitions (a unit is one decoded prompt, a sample; a question is one or more units, its conversation's turns):

  mean_accepted_tokens  Σ new tokens / Σ verify steps over the units (each step's accepted tokens plus the
                        corrected or bonus token, pooled over steps as Spec-Bench's mean of accept lengths; 1.00 for
                        plain decoding)
  identical_outputs     the share of units whose tokens equal the γ = 0 loop's for the same unit
  token_agreement       Σ positions where both emitted the same token / Σ the longer output's length
  prefix_agreement      Σ tokens before the first divergence / Σ the γ = 0 loop's tokens
  tokens_per_second     per repeat, the mean over the timed questions of a question's tokens / its seconds (its
                        turns summed; a unit's seconds are its batch's), as Spec-Bench's evaluation/speed.py
                        averages per-question rates; the median over repeats
  speedup               per repeat, that mean for the speculative loop / the mean for the γ = 0 loop, timed in the
                        same repeat on the same prompts; the median over repeats with its order-statistic interval
                        (pipeline/measure.py). A group's (and the overall) mean runs over every timed question of its
                        categories, as Spec-Bench's does over a group's questions
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.measure import median_ci
from pipeline.paired import AUTOREGRESSIVE, SPECULATIVE

OVERALL = "overall"


def agreement(outputs: Sequence[Sequence[int]], references: Sequence[Sequence[int]]) -> tuple[dict, list[dict]]:
    """Token ids of each unit's output and of the γ = 0 loop's output for it -> (corpus quality, per-unit quality).

    Per unit: ``identical`` (1.0 or 0.0), ``token_agreement`` (matched / compared), ``matched_tokens`` (positions
    with the same token), ``compared_tokens`` (the longer output's length), ``prefix_tokens`` (tokens before the
    first divergence), ``ar_tokens`` (the reference's length) and ``first_divergence`` (the first differing position,
    None for identical outputs). Corpus: ``identical_outputs``, ``token_agreement``, ``prefix_agreement`` (pooled as
    the module docstring says) and ``units``."""
    if len(outputs) != len(references):
        raise ValueError(f"agreement needs one reference per output; got {len(outputs)} and {len(references)}")
    per = []
    for out, ref in zip(outputs, references):
        out, ref = list(out), list(ref)
        matched = sum(a == b for a, b in zip(out, ref))
        prefix = next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), min(len(out), len(ref)))
        same = out == ref
        compared = max(len(out), len(ref))
        per.append({"identical": float(same), "token_agreement": matched / compared if compared else 1.0,
                    "matched_tokens": matched, "compared_tokens": compared, "prefix_tokens": prefix,
                    "ar_tokens": len(ref), "first_divergence": None if same else prefix})
    return _pooled(per), per


def _pooled(per: list[dict]) -> dict:
    """Corpus agreement of per-unit agreement records (those that have one)."""
    scored = [q for q in per if "compared_tokens" in q]
    if not scored:
        return {}
    compared, reference = sum(q["compared_tokens"] for q in scored), sum(q["ar_tokens"] for q in scored)
    return {"identical_outputs": sum(q["identical"] for q in scored) / len(scored),
            "token_agreement": sum(q["matched_tokens"] for q in scored) / compared if compared else 1.0,
            "prefix_agreement": sum(q["prefix_tokens"] for q in scored) / reference if reference else 1.0,
            "units": len(scored)}


def by_category(units: list[dict], samples: list[dict], timings: dict | None,
                groups: dict[str, Sequence[str]]) -> dict:
    """A run's metrics per category and per group.

    units    the run's decode units in order, each with "id", "category" and "question_id"
    samples  its samples, one per unit in the same order ("new_tokens", "verify_steps", "accepted", "drafted", and
             "quality" from :func:`agreement` where the outputs were compared)
    timings  the measurement's per-category timing (pipeline/paired.py ``time_groups``'s by_group), or None
    groups   group name -> its categories (a group is reported when any of them ran; ``overall`` is every category)
    Returns {"by_category": {category: figures}, "by_group": {group: figures, ..., "overall": figures}}; figures:
    categories, questions, samples, new_tokens, verify_steps, mean_accepted_tokens, acceptance_rate, the agreement
    of :func:`agreement` (where compared), and from the timing timed_questions, timed_samples, tokens_per_second,
    ar_tokens_per_second, and with both loops speedup, speedup_ci_low, speedup_ci_high, speedup_ci_coverage.
    """
    if len(units) != len(samples):
        raise ValueError(f"by_category needs one sample per unit; got {len(units)} units and {len(samples)} samples")
    categories = list(dict.fromkeys(u["category"] for u in units))
    question_of = {u["id"]: u["question_id"] for u in units}
    sets = {c: (c,) for c in categories}
    per_category = {c: _figures(sets[c], units, samples, timings or {}, question_of) for c in categories}
    per_group = {g: _figures(tuple(c for c in members if c in categories), units, samples, timings or {},
                             question_of)
                 for g, members in groups.items() if any(c in categories for c in members)}
    per_group[OVERALL] = _figures(tuple(categories), units, samples, timings or {}, question_of)
    return {"by_category": per_category, "by_group": per_group}


def _figures(members: tuple[str, ...], units: list[dict], samples: list[dict], timings: dict,
             question_of: dict) -> dict:
    chosen = [s for u, s in zip(units, samples) if u["category"] in members]
    new_tokens = sum(s["new_tokens"] for s in chosen)
    steps = sum(s["verify_steps"] for s in chosen)
    accepted, drafted = sum(s.get("accepted", 0) for s in chosen), sum(s.get("drafted", 0) for s in chosen)
    out = {"categories": list(members),
           "questions": len({u["question_id"] for u in units if u["category"] in members}),
           "samples": len(chosen), "new_tokens": new_tokens, "verify_steps": steps,
           "mean_accepted_tokens": new_tokens / steps if steps else None,
           "acceptance_rate": accepted / drafted if drafted else None,
           **{k: v for k, v in _pooled([s.get("quality") or {} for s in chosen]).items() if k != "units"}}
    timed = [timings[c] for c in members if c in timings]
    if timed:
        out.update(speed(timed, question_of))
    return out


def speed(records: list[dict], question_of: dict) -> dict:
    """Tokens/s and the paired speedup over the timing records of some categories (``time_groups``'s by_group
    values: "ids" and per loop "unit_seconds", "unit_tokens" [R][U]), a question's rate being its units' tokens over
    their seconds -> timed_questions, timed_samples, tokens_per_second, ar_tokens_per_second (medians over repeats)
    and, with both loops, speedup, speedup_ci_low, speedup_ci_high and speedup_ci_coverage."""
    rates = {loop: question_mean_rates(records, loop, question_of)
             for loop in (SPECULATIVE, AUTOREGRESSIVE) if all(loop in r for r in records)}
    ids = [i for r in records for i in r["ids"]]
    out = {"timed_questions": len({question_of[i] for i in ids}), "timed_samples": len(ids)}
    main = rates.get(SPECULATIVE) or rates[AUTOREGRESSIVE]
    out["tokens_per_second"] = median_ci(main).median
    out["ar_tokens_per_second"] = median_ci(rates[AUTOREGRESSIVE]).median
    if SPECULATIVE in rates:
        ci = median_ci([a / b for a, b in zip(rates[SPECULATIVE], rates[AUTOREGRESSIVE])])
        out.update({"speedup": ci.median, "speedup_ci_low": ci.low, "speedup_ci_high": ci.high,
                    "speedup_ci_coverage": ci.coverage})
    return out


def question_mean_rates(records: list[dict], loop: str, question_of: dict) -> list[float]:
    """Per repeat, the mean over questions of (Σ its units' tokens / Σ their seconds) for ``loop`` -> float [R]."""
    repeats = len(records[0][loop]["unit_seconds"])
    out = []
    for r in range(repeats):
        sums: dict[str, list[float]] = {}
        for record in records:
            timing = record[loop]
            for unit, seconds, tokens in zip(record["ids"], timing["unit_seconds"][r], timing["unit_tokens"][r]):
                acc = sums.setdefault(question_of[unit], [0.0, 0.0])
                acc[0] += tokens
                acc[1] += seconds
        out.append(sum(t / s for t, s in sums.values()) / len(sums))
    return out


def summary_lines(by_group: dict) -> list[str]:
    """What `specsweep run` prints of :func:`by_category`'s groups: one line each, 'translation: 1.23x [1.10, 1.31],
    2.10 tokens/step over 8 questions'."""
    lines = []
    for group, f in by_group.items():
        tokens = f.get("mean_accepted_tokens")
        parts = [f"{tokens:.2f} tokens/step" if tokens is not None else "no verify step"]
        if f.get("speedup") is not None:
            parts.insert(0, f"{f['speedup']:.2f}x [{f['speedup_ci_low']:.2f}, {f['speedup_ci_high']:.2f}]")
        agreement = f.get("identical_outputs")
        same = f"; {agreement:.0%} identical to AR" if agreement is not None else ""
        lines.append(f"  {group}: {', '.join(parts)} over {f['questions']} question(s){same}")
    return lines
