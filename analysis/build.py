"""Assemble the analysis report from the table of :mod:`pipeline.analysis.tables` and write it:

  results.csv        the whole table (runs, AR baselines, Optuna trials, benchmark timings)
  report.md          the report in Markdown, figures referenced as figures/<name>.png
  report.html        the same report as one HTML page (inline CSS; the same relative figure paths)
  figures/*.png      per task and model pair: quality vs speedup with the Pareto front, acceptance vs theory, the
                     sigmoid's alpha/beta landscape; verify-step latency from the benchmarks; the roofline of
                     every run's phases (analysis/origins_view.py, with the samples coloured by token origin);
                     per target run with a draft of another tokenizer, speedup and character acceptance against γ
                     per draft and mode (analysis/tokenizers_view.py, section "Drafts with another tokenizer")

Sections of report.md beyond this module's own: Spec-Bench's leaderboard table per group of categories, with the
outputs' agreement with the target alone and a figure (analysis/spec_bench_view.py; absent without a spec_bench run),
schedules (analysis/schedule_view.py), drafts with another tokenizer
than the target's (analysis/tokenizers_view.py: matched against mismatched drafts of one target, in tokens and in
characters, with the vocabulary intersection; absent when every draft shares its target's tokenizer), where the draft
fails and where the time goes (analysis/origins_view.py), serving (analysis/serving.py). A per-pair table of a
draft with another tokenizer has a "draft tokenizer" column (its mode); the tables of other pairs are unchanged.

PNG files in figures/ that this build did not write (left by an earlier report) are removed.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from pipeline.errors import SpecsweepError
from pipeline.io import write_text_atomic
from pipeline.objectives import QUALITY, expected_tokens_iid, expected_tokens_positions
from pipeline.rules import RULES, SPEED_ONLY_NOTE, is_speed_only, param_names
from pipeline.tasks import TASK_NAMES, quality_metric

from . import (
    drafters_view,
    figures,
    origins_view,
    schedule_view,
    serving,
    spec_bench_view,
    tokenizers_view,
    trees_view,
)
from .document import Bullets, Figure, Heading, Para, Table, to_html, to_markdown
from .pareto import pareto_mask
from .recommend import (
    GROUP,
    VS_REFERENCE,
    at_temperature,
    baselines,
    flagged,
    is_lossless,
    of_kind,
    recommend,
    to_number,
    with_loss,
    with_speed_reference,
)
from .speed_reference import describe, several_dtypes
from .theory import parse_rates

TITLE = "specsweep report: verify kernel, γ and sigmoid settings, speed against quality"
METRIC_NAME = {m.key: m.display for m in map(quality_metric, TASK_NAMES) if m is not None}  # metric key -> name


def build_report(table, out_dir: str | os.PathLike, max_quality_loss: float = 0.01,
                 missing: list[dict] | None = None) -> dict[str, Path]:
    """Write results.csv, report.md, report.html and figures/ into ``out_dir``; returns the written paths.
    ``missing``: the profile's list of what it does not run yet (``{"what", "why"}`` each), a section after the
    header."""
    if not (isinstance(max_quality_loss, (int, float)) and math.isfinite(max_quality_loss)
            and 0 <= max_quality_loss < 1):
        raise SpecsweepError(f"--max-quality-loss must be a fraction in [0, 1), e.g. 0.01 for 1 %; "
                             f"got {max_quality_loss}")
    out_dir = Path(out_dir)
    fig_dir = out_dir / "figures"
    table = with_speed_reference(add_effective_params(table))   # speedup_vs_reference: analysis/speed_reference.py
    written: dict[str, Path] = {"results.csv": write_text_atomic(out_dir / "results.csv", table.to_csv(index=False))}
    blocks = _header(table, max_quality_loss)
    blocks += _missing(missing or [])
    blocks += _recommendations(table, max_quality_loss)
    blocks += _flagged(table)
    blocks += _per_pair(table, fig_dir, max_quality_loss, written)
    blocks += drafters_view.section(table, fig_dir, written)     # every drafter of a target side by side
    blocks += trees_view.section(table)      # token trees against chains at equal tokens scored per step
    blocks += spec_bench_view.section(table, fig_dir, written)   # Spec-Bench's leaderboard table, per group
    blocks += tokenizers_view.section(table, fig_dir, written)   # drafts with another tokenizer than the target's
    blocks += schedule_view.section(table)   # tuned schedules per batch size and bucket; fixed vs adaptive γ
    blocks += origins_view.section(table, fig_dir, written)   # token origins by class; the roofline
    blocks += _latency(table, fig_dir, written)
    blocks += _loops(table)
    blocks += _lossless(table)
    blocks += serving.section(table)
    blocks += _sources(table)
    written["report.md"] = write_text_atomic(out_dir / "report.md", to_markdown(blocks))
    written["report.html"] = write_text_atomic(out_dir / "report.html", to_html(blocks, TITLE))
    keep = {p.resolve() for p in written.values()}
    for stale in fig_dir.glob("*.png") if fig_dir.is_dir() else ():
        if stale.resolve() not in keep:
            stale.unlink()
    return written


def add_effective_params(table):
    """``<param>_eff`` (e.g. ``alpha_eff``, ``beta_eff``): the rule parameters a run actually used, its own or
    else its preset's or the rule's defaults (pipeline/rules.py); None where the run's rule has no such one."""
    table = table.copy()
    for col in ("sampler", "preset", "kind", *param_names()):
        if col not in table.columns:
            table[col] = None
    for name in param_names():
        table[f"{name}_eff"] = [_effective(row, name) for _, row in table.iterrows()]
    return table


