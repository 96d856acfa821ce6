"""The report's Spec-Bench section (task ``spec_bench``, pipeline/tasks/spec_bench.py), shaped like Spec-Bench's
leaderboard: a row per model pair, drafter, acceptance rule and γ (temperature and dtype too where they vary), a
column per leaderboard group (Multi-turn Conversation, Translation, Summarization, Question Answering, Mathematical
Reasoning, Retrieval-aug. Generation) and Overall, each cell the paired speedup with its interval and the mean
accepted tokens per step; then how far each run's outputs are the target's own (identical outputs and token agreement
with the γ = 0 loop), a table per category, and a figure of the groups.

Rows are the runs (γ > 0) whose results file has per-group figures (the runs table's ``by_group`` and
``by_category`` columns, JSON text: pipeline/categories.py defines every figure). A flagged measurement stays in
these tables, marked: the section describes what was measured, and the recommendation and Pareto fronts leave it
out as everywhere else. Without a Spec-Bench run the section is absent.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from pipeline.tasks.spec_bench import CATEGORIES, GROUP_NAMES, GROUPS

from .document import Figure, Heading, Para, Table
from .figures import save
from .recommend import to_number

TASK = "spec_bench"
ORDER = (*GROUPS, "overall")     # the leaderboard's columns, left to right
FIGURE = "spec-bench-groups.png"


def section(table, fig_dir: Path | None = None, written: dict | None = None) -> list:
    """The section's blocks (empty without a Spec-Bench run); with ``fig_dir`` its figure goes there and into
    ``written`` (name -> path)."""
    runs = spec_bench_runs(table)
    if not runs:
        return []
    varying = [k for k in ("temperature", "dtype") if len({str(r[k]) for r in runs}) > 1]
    blocks = [Heading(2, "Spec-Bench"),
              Para("Spec-Bench (Xia et al., ACL Findings 2024) decoded as its leaderboard reports it: per group of "
                   "categories, the speedup over the target alone and the mean accepted tokens per verify step (the "
                   "bonus token counted, so plain decoding scores 1.00). Each cell: paired speedup [interval], mean "
                   "accepted tokens. A group's speedup is the median over interleaved repeats of the ratio of mean "
                   "tokens/s over its timed questions (a question's tokens over its turns' seconds, as Spec-Bench "
                   "averages them), the speculative loop against the γ = 0 loop on the same prompts; the timed "
                   "questions are the first `--samples-per-repeat` of each category, the mean accepted tokens come "
                   "from every question. The second MT-Bench turn follows the model's own first answer.")]
    setting = ["target", "drafter", "rule", "γ", *varying]
    blocks.append(Table([*setting, *(GROUP_NAMES[g] for g in ORDER), "flagged", "run"],
                        [[*_setting(r, varying), *(_cell(r["by_group"].get(g)) for g in ORDER), bool(r["flagged"]),
                          r["run"]] for r in runs]))
    missing = sorted({GROUP_NAMES[g] for r in runs for g in GROUPS if g not in r["by_group"]})
    if missing:
        blocks.append(Para(f"No question of {', '.join(missing)} was run (`--categories`): those cells are empty.",
                           note=True))
    if any(r["flagged"] for r in runs):
        blocks.append(Para("A flagged measurement (section **Flagged measurements**) is shown here as measured, "
                           "marked; the recommendation leaves it out.", note=True))
    blocks.append(Para("Speed is only half of it: a lossless rule must reproduce the target's own tokens. Against the "
                       "γ = 0 loop's outputs for the same turns (T = 0; its own conversation), the share of identical "
                       "outputs and the token agreement (positions with the same token over the longer output):"))
    blocks.append(Table([*setting, "identical outputs", "token agreement", "agreement before the first divergence",
                         "AR outputs from", "questions", "turns", "run"],
                        [[*_setting(r, varying), *_agreement(r["overall"]), r["ar_outputs"],
                          r["overall"].get("questions"), r["overall"].get("samples"), r["run"]] for r in runs]))
    blocks.append(Heading(3, "Per category"))
    blocks.append(Table(["run", "category", "group", "questions", "turns", "new tokens", "verify steps",
                         "mean accepted tokens", "timed questions", "speedup [interval]", "tokens/s (AR)",
                         "identical outputs"],
                        [[r["run"], c, _group_of(c), f.get("questions"), f.get("samples"), f.get("new_tokens"),
                          f.get("verify_steps"), _fmt(f.get("mean_accepted_tokens"), ".2f"), f.get("timed_questions"),
                          _speedup(f), _rates(f), _fmt(f.get("identical_outputs"), ".0%")]
                         for r in runs for c, f in _ordered(r["by_category"])]))
    if fig_dir is not None:
        path = _figure(runs, Path(fig_dir) / FIGURE)
        if written is not None:
            written[path.name] = path
        blocks.append(Figure(f"figures/{path.name}",
                             "Per leaderboard group: the paired speedup with its interval (left; 1 = the target "
                             "alone) and the mean accepted tokens per verify step (right), one bar per run."))
    return blocks


# ---------------------------------------------------------------------------------------------- rows

def spec_bench_runs(table) -> list[dict]:
    """The Spec-Bench runs (γ > 0, with per-group figures) as dicts, in a stable order (target, drafter, rule, γ),
    each with its ``by_group`` and ``by_category`` parsed, ``overall`` (its overall figures) and ``drafter_label``."""
    if table.empty or "task" not in table.columns or "by_group" not in table.columns:
        return []
    rows = table[(table["task"] == TASK) & (table["kind"] == "run") & table["by_group"].notna()]
    out = []
    for _, r in rows.iterrows():
        row = {k: r.get(k) for k in ("run", "target", "draft", "drafter", "sampler", "gamma", "temperature", "dtype",
                                     "flagged", "ar_outputs")}
        row["by_group"] = json.loads(r["by_group"])
        row["by_category"] = json.loads(r["by_category"]) if isinstance(r.get("by_category"), str) else {}
        row["overall"] = row["by_group"].get("overall", {})
        row["drafter_label"] = drafter_label(row)
        out.append(row)
    return sorted(out, key=lambda r: (str(r["target"]), r["drafter_label"], str(r["sampler"]),
                                      to_number(r["gamma"]) or 0, str(r["temperature"]), str(r["dtype"])))


def drafter_label(row: dict) -> str:
    """What proposed the drafts: the draft model, or a drafter without one (prompt-lookup, suffix)."""
    drafter = row.get("drafter")
    if isinstance(drafter, str) and drafter not in ("", "model"):
        return drafter
    draft = row.get("draft")
    return str(draft) if isinstance(draft, str) and draft else "–"


def _ordered(by_category: dict) -> list[tuple[str, dict]]:
    """Categories in Spec-Bench's order, others after them."""
    rank = {c: i for i, c in enumerate(CATEGORIES)}
    return sorted(by_category.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0]))


