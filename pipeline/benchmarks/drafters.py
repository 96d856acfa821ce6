"""`specsweep bench drafters`: drafters without a draft model, against transformers' prompt lookup and our own loop.

Loops, each decoding every prompt alone (batch 1) greedily for at most ``max_new_tokens`` tokens, on one target:

  ours_ar             our engine at γ = 0 (the target alone)
  hf_plain            transformers' ``generate`` (the target alone)
  ours_lookup_K       our engine with prompt lookup (pipeline/decoding/drafters/lookup.py), K tokens per proposal
  hf_lookup_K         transformers' prompt lookup: ``generate(prompt_lookup_num_tokens=K,
                      max_matching_ngram_size=lookup_max)``
  ours_suffix_K       our engine with suffix decoding, at most K tokens per proposal

At T = 0 every loop must emit the target's greedy tokens: each loop's tokens are compared with ``ours_ar``'s, prompt
by prompt, and the comparison is recorded (``identical``). The loops run interleaved in each repeat (their order
rotates from repeat to repeat), and each ratio is paired within a repeat, then summarised by its median over the
repeats with an order-statistic interval (pipeline/measure.py): ours over transformers' prompt lookup at each K,
and each speculative loop over its own plain loop. Our loops' time per phase (prefill, target, verify, lookup) is
recorded too: where the time goes when a drafter does not pay.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from pipeline.benchmarks.prompts import prompts_of
from pipeline.benchmarks.timing import format_table
from pipeline.config import RunConfig
from pipeline.decoding.drafters.lookup import prompt_lookup, suffix_decoding
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.env_info import provenance
from pipeline.errors import SpecsweepError
from pipeline.io import write_json_atomic
from pipeline.measure import median_ci
from pipeline.models import eos_token_ids, load_causal_lm, load_tokenizer
from pipeline.samplers import get_sampler


def _loops(target, tokenizer, eos: list[int], lookup_tokens: list[int], lookup_max: int, max_new_tokens: int,
           device: str) -> dict:
    """name -> (inputs -> (new token ids, verify steps or None, phase seconds or None))."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if eos else 0)
    greedy = get_sampler("greedy", temperature=0.0)

    def ours(drafter, gamma):
        engine = SpeculativeEngine(target, drafter, greedy, gamma=gamma, device=device, eos_token_ids=eos,
                                   pad_token_id=pad)

        def decode(inputs):
            r = engine.generate(inputs["input_ids"], inputs["attention_mask"], max_new_tokens)
            return r.tokens[0], r.verify_steps, r.phase_time_s
        return decode

    def hf(**extra):
        def decode(inputs):
            ids, mask = inputs["input_ids"].to(device), inputs["attention_mask"].to(device)
            out = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, temperature=None, top_p=None,
                                  top_k=None, max_new_tokens=max_new_tokens, pad_token_id=pad, eos_token_id=eos or None,
                                  **extra)
            new = out[0, ids.shape[1]:].tolist()
            if eos and any(t in eos for t in new):    # ours stops at the first EOS, included
                new = new[: next(i for i, t in enumerate(new) if t in eos) + 1]
            return new, None, None
        return decode

    loops = {"ours_ar": ours(None, 0), "hf_plain": hf()}
    for k in lookup_tokens:
        loops[f"ours_lookup_{k}"] = ours(prompt_lookup(1, lookup_max, eos), k)
        loops[f"hf_lookup_{k}"] = hf(prompt_lookup_num_tokens=k, max_matching_ngram_size=lookup_max)
        loops[f"ours_suffix_{k}"] = ours(suffix_decoding(24, 1.0, 0.1, False), k)
    return loops


def _timed(decode, inputs, device: str):
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = decode(inputs)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