def _effective(row, name: str):
    rule = RULES.get(row.get("sampler"))
    if rule is None or name not in rule.param_names:
        return None
    preset = row.get("preset") if isinstance(row.get("preset"), str) else None
    return rule.effective({k: to_number(row.get(k)) for k in rule.param_names}, preset)[name]


# ---------------------------------------------------------------------------------------------- sections

def _header(table, max_quality_loss: float) -> list:
    counts = table["kind"].value_counts().to_dict() if not table.empty else {}
    blocks = [Heading(1, TITLE),
              Para("Which verify kernel, γ and sigmoid setting to use for a model pair, and what it costs in quality. "
                   f"Rows read: {counts.get('run', 0)} run(s), {counts.get('baseline', 0)} AR baseline(s), "
                   f"{counts.get('trial', 0)} Optuna trial(s), {counts.get('latency', 0)} benchmark timing(s). "
                   "The full table is `results.csv`; every number below names its source file, device and date "
                   "(section **Sources**).")]
    measured = table[table["kind"] != "latency"] if "kind" in table.columns else table
    if "cpu_only" in measured.columns and len(measured) and measured["cpu_only"].fillna(True).astype(bool).all():
        blocks.append(Para("**CPU only:** every run, baseline and trial here was measured on a CPU. Speedups on a CPU "
                           "say little about a GPU, where the paper's kernels run.", note=True))
    blocks.append(Para("Speedup = the median over interleaved repeats of the per-repeat ratio of tokens/s, the "
                       "speculative loop over the γ = 0 loop of the same engine and loaded target on the same samples "
                       "(paired, in one process), with its order-statistic confidence interval in brackets. A "
                       "measurement whose interval is too wide, whose speedup is implausible against the one its "
                       "own tokens per step and forward costs predict, or whose threads waited for a CPU that other "
                       "processes held is flagged, and left out of the recommendation and "
                       "the Pareto fronts "
                       "(section **Flagged measurements**). Quality is "
                       "ROUGE-L (CNN/DailyMail, higher is better), WER (LibriSpeech, lower is better) or the token "
                       "agreement with the target alone at T = 0 (Spec-Bench, higher is better). Quality "
                       "loss = 1 − quality ratio against the reference (the AR baseline of the same pair, dtype and "
                       "temperature, else the mean of the exact runs at that temperature): ROUGE-L / reference, "
                       "or (1 − WER) / (1 − reference WER); "
                       f"the allowed loss is {max_quality_loss:.1%} (`--max-quality-loss`). Lossless: exact, and "
                       "greedy at temperature 0. Each decoding temperature (T) has its own recommendation: a greedy "
                       "run and a sampled one are never ranked against each other."))
    if several_dtypes(table):
        blocks.append(Para("A speedup is over the target alone in the run's own dtype, so a dtype can win on "
                           "speedup and lose on speed. Where a task and target ran in several dtypes, the "
                           "recommendation, the Pareto fronts and the rules' order rank its runs and trials "
                           "against one reference instead, the target alone in its fastest measured dtype "
                           "(**speedup vs reference**; `speedup_vs_reference` in `runs.csv` and `results.csv`, "
                           "analysis/speed_reference.py); each such pair names its reference below."))
    return blocks


def _missing(items: list[dict]) -> list:
    if not items:
        return []
    return [Heading(2, "What this profile does not run yet"),
            Bullets([f"**{m['what']}**: {m['why']}" for m in items])]


