"""One speed reference per task and target across dtypes: the target alone in its fastest measured dtype.

A run's ``speedup`` is paired against the target alone in the run's own dtype (pipeline/paired.py), so a dtype can
win on speedup and lose on speed: a bfloat16 run at 1.9x over bfloat16's target alone is slower than a float32 run
at 1.4x when the target alone is much faster in float32. To rank the runs and trials of one task and target across
dtypes, every one of them gets

    speedup_vs_reference = speedup × T(its dtype) / T(the reference dtype)

where T(d) is the target alone's tokens/s in dtype d and the reference dtype is the one with the highest T. T(d) is
the median tokens/s of the pair's AR baselines (γ = 0 results files) in d that are not flagged; for a dtype with
none, the median of the γ = 0 loop that its runs timed beside themselves (``ar_tokens_per_second``). Baselines and
runs are grouped by task, target and dtype, as the quality reference is (any draft: the target alone uses none).

Intervals: in the reference dtype the factor is 1 and the paired interval is carried over. In another dtype the
factor is a ratio of two measurements made apart, not paired, so no interval is given (``_ci_low``/``_ci_high`` are
None): the point estimate ranks, the report marks it unpaired. A task and target measured in one dtype is unchanged:
``speedup_vs_reference`` is ``speedup``, with its interval. In a task and target of several dtypes, a run whose dtype
has no T (no baseline, no paired loop) gets None, and cannot be ranked against the reference.

The columns it adds (to runs, trials and baselines of the task and target): ``speedup_vs_reference`` and its interval
(runs and trials only), ``speed_reference_dtype``, ``speed_reference_tokens_per_second``,
``target_alone_tokens_per_second`` (T of the row's dtype), ``target_alone_source`` (what T came from) and
``speed_dtypes`` (how many dtypes the task and target were measured in).
"""

from __future__ import annotations

SPEEDUP_KINDS = ("run", "trial")      # rows with a paired speedup to put on the common scale
MEASURED_KINDS = (*SPEEDUP_KINDS, "baseline")
COLUMNS = ("speedup_vs_reference", "speedup_vs_reference_ci_low", "speedup_vs_reference_ci_high",
           "speed_reference_dtype", "speed_reference_tokens_per_second", "target_alone_tokens_per_second",
           "target_alone_source", "speed_dtypes")
NUMERIC = tuple(c for c in COLUMNS if c not in ("speed_reference_dtype", "target_alone_source"))


def add_speed_reference(table, trusted):
    """A copy of ``table`` with the columns above (None on rows of other kinds). ``trusted``: a bool Series, False
    for rows whose speed measurement is flagged (their tokens/s is not used for T)."""
    import pandas as pd

    table = table.copy()
    values = {c: pd.Series(None, index=table.index, dtype=object) for c in COLUMNS}
    if not {"kind", "task", "target", "dtype", "speedup"} <= set(table.columns):
        return table.assign(**values)
    measured = table[table["kind"].isin(MEASURED_KINDS) & table["task"].notna() & table["target"].notna()]
    for _, rows in measured.groupby(["task", "target"], sort=False):
        for index, cells in _pair_cells(rows, trusted.loc[rows.index]).items():
            for column, value in cells.items():
                values[column].at[index] = value
    for column in NUMERIC:
        values[column] = pd.to_numeric(values[column], errors="coerce")
    return table.assign(**values)


def target_alone_speeds(rows, trusted) -> dict[str, tuple[float, str]]:
    """{dtype: (T, what it came from)} for one task and target's ``rows``, from those ``trusted`` marks: the median
    tokens/s of its AR baselines in the dtype, else of its runs' paired γ = 0 loops; a dtype with neither is absent."""
    speeds = {}
    for dtype, group in rows[trusted & rows["dtype"].notna()].groupby("dtype", sort=True):
        base = _numbers(group[group["kind"] == "baseline"], "tokens_per_second")
        loops = _numbers(group[group["kind"].isin(SPEEDUP_KINDS)], "ar_tokens_per_second")
        if len(base):
            speeds[str(dtype)] = (float(base.median()), f"{len(base)} AR baseline(s)")
        elif len(loops):
            speeds[str(dtype)] = (float(loops.median()), f"the γ = 0 loop of {len(loops)} paired run(s)")
    return speeds


def _numbers(rows, column: str):
    """The numbers in ``rows``' ``column`` (none where the table has no such column)."""
    import pandas as pd

    if column not in rows.columns:
        return pd.Series(dtype=float)
    return pd.to_numeric(rows[column], errors="coerce").dropna()


