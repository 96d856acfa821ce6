"""Which setting to use: per task, model pair and decoding temperature, the fastest setting within a quality loss, and
the best lossless. A greedy run and a sampled one answer different questions (a user decodes at one temperature), so
they are never ranked against each other.

Quality loss is relative to the reference quality of the same task, model pair, dtype and temperature: the AR baseline
(γ = 0 sampling from the target alone) when there is one, else the mean of the exact sampler's runs. The AR baseline
does not use the draft, so a pair without its own takes one of the same task, target and dtype measured with another
draft (the pipeline measures one per task, and a target may be run with several drafts, e.g. one with another
tokenizer: pipeline/decoding/drafters/cross_tokenizer.py). It is
1 - quality ratio, the ratio the project's ``tradeoff`` uses: ROUGE-L / reference ROUGE-L, or for WER
(1 - WER) / (1 - reference WER). A negative loss means better than the reference (sampling noise, on few samples).

Runs and trials whose speed measurement is flagged (:func:`flagged`) are never candidates.

Speed: candidates are ranked by ``speedup_vs_reference`` (analysis/speed_reference.py): a task and target measured in
several dtypes is ranked against the target alone in its fastest measured dtype, not each run against the target
alone in its own dtype; with one dtype that is the paired speedup itself.

Lossless: what the acceptance-rule registry says (pipeline/rules.py): exact and hf at any temperature (they
sample the target's distribution exactly), greedy at temperature 0 only (it reproduces the target's greedy
decoding; at T > 0 it is not lossless with respect to sampling).
"""

from __future__ import annotations

import math

from pipeline.objectives import QUALITY, quality_ratio
from pipeline.rules import is_lossless, param_names

from .speed_reference import add_speed_reference

GROUP = ("task", "target", "draft")
DECODING = (*GROUP, "temperature")
"""What one recommendation is for: a pair on a task at one decoding temperature."""
CANDIDATE_KINDS = ("run", "trial")


def at_temperature(rows, temperature):
    """``rows`` decoded at ``temperature``, with those whose temperature is not recorded (results older than the
    column); all of them where ``temperature`` is unknown (None or NaN) or the table has no such column."""
    wanted = to_number(temperature)
    if wanted is None or "temperature" not in rows.columns:
        return rows
    return rows.iloc[[i for i, t in enumerate(rows["temperature"]) if to_number(t) in (None, wanted)]]


def reference_quality(table, task, target, draft, dtype, temperature=None) -> tuple[float | None, str]:
    """(raw reference score, where it came from) for one task, pair, dtype and temperature (None: any)."""
    if task not in QUALITY:
        return None, "no quality metric"
    key = QUALITY[task][0]
    if key not in table.columns:
        return None, "no scores"
    same = at_temperature(table[(table["task"] == task) & (table["target"] == target) & (table["draft"] == draft)
                                & (table["dtype"] == dtype)], temperature)
    base = at_temperature(baselines(table, task, target, draft, dtype), temperature)
    base = base[base[key].notna()]
    if not base.empty:
        return float(base[key].iloc[0]), f"AR baseline {base['source'].iloc[0]}"
    exact = same[same["kind"].isin(CANDIDATE_KINDS) & (same["sampler"] == "exact") & same[key].notna()]
    if not exact.empty:
        return float(exact[key].mean()), f"mean of {len(exact)} exact run(s)"
    return None, "no AR baseline or exact run"


def baselines(table, task, target, draft, dtype=None):
    """The AR baseline rows (γ = 0, the target alone) of a pair: its own (same draft), else those of the same task
    and target measured with another draft (the draft is not used at γ = 0); of ``dtype`` when given."""
    if table.empty or "kind" not in table.columns:
        return table[:0]
    base = table[(table["kind"] == "baseline") & (table["task"] == task) & (table["target"] == target)]
    if dtype is not None:
        base = base[base["dtype"] == dtype]
    own = base[base["draft"] == draft]
    if not own.empty:
        return own
    return base.sort_values("source", kind="stable") if "source" in base.columns else base