def _recommendations(table, max_quality_loss: float) -> list:
    blocks = [Heading(2, "Recommendation")]
    rec = recommend(table, max_quality_loss)
    if rec.empty:
        return [*blocks, Para("No run or trial with a measured speedup: nothing to recommend yet."),
                *_speed_references(table)]
    several = several_dtypes(rec)
    cols = ["task", "target", "draft", "T", "choice", "sampler", "backend", "gamma", "parameters", "dtype", "speedup",
            *_vs_reference_column(several), "quality", "quality loss", "device", "date", "source"]
    rows = []
    for _, r in rec.iterrows():
        temperature = _temperature(r.get("temperature"))
        if r.get("run") is None or (isinstance(r.get("run"), float) and math.isnan(r["run"])):
            rows.append([r["task"], r["target"], r["draft"], temperature, r["choice"], f"none ({r['note']})"]
                        + [None] * (len(cols) - 6))
            continue
        rows.append([r["task"], r["target"], r["draft"], temperature, r["choice"], r["sampler"], r["backend"],
                     _int(r["gamma"]),
                     _with_mode(_params(r), r), r["dtype"], _speedup(r), *_vs_reference_cell(r, several),
                     _raw_quality(r), _pct(r["quality_loss"]),
                     _device(r), r["date"], r["source"]])
    blocks.append(Table(cols, rows))
    for _, r in rec.iterrows():
        if r.get("note") and isinstance(r.get("run"), str):
            at = f" at T = {_temperature(r.get('temperature'))}" if _temperature(r.get("temperature")) else ""
            blocks.append(Para(f"**{r['task']}{at}, {r['choice']}** (`{r['run']}`): {r['note']}."))
    blocks += _speed_references(table)
    blocks.append(Para("Quality is the raw score (ROUGE-L, or WER); loss is relative to the reference named in "
                       "`results.csv` (`reference_source`). On few samples, quality differences of a few percent "
                       "are within sampling noise: confirm a sigmoid choice on more data."))
    return blocks


def _temperature(value) -> str:
    """A decoding temperature as the recommendation writes it ("0", "1", "0.7"; "" where unknown)."""
    number = to_number(value)
    return "" if number is None else f"{number:g}"


def _speed_references(table) -> list:
    """A paragraph per task and target that ran in several dtypes, naming the speed reference its runs are ranked
    against (analysis/speed_reference.py); none where every task and target ran in one dtype."""
    measured = of_kind(table, "run", "trial", "baseline")
    if not several_dtypes(measured):
        return []
    return [Para(f"**Speed reference.** {describe(pair)}")
            for _, pair in measured.groupby(["task", "target"], sort=True) if several_dtypes(pair)]


def _flagged(table) -> list:
    """Runs, baselines and trials whose speed measurement is flagged, with the reasons: listed here and nowhere
    in the recommendation or the Pareto fronts."""
    blocks = [Heading(2, "Flagged measurements")]
    rows = table[flagged(table)] if not table.empty else table
    if rows.empty:
        return [*blocks, Para("None: every measured run, baseline and trial passed the checks (interval width and "
                              "measured against predicted speedup).")]
    blocks.append(Para(f"{len(rows)} measurement(s) flagged, left out of the recommendation and the Pareto fronts. "
                       "Re-run them on a quieter machine, or with more `--repeats`."))
    blocks.append(Table(["run", "kind", "task", "sampler", "gamma", "speedup", "predicted speedup",
                         "others' busy cores", "reasons", "source"],
                        [[r["run"], r["kind"], r.get("task"), r.get("sampler"), _int(r.get("gamma")), _speedup(r),
                          r.get("predicted_speedup"), r.get("others_busy_cores"), r.get("flag_reasons"),
                          r.get("source")] for _, r in rows.iterrows()]))
    return blocks


def _per_pair(table, fig_dir: Path, max_quality_loss: float, written: dict) -> list:
    cand = of_kind(table, "run", "trial", "baseline")
    if cand.empty or "task" not in cand.columns:
        return [Heading(2, "Runs"), Para("No runs, baselines or trials in the folders read (--runs, --tune).")]
    losses = with_loss(table)
    blocks: list = []
    for (task, target, draft), group in cand.groupby(list(GROUP), sort=True, dropna=False):
        name = f"{task}: {target} ← {draft}"
        slug = _slug(f"{task}-{target}-{draft}")
        metric = QUALITY.get(task, (None,))[0]
        metric = metric if metric in group.columns else None
        other = tokenizers_view.other_tokenizer(group)   # a draft with another tokenizer: its mode in the tables
        base = baselines(cand, task, target, draft)
        blocks.append(Heading(2, f"{name}"))
        speed_rows = cand[(cand["task"] == task) & (cand["target"] == target)]
        temperatures = _temperatures(group)
        for t in temperatures or [None]:    # a front per decoding temperature where the pair ran at several
            at = None if len(temperatures) < 2 else t
            blocks += _quality_section(at_temperature(group, at), at_temperature(losses, at), task=task,
                                       target=target, draft=draft, metric=metric, name=name, slug=slug,
                                       fig_dir=fig_dir, max_quality_loss=max_quality_loss, written=written,
                                       baseline_rows=at_temperature(base, at), speed_rows=speed_rows, other=other,
                                       temperature=at)
        blocks += _rules_section(losses, task, target, draft, metric, other, by_temperature=len(temperatures) > 1)
        blocks += _acceptance_section(group, name, slug, fig_dir, written, other)
        blocks += _sigmoid_section(group, metric, name, slug, fig_dir, written)
    return blocks


