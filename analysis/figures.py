"""The report's figures: matplotlib (Agg backend), one PNG each, written atomically. Each function takes the
rows it draws (a slice of the analysis table) and a path, and returns the path, or None when there is nothing
to draw."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.lines import Line2D

from pipeline.io import atomic_file
from pipeline.objectives import expected_tokens_iid, expected_tokens_positions
from pipeline.rules import RULES

from .pareto import front_order
from .recommend import flagged, is_lossless
from .theory import parse_rates

STYLE = {"exact": ("tab:blue", "o"), "sigmoid": ("tab:orange", "^"), "greedy": ("tab:green", "s"),
         "hf": ("tab:red", "D"), "flashinfer+softmax": ("tab:purple", "P")}
# Paper, as reported (Wagner et al., EMNLP 2024): profiling-time improvement of the verify step over HF's
# implementation. Read as a reduction of verify time, the time relative to HF is 1 - improvement.
PAPER_VERIFY_IMPROVEMENT = {"exact": (0.06, 0.13), "sigmoid": (0.37, 0.94)}
PAPER_NOTE = ("Paper, as reported (Wagner et al., EMNLP 2024, GPU): verify step 6–13 % (exact) and 37–94 % (sigmoid) "
              "less profiling time than HF's;\nminor accuracy decline for sigmoid. Verify-step times, not end-to-end "
              "speedups, so not placed on these axes. Everything plotted here is measured.")
DPI = 110


_MARKERS = "ov^<>sPD*Xhp"


def style(name: str) -> tuple[str, str]:
    """(colour, marker) for a sampler or implementation name: STYLE's, else one of its own for every rule in the
    registry (by its place there, so a new rule needs no entry here), else grey."""
    key = str(name).split(" ")[0]
    if key in STYLE:
        return STYLE[key]
    if key in RULES:
        i = list(RULES).index(key)
        return f"C{i % 10}", _MARKERS[i % len(_MARKERS)]
    return "tab:gray", "x"


def slug(text: str, limit: int = 80) -> str:
    """A file-name part for ``text``: lower-case letters, digits and dashes, at most ``limit`` characters. A longer
    one is cut and ends in a hash of the whole text, so two model pairs that differ only past the cut (two drafts of
    one target, say) get two names."""
    s = re.sub(r"[^A-Za-z0-9]+", "-", str(text)).strip("-").lower() or "run"
    if len(s) <= limit:
        return s
    digest = hashlib.sha1(str(text).encode("utf-8")).hexdigest()[:8]
    return f"{s[:limit - 9].rstrip('-')}-{digest}"


def save(fig, path: str | os.PathLike) -> Path:
    """Write ``fig`` as PNG to ``path`` atomically and close it."""
    with atomic_file(path, "wb") as f:
        fig.savefig(f, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return Path(path)


def _marker_groups(sampler: str, group, size: int):
    """(rows, scatter kwargs) for a sampler's runs (filled markers) and Optuna trials (hollow), skipping empty."""
    colour, marker = style(sampler)
    for kind, filled in (("run", True), ("trial", False)):
        g = group[group["kind"] == kind]
        if not g.empty:
            yield g, {"marker": marker, "s": size, "facecolors": colour if filled else "none", "edgecolors": colour,
                      "label": f"{sampler} ({kind}s)", "zorder": 3}


def _cpu_tag(rows) -> str:
    if "cpu_only" in rows.columns and len(rows) and rows["cpu_only"].fillna(False).astype(bool).all():
        return " [CPU only]"
    return ""


