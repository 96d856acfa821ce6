"""Paired timing inside one run: the speculative loop (A) and the autoregressive loop (B, γ = 0) of the same engine,
with the same loaded target, on the same samples, interleaved in repeats after the warm-up.

Repeat r decodes the first ``samples_per_repeat`` samples with both loops, A then B in even repeats and B then A
in odd ones (counterbalanced, so a load that rises or falls steadily does not favour the loop that always runs
first). Every repeat seeds its generators alike (``seed + REPEAT_SEED``), so every repeat does the same work: the
same tokens, drafts and acceptances. The repeats then differ only in how the machine ran them; sampling
variation of the acceptance is not mixed into the spread (the quality pass over every sample measures it). A
load change between repeats cancels out of each repeat's ratio; one that lands inside a repeat shows up as
spread, which the checks in :mod:`pipeline.measure` flag. A γ = 0 run times only its own loop.

A task with categories (``spec_bench``) times them apart (:func:`time_groups`): in every repeat, category by category,
both loops decode that category's samples back to back, so each category's ratio is paired within moments and the
run's overall figures are the sums over the categories.

The record (``results["measurement"]``) holds the per-repeat seconds and tokens, the median speedup with its
interval, tokens/s medians and spread, the machine's load around the repeats, the thread settings in force, and
the flags with their reasons.
"""

from __future__ import annotations

import sys

import torch
from tqdm.auto import tqdm

from pipeline import measure

SPECULATIVE, AUTOREGRESSIVE = "speculative", "autoregressive"
REPEAT_SEED = 10_000  # repeat generators start here, away from the quality pass's seed and the warm-up's seed + 1


def prompt_texts(loop, batch: dict) -> dict:
    """generate's ``prompt_texts`` keyword where the loop reads them (our engine with a draft of another tokenizer,
    pipeline/decoding/drafters/cross_tokenizer.py) and the task's batch has them; else nothing."""
    # the bridge is the drafter's (pipeline/stack.py build_drafter); an HF engine's generate takes no texts
    if getattr(getattr(loop, "drafter", None), "bridge", None) is not None and "prompt_texts" in batch:
        return {"prompt_texts": batch["prompt_texts"]}
    return {}


def time_repeats(loops: dict, batches: list[dict], max_new_tokens: int, repeats: int, seed: int, device: str,
                 progress: bool = True) -> dict[str, dict[str, list]]:
    """Time each loop in ``loops`` ({name: engine}, one or two) on ``batches`` in ``repeats`` interleaved repeats.

    batches  encoded inputs: {"input_ids": int64 [B, L], "attention_mask": int64 [B, L], and for an encoder-decoder
             target "encoder_inputs": {...}}
    Returns {name: {"seconds": float [R], "tokens": int [R], "prefill_seconds": float [R], "rows": int [R],
    "phases": {...}, "outputs": [[int]]}}: seconds inside the engine's generate calls, new tokens, seconds of the
    prefill phase (the prompt's forward, which gives each row's first token) and rows decoded, summed over the
    batches of each repeat; "phases" sums over every
    repeat the seconds and calls per engine phase ("time_s", "calls": prefill, draft, target, verify) and the draft
    forwards ("draft_forwards"), from which the run's per-forward costs are read (:func:`forward_costs`); "outputs"
    are the first repeat's new token ids, row by row (at T = 0 the two loops' tokens can be compared).
    """
    names = list(loops)
    out = _empty(names)
    bar = tqdm(range(repeats), desc="timed repeats", unit="repeat", disable=not progress)
    for rep in bar:
        for name in (names if rep % 2 == 0 else names[::-1]):
            prefill = out[name]["phases"]["time_s"].get("prefill", 0.0)
            decoded = _decode(loops[name], batches, max_new_tokens, seed, device, out[name]["phases"],
                              out[name]["outputs"] if rep == 0 else None)
            out[name]["seconds"].append(sum(seconds for seconds, _ in decoded))
            out[name]["tokens"].append(sum(sum(tokens) for _, tokens in decoded))
            out[name]["prefill_seconds"].append(out[name]["phases"]["time_s"].get("prefill", 0.0) - prefill)
            out[name]["rows"].append(sum(len(tokens) for _, tokens in decoded))
    bar.close()
    return out