def _temperatures(group) -> list[float]:
    """The decoding temperatures a pair's runs and trials were decoded at (known ones, sorted)."""
    if "temperature" not in group.columns:
        return []
    measured = group[group["kind"].isin(("run", "trial"))]["temperature"]
    return sorted({t for t in map(to_number, measured) if t is not None})


def _quality_section(group, losses, *, task, target, draft, metric, name, slug, fig_dir, max_quality_loss,
                     written, baseline_rows, speed_rows, other: bool = False, temperature: float | None = None) -> list:
    """``baseline_rows``: the pair's AR baselines (recommend.baselines: its own, else the target's with another
    draft); ``speed_rows``: the task and target's runs, trials and baselines, every draft's (its speed reference);
    ``other``: the pair's draft has another tokenizer, so the front's table names each run's mode. Where the task
    and target ran in several dtypes, the figure, the front and its table use the speedup against the common
    reference (analysis/speed_reference.py). ``temperature``: the pair ran at several decoding temperatures, and
    ``group``, ``losses`` and ``baseline_rows`` hold this one's rows (a greedy point and a sampled one answer
    different questions, so they never share a front); its own heading, figure and AR reference."""
    at = "" if temperature is None else f", T = {temperature:g}"
    if temperature is not None:
        name, slug = f"{name}{at}", f"{slug}-t{temperature:g}"
    blocks = [Heading(3, f"Quality against speedup{at}")]
    several = several_dtypes(group)
    if several:
        blocks.append(Para(f"**Speed reference.** {describe(speed_rows)}"))
    if metric is None:
        return [*blocks, Para(f"Task {task} has no quality metric: no quality/speedup figure.")]
    base = baseline_rows[baseline_rows[metric].notna()] if metric in baseline_rows.columns else baseline_rows[:0]
    reference = float(base[metric].iloc[0]) if not base.empty else None
    x = "speedup_vs_reference" if several else "speedup"
    refs = group["speed_reference_dtype"].dropna() if several else []   # none: no run can be drawn against one
    xlabel = (f"speedup over the target alone in {refs.iloc[0]}, its fastest measured dtype" if len(refs)
              else "measured speedup over AR (tokens/s ratio)")
    path = figures.quality_vs_speedup(group, metric, f"{name}: {METRIC_NAME[metric]} vs speedup",
                                      fig_dir / f"quality-{slug}.png", reference, max_quality_loss, x=x, xlabel=xlabel)
    if path is None:
        return [*blocks, Para("No run or trial with both a speedup and a quality score.")]
    written[path.name] = path
    blocks.append(Figure(f"figures/{path.name}",
                         f"{METRIC_NAME[metric]} against measured speedup (all measured): runs filled, Optuna trials "
                         "hollow, lossless points (exact, or greedy at T = 0) ringed, the Pareto front as a line, "
                         f"the AR reference dotted and the {max_quality_loss:.1%} loss band shaded. The paper's "
                         "numbers (note under the plot) are verify-step times and are not drawn on these axes."))
    sel = losses[(losses["task"] == task) & (losses["target"] == target) & (losses["draft"] == draft)] \
        if not losses.empty else losses
    sel = sel[sel[metric].notna()] if not sel.empty else sel
    if sel.empty:
        return blocks
    sign = QUALITY[task][1]
    mask = pareto_mask([float(v) for v in sel[x]], [sign * float(v) for v in sel[metric]])
    front = sel[mask].sort_values(x)
    blocks.append(Para(f"Pareto front ({len(front)} of {len(sel)} runs and trials; "
                       f"{'speedup vs reference' if several else 'speedup'} and quality both maximised):"))
    blocks.append(Table(["run", "kind", "sampler", "gamma", *_mode_column(other), "parameters", "dtype", "speedup",
                         *_vs_reference_column(several), METRIC_NAME[metric], "quality loss", "acceptance", "device"],
                        [[r["run"], r["kind"], r["sampler"], _int(r["gamma"]), *_mode_cell(r, other), _params(r),
                          r["dtype"], _speedup(r), *_vs_reference_cell(r, several), r[metric],
                          _pct(r["quality_loss"]), r["acceptance_rate"], _device(r)]
                         for _, r in front.iterrows()]))
    return blocks