def quality_vs_speedup(rows, metric: str, title: str, path, reference: float | None = None,
                       max_quality_loss: float | None = None, x: str = "speedup",
                       xlabel: str = "measured speedup over AR (tokens/s ratio)") -> Path | None:
    """Quality (``metric``: rougeL or wer) against measured speedup (column ``x``: the paired ``speedup``, or
    ``speedup_vs_reference`` where the pair ran in several dtypes; its interval where ``x``_ci_low/_ci_high hold
    one): runs filled, Optuna trials hollow, lossless points (pipeline/rules.py: exact, or greedy at T = 0) ringed,
    speedup intervals as horizontal bars, the Pareto front (speedup and quality both maximised, flagged measurements
    left out) drawn, flagged measurements as grey crosses, the AR reference and the allowed quality loss shaded."""
    measured = rows[rows["kind"].isin(("run", "trial")) & rows[x].notna() & rows[metric].notna()]
    bad = flagged(measured)
    pts, excluded = measured[~bad], measured[bad]
    if pts.empty and excluded.empty:
        return None
    lower_better = metric == "wer"
    fig, ax = plt.subplots(figsize=(7.5, 5.2))
    if not excluded.empty:
        ax.scatter(excluded[x], excluded[metric], marker="x", color="gray", s=40,
                   label="flagged measurement (excluded)", zorder=1)
    if f"{x}_ci_low" in pts.columns:
        ci = pts[pts[f"{x}_ci_low"].notna() & pts[f"{x}_ci_high"].notna()]
        ax.errorbar(ci[x], ci[metric], xerr=[ci[x] - ci[f"{x}_ci_low"], ci[f"{x}_ci_high"] - ci[x]],
                    fmt="none", ecolor="gray", elinewidth=0.8, alpha=0.7, zorder=1)
    for sampler, group in pts.groupby("sampler", sort=True):
        for g, kw in _marker_groups(sampler, group, size=46):
            ax.scatter(g[x], g[metric], linewidths=1.3, **kw)
    temperatures = pts["temperature"] if "temperature" in pts.columns else [None] * len(pts)
    lossless = pts[[is_lossless(s, t) for s, t in zip(pts["sampler"], temperatures)]]
    if not lossless.empty:
        ax.scatter(lossless[x], lossless[metric], s=150, facecolors="none", edgecolors="black",
                   linewidths=0.8, label="lossless (ringed)", zorder=2)
    xs = [float(v) for v in pts[x]]
    ys = [(-1.0 if lower_better else 1.0) * float(v) for v in pts[metric]]
    order = front_order(xs, ys)
    ax.step([xs[i] for i in order], [float(pts[metric].iloc[i]) for i in order], where="post", color="black",
            linewidth=1.2, linestyle="-", label="Pareto front (measured)", zorder=1)
    if reference is not None:
        ax.axhline(reference, color="gray", linestyle=":", linewidth=1, label="AR reference quality")
        if max_quality_loss:
            if lower_better:  # loss on word accuracy: 1 - wer >= (1 - ref)(1 - loss)
                edge = 1.0 - (1.0 - reference) * (1.0 - max_quality_loss)
            else:
                edge = reference * (1.0 - max_quality_loss)
            ax.axhspan(min(reference, edge), max(reference, edge), color="gray", alpha=0.12,
                       label=f"within {max_quality_loss:.1%} quality loss")
    ax.axvline(1.0, color="gray", linewidth=0.6)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("WER (lower is better; axis inverted)" if lower_better else "ROUGE-L (higher is better)")
    if lower_better:
        ax.invert_yaxis()
    ax.set_title(title + _cpu_tag(pts), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.text(0.01, -0.02, PAPER_NOTE, fontsize=6.5, va="top", color="dimgray")
    return save(fig, path)


def acceptance(rows, title: str, path) -> Path | None:
    """Three panels: acceptance rate against γ; mean accepted tokens per step against γ with the theoretical
    curves (per-position product, and i.i.d. from the run's estimated per-token rate α) of each sampler's
    largest-γ run; measured against theoretical speedup."""
    pts = rows[rows["kind"].isin(("run", "trial")) & rows["acceptance_rate"].notna() & rows["gamma"].notna()]
    if pts.empty:
        return None
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(14, 4.4))
    gmax = int(pts["gamma"].max())
    for sampler, group in pts.groupby("sampler", sort=True):
        colour, _ = style(sampler)
        for g, kw in _marker_groups(sampler, group, size=40):
            a1.scatter(g["gamma"], g["acceptance_rate"], **kw)
            if g["mean_accepted_tokens"].notna().any():
                a2.scatter(g["gamma"], g["mean_accepted_tokens"], **kw)
            both = g[g["theoretical_speedup"].notna() & g["speedup"].notna()]
            if not both.empty:
                a3.scatter(both["theoretical_speedup"], both["speedup"], **kw)
        ref = group.sort_values(["gamma", "kind"], ascending=[False, True]).iloc[0]
        gammas = list(range(0, gmax + 1))
        alpha = ref.get("iid_alpha")
        if alpha is not None and alpha == alpha:  # the i.i.d. per-token rate α (not accepted/drafted)
            a = min(max(float(alpha), 0.0), 1.0)
            a2.plot(gammas, [expected_tokens_iid(a, k) for k in gammas], color=colour, linestyle="--",
                    linewidth=1, label=f"{sampler}: i.i.d. α={a:.2f} (γ={int(ref['gamma'])} run)")
        rates = parse_rates(ref.get("position_acceptance"))
        if rates:
            pos = [(k, expected_tokens_positions(rates, k)) for k in range(0, len(rates) + 1)]
            pos = [(k, v) for k, v in pos if v is not None]
            a2.plot([k for k, _ in pos], [v for _, v in pos], color=colour, linestyle=":", linewidth=1.6,
                    label=f"{sampler}: per-position rates")
    a1.set(xlabel="γ (draft tokens per step)", ylabel="acceptance rate", ylim=(-0.02, 1.02),
           title="acceptance rate (measured)")
    a2.set(xlabel="γ", ylabel="tokens per verify step", title="mean accepted tokens (+1): measured vs theory")
    lim = [0, max(1.0, float(pts[["speedup", "theoretical_speedup"]].max().max()) * 1.1)]
    a3.plot(lim, lim, color="gray", linewidth=0.8, label="measured = theoretical")
    a3.set(xlabel="theoretical speedup (1-α^(γ+1))/((1-α)(γc+1))", ylabel="measured speedup",
           title="measured against theoretical speedup", xlim=lim, ylim=lim)
    for ax in (a1, a2, a3):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6.5)
    fig.suptitle(title + _cpu_tag(pts), fontsize=10)
    fig.tight_layout()
    return save(fig, path)


