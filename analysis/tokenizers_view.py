"""The report's section on drafts whose tokenizer is not the target's (pipeline/decoding/drafters/cross_tokenizer.py):
what the
mismatched tokenizer costs next to a draft that shares the target's.

Per task and target that ran a draft with another tokenizer, one table with a row per (draft, mode, rule, γ,
temperature): the paired speedup with its interval, acceptance in target tokens and in characters, characters emitted
per verify step (the two that compare drafts with different tokenizers, where token counts do not), and in
intersection mode the vocabulary bridge: how many tokens both vocabularies share, the share of the target's
vocabulary among them, and the target's probability mass on them (an upper bound of the token acceptance). Sentences
built from the same numbers compare each such draft with the fastest draft of the target's own tokenizer at the same
setting, and a figure draws speedup and character acceptance against γ, one line per draft, mode and rule.

Rows are the pipeline's runs with a measured speedup; flagged measurements are left out, as everywhere else in the
report. A results file written before drafts could have another tokenizer counts as ``shared``.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from pipeline.rules import RULES, is_lossless

from .document import Figure, Heading, Para, Table
from .figures import save, slug, style
from .recommend import flagged, to_number

SHARED = "shared"
KEY = ("draft", "mode", "sampler", "gamma", "temperature", "dtype")   # one table row per key: the fastest run


def mode_of(value) -> str:
    """A row's draft-tokenizer mode: ``shared`` where the table has none (older results, trials without a file)."""
    return value if isinstance(value, str) and value else SHARED


def other_tokenizer(rows) -> bool:
    """True when any of ``rows`` ran a draft with another tokenizer than the target's."""
    return ("draft_tokenizer_mode" in rows.columns and len(rows) > 0
            and any(mode_of(v) != SHARED for v in rows["draft_tokenizer_mode"]))


def section(table, fig_dir: Path | None = None, written: dict | None = None) -> list:
    """The section's blocks; empty when no run used a draft with another tokenizer. With ``fig_dir``, one figure per
    task and target goes there and into ``written`` (name -> path)."""
    runs, left_out = _runs(table)
    if runs.empty or not (runs["mode"] != SHARED).any():
        return []
    blocks = [Heading(2, "Drafts with another tokenizer"),
              Para("A draft whose tokenizer is not the target's proposes through a bridge "
                   "(pipeline/decoding/drafters/cross_tokenizer.py): in **intersection** mode it drafts "
                   "only the tokens whose text "
                   "both vocabularies share (lossless at any temperature; the target's probability mass on those "
                   "tokens bounds the acceptance), in **string** mode its own text is re-tokenised for the target "
                   "and verified as a one-hot draft. "
                   "Token acceptance counts the target's tokens; acceptance in characters (accepted / drafted "
                   "characters) and characters per verify step compare drafts with different tokenizers, where token "
                   "counts do not. Speedups are paired against the target alone, as everywhere in this report.")]
    if left_out:
        blocks.append(Para(f"{left_out} flagged measurement(s) of these targets left out (section **Flagged "
                           "measurements**)."))
    for (task, target), group in runs.groupby(["task", "target"], sort=True, dropna=False):
        if not (group["mode"] != SHARED).any():
            continue
        rows = _one_per_key(group)
        blocks.append(Heading(3, f"{task}: {target}"))
        blocks.append(_table(rows))
        blocks += [Para(text) for text in _sentences(rows)]
        if fig_dir is not None:
            path = _figure(rows, f"{task}: {target}, drafts by tokenizer",
                           Path(fig_dir) / f"tokenizers-{slug(f'{task}-{target}')}.png")
            if path is not None:
                if written is not None:
                    written[path.name] = path
                blocks.append(Figure(f"figures/{path.name}",
                                     "Paired speedup (with its interval) and acceptance in characters against γ: one "
                                     "colour per draft and tokenizer mode, one marker per acceptance rule, a line per "
                                     "temperature and dtype. Filled markers: the draft shares the target's tokenizer."))
    return blocks


# ---------------------------------------------------------------------------------------------- rows