def _pair_cells(rows, trusted) -> dict:
    """{row index: {column: value}} for one task and target's rows."""
    speeds = target_alone_speeds(rows, trusted)
    dtypes = sorted({str(d) for d in rows["dtype"].dropna()})
    if len(dtypes) == 1:
        reference = dtypes[0]
    else:   # the fastest target alone; ties broken by name, so the choice does not depend on the files' order
        reference = max(sorted(speeds), key=lambda d: speeds[d][0]) if speeds else None
    ref_speed = speeds.get(reference, (None, None))[0]
    out = {}
    for index, row in rows.iterrows():
        dtype = None if row["dtype"] is None or row["dtype"] != row["dtype"] else str(row["dtype"])
        own, source = speeds.get(dtype, (None, None))
        cells = {"speed_reference_dtype": reference, "speed_reference_tokens_per_second": ref_speed,
                 "target_alone_tokens_per_second": own, "target_alone_source": source, "speed_dtypes": len(dtypes)}
        if row["kind"] in SPEEDUP_KINDS:
            cells.update(_on_reference(row, dtype, reference, own, ref_speed))
        out[index] = cells
    return out


def _on_reference(row, dtype, reference, own, ref_speed) -> dict:
    """A run's or trial's speedup against the reference: its own with its interval in the reference dtype, scaled by
    T(own) / T(reference) and without an interval in another, None where either T is unknown."""
    keys = ("speedup_vs_reference", "speedup_vs_reference_ci_low", "speedup_vs_reference_ci_high")
    speedup = _number(row.get("speedup"))
    if dtype is not None and dtype == reference:
        return dict(zip(keys, (speedup, _number(row.get("speedup_ci_low")), _number(row.get("speedup_ci_high")))))
    if speedup is None or own is None or not ref_speed:
        return dict.fromkeys(keys)
    return dict(zip(keys, (speedup * own / ref_speed, None, None)))


def several_dtypes(rows) -> bool:
    """Whether a task and target's rows (with the columns above) were measured in more than one dtype."""
    counts = rows["speed_dtypes"].dropna() if "speed_dtypes" in rows.columns else []
    return len(counts) > 0 and max(counts) > 1


def describe(rows) -> str:
    """The sentences that name one task and target's reference, from its rows (with the columns above): which dtype,
    its tokens/s and where they came from, the other dtypes', how the other dtypes' speedups are scaled, and which
    dtypes could not be ranked. For a task and target of several dtypes (:func:`several_dtypes`)."""
    first = rows.iloc[0]
    task, target, reference = first["task"], first["target"], first["speed_reference_dtype"]
    dtypes = sorted({str(d) for d in rows["dtype"].dropna()})
    speeds = {str(d): (g["target_alone_tokens_per_second"].dropna(), g["target_alone_source"].dropna())
              for d, g in rows[rows["dtype"].notna()].groupby("dtype", sort=True)}
    known = {d: (float(t.iloc[0]), str(s.iloc[0])) for d, (t, s) in speeds.items() if len(t)}
    if reference is None or reference != reference or reference not in known:
        return (f"{task}, {target}: measured in {', '.join(dtypes)}, but with no measurement of the target alone "
                "in any of them, so its runs cannot be ranked against one reference and are left out of the "
                "recommendation and the fronts.")
    tps, source = known[reference]
    others = "; ".join(f"{d}: {known[d][0]:.0f} tok/s ({known[d][1]})" for d in dtypes if d in known and d != reference)
    text = (f"{task}, {target}: ranked against the target alone in {reference}, its fastest measured dtype "
            f"({tps:.0f} tok/s, {source}; {others}). Speedup vs reference = the paired speedup × the target alone's "
            f"tokens/s in the run's dtype / in {reference}: in {reference} it is the paired speedup with its "
            "interval; in another dtype a ratio of measurements made apart, not paired, so it has no interval.")
    unranked = [d for d in dtypes if d not in known]
    if unranked:
        text += (f" Runs in {', '.join(unranked)} are left out: no measurement of the target alone in that "
                 "dtype.")
    if rows.loc[rows["kind"] == "trial", "dtype"].nunique() > 1:     # a study with a dtype axis
        text += (" The Optuna study's own objective (and its front) is the per-dtype speedup; here its trials are "
                 "ranked against the same reference as the runs.")
    return text


def _number(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if f != f else f