def sigmoid_landscape(rows, metric: str | None, title: str, path) -> Path | None:
    """The sigmoid's (alpha, beta) plane: each sigmoid run or trial coloured by quality and by acceptance rate
    (alpha on a log axis; runs without alpha/beta used the defaults α = 1, β = −20, the paper preset its own)."""
    pts = rows[rows["kind"].isin(("run", "trial")) & (rows["sampler"] == "sigmoid")]
    if pts.empty:
        return None
    panels = [(c, lab) for c, lab in ((metric, metric and ("WER" if metric == "wer" else "ROUGE-L")),
                                      ("acceptance_rate", "acceptance rate")) if c and pts[c].notna().any()]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.6), squeeze=False)
    for ax, (col, label) in zip(axes[0], panels):
        g = pts[pts[col].notna()]
        for kind, marker in (("run", "o"), ("trial", "^")):
            k = g[g["kind"] == kind]
            if k.empty:
                continue
            sc = ax.scatter(k["alpha_eff"], k["beta_eff"], c=k[col], cmap="viridis_r" if col == "wer" else "viridis",
                            marker=marker, s=70, edgecolors="black", linewidths=0.5, label=f"{kind}s",
                            vmin=float(g[col].min()), vmax=float(g[col].max()) + 1e-12)
        for (a, b), at in g.groupby(["alpha_eff", "beta_eff"], sort=True):  # one label per point: its γ values
            gammas = ",".join(str(int(v)) for v in sorted(set(at["gamma"].dropna())))
            ax.annotate(f"γ {gammas}", (a, b), fontsize=6, xytext=(4, 3), textcoords="offset points")
        fig.colorbar(sc, ax=ax, label=label)
        ax.set_xscale("log")
        ax.set(xlabel="alpha (log)", ylabel="beta", title=f"{label} over (alpha, beta)")
        ax.grid(alpha=0.3)
        handles = [Line2D([], [], marker=m, linestyle="", color="gray", label=f"{kind}s")
                   for kind, m in (("run", "o"), ("trial", "^")) if (g["kind"] == kind).any()]
        ax.legend(handles=handles, fontsize=7)
    fig.suptitle(title + _cpu_tag(pts), fontsize=10)
    fig.tight_layout()
    return save(fig, path)