def _runs(table):
    """(runs with γ > 0 and a speedup, not flagged, with a ``mode`` column; how many flagged ones of the targets that
    ran another tokenizer were left out)."""
    if table.empty or "kind" not in table.columns or "speedup" not in table.columns:
        return table.iloc[:0], 0
    runs = table[(table["kind"] == "run") & table["speedup"].notna()].copy()
    runs = runs[[(to_number(g) or 0) > 0 for g in runs["gamma"]]] if "gamma" in runs.columns else runs[:0]
    modes = runs["draft_tokenizer_mode"] if "draft_tokenizer_mode" in runs.columns else [None] * len(runs)
    runs["mode"] = [mode_of(v) for v in modes]
    for col in ("task", "target", "draft", "sampler", "temperature", "dtype", "speedup_ci_low", "speedup_ci_high",
                "acceptance_rate", "acceptance_rate_chars", "chars_per_step", "intersection_size",
                "target_share_in_intersection", "target_mass_on_intersection"):
        if col not in runs.columns:
            runs[col] = None
    bad = flagged(runs)
    other = {(t, g) for t, g, m in zip(runs["task"], runs["target"], runs["mode"]) if m != SHARED}
    left_out = sum(1 for t, g, b in zip(runs["task"], runs["target"], bad) if b and (t, g) in other)
    return runs[~bad], left_out


def _one_per_key(group):
    """The group's fastest run per KEY (several runs share a key when only their rule parameters or batch size
    differ), matched drafts first."""
    group = group.assign(_matched=group["mode"] != SHARED, _t=[to_number(t) for t in group["temperature"]],
                         _g=[to_number(g) for g in group["gamma"]])
    group = group.sort_values(["_matched", "draft", "mode", "sampler", "_g", "_t", "dtype", "speedup"],
                              ascending=[True, True, True, True, True, True, True, False], kind="stable")
    keep = ~group[list(KEY)].astype(str).duplicated(keep="first")
    return group[keep.to_numpy()].drop(columns=["_matched", "_t", "_g"])


def _table(rows) -> Table:
    dtypes = len({str(d) for d in rows["dtype"]}) > 1
    cols = ["draft", "draft tokenizer", "rule", "γ", "T", *(["dtype"] if dtypes else []), "speedup [interval]",
            "acceptance (tokens)", "acceptance (chars)", "chars/step", "shared tokens", "target vocab in them",
            "target mass on them", "run"]
    out = []
    for _, r in rows.iterrows():
        out.append([r["draft"], r["mode"], r["sampler"], _int(r["gamma"]), _temp(r["temperature"]),
                    *([r["dtype"]] if dtypes else []), _speedup(r), _num(r["acceptance_rate"]),
                    _num(r["acceptance_rate_chars"]), _num(r["chars_per_step"]), _int(r["intersection_size"]),
                    _pct(r["target_share_in_intersection"]), _pct(r["target_mass_on_intersection"]), r["run"]])
    return Table(cols, out)


# ---------------------------------------------------------------------------------------------- sentences

def _setting(r) -> str:
    return f"{r['sampler']} γ {_int(r['gamma'])}, T = {_temp(r['temperature'])}"


def _same(r) -> tuple:
    return tuple(str(r[k]) for k in ("sampler", "gamma", "temperature", "dtype"))