@torch.inference_mode()
def run(config: RunConfig, *, lookup_tokens: list[int], lookup_max: int, repeats: int, device: str,
        out: Path, progress: bool = True) -> dict:
    """Every loop over every prompt, ``repeats`` times interleaved; writes the results JSON after each repeat."""
    target = load_causal_lm(config.target, torch.float32, device)
    tokenizer = load_tokenizer(config.target)
    if config.chat_template and not getattr(tokenizer, "chat_template", None):
        raise SpecsweepError(f"--chat-template: {config.target}'s tokenizer has no chat template: leave the flag out")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    eos = eos_token_ids(target, tokenizer)
    prompts = prompts_of(config, target, tokenizer)
    loops = _loops(target, tokenizer, eos, lookup_tokens, lookup_max, config.max_new_tokens, device)
    for decode in loops.values():                        # warm-up, untimed
        decode({k: v[:, -8:] for k, v in prompts[0].items() if k in ("input_ids", "attention_mask")})
    names = list(loops)
    record = {name: {"seconds": [], "tokens": [], "steps": [], "phases": {}} for name in names}
    identical = {name: True for name in names}
    result = {}
    bar = tqdm(total=repeats * len(names), desc="bench drafters", unit="loop", disable=not progress)
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:        # the order rotates per repeat
            outputs, seconds, steps = [], 0.0, 0
            for inputs in prompts:
                (tokens, n_steps, phases), s = _timed(loops[name], inputs, device)
                outputs.append(tokens)
                seconds += s
                steps += n_steps or 0
                for phase, t in (phases or {}).items():
                    record[name]["phases"][phase] = record[name]["phases"].get(phase, 0.0) + t / repeats
            rec = record[name]
            rec["seconds"].append(seconds)
            rec["tokens"].append(sum(len(t) for t in outputs))
            rec["steps"].append(steps)
            rec["outputs"] = outputs
            bar.update(1)
        for name in names:
            identical[name] = identical[name] and record[name]["outputs"] == record["ours_ar"]["outputs"]
        result = _summary(config, record, identical, lookup_tokens, lookup_max, device, len(prompts))
        write_json_atomic(out, result)
    bar.close()
    return result


def _ratio(record: dict, a: str, b: str) -> dict:
    """Loop a's tokens/s over loop b's, paired per repeat: median and interval."""
    ratios = [(ta / sa) / (tb / sb) for ta, sa, tb, sb in zip(record[a]["tokens"], record[a]["seconds"],
                                                             record[b]["tokens"], record[b]["seconds"])]
    return {**median_ci(ratios).to_dict(), "ratios": ratios}


def _summary(config: RunConfig, record: dict, identical: dict, lookup_tokens: list[int], lookup_max: int,
             device: str, n_prompts: int) -> dict:
    loops = {}
    for name, rec in record.items():
        tps = [t / s for t, s in zip(rec["tokens"], rec["seconds"])]
        loops[name] = {"tokens_per_second": median_ci(tps).median, "tokens": rec["tokens"][-1],
                       "seconds": rec["seconds"], "identical_to_target": identical[name],
                       "mean_accepted_tokens": rec["tokens"][-1] / rec["steps"][-1] if rec["steps"][-1] else None,
                       "phase_seconds": rec["phases"] or None}
    ratios = {"ours_ar_over_hf_plain": _ratio(record, "ours_ar", "hf_plain")}
    for k in lookup_tokens:
        ratios[f"ours_lookup_{k}_over_hf_lookup_{k}"] = _ratio(record, f"ours_lookup_{k}", f"hf_lookup_{k}")
        ratios[f"ours_lookup_{k}_over_ours_ar"] = _ratio(record, f"ours_lookup_{k}", "ours_ar")
        ratios[f"hf_lookup_{k}_over_hf_plain"] = _ratio(record, f"hf_lookup_{k}", "hf_plain")
        ratios[f"ours_suffix_{k}_over_ours_ar"] = _ratio(record, f"ours_suffix_{k}", "ours_ar")
    goals = {"ours_lookup_at_least_hf_every_k": all(ratios[f"ours_lookup_{k}_over_hf_lookup_{k}"]["median"] >= 1
                                                   for k in lookup_tokens),
             "all_identical": all(identical.values())}
    return {"benchmark": "drafters", "provenance": provenance(device),
            "settings": {"target": config.target, "data": config.data, "task": config.task,
                         "chat_template": config.chat_template, "prompts": n_prompts,
                         "max_new_tokens": config.max_new_tokens, "max_prompt_tokens": config.max_prompt_tokens,
                         "lookup_tokens": lookup_tokens, "lookup_max": lookup_max, "temperature": 0.0,
                         "repeats": len(next(iter(record.values()))["seconds"]), "batch": 1,
                         "suffix": {"depth": 24, "factor": 1.0, "min_prob": 0.1}},
            "loops": loops, "ratios": ratios, "goals": goals}


def print_table(result: dict) -> None:
    rows = []
    for name, loop in result["loops"].items():
        mat = loop["mean_accepted_tokens"]
        rows.append({"loop": name, "tok/s": f"{loop['tokens_per_second']:.1f}",
                     "tokens/step": f"{mat:.2f}" if mat else "-", "same tokens": "yes" if loop["identical_to_target"]
                     else "NO"})
    print(format_table(rows, ["loop", "tok/s", "tokens/step", "same tokens"]))
    print(format_table([{"ratio": k, "median": f"{v['median']:.2f}",
                         "interval": f"[{v['ci_low']:.2f}, {v['ci_high']:.2f}]"} for k, v in result["ratios"].items()],
                       ["ratio", "median", "interval"]))
    print(f"goals: {result['goals']}")