def of_kind(table, *kinds):
    """The table's rows of these kinds (run, trial, baseline, latency, loop, lossless, serving...); none when the
    table has no kind column (an empty table)."""
    return table[table["kind"].isin(kinds)] if "kind" in table.columns else table[:0]


def flagged(table):
    """bool Series: rows whose speed measurement is flagged (pipeline/measure.py); False where not recorded."""
    import pandas as pd

    if "flagged" not in table.columns:
        return pd.Series(False, index=table.index)
    return table["flagged"].map(lambda v: v is True or v == 1 or str(v).lower() == "true")


def with_speed_reference(table):
    """``table`` with the common speed reference's columns (:func:`add_speed_reference`), flagged rows' speeds not
    used for it."""
    return add_speed_reference(table, ~flagged(table))


def with_loss(table):
    """Candidate rows (runs and completed trials with a speedup on the common speed reference,
    ``speedup_vs_reference``, and a measurement that is not flagged) with ``reference`` and ``quality_loss``
    columns. Flagged rows are left out: they are listed on their own."""
    import pandas as pd

    if table.empty or "speedup" not in table.columns:
        return pd.DataFrame()
    table = with_speed_reference(table)
    cand = table[table["kind"].isin(CANDIDATE_KINDS) & table["speedup_vs_reference"].notna()
                 & ~flagged(table)].copy()
    if "trial_state" in cand.columns:
        cand = cand[cand["trial_state"].isna() | (cand["trial_state"] == "COMPLETE")]
    refs, losses, ref_src = [], [], []
    for _, row in cand.iterrows():
        ref, src = reference_quality(table, row["task"], row["target"], row["draft"], row["dtype"],
                                     row.get("temperature"))
        key = QUALITY.get(row["task"], (None,))[0]
        value = row.get(key) if key else None
        loss = None
        if ref is not None and to_number(value) is not None:
            ratio = quality_ratio(row["task"], {key: float(value)}, {key: ref})
            loss = None if ratio is None else 1.0 - ratio
        refs.append(ref)
        losses.append(loss)
        ref_src.append(src)
    cand["reference"] = refs
    cand["reference_source"] = ref_src
    cand["quality_loss"] = pd.to_numeric(pd.Series(losses, index=cand.index, dtype=object), errors="coerce")
    return cand


def recommend(table, max_quality_loss: float = 0.01):
    """One or two rows per (task, target, draft, temperature): ``choice`` = 'fastest within loss' and 'best
    lossless'.

    A group with nothing eligible gets a row whose ``run`` is None and whose ``note`` says why. A choice that is
    slower than decoding with the target alone (its speedup interval, or its speedup where it has none, lies
    below 1) keeps its row, and its ``note`` says so: the best setting of a pair can still lose to no drafting. So
    does a choice whose interval reaches below 1: its repeats do not show it faster than the target alone."""
    import pandas as pd

    if not (max_quality_loss >= 0 and math.isfinite(max_quality_loss)):
        raise ValueError(f"max_quality_loss must be a finite number >= 0; got {max_quality_loss}")
    cand = with_loss(table)
    out = []
    if cand.empty:
        return pd.DataFrame(out)
    if "temperature" not in cand.columns:
        cand = cand.assign(temperature=float("nan"))
    for (task, target, draft, temperature), group in cand.groupby(list(DECODING), sort=True, dropna=False):
        within = group[group["quality_loss"].notna() & (group["quality_loss"] <= max_quality_loss)]
        lossless = group[[is_lossless(s, t) for s, t in zip(group["sampler"], group.get("temperature"))]]
        why_none = ("task has no quality metric" if task not in QUALITY else
                    "no AR baseline or exact run at this temperature to measure a loss against"
                    if group["quality_loss"].isna().all() else "no run with a known quality loss this small")
        choices = ((f"fastest within {max_quality_loss:.1%} quality loss", within, why_none),
                   ("best lossless", lossless, "no lossless run"))
        for label, rows, why in choices:
            base = {"task": task, "target": target, "draft": draft, "temperature": temperature, "choice": label}
            if rows.empty:
                out.append({**base, "run": None, "note": why})
                continue
            best = rows.sort_values(["speedup_vs_reference", "quality_loss"], ascending=[False, True]).iloc[0]
            out.append({**base, **{k: best.get(k) for k in (
                "run", "kind", "sampler", "backend", "gamma", *param_names(), "preset", "dtype",
                "speedup", "speedup_ci_low", "speedup_ci_high", *VS_REFERENCE, "speed_reference_dtype",
                "speed_dtypes", "quality", "quality_loss", "reference",
                "reference_source", "acceptance_rate", "draft_tokenizer_mode",
                "source", "device_name", "date", "cpu_only")}, "note": _slower_note(best)})
    return pd.DataFrame(_point_to_a_faster_draft(out))


