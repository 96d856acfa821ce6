"""The report's section on where the draft fails and where the time goes: per task and model pair, a few samples
coloured by each token's origin and the acceptance by token class (pipeline/origins.py); over every run,
the roofline with each phase of each run as a point, and which phase bounds the speedup (pipeline/roofline.py).

It reads the results files the table names (``source``), since samples and the nested roofline are not table
columns, and loads each pair's tokenizer to show the tokens' text (token ids when it cannot).
"""

from __future__ import annotations

import html
import math
import statistics
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter

from pipeline import origins as prov
from pipeline.errors import SpecsweepError
from pipeline.result import read_result
from pipeline.roofline import PHASES

from .document import Figure, Heading, Html, Para, Table
from .figures import save
from .recommend import GROUP, is_lossless

SAMPLES_SHOWN = 3
MIN_OFFERED = 20        # a class needs this many positions on offer before the text names it as hard or easy
PHASE_STYLE = {"draft": ("tab:orange", "o"), "target": ("tab:blue", "s"), "verify": ("tab:green", "^")}
CLASS_CAPTION = ("Acceptance by token class: over the emitted tokens at positions where a draft token was on offer "
                 "(an accepted draft token, or the target's correction after a rejection; bonus tokens and tokens "
                 "with no draft on offer are left out, and rejected draft tokens are never emitted), the share that "
                 "were accepted draft tokens, by the class of the emitted token and by the class of the token before "
                 "it. Classes come from the tokenizer's text of each token in context: punctuation, digit, word "
                 "start (a leading space, the beginning of the output, or after whitespace), continuation (letters "
                 "inside a word), other (whitespace, special tokens, mixed). Summed over every speculative run of "
                 "the pair (all rules and γ).")


def section(table, fig_dir: Path, written: dict) -> list:
    """The section's blocks; figures go to ``fig_dir`` and into ``written`` (name -> path)."""
    blocks = [Heading(2, "Where the draft fails and where the time goes")]
    runs = _results(table)
    if not runs:
        return [*blocks, Para("No results file of a run or baseline was found (results/runs).")]
    speculative = [(row, res) for row, res in runs if (row.get("gamma") or 0) > 0]
    groups: dict[tuple, list] = {}
    for row, res in speculative:
        groups.setdefault(tuple(str(row.get(k)) for k in GROUP), []).append((row, res))
    for (task, target, draft), members in sorted(groups.items()):
        blocks.append(Heading(3, f"{task}: {target} ← {draft}"))
        blocks += _samples(members)
        blocks += _classes(members)
    blocks += _roofline(runs, fig_dir, written)
    return blocks


def _results(table) -> list[tuple[dict, dict]]:
    """(row, results dict) of every run and baseline row whose source file is readable."""
    if table.empty or "kind" not in table.columns or "source" not in table.columns:
        return []
    out, seen = [], set()
    for _, row in table[table["kind"].isin(("run", "baseline"))].iterrows():
        source = row.get("source")
        if not isinstance(source, str) or source in seen or not Path(source).is_file():
            continue
        seen.add(source)
        try:
            result = read_result(source)
        except SpecsweepError:
            continue
        if result is not None:
            out.append((row.to_dict(), result))
    return out


# ---------------------------------------------------------------------------------------------- samples and classes

def _samples(members: list) -> list:
    """A few samples of one run of the pair, coloured by origin: a lossless run first, then the largest γ."""
    with_origins = [(row, res) for row, res in members
                    if any(prov.sample_origins(s) is not None for s in res.get("samples") or [])]
    if not with_origins:
        return [Para("No run of this pair recorded token origins (`--engine hf` cannot, and older results files "
                     "lack them).")]
    row, res = min(with_origins, key=lambda m: (not is_lossless(m[0].get("sampler"), m[0].get("temperature")),
                                                -(m[0].get("gamma") or 0), str(m[0].get("run"))))
    pieces, note = prov.pieces_for(res.get("config") or {})
    shown = [s for s in res["samples"] if prov.sample_origins(s) is not None][:SAMPLES_SHOWN]
    parts_html, parts_md = [f"<p>{prov.legend_html()}</p>"], [prov.legend_plain(), ""]
    for s in shown:
        origins = prov.sample_origins(s)
        text = pieces(s.get("token_ids") or [])
        parts_html.append(f"<p><b>{html.escape(prov.summary_line(s))}</b></p>"
                          + prov.render_html(text, origins, s.get("origin_steps")))
        parts_md += [prov.summary_line(s), prov.render_plain(text, origins), ""]
    blocks = [Para(f"{len(shown)} sample(s) of run `{row.get('run')}` ({row.get('sampler')}, γ = "
                   f"{int(row.get('gamma') or 0)}, T = {row.get('temperature')}), each token coloured by where it "
                   "came from; hover a token for its verify step.")]
    if note:
        blocks.append(Para(note, note=True))
    blocks.append(Html("\n".join(parts_html), "```text\n" + "\n".join(parts_md).rstrip() + "\n```"))
    return blocks