def time_groups(loops: dict, groups: dict[str, list[tuple[list[str], dict]]], max_new_tokens: int, repeats: int,
                seed: int, device: str, progress: bool = True) -> tuple[dict[str, dict[str, list]], dict]:
    """:func:`time_repeats` over groups of samples (a task's categories), each group's loops back to back: in every
    repeat, group by group, A then B (B then A in odd repeats), so each group's ratio is paired within moments.

    groups  {group: [(sample ids [B], encoded batch), ...]}
    Returns (timings, by_group): ``timings`` as :func:`time_repeats` returns them, summed over the groups (the run's
    overall figures), and ``by_group`` {group: {"ids": [sample ids, U], name: {"seconds": float [R], "tokens": int
    [R], "unit_seconds": float [R][U], "unit_tokens": int [R][U]}}}, where a sample's seconds are its batch's (at
    batch 1, its own).
    """
    names = list(loops)
    out = _empty(names)
    by_group = {g: {"ids": [i for ids, _ in batches for i in ids],
                    **{name: {"seconds": [], "tokens": [], "unit_seconds": [], "unit_tokens": []} for name in names}}
                for g, batches in groups.items()}
    bar = tqdm(range(repeats), desc="timed repeats", unit="repeat", disable=not progress)
    for rep in bar:
        totals = {name: [0.0, 0] for name in names}
        for g, batches in groups.items():
            for name in (names if rep % 2 == 0 else names[::-1]):
                decoded = _decode(loops[name], [b for _, b in batches], max_new_tokens, seed, device,
                                  out[name]["phases"])
                record = by_group[g][name]
                record["unit_seconds"].append([seconds for seconds, tokens in decoded for _ in tokens])
                record["unit_tokens"].append([t for _, tokens in decoded for t in tokens])
                record["seconds"].append(sum(seconds for seconds, _ in decoded))
                record["tokens"].append(sum(record["unit_tokens"][-1]))
                totals[name][0] += record["seconds"][-1]
                totals[name][1] += record["tokens"][-1]
        for name in names:
            out[name]["seconds"].append(totals[name][0])
            out[name]["tokens"].append(totals[name][1])
    bar.close()
    return out, by_group


def _empty(names: list[str]) -> dict:
    return {name: {"seconds": [], "tokens": [], "phases": {"time_s": {}, "calls": {}, "draft_forwards": 0},
                   "outputs": [], "prefill_seconds": [], "rows": []} for name in names}


def _decode(loop, batches: list[dict], max_new_tokens: int, seed: int, device: str, phases: dict,
            outputs: list | None = None) -> list[tuple[float, list[int]]]:
    """One timed pass of ``loop`` over ``batches``, its generator seeded alike in every repeat -> per batch (seconds
    inside generate, new tokens per row); the phases are added to ``phases``, each row's new token ids to
    ``outputs`` when it is given."""
    generator = torch.Generator(device=device).manual_seed(seed + REPEAT_SEED)
    out = []
    for batch in batches:
        result = loop.generate(batch["input_ids"], batch["attention_mask"], max_new_tokens, generator,
                               encoder_inputs=batch.get("encoder_inputs"), **prompt_texts(loop, batch))
        out.append((result.wall_time_s, [s["new_tokens"] for s in result.row_stats]))
        _add_phases(phases, result)
        if outputs is not None:
            outputs.extend(list(row) for row in result.tokens)
    return out


def _add_phases(phases: dict, result) -> None:
    """Add one generate call's phase seconds, phase calls and draft forwards to ``phases`` (in place)."""
    for key, values in (("time_s", result.phase_time_s), ("calls", result.phase_calls)):
        for phase, v in values.items():
            phases[key][phase] = phases[key].get(phase, 0) + v
    phases["draft_forwards"] += result.extra.get("draft_forwards", 0)


def forward_costs(timings: dict[str, dict]) -> dict[str, float | None]:
    """Per-forward costs of the two loops of a paired timing (:func:`time_repeats`), all timed in the same
    interleaved repeats:

      draft_forward_s     seconds per draft forward (the speculative loop's draft phase / its draft forwards)
      target_forward_s    seconds per target forward of autoregressive decoding: one new token (the γ = 0 loop's
                          target phase / its calls; its prompt prefill is timed apart and left out)
      verify_forward_s    seconds per target forward of the speculative loop: the pending token and γ drafts
      cost_ratio          c = draft_forward_s / target_forward_s: Leviathan et al.'s cost coefficient, the time of
                          one draft run over the time of one target run, both decoding one token
      verify_cost_ratio   r = verify_forward_s / target_forward_s: what scoring γ + 1 tokens in one forward costs
                          in target steps. Leviathan et al.'s speedup assumes r = 1 (the forward is bound by reading
                          weights, so extra tokens are free); where a forward's time grows with its tokens (small
                          models on a CPU) r > 1, and the speedup falls short of that theory by (γc + 1) / (γc + r)

    Values are None where a loop or phase is missing (a γ = 0 run; a phase with no calls).
    """
    spec, ar = timings.get(SPECULATIVE, {}).get("phases"), timings.get(AUTOREGRESSIVE, {}).get("phases")

    def per_call(phases, phase, count=None):
        if not phases:
            return None
        n = phases["calls"].get(phase, 0) if count is None else count
        return phases["time_s"].get(phase, 0.0) / n if n else None

    draft = per_call(spec, "draft", spec["draft_forwards"] if spec else None)
    target, verify = per_call(ar, "target"), per_call(spec, "target")
    return {"draft_forward_s": draft, "target_forward_s": target, "verify_forward_s": verify,
            "cost_ratio": draft / target if draft is not None and target else None,
            "verify_cost_ratio": verify / target if verify is not None and target else None}


