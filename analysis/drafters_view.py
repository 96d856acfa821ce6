"""The report's comparison of drafters for one target: its draft models and the drafters without one (prompt lookup,
suffix decoding; pipeline/decoding/drafters/), side by side.

Per task and target that ran more than one drafter: a table with each drafter's fastest lossless setting (the
acceptance rule keeps the target's output at its temperature, pipeline/rules.py; where a drafter ran none, its
fastest setting, marked lossy) with the paired speedup and its interval, acceptance, tokens per verify step and a
draft model's cost ratio c (its forward's time over the target's, as the run measured it), and
a figure of quality against speedup with every run and trial of every drafter on one front. Flagged measurements are
left out, as everywhere in the report.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from pipeline.rules import is_lossless

from .document import Figure, Heading, Para, Table
from .figures import save, slug
from .recommend import CANDIDATE_KINDS, flagged, to_number


def section(table, fig_dir: Path | None = None, written: dict | None = None) -> list:
    """The section's blocks; empty when no target ran more than one drafter."""
    runs = _runs(table)
    if runs is None or runs.empty:
        return []
    groups = [(key, g) for key, g in runs.groupby(["task", "target"], sort=True, dropna=False)
              if g["draft"].nunique() > 1 and (g["drafter"] != "model").any()]
    if not groups:
        return []
    blocks = [Heading(2, "Drafters"),
              Para("Each drafter's fastest setting that keeps the target's output (a lossless rule at its "
                   "temperature), against the target alone, paired. Prompt lookup and suffix decoding need no draft "
                   "model: their cost is a search on the host (the lookup phase), so they win where the output "
                   "repeats the prompt or itself, and lose little elsewhere.")]
    for (task, target), group in groups:
        blocks += [Heading(3, f"{task}: {target}"), _table(group)]
        if fig_dir is not None:
            path = _figure(group, f"{task}: {target}, every drafter",
                           Path(fig_dir) / f"drafters-{slug(f'{task}-{target}')}.png")
            if written is not None:
                written[path.name] = path
            blocks.append(Figure(f"figures/{path.name}", "Quality against paired speedup, every run and Optuna trial, "
                                                         "one colour per drafter; ringed points are lossless."))
    return blocks


def _runs(table):
    """Runs and trials with γ > 0, a speedup and a quality, not flagged."""
    need = {"kind", "speedup", "gamma", "drafter", "draft", "quality"}
    if table.empty or not need <= set(table.columns):
        return None
    runs = table[table["kind"].isin(CANDIDATE_KINDS) & table["speedup"].notna()].copy()
    runs = runs[[(to_number(g) or 0) > 0 for g in runs["gamma"]]]
    runs = runs[~flagged(runs)]
    runs["drafter"] = runs["drafter"].fillna("model")
    runs["lossless"] = [is_lossless(s, to_number(t) if to_number(t) is not None else 1.0)
                        for s, t in zip(runs["sampler"], runs.get("temperature", [1.0] * len(runs)))]
    return runs


def _best(group):
    """Per draft label: its fastest lossless row, else its fastest row."""
    out = []
    for _, rows in group.groupby("draft", sort=True):
        pool = rows[rows["lossless"]] if rows["lossless"].any() else rows
        out.append(pool.loc[pool["speedup"].astype(float).idxmax()])
    return sorted(out, key=lambda r: -float(r["speedup"]))


def _table(group) -> Table:
    rows = []
    for r in _best(group):
        ci = f" [{_num(r.get('speedup_ci_low'))}, {_num(r.get('speedup_ci_high'))}]"
        rows.append([r["draft"], r["sampler"] + ("" if r["lossless"] else " (lossy)"), int(to_number(r["gamma"])),
                     f"{_num(r['speedup'])}x{ci}", _num(r.get("acceptance_rate")), _num(r.get("mean_accepted_tokens")),
                     _num(r.get("cost_ratio")) if r["drafter"] == "model" else "-", _num(r.get("quality")),
                     r.get("run")])
    return Table(["drafter or draft", "rule", "γ", "speedup [interval]", "acceptance", "tokens/step",
                  "c (draft / target forward)", "quality", "run"], rows)


def _figure(group, title: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, rows) in enumerate(group.groupby("draft", sort=True)):
        x, y = rows["speedup"].astype(float), rows["quality"].astype(float)
        ax.scatter(x, y, color=colours[i % len(colours)], label=str(label), alpha=0.8, s=28)
        lossless = rows[rows["lossless"]]
        ax.scatter(lossless["speedup"].astype(float), lossless["quality"].astype(float), facecolors="none",
                   edgecolors="black", s=70, linewidths=0.8)
    ax.axvline(1.0, color="grey", lw=0.8, ls=":")
    ax.set(xlabel="paired speedup over the target alone", ylabel="quality", title=title)
    ax.legend(fontsize=8)
    return save(fig, path)


def _num(v) -> str:
    v = to_number(v)
    return "-" if v is None else f"{v:.2f}"
