"""Paired timing inside one run: the speculative loop (A) and the autoregressive loop (B, γ = 0) of the same engine,
with the same loaded target, on the same samples, interleaved in repeats after the warm-up.

Repeat r decodes the first ``samples_per_repeat`` samples with both loops, A then B in even repeats and B then A
in odd ones (counterbalanced, so a load that rises or falls steadily does not favour the loop that always runs
first). Every repeat seeds its generators alike (``seed + REPEAT_SEED``), so every repeat does the same work: the
same tokens, drafts and acceptances. The repeats then differ only in how the machine ran them; sampling
variation of the acceptance is not mixed into the spread (the quality pass over every sample measures it). A
load change between repeats cancels out of each repeat's ratio; one that lands inside a repeat shows up as
spread, which the checks in :mod:`pipeline.measure` flag. A γ = 0 run times only its own loop.

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


def time_repeats(loops: dict, batches: list[dict], max_new_tokens: int, repeats: int, seed: int, device: str,
                 progress: bool = True) -> dict[str, dict[str, list]]:
    """Time each loop in ``loops`` ({name: engine}, one or two) on ``batches`` in ``repeats`` interleaved repeats.

    batches  encoded inputs: {"input_ids": int64 [B, L], "attention_mask": int64 [B, L], and for an encoder-decoder
             target "encoder_inputs": {...}}
    Returns {name: {"seconds": float [R], "tokens": int [R]}}: seconds inside the engine's generate calls and new
    tokens, summed over the batches of each repeat.
    """
    names = list(loops)
    out = {name: {"seconds": [], "tokens": []} for name in names}
    bar = tqdm(range(repeats), desc="timed repeats", unit="repeat", disable=not progress)
    for rep in bar:
        for name in (names if rep % 2 == 0 else names[::-1]):
            generator = torch.Generator(device=device).manual_seed(seed + REPEAT_SEED)
            seconds, tokens = 0.0, 0
            for batch in batches:
                result = loops[name].generate(batch["input_ids"], batch["attention_mask"], max_new_tokens, generator,
                                              encoder_inputs=batch.get("encoder_inputs"))
                seconds += result.wall_time_s
                tokens += sum(s["new_tokens"] for s in result.row_stats)
            out[name]["seconds"].append(seconds)
            out[name]["tokens"].append(tokens)
    bar.close()
    return out


def summarize(timings: dict[str, dict[str, list]], predicted: float | None, load: dict, threads: dict,
              samples_per_repeat: int, max_spread: float = measure.MAX_RELATIVE_WIDTH,
              max_cpu_wait: float = measure.MAX_CPU_WAIT) -> dict:
    """The measurement record of :func:`time_repeats`'s timings, with flags (see pipeline.measure: an interval
    wider than ``max_spread`` x its median, a speedup far from ``predicted``, the speedup the run's tokens per
    step and cost ratio predict, or threads that waited for a CPU more than ``max_cpu_wait`` of their ready time
    (``load["runqueue_wait"]``, from :class:`pipeline.env_info.LoadProbe`) is flagged)."""
    tps = {name: measure.rates(t["tokens"], t["seconds"]) for name, t in timings.items()}
    record = {"method": "paired" if SPECULATIVE in timings else "repeated", "repeats": len(next(iter(tps.values()))),
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