def _sentences(rows) -> list[str]:
    """Per draft and mode with another tokenizer: against the fastest matched draft at the setting where it does
    best among the settings both ran, then the bridge's numbers, then best against best. Only rules that keep the
    target's output (:func:`_faithful`) are compared, lossless ones first where a draft has any."""
    every_matched = _faithful([r for _, r in rows.iterrows() if r["mode"] == SHARED])
    out = []
    for (draft, mode), group in rows[rows["mode"] != SHARED].groupby(["draft", "mode"], sort=True):
        mine = _lossless_first(_faithful([r for _, r in group.iterrows()]))
        matched = _lossless_first(every_matched) if _lossless(mine[0]) else every_matched
        best = max(mine, key=lambda r: to_number(r["speedup"]))
        parts = []
        if not matched:
            parts.append(f"No draft with the target's tokenizer was run for this target, so `{draft}` ({mode}) has "
                         f"nothing to be compared with; its fastest setting, {_setting(best)}, reaches "
                         f"{_speedup(best)}.")
        else:
            by_setting: dict[tuple, object] = {}
            for m in matched:
                if _same(m) not in by_setting or to_number(m["speedup"]) > to_number(by_setting[_same(m)]["speedup"]):
                    by_setting[_same(m)] = m
            common = [r for r in mine if _same(r) in by_setting]
            if common:
                r = max(common, key=lambda x: to_number(x["speedup"]))
                m = by_setting[_same(r)]
                parts.append(f"At {_setting(r)}, `{draft}` ({mode}) reaches {_speedup(r)} against {_speedup(m)} for "
                             f"`{m['draft']}`, which shares the target's tokenizer ({_verdict(r, m)}); "
                             f"{_chars(r, m)}.")
                parts.append(_bridge(r))
            else:
                parts.append(f"`{draft}` ({mode}) ran no setting (rule, γ, T, dtype) that a draft with the target's "
                             "tokenizer also ran.")
                parts.append(_bridge(best))
            top = max(matched, key=lambda x: to_number(x["speedup"]))
            if not common or best["run"] != r["run"] or top["run"] != m["run"]:
                parts.append(f"Best against best: {_speedup(best)} ({_setting(best)}) against {_speedup(top)} for "
                             f"`{top['draft']}` ({_setting(top)}).")
        out.append(" ".join(p for p in parts if p))
    return out


def _lossless_first(rows: list) -> list:
    """The rows whose rule is lossless at their temperature (pipeline/rules.py), or all of them if none is."""
    lossless = [r for r in rows if _lossless(r)]
    return lossless or rows


def _faithful(rows: list) -> list:
    """The rows whose rule keeps the target's output (lossless at any temperature, or at T = 0 as greedy
    verification, pipeline/rules.py), or all of them if none does: a lossy rule's speed comes with a quality loss
    these sentences do not weigh."""

    kept = [r for r in rows if RULES.get(r["sampler"]) is None or RULES[r["sampler"]].lossless != "never"]
    return kept or rows


def _lossless(row) -> bool:

    return is_lossless(row["sampler"], _or_one(to_number(row["temperature"])))


def _verdict(a, b) -> str:
    lo_a, hi_a, lo_b, hi_b = (to_number(a["speedup_ci_low"]), to_number(a["speedup_ci_high"]),
                              to_number(b["speedup_ci_low"]), to_number(b["speedup_ci_high"]))
    if None in (lo_a, hi_a, lo_b, hi_b):
        return "no interval to compare"
    if hi_a < lo_b or hi_b < lo_a:
        return "the intervals do not overlap"
    return "the intervals overlap: the measurement cannot tell them apart"


def _chars(r, m) -> str:
    a, b = _num(r["acceptance_rate_chars"]), _num(m["acceptance_rate_chars"])
    c, d = _num(r["chars_per_step"]), _num(m["chars_per_step"])
    parts = []
    if a is not None and b is not None:
        parts.append(f"its acceptance in characters is {a} against {b}")
    if c is not None and d is not None:
        parts.append(f"it emits {c} characters per verify step against {d}")
    return " and ".join(parts) if parts else "no character counts were recorded (older results files)"


def _bridge(r) -> str:
    """What the row's bridge says about its acceptance."""
    acc, mass = to_number(r["acceptance_rate"]), to_number(r["target_mass_on_intersection"])
    size, share = _int(r["intersection_size"]), _pct(r["target_share_in_intersection"])
    held = f"The {size} shared tokens are {share} of the target's vocabulary" if size is not None else ""
    if r["mode"] == "intersection" and mass is not None:
        text = (f"{held}{' and' if held else 'The shared tokens'} carry {_pct(mass)} of the target's probability "
                f"where it scored, which bounds the token acceptance: measured {_num(acc)}")
        if acc is not None and acc > mass:
            text += (", above the bound, which holds position by position (the two averages weigh positions "
                     "differently)")
        return text + "."
    if r["mode"] == "string":
        return ("In string mode the draft's text is re-tokenised into the target's tokens and verified as a one-hot "
                f"draft: its token acceptance ({_num(acc)}) counts target tokens, and the shared vocabulary does not "
                "bound it.")
    return f"{held}." if held else ""