def _rules_section(losses, task, target, draft, metric, other: bool = False, by_temperature: bool = False) -> list:
    """Every acceptance rule side by side: per (rule, γ), the pipeline's runs (not trials, not flagged) with their
    acceptance rate, tokens per step, quality loss and paired speedup, fastest first against the common speed
    reference (where the task and target ran in several dtypes, a column of its own; with ``other``, a draft with
    another tokenizer: its mode, and acceptance and emitted length in characters too). ``by_temperature``: the pair
    ran at several decoding temperatures: a T column, and the rows by temperature first (each run's quality loss
    is against its own temperature's reference)."""
    blocks = [Heading(3, "Acceptance rules side by side")]
    sel = losses[(losses["task"] == task) & (losses["target"] == target) & (losses["draft"] == draft)
                 & (losses["kind"] == "run")] if not losses.empty else losses
    if sel.empty:
        return [*blocks, Para("No unflagged run.")]
    chars = (lambda r: [r.get("acceptance_rate_chars"), r.get("chars_per_step")]) if other else (lambda r: [])
    several = several_dtypes(sel)
    t_cell = (lambda r: [_temperature(r.get("temperature"))]) if by_temperature else (lambda r: [])
    order = sel.sort_values("speedup_vs_reference", ascending=False)
    if by_temperature:      # by temperature (unknown last), fastest first within each
        order = order.assign(_t=[to_number(t) for t in order["temperature"]]).sort_values(
            "_t", kind="stable", na_position="last")
    rows = [[r["sampler"] + (" (speed only)" if is_speed_only(r["sampler"]) else ""),
             "yes" if is_lossless(r["sampler"], r.get("temperature")) else "no", *t_cell(r),
             _int(r["gamma"]), *_mode_cell(r, other), _params(r), r["dtype"], r.get("acceptance_rate"),
             r.get("mean_accepted_tokens"), *chars(r), _pct(r["quality_loss"]) if metric else None, _speedup(r),
             *_vs_reference_cell(r, several), r["run"]]
            for _, r in order.iterrows()]
    blocks.append(Table(["rule", "lossless", *(["T"] if by_temperature else []), "gamma", *_mode_column(other),
                         "parameters", "dtype", "acceptance",
                         "tokens/step", *(["acceptance (chars)", "chars/step"] if other else []), "quality loss",
                         "speedup", *_vs_reference_column(several), "run"], rows))
    blocks.append(Para("Acceptance is accepted / drafted tokens; tokens/step counts the corrected or bonus token "
                       "(pipeline/runner.py). Lossless is the registry's (pipeline/rules.py); a lossless rule's "
                       "quality loss is sampling noise. Rules and their parameters: `specsweep run --help`."))
    if any(is_speed_only(s) for s in sel["sampler"]):
        blocks.append(Para(f"A synthetic row is a speed measurement only ({SPEED_ONLY_NOTE}, `--sampler synthetic`): "
                           "its quality is not shown and it is never recommended."))
    if other:
        blocks.append(Para(_OTHER_TOKENIZER_NOTE))
    return blocks


_OTHER_TOKENIZER_NOTE = ("This draft's tokenizer is not the target's: the draft tokenizer column is how its proposals "
                         "reached the target (pipeline/decoding/drafters/cross_tokenizer.py: intersection, or "
                         "string), tokens are the "
                         "target's, and acceptance and emitted length in characters compare it with a draft of the "
                         "target's own tokenizer (section **Drafts with another tokenizer**).")


def _vs_reference_column(several: bool) -> list[str]:
    """The "speedup vs reference" column: only where a task and target ran in several dtypes."""
    return ["speedup vs reference"] if several else []


def _vs_reference_cell(r, several: bool) -> list:
    return [_speedup(r, VS_REFERENCE)] if several else []


def _mode_column(other: bool) -> list[str]:
    """The per-pair tables' "draft tokenizer" column: only for a pair whose draft has another tokenizer."""
    return ["draft tokenizer"] if other else []


def _mode_cell(r, other: bool) -> list:
    return [tokenizers_view.mode_of(r.get("draft_tokenizer_mode"))] if other else []


def _with_mode(params: str | None, r) -> str | None:
    """A recommendation's parameters, with the draft-tokenizer mode of a draft with another tokenizer."""
    mode = tokenizers_view.mode_of(r.get("draft_tokenizer_mode"))
    if mode == tokenizers_view.SHARED:
        return params
    return ", ".join(p for p in (params, f"draft tokenizer {mode}") if p)