def _classes(members: list) -> list:
    counts = prov.empty_counts()
    for _, res in members:
        prov.merge_counts(counts, (res.get("metrics") or {}).get("token_class_acceptance"))
    rows = prov.class_rates(counts)
    if not any(r["offered_after"] for r in rows):
        return [Para("No acceptance by token class recorded for this pair (runs before token origins, or "
                     "`--engine hf`).")]
    table = Table(["class", "on offer (this token)", "accepted (this token)", "on offer (after this token)",
                   "accepted (after this token)"],
                  [[r["class"] if r["class"] != prov.START else "(start of output)",
                    r["offered"], _pct(r["rate"]), r["offered_after"], _pct(r["rate_after"])] for r in rows])
    return [Para(_hardest(rows)), table, Para(CLASS_CAPTION)]


def _hardest(rows: list[dict]) -> str:
    """A sentence naming the class the draft fails most and least on (with enough positions on offer)."""
    cands = [(r["rate"], f"{r['class']} tokens", r["offered"]) for r in rows
             if r["rate"] is not None and r["offered"] >= MIN_OFFERED]
    cands += [(r["rate_after"], f"tokens after {'the start' if r['class'] == prov.START else r['class']}",
               r["offered_after"]) for r in rows if r["rate_after"] is not None and r["offered_after"] >= MIN_OFFERED]
    if len(cands) < 2:
        return (f"Too few positions on offer per class (fewer than {MIN_OFFERED}) to say where the draft fails; the "
                "counts are below.")
    low, high = min(cands), max(cands)
    if high[0] - low[0] < 0.05:
        return (f"Acceptance hardly depends on the token class here ({_pct(low[0])} to {_pct(high[0])} over the "
                f"classes with at least {MIN_OFFERED} positions on offer).")
    return (f"The draft fails most on {low[1]} ({_pct(low[0])} accepted of {low[2]} on offer) and least on {high[1]} "
            f"({_pct(high[0])} of {high[2]}): a better draft gains most where acceptance is low and many tokens are "
            "on offer.")


# ---------------------------------------------------------------------------------------------- roofline

def _roofline(runs: list, fig_dir: Path, written: dict) -> list:
    blocks = [Heading(3, "Roofline: where the time goes")]
    roofs = [(row, (res.get("metrics") or {}).get("roofline")) for row, res in runs]
    points = [(row, roof) for row, roof in roofs if isinstance(roof, dict) and roof.get("phases")]
    if not points:
        return [*blocks, Para("No run recorded a roofline (results files written before it).")]
    path = roofline_figure(points, fig_dir / "roofline.png")
    written[path.name] = path
    blocks.append(Figure(f"figures/{path.name}",
                         "Each phase of each run (and AR baseline) as a point: analytic FLOPs per byte against the "
                         "FLOP/s achieved over the phase's measured time in the run's quality pass, under the "
                         "machine's roofline (the peak FLOP/s, and the peak bandwidth times the intensity; a CPU's "
                         "peaks are a short probe, a GPU's its rated figures). Counted: weights read once per "
                         "forward, KV cache reads, logits written; 2 FLOPs per matrix parameter per token and the "
                         "attention over the cache; the verify step's softmaxes over the vocabulary "
                         "(pipeline/roofline.py says what is not counted)."))
    rows = []
    by_task: dict[str, list] = {}
    for row, roof in sorted(points, key=lambda p: (str(p[0].get("task")), str(p[0].get("run")))):
        name = roof.get("bounding_phase")
        phase = roof["phases"].get(name) or {}
        found = by_task.setdefault(str(row.get("task")), [])
        if (row.get("gamma") or 0) > 0:  # an AR baseline has a roofline but no speedup to bound
            found.append((name, phase))
        rows.append([row.get("run"), row.get("task"), row.get("sampler"), _int(row.get("gamma")), name,
                     _pct(phase.get("time_share")), _pct(phase.get("roofline_fraction")), phase.get("bound"),
                     *[_pct((roof["phases"].get(p) or {}).get("roofline_fraction")) for p in PHASES]])
    for task, found in by_task.items():
        if found:
            blocks.append(Para(_bounds_sentence(task, found)))
    blocks.append(Table(["run", "task", "sampler", "γ", "bounding phase", "its share of decode time",
                         "its share of the roofline", "bound", *[f"{p}: share of roofline" for p in PHASES]], rows))
    return blocks