# ---------------------------------------------------------------------------------------------- figure

def _figure(rows, title: str, path: Path) -> Path | None:
    """Speedup and character acceptance against γ: colour per (draft, mode), marker per rule, hollow markers for a
    draft with another tokenizer."""
    pts = rows[rows["gamma"].notna()]
    if pts.empty:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.4))
    pairs = list(dict.fromkeys(zip(pts["draft"], pts["mode"])))
    colours = {p: f"C{i % 10}" for i, p in enumerate(pairs)}
    for (draft, mode, sampler, temp, _dtype), g in pts.groupby(["draft", "mode", "sampler", "temperature", "dtype"],
                                                                sort=True, dropna=False):
        g = g.sort_values("gamma")
        colour, marker = colours[(draft, mode)], style(sampler)[1]
        face = colour if mode == SHARED else "none"
        label = f"{Path(str(draft)).name} ({mode}), {sampler}, T={_temp(temp)}"
        xs = [float(v) for v in g["gamma"]]
        ys = [float(v) for v in g["speedup"]]
        lo = [to_number(v) for v in g["speedup_ci_low"]]
        hi = [to_number(v) for v in g["speedup_ci_high"]]
        if all(v is not None for v in lo + hi):
            a1.errorbar(xs, ys, yerr=[[y - v for y, v in zip(ys, lo)], [v - y for y, v in zip(ys, hi)]],
                        fmt="none", ecolor=colour, elinewidth=0.8, alpha=0.6)
        a1.plot(xs, ys, color=colour, marker=marker, markerfacecolor=face, linewidth=1, label=label)
        chars = [(x, to_number(v)) for x, v in zip(xs, g["acceptance_rate_chars"]) if to_number(v) is not None]
        if chars:
            a2.plot([x for x, _ in chars], [v for _, v in chars], color=colour, marker=marker, markerfacecolor=face,
                    linewidth=1, label=label)
    a1.axhline(1.0, color="gray", linewidth=0.6)
    a1.set(xlabel="γ (draft proposals per step)", ylabel="paired speedup over the target alone",
           title="speedup against γ")
    a2.set(xlabel="γ", ylabel="accepted / drafted characters", ylim=(-0.02, 1.02),
           title="acceptance in characters against γ")
    for ax in (a1, a2):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    handles, labels = a1.get_legend_handles_labels()   # one legend for both panels, below them, off the data
    lines = math.ceil(len(labels) / 3)
    height = 4.4 + 0.17 * lines
    fig.set_size_inches(12, height)
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, (0.17 * lines + 0.1) / height, 1, 1))
    return save(fig, path)


# ---------------------------------------------------------------------------------------------- formatting

def _speedup(r) -> str | None:
    """'1.23x [1.10, 1.31]', as the rest of the report prints a paired speedup."""
    v = to_number(r["speedup"])
    if v is None:
        return None
    lo, hi = to_number(r["speedup_ci_low"]), to_number(r["speedup_ci_high"])
    return f"{v:.2f}x (unpaired)" if lo is None or hi is None else f"{v:.2f}x [{lo:.2f}, {hi:.2f}]"


def _num(v) -> str | None:
    f = to_number(v)
    return None if f is None else f"{f:.2f}"


def _pct(v) -> str | None:
    f = to_number(v)
    return None if f is None else f"{100 * f:.0f} %"


def _int(v) -> int | None:
    f = to_number(v)
    return None if f is None or math.isinf(f) else int(f)


def _temp(v) -> str | None:
    f = to_number(v)
    return None if f is None else f"{f:g}"


def _or_one(temperature):
    """A run without a recorded temperature ran the default, 1."""
    return 1.0 if temperature is None else temperature