def summarize(timings: dict[str, dict[str, list]], predicted: float | None, load: dict, threads: dict,
              samples_per_repeat: int, max_spread: float = measure.MAX_RELATIVE_WIDTH,
              max_cpu_wait: float = measure.MAX_CPU_WAIT) -> dict:
    """The measurement record of :func:`time_repeats`'s timings, with flags (see pipeline.measure: an interval
    wider than ``max_spread`` x its median, a speedup far from ``predicted``, the speedup the run's tokens per
    step and forward costs predict, or threads that waited for a CPU more than ``max_cpu_wait`` of their ready time
    (``load["runqueue_wait"]``, from :class:`pipeline.env_info.LoadProbe`) is flagged)."""
    tps = {name: measure.rates(t["tokens"], t["seconds"]) for name, t in timings.items()}
    outputs = {name: t.pop("outputs", []) for name, t in timings.items()}   # each loop's first repeat's tokens
    record = {"outputs": outputs,
              "method": "paired" if SPECULATIVE in timings else "repeated", "repeats": len(next(iter(tps.values()))),
              "samples_per_repeat": samples_per_repeat,
              "order": "A/B alternating per repeat (A B, B A, ...)" if len(timings) > 1 else "one loop",
              "timings": timings,
              "tokens_per_second": {name: {**measure.spread(v), "ci": measure.median_ci(v).to_dict()}
                                    for name, v in tps.items()},
              "load": load, "threads": threads, "confidence": measure.CONFIDENCE,
              "max_relative_width": max_spread, "max_cpu_wait": max_cpu_wait, "plausible": list(measure.PLAUSIBLE)}
    wait = (load.get("runqueue_wait") or {}).get("wait_fraction")
    if SPECULATIVE in timings:
        a, b = timings[SPECULATIVE], timings[AUTOREGRESSIVE]
        interval, ratios = measure.paired_speedup(a["tokens"], a["seconds"], b["tokens"], b["seconds"])
        record["ratios"] = ratios
        record["speedup"] = interval.to_dict()
        if a.get("prefill_seconds") and b.get("prefill_seconds"):      # time_repeats' timings (not time_groups')
            record["decode_speedup"] = decode_speedup(a, b).to_dict()
        record["predicted_speedup"] = predicted
        record["measured_over_predicted"] = measure.plausibility(interval.median, predicted)
        reasons = measure.flag_reasons(interval, "speedup", predicted, max_spread, cpu_wait=wait,
                                       max_cpu_wait=max_cpu_wait)
    else:
        reasons = measure.flag_reasons(measure.median_ci(tps[AUTOREGRESSIVE]), "tokens/s", None, max_spread,
                                       cpu_wait=wait, max_cpu_wait=max_cpu_wait)
    record["flags"] = reasons
    record["flagged"] = bool(reasons)
    return record


def decode_speedup(spec: dict, ar: dict) -> measure.MedianCI:
    """The paired speedup of the decoding phase alone (time per output token after the first, as serving systems
    report it): each repeat's tokens after each row's first over its seconds after the prefill, speculative over
    autoregressive, median with its interval. The prefill (the target's forward over the prompt, and a draft model's
    own) is a fixed cost per sample that speculative decoding does not reduce; the end-to-end speedup counts it."""
    def decode(t: dict) -> tuple[list[int], list[float]]:
        return ([n - rows for n, rows in zip(t["tokens"], t["rows"])],
                [s - p for s, p in zip(t["seconds"], t["prefill_seconds"])])

    interval, _ = measure.paired_speedup(*decode(spec), *decode(ar))
    return interval


def metrics_of(record: dict) -> dict:
    """The flat metrics a run reports from its measurement record (tokens/s medians, the paired speedup and its
    interval, ``flagged``)."""
    tps = record["tokens_per_second"]
    main = tps.get(SPECULATIVE) or tps[AUTOREGRESSIVE]
    out = {"tokens_per_second": main["median"], "tokens_per_second_ci_low": main["ci"]["ci_low"],
           "tokens_per_second_ci_high": main["ci"]["ci_high"], "tokens_per_second_relative_iqr": main["relative_iqr"],
           "flagged": record["flagged"]}
    if "speedup" in record:
        out.update({"ar_tokens_per_second": tps[AUTOREGRESSIVE]["median"], "speedup": record["speedup"]["median"],
                    "speedup_ci_low": record["speedup"]["ci_low"], "speedup_ci_high": record["speedup"]["ci_high"],
                    "speedup_paired": True})
    if "decode_speedup" in record:
        out.update({"decode_speedup": record["decode_speedup"]["median"],
                    "decode_speedup_ci_low": record["decode_speedup"]["ci_low"],
                    "decode_speedup_ci_high": record["decode_speedup"]["ci_high"]})
    return out


def warn_if_flagged(record: dict, out: str) -> None:
    """One warning on stderr per flag reason of a flagged measurement."""
    if not record["flagged"]:
        return
    load = record["load"]
    busy = load.get("others_busy_cores")
    where = f" (other processes kept {busy:.1f} of {load['cores']} cores busy)" if busy is not None else ""
    for reason in record["flags"]:
        tqdm.write(f"warning: {out}: speed measurement flagged{where}: {reason}. Flagged runs are left out of the "
                   "report's recommendation and Pareto front; re-run on a quieter machine or with more --repeats",
                   file=sys.stderr)