def _bounds_sentence(task: str, found: list) -> str:
    """'cnn_dailymail: the target phase bounds the speedup in 5 of 7 runs (...)'."""
    names = [n for n, _ in found if n]
    if not names:
        return f"{task}: no phase times recorded."
    top = max(sorted(set(names)), key=names.count)
    phases = [p for n, p in found if n == top]
    shares = [p["time_share"] for p in phases if p.get("time_share") is not None]
    fracs = [p["roofline_fraction"] for p in phases if p.get("roofline_fraction") is not None]
    bounds = sorted({p.get("bound") for p in phases if p.get("bound")})
    detail = []
    if shares:
        detail.append(f"a median {_pct(statistics.median(shares))} of the decode time")
    if fracs:
        detail.append(f"at a median {_pct(statistics.median(fracs))} of its roofline")
    if bounds:
        detail.append(f"{' or '.join(bounds)}-bound")
    others = ", ".join(f"the {n} phase in {names.count(n)}" for n in sorted(set(names) - {top}))
    return (f"**{task}**: the {top} phase bounds the speedup in {names.count(top)} of {len(names)} speculative run(s) "
            f"({', '.join(detail)}){'; ' + others if others else ''}. The bounding phase takes the largest share of "
            "the decode time: a faster implementation of it is where the speedup would grow most.")


def roofline_figure(points: list, path: Path) -> Path:
    """Log-log roofline: for each distinct machine peak its roof, and each (run, phase) as a point."""
    fig, ax = plt.subplots(figsize=(7.5, 5))
    peaks = {}
    for _, roof in points:
        peak = roof.get("peak") or {}
        if peak.get("flops_per_s") and peak.get("bytes_per_s"):
            peaks[(peak["flops_per_s"], peak["bytes_per_s"])] = f"{peak.get('device', '?')} ({peak.get('dtype', '?')})"
    xs = [p.get("intensity") for _, roof in points for p in roof["phases"].values() if p.get("intensity")]
    xs += [pf / pb for pf, pb in peaks]                     # the ridge points
    lo, hi = (min(xs) / 4, max(xs) * 4) if xs else (0.1, 100)
    for i, ((pf, pb), label) in enumerate(sorted(peaks.items())):
        ridge = pf / pb
        grid = sorted({lo, hi, min(max(ridge, lo), hi)})
        ax.plot(grid, [min(pf, x * pb) for x in grid], color="black", linestyle=("-", "--", ":", "-.")[i % 4],
                linewidth=1, label=f"roof: {label}")
    for name in PHASES:
        colour, marker = PHASE_STYLE[name]
        for baseline in (False, True):
            pts = [(p["intensity"], p["flops_per_s"]) for row, roof in points
                   if ((row.get("gamma") or 0) == 0) == baseline
                   for n, p in roof["phases"].items() if n == name and p.get("intensity") and p.get("flops_per_s")]
            if pts:
                ax.scatter(*zip(*pts), marker=marker, s=30, alpha=0.85, edgecolors=colour,
                           facecolors="none" if baseline else colour,
                           label=f"{name}, {'AR baseline' if baseline else 'speculative'} ({len(pts)})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOP / byte, analytic)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title("Roofline: each phase of each run")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return save(fig, path)


def _pct(v) -> str | None:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return f"{100 * v:.3g} %"


def _int(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        return None