def _params(r) -> str | None:
    """'alpha=1, beta=-20': the parameters the row's rule used (its own, else its preset's or the defaults), None
    for a rule without any."""
    rule = RULES.get(r.get("sampler"))
    parts = [f"{n}={_effective(r, n):g}" for n in rule.param_names] if rule is not None else []
    return ", ".join(parts + _draft_length(r)) or None


def _draft_length(r) -> list[str]:
    """The adaptive draft length a row ran with (pipeline/decoding/draft_policy.py), as 'parameters': [] for a fixed
    γ."""
    schedule, confidence = r.get("draft_schedule"), to_number(r.get("draft_confidence"))
    parts = [f"draft schedule {schedule}"] if isinstance(schedule, str) and schedule != "constant" else []
    if confidence:
        parts.append(f"draft confidence {confidence:g}")
    if parts and to_number(r.get("gamma_max")) is not None:
        parts.append(f"γ max {int(to_number(r.get('gamma_max')))}")
    return parts


def _acceptance_section(group, name, slug, fig_dir, written, other: bool = False) -> list:
    blocks = [Heading(3, "Acceptance against theory")]
    path = figures.acceptance(group, f"{name}: acceptance", fig_dir / f"acceptance-{slug}.png")
    if path is None:
        return [*blocks, Para("No speculative run with an acceptance rate.")]
    written[path.name] = path
    blocks.append(Figure(f"figures/{path.name}",
                         "Left: measured acceptance rate per γ. Middle: measured tokens per verify step (accepted + "
                         "1) per γ, with two predictions from each sampler's largest-γ run: i.i.d. (1 − α^(γ+1)) / "
                         "(1 − α) from its per-token rate α (dashed; α is estimated from the accepted counts, "
                         "accepted / (accepted + rejections), which is not accepted / drafted), and the product of "
                         "its measured per-position rates (dotted). Right: measured speedup against the run's own "
                         "theoretical speedup (1 − α^(γ+1)) / ((1 − α)(γc + 1)), c the time of one draft forward over "
                         "one target forward, each decoding one token (Leviathan et al.'s cost coefficient). That "
                         "theory assumes the target scores γ + 1 tokens in the time of one; r in the table is what "
                         "that forward measured in target steps, and the predicted speedup, tokens per step / "
                         "(γc + r), takes it into account."))
    runs = group[group["kind"].isin(("run", "trial")) & group["acceptance_rate"].notna()].sort_values(
        ["sampler", "gamma"])
    rows = []
    for _, r in runs.iterrows():
        g = _int(r["gamma"])
        rates = parse_rates(r.get("position_acceptance"))
        alpha = r.get("iid_alpha")
        has_alpha = alpha is not None and alpha == alpha and g is not None
        rows.append([r["run"], r["sampler"], *_mode_cell(r, other), g, r["acceptance_rate"], alpha,
                     r["mean_accepted_tokens"],
                     expected_tokens_iid(min(max(float(alpha), 0.0), 1.0), g) if has_alpha else None,
                     expected_tokens_positions(rates, g) if rates and g is not None else None,
                     r.get("cost_ratio"), r.get("verify_cost_ratio"), r["speedup"], r.get("predicted_speedup"),
                     r["theoretical_speedup"]])
    blocks.append(Table(["run", "sampler", *_mode_column(other), "γ", "acceptance", "α", "tokens/step",
                         "i.i.d. prediction",
                         "per-position prediction", "c", "r", "speedup", "predicted speedup", "theoretical speedup"],
                        rows))
    return blocks


def _sigmoid_section(group, metric, name, slug, fig_dir, written) -> list:
    """The sigmoid's alpha/beta landscape; nothing for a pair without a sigmoid run or trial."""
    blocks = [Heading(3, "Sigmoid: alpha/beta landscape")]
    path = figures.sigmoid_landscape(group, metric, f"{name}: sigmoid settings", fig_dir / f"sigmoid-{slug}.png")
    if path is None:
        return []
    written[path.name] = path
    blocks.append(Figure(f"figures/{path.name}",
                         "Each sigmoid run (circles) and Optuna trial (triangles) at its (alpha, beta), coloured by "
                         "quality and by acceptance rate, labelled with γ. Runs without alpha/beta used the defaults "
                         f"α = {RULES['sigmoid'].defaults()['alpha']:g}, β = {RULES['sigmoid'].defaults()['beta']:g}."))
    return blocks