def _point_to_a_faster_draft(rows: list[dict]) -> list[dict]:
    """A choice slower than the target alone names the draft or drafter of the same task, target and choice that is
    shown faster than the target alone (its interval above 1x; the fastest such), where there is one: "decode with
    the target alone" would be the wrong advice when another draft of the same target wins. Speeds are against the
    common reference (``speedup_vs_reference``)."""
    speed, low, high = VS_REFERENCE
    for row in rows:
        if not str(row.get("note") or "").startswith(SLOWER):
            continue
        faster = [r for r in rows if r.get("run") is not None and r is not row
                  and all(r.get(k) == row.get(k) for k in ("task", "target", "choice"))
                  and _same_temperature(r.get("temperature"), row.get("temperature"))
                  and (to_number(r.get(low)) or 0.0) > 1]
        if faster:
            best = max(faster, key=lambda r: to_number(r.get(speed)) or 0.0)
            faster_one = (f"on this target, {best['draft']} is faster ({best[speed]:.2f}x "
                          f"[{best[low]:.2f}, {best[high]:.2f}], run {best['run']})")
            row["note"] = row["note"].replace(ALONE, faster_one)
    return rows


VS_REFERENCE = ("speedup_vs_reference", "speedup_vs_reference_ci_low", "speedup_vs_reference_ci_high")
SLOWER = "slower than the target alone"
ALONE = "with this pair on this machine, decode with the target alone"


def _same_temperature(a, b) -> bool:
    """Whether two rows decoded at one temperature (unknown, NaN, matches only unknown)."""
    a, b = to_number(a), to_number(b)
    return (a is None) == (b is None) and (a is None or a == b)


def _slower_note(row) -> str:
    """A note when ``row``'s speedup against the common reference (its interval's upper end where it has one) is
    below 1, or when its interval reaches below 1 (not shown faster than the target alone), else ''. Where the
    task and target ran in several dtypes, the note names the reference's dtype."""
    speedup, low, high = (to_number(row.get(k)) for k in VS_REFERENCE)
    top = high if high is not None else speedup
    if top is None:
        return ""
    several = (to_number(row.get("speed_dtypes")) or 1) > 1
    where = f" in {row.get('speed_reference_dtype')}, its fastest measured dtype" if several else ""
    if top < 1:
        below = "interval below 1x" if high is not None else "not paired, no interval"
        return f"{SLOWER}{where} (speedup {speedup:.2f}x, {below}): {ALONE}"
    if low is not None and low < 1:
        return (f"not shown faster than the target alone{where} (speedup {speedup:.2f}x, but its interval "
                f"[{low:.2f}, {high:.2f}] reaches below 1x): more repeats (--repeats) would settle it")
    return ""


def to_number(v) -> float | None:
    """A finite-or-inf float from a table cell, or None for missing, non-numeric or NaN."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f