def _group_of(category: str) -> str:
    return next((GROUP_NAMES[g] for g, members in GROUPS.items() if category in members), "–")


# ---------------------------------------------------------------------------------------------- figure

def _figure(runs: list[dict], path: Path) -> Path:
    """Grouped bars per leaderboard group: speedup with its interval, and mean accepted tokens."""
    labels = [GROUP_NAMES[g] for g in ORDER]
    x = np.arange(len(ORDER))
    width = 0.8 / len(runs)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.6))
    for i, r in enumerate(runs):
        figures = [r["by_group"].get(g) or {} for g in ORDER]
        speed = [to_number(f.get("speedup")) for f in figures]
        lo = [to_number(f.get("speedup_ci_low")) for f in figures]
        hi = [to_number(f.get("speedup_ci_high")) for f in figures]
        tokens = [to_number(f.get("mean_accepted_tokens")) for f in figures]
        pos = x - 0.4 + width * (i + 0.5)
        target, drafter, rule, gamma = _setting(r, [])
        label = f"{Path(str(target)).name} ← {Path(drafter).name}, {rule} γ {gamma}"
        err = [[_nan(s) - _nan(a) for s, a in zip(speed, lo)], [_nan(b) - _nan(s) for s, b in zip(speed, hi)]]
        a1.bar(pos, [_nan(s) for s in speed], width, yerr=err, capsize=2, color=f"C{i % 10}", label=label)
        a2.bar(pos, [_nan(t) for t in tokens], width, color=f"C{i % 10}", label=label)
    a1.axhline(1.0, color="gray", linewidth=0.7)
    a2.axhline(1.0, color="gray", linewidth=0.7)
    a1.set(ylabel="paired speedup over the target alone", title="speedup")
    a2.set(ylabel="mean accepted tokens per verify step", title="mean accepted tokens")
    for ax in (a1, a2):
        ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    handles, names = a1.get_legend_handles_labels()
    lines = math.ceil(len(names) / 2)
    fig.legend(handles, names, loc="lower center", ncol=2, fontsize=7, frameon=False)
    fig.suptitle("Spec-Bench by leaderboard group", fontsize=10)
    fig.tight_layout(rect=(0, 0.05 + 0.04 * lines, 1, 1))
    return save(fig, path)


# ---------------------------------------------------------------------------------------------- formatting

def _setting(r: dict, varying: list[str]) -> list:
    """A row's setting cells: target, drafter, rule, γ and the settings that vary between rows."""
    return [r["target"], r["drafter_label"], r["sampler"], _fmt(r["gamma"], ".0f"), *(r[k] for k in varying)]


def _agreement(figures: dict) -> list:
    """Identical outputs, token agreement and agreement before the first divergence, formatted."""
    return [_fmt(figures.get("identical_outputs"), ".0%"), _fmt(figures.get("token_agreement"), ".3f"),
            _fmt(figures.get("prefix_agreement"), ".3f")]


def _cell(figures: dict | None) -> str | None:
    """'1.23x [1.10, 1.31], 2.10': a group's paired speedup with its interval, and its mean accepted tokens."""
    if not figures:
        return None
    tokens = _fmt(figures.get("mean_accepted_tokens"), ".2f")
    speed = _speedup(figures)
    return ", ".join(p for p in (speed, tokens) if p) or None


def _speedup(figures: dict) -> str | None:
    v, lo, hi = (to_number(figures.get(k)) for k in ("speedup", "speedup_ci_low", "speedup_ci_high"))
    if v is None:
        return None
    return f"{v:.2f}x" if lo is None or hi is None else f"{v:.2f}x [{lo:.2f}, {hi:.2f}]"


def _rates(figures: dict) -> str | None:
    a, b = to_number(figures.get("tokens_per_second")), to_number(figures.get("ar_tokens_per_second"))
    return None if a is None or b is None else f"{a:.1f} ({b:.1f})"


def _fmt(v, spec: str) -> str | None:
    """A number formatted with ``spec`` ('.2f', '.0%'), None for a missing one."""
    f = to_number(v)
    return None if f is None or math.isinf(f) else f"{f:{spec}}"


def _nan(v) -> float:
    return float("nan") if v is None else float(v)