def _latency(table, fig_dir: Path, written: dict) -> list:
    blocks = [Heading(2, "Verify-step latency")]
    lat = of_kind(table, "latency")
    kernels = lat[lat["benchmark"] == "kernels"] if not lat.empty else lat
    samplers = lat[lat["benchmark"] == "samplers"] if not lat.empty else lat
    blocks.append(Heading(3, "CUDA kernels (`specsweep bench kernels`)"))
    if kernels.empty:
        blocks.append(Para("No kernel benchmark results (kernels/results/*.json): the CUDA kernels have not been "
                           "benchmarked on a GPU yet (`bash kernels/gpu_validate.sh` writes them). Section skipped."))
    else:
        path = figures.latency(kernels, "CUDA verify kernels vs HF, torch, FlashInfer", fig_dir / "latency-kernels.png")
        written[path.name] = path
        blocks.append(Figure(f"figures/{path.name}", _latency_caption(kernels, gpu=True)))
    blocks.append(Heading(3, "Samplers (`specsweep bench samplers`)"))
    if samplers.empty:
        blocks.append(Para("No sampler benchmark results (results/bench/samplers-*.json)."))
    else:
        path = figures.latency(samplers, "samplers vs HF's _speculative_sampling", fig_dir / "latency-samplers.png")
        written[path.name] = path
        blocks.append(Figure(f"figures/{path.name}", _latency_caption(samplers, gpu=False)))
    blocks.append(Para("Paper, as reported (Wagner et al., EMNLP 2024): profiling-time improvements of the verify "
                       "step over HF's implementation of 6–13 % with exact sampling and 37–94 % with the sigmoid "
                       "approximation, with a minor decline in accuracy for the sigmoid. The bands in the right-hand "
                       "panels read “improvement” as a reduction of verify time (time relative to HF = 1 − "
                       "improvement); they are the paper's GPU numbers, drawn for reference only."))
    return blocks


def _loops(table) -> list:
    """The decoding-loop benchmark: our loops against HF's generate, one row per (file, temperature)."""
    blocks = [Heading(2, "Decoding loop against Hugging Face (`specsweep bench engine`)")]
    loops = of_kind(table, "loop")
    if loops.empty:
        return [*blocks, Para("No engine benchmark results (results/bench/engine-*.json).")]

    def ratio(v):
        v = to_number(v)
        return "-" if v is None else f"{v:.2f}x"

    def rate(v):
        v = to_number(v)
        return "-" if v is None else f"{v:.3f}"

    rows = [[Path(str(r["source"])).name, _device(r), r["pair"], r["gamma"], f"{float(r['temperature']):g}",
             ratio(r["speculative_over_hf"]), ratio(r["autoregressive_over_hf"]),
             ratio(r["ceiling_over_hf"]), f"{rate(r['acceptance_ours'])} / {rate(r['acceptance_hf'])}"]
            for _, r in loops.sort_values(["source", "temperature"]).iterrows()]
    blocks.append(Table(["file", "device", "pair", "γ", "T", "ours / HF assisted", "ours (γ = 0) / HF plain",
                         "ceiling", "acceptance ours / HF"], rows))
    blocks.append(Para("Tokens/s of our speculative loop over HF's generate(assistant_model=...) at the same γ, and "
                       "of our γ = 0 loop over HF's plain generate: the median over repeats of per-repeat ratios, "
                       "batch 1, EOS and pad masked so every loop emits the same number of tokens. Goals: 1.5x and "
                       "1x. The ceiling (CPU only) is HF's time over our model-forward time: what a loop costing "
                       "nothing beyond its forwards would reach."))
    return blocks