def latency(rows, title: str, path) -> Path | None:
    """Verify-step latency: against batch size B and against vocabulary size V (log-log) for every
    implementation, the floor drawn where the benchmark measured one; and, at B = 1, time relative to HF with the
    paper's reported ranges as bands."""
    if rows.empty:
        return None
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(15, 4.6))
    by_b = _best_slice(rows, "B")
    by_v = _best_slice(rows[rows["B"] == rows["B"].min()], "V")
    for ax, (sl, desc), x in ((a1, by_b, "B"), (a2, by_v, "V")):
        # one line per implementation and device: files from several GPUs measure the same shapes, and one line
        # through both would zigzag between them
        device = sl["device_name"].astype(str)          # every timing row names its device (analysis/tables.py)
        devices = sorted(device.unique())
        for (impl, on), g in sl.assign(_device=device).groupby(["impl", "_device"], sort=True):
            g = g.sort_values(x)
            colour, marker = style(impl)
            ref = "(torch)" in impl and "(cupy)" in " ".join(rows["impl"].unique())  # the reference beside kernels
            ax.plot(g[x], g["median_s"] * 1e6, marker=marker, color=colour, linewidth=1,
                    label=f"{impl} ({on})" if len(devices) > 1 else impl,
                    linestyle="--" if ref else ("-", ":", "-.")[devices.index(on) % 3],
                    markerfacecolor="none" if ref else colour)
        floors = sl[sl["floor_s"].notna() & (sl["sampler"] == "exact")] if "floor_s" in sl else sl[:0]
        for on, floor in floors.assign(_device=device[floors.index]).groupby("_device", sort=True):
            floor = floor.sort_values(x)
            ax.plot(floor[x], floor["floor_s"] * 1e6, color="black", linewidth=1.2,
                    linestyle=("--", ":", "-.")[devices.index(on) % 3],
                    label="floor (exact: launch or bytes / bandwidth)" + (f", {on}" if len(devices) > 1 else ""))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set(xlabel="batch size B" if x == "B" else "vocabulary size V", ylabel="median µs per verify call",
               title=f"latency vs {x} ({desc})")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=6.5)
    hf = rows[(rows["impl"] == "hf") & (rows["B"] == 1)]
    drawn = False
    if not hf.empty:
        # each time over HF's of the same shape in the same benchmark file: one GPU, one process (files from
        # several GPUs measure the same shapes)
        key = ["source", "gamma", "V", "dtype"]
        base = hf.groupby(key)["median_s"].median()
        for sampler in ("exact", "sigmoid"):
            ours = rows[(rows["B"] == 1) & (rows["sampler"] == sampler) & (rows["impl"] != "hf")
                        & (rows["impl"] != "flashinfer+softmax")]
            for impl, g in ours.groupby("impl", sort=True):
                g = g[g.set_index(key).index.isin(base.index)]
                if g.empty:
                    continue
                rel = [m / base.loc[tuple(k)] for m, k in zip(g["median_s"], g[key].itertuples(index=False))]
                colour, marker = style(sampler)
                hollow = "(torch)" in impl and "(cupy)" in " ".join(rows["impl"].unique())
                a3.scatter(g["V"], rel, marker=marker, edgecolors=colour, facecolors="none" if hollow else colour,
                           s=30, label=f"{impl} / hf (measured)")
                drawn = True
            lo, hi = PAPER_VERIFY_IMPROVEMENT[sampler]
            a3.axhspan(1 - hi, 1 - lo, color=style(sampler)[0], alpha=0.15,
                       label=f"{sampler}: paper, as reported ({lo:.0%}–{hi:.0%} less time than HF; GPU)")
        a3.axhline(1.0, color="tab:red", linewidth=0.8)
        a3.set_xscale("log")
        a3.set(xlabel="vocabulary size V", ylabel="verify time / HF's (B = 1)", ylim=(0, None),
               title="time relative to HF at B = 1 (all γ, dtypes)")
        a3.grid(alpha=0.3)
        a3.legend(fontsize=6)
    if not drawn:
        a3.set_axis_off()
        a3.text(0.5, 0.5, "no HF timings at B = 1 to compare with", ha="center", va="center")
    fig.suptitle(title + _cpu_tag(rows), fontsize=10)
    fig.tight_layout()
    return save(fig, path)


def _best_slice(rows, axis: str):
    """The (γ, dtype[, V or B]) slice with the most distinct values of ``axis`` (ties: the largest V, then the
    smallest γ), and a description of what is held fixed."""
    fixed = ["gamma", "dtype"] + (["V"] if axis == "B" else ["B"])
    best, best_key = None, None
    for key, g in rows.groupby(fixed, sort=True):
        k = dict(zip(fixed, key))
        score = (g[axis].nunique(), k.get("V", 0), -k["gamma"])
        if best is None or score > best_key:
            best, best_key = (g, ", ".join(f"{'γ' if n == 'gamma' else n}={_plain(k[n])}" for n in fixed)), score
    if best is None:
        return rows[:0], "none"
    return best



def _plain(v):
    """1.0 -> 1 (table columns turn integers into floats when other rows lack them)."""
    return int(v) if isinstance(v, float) and v.is_integer() else v