def _lossless(table) -> list:
    """The losslessness benchmark: per (file, rule, dtype), the greedy match rate against the target alone, the first
    divergences, the sampled tests' p-values and the verdict."""
    blocks = [Heading(2, "Losslessness per dtype (`specsweep bench lossless`)")]
    rows = of_kind(table, "lossless")
    if rows.empty:
        return [*blocks, Para("The benchmark has not been run (no results/bench/lossless-*.json): `specsweep bench "
                              "lossless` writes it.")]

    def pvalue(v):
        v = to_number(v)
        return "-" if v is None else f"{v:.3g}"

    def match(r):
        rate = to_number(r.get("greedy_match_rate"))
        if rate is None:
            return "skipped (T > 0 only)" if r.get("greedy_skipped") else "-"
        return f"{rate:.0%} ({_int(r.get('greedy_identical'))}/{_int(r.get('greedy_prompts'))})"

    def divergences(r):
        if to_number(r.get("greedy_match_rate")) is None:
            return "-"
        text = r.get("first_divergences")
        return text if isinstance(text, str) and text else "none"

    out = [[Path(str(r["source"])).name, _device(r), r["pair"], r["rule_label"], r["registry_lossless"], r["dtype"],
            match(r), divergences(r), pvalue(r["p_first_token"]), pvalue(r["p_first_two"]), r["verdict"]]
           for _, r in rows.sort_values(["source"], kind="stable").iterrows()]
    blocks.append(Table(["file", "device", "pair", "rule", "lossless (registry)", "dtype", "greedy match",
                         "first divergences (prompt@position)", "p first token", "p first two tokens", "sampled"],
                        out))
    blocks.append(Para("Greedy: at T = 0, each prompt decoded by the rule and by the target alone (γ = 0, same engine "
                       "and dtype, batch 1); the share of prompts whose tokens are identical, and where the others "
                       "first diverge (new-token position). Sampled: at T = 1, N short continuations with the rule "
                       "against N with the target alone, chi-square tests of homogeneity of the first token and of "
                       "the first two tokens (the smallest p-value over the prompts shown); \"differs\" when one "
                       "is below the level, Bonferroni-corrected over the row's tests. Half precision may change a "
                       "near-tie between the speculative and the autoregressive forward: such mismatches are shown, "
                       "not hidden."))
    return blocks


def _latency_caption(rows, gpu: bool) -> str:
    devices = ", ".join(sorted({str(d) for d in rows["device_name"].dropna()}))
    sources = ", ".join(sorted({str(s) for s in rows["source"].dropna()}))
    cpu = " CPU only." if rows["cpu_only"].fillna(False).astype(bool).all() else ""
    floor = " The dashed black line is the exact kernel's floor (launch latency or bytes read / bandwidth)." \
        if gpu else ""
    return (f"Median latency per verify call (log-log) against batch size and vocabulary size, each panel at the "
            f"fixed settings named in its title; right: time relative to HF at B = 1.{floor} Measured on {devices} "
            f"({sources}).{cpu}")


def _sources(table) -> list:
    blocks = [Heading(2, "Sources")]
    if table.empty or "source" not in table.columns:
        return [*blocks, Para("No files were read.")]
    rows = []
    for src, g in table.groupby("source", sort=True):
        first = g.iloc[0]
        kinds = ", ".join(sorted({str(k) for k in g["kind"].dropna()}))
        rows.append([src, kinds, len(g), first.get("device_name"), first.get("date"), first.get("host"),
                     bool(first.get("cpu_only")) if first.get("cpu_only") is not None else None])
    blocks.append(Table(["file", "kind", "rows", "device", "date", "host", "CPU only"], rows))
    blocks.append(Bullets(["Runs and baselines: results/runs/*.json (`specsweep run`).",
                           "Trials: the Optuna study's SQLite file (read-only) and Pareto JSON under results/tune; "
                           "a trial's metrics come from its results file when it exists.",
                           "Latency: kernels/results/*.json (GPU) and results/bench/samplers-*.json.",
                           "Decoding loops: results/bench/engine-*.json.",
                           "Losslessness per dtype: results/bench/lossless-*.json."]))
    return blocks


# ---------------------------------------------------------------------------------------------- helpers

def _raw_quality(r):
    key = QUALITY.get(r["task"], (None,))[0]
    if key is None:
        return None
    q = to_number(r.get("quality"))
    return None if q is None else QUALITY[r["task"]][1] * q


def _device(r) -> str | None:
    name = r.get("device_name")
    if name is None or (isinstance(name, float) and math.isnan(name)):
        return None
    cpu = bool(r.get("cpu_only")) and not str(name).startswith("CPU")
    return f"{name}{' (CPU only)' if cpu else ''}"


def _speedup(r, keys: tuple[str, str, str] = ("speedup", "speedup_ci_low", "speedup_ci_high")) -> str | None:
    """'1.23x [1.10, 1.31]': the median speedup and its interval where recorded ('unpaired' for a speedup
    against an external baseline file, or against the target alone in another dtype); ``keys``: the columns of
    the speedup and its interval (recommend.VS_REFERENCE: against the common speed reference)."""
    v = to_number(r.get(keys[0]))
    if v is None:
        return None
    lo, hi = to_number(r.get(keys[1])), to_number(r.get(keys[2]))
    if lo is None or hi is None:
        return f"{v:.2f}x (unpaired)"
    return f"{v:.2f}x [{lo:.2f}, {hi:.2f}]"


def _pct(v):
    f = to_number(v)
    return None if f is None else f"{100 * f:+.2f} %"


def _int(v):
    f = to_number(v)
    return None if f is None else int(f)


def _slug(text: str) -> str:
    return figures.slug(text)
