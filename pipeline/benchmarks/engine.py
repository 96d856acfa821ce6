"""`specsweep bench engine`: our decoding loop against Hugging Face's, side by side in one process.

Four loops over the same models, prompts, γ and temperature, each prompt decoded alone (HF's assisted
generation is batch 1) for exactly ``max_new_tokens`` tokens (EOS ignored, so lengths are equal):

  ours_speculative   SpeculativeEngine, `exact` sampler
  hf_assisted        target.generate(assistant_model=draft), constant schedule of γ draft tokens, no confidence
                     threshold, HF's own verify step
  ours_autoregressive  SpeculativeEngine with γ = 0
  hf_plain           target.generate()

Tokens/s is total new tokens over total seconds; the loops are interleaved and repeated, and the median of
the repeats is reported. The goals use paired ratios: within each repeat, ours over HF's, then the median over
repeats (a load change between repeats cancels out of each ratio). At T = 0 both speculative loops must emit
identical tokens (checked), so their acceptance is equal by construction; at T > 0 both acceptance rates are
reported. Without --target/--draft a
synthetic random-init pair is built (pipeline.synthetic): it measures the loops, not language quality.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from tqdm import tqdm

from pipeline.benchmarks.timing import format_table
from pipeline.engine import SpeculativeEngine
from pipeline.env_info import provenance
from pipeline.io import write_json_atomic
from pipeline.samplers import get_sampler

SYNTHETIC = {"layers": 8, "width": 256, "draft_layers": 1, "noise": 0.02, "deep_layer_scale": 0.1}
SYNTHETIC_PROMPTS = [
    "the storm hit the city", "police said the plane was", "a new report on the state of the world",
    "the president said that the game was not", "water and power", "the court said that it would not",
    "people in the city said there was a fire", "the team had a new home",
]


class _CountingHFVerify:
    """Wraps HF's own ``_speculative_sampling`` to count accepted/drafted tokens; calls it unchanged."""

    def __enter__(self):
        from transformers.generation import utils as hf_utils

        self.module, self.original = hf_utils, hf_utils._speculative_sampling
        self.accepted = self.drafted = 0

        def counted(candidate_input_ids, candidate_logits, candidate_length, new_logits, *args, **kwargs):
            valid, n = self.original(candidate_input_ids, candidate_logits, candidate_length, new_logits,
                                     *args, **kwargs)
            self.accepted += int(n)
            self.drafted += candidate_length
            return valid, n

        hf_utils._speculative_sampling = counted
        return self

    def __exit__(self, *exc):
        self.module._speculative_sampling = self.original


def _hf_kwargs(max_new: int, temperature: float, pad: int) -> dict:
    kw = {"max_new_tokens": max_new, "min_new_tokens": max_new, "do_sample": temperature > 0, "top_k": None,
          "top_p": None, "num_beams": 1, "pad_token_id": pad}
    if temperature > 0:
        kw["temperature"] = temperature
    return kw


def _load_prompts(data: str | None) -> list[str]:
    if data is None:
        return SYNTHETIC_PROMPTS
    return [json.loads(line)["prompt"] for line in Path(data).read_text().splitlines() if line.strip()]


def run(target: str | None = None, draft: str | None = None, data: str | None = None, gamma: int = 4,
        max_new_tokens: int = 64, repeats: int = 3, temperatures=(0.0, 1.0), device: str = "cpu",
        out: Path | None = None) -> dict:
    from pipeline.models import load_causal_lm, load_tokenizer
    from pipeline.synthetic import save_pair

    tmp = None
    if target is None:
        tmp = tempfile.TemporaryDirectory()
        target, draft = (str(p) for p in save_pair(Path(tmp.name), **SYNTHETIC))
    tok = load_tokenizer(target)
    t_model = load_causal_lm(target, torch.float32, device)
    d_model = load_causal_lm(draft, torch.float32, device)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    prompts = [tok(p, return_tensors="pt").input_ids.to(device) for p in _load_prompts(data)]

    def ours(gam: int, temperature: float, seed: int):
        engine = SpeculativeEngine(t_model, d_model if gam else None, get_sampler("exact", temperature=temperature),
                                   gam, device, eos_token_ids=[], pad_token_id=pad)
        g = torch.Generator(device=device).manual_seed(seed)
        tokens, acc, dr = [], 0, 0
        for ids in prompts:
            r = engine.generate(ids, torch.ones_like(ids), max_new_tokens, g)
            tokens.append(r.tokens[0])
            acc += r.row_stats[0]["accepted"]
            dr += r.row_stats[0]["drafted"]
        return tokens, acc, dr

    def hf(gam: int, temperature: float, seed: int):
        kw = _hf_kwargs(max_new_tokens, temperature, pad)
        if gam:
            kw.update(assistant_model=d_model, num_assistant_tokens=gam, num_assistant_tokens_schedule="constant",
                      assistant_confidence_threshold=0.0)
        torch.manual_seed(seed)
        tokens = []
        with _CountingHFVerify() as counter, torch.inference_mode():
            for ids in prompts:
                outp = t_model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw)
                tokens.append(outp[0, ids.shape[1]:].tolist())
        return tokens, counter.accepted, counter.drafted

    loops = {"ours_speculative": (ours, gamma), "hf_assisted": (hf, gamma),
             "ours_autoregressive": (ours, 0), "hf_plain": (hf, 0)}
    rows = []
    for temperature in temperatures:
        runs: dict[str, list] = {k: [] for k in loops}
        for rep in tqdm(range(repeats), desc=f"bench engine T={temperature}", unit="repeat"):
            for name, (fn, gam) in loops.items():
                t0 = time.perf_counter()
                tokens, acc, dr = fn(gam, temperature, seed=rep)
                runs[name].append((time.perf_counter() - t0, tokens, acc, dr))
        for name, (_, gam) in loops.items():
            secs = [r[0] for r in runs[name]]
            n_tokens = sum(len(t) for t in runs[name][0][1])
            acc = sum(r[2] for r in runs[name])
            dr = sum(r[3] for r in runs[name])
            rows.append({"loop": name, "gamma": gam, "temperature": temperature, "prompts": len(prompts),
                         "new_tokens": n_tokens, "seconds": secs,
                         "tokens_per_second": n_tokens / statistics.median(secs),
                         "acceptance_rate": acc / dr if dr else None})
        if temperature == 0.0:
            same = runs["ours_speculative"][0][1] == runs["hf_assisted"][0][1]
            rows[-4]["identical_to_hf_assisted"] = same
            rows[-2]["identical_to_hf_plain"] = runs["ours_autoregressive"][0][1] == runs["hf_plain"][0][1]
    result = {"benchmark": "engine", "provenance": provenance(device),
              "settings": {"target": target if tmp is None else f"synthetic {SYNTHETIC}", "gamma": gamma,
                           "max_new_tokens": max_new_tokens, "repeats": repeats, "dtype": "float32",
                           "batch": 1, "eos": "ignored (every loop emits max_new_tokens)"},
              "results": rows, "goals": _goals(rows)}
    if tmp is not None:
        tmp.cleanup()
    if out is not None:
        write_json_atomic(out, result)
    return result


def _paired_ratio(ours: dict, theirs: dict) -> float:
    """Median over repeats of (our tokens/s) / (their tokens/s) within the same repeat: the two loops ran back to
    back, so a change in machine load between repeats cancels out of each ratio."""
    return statistics.median(theirs_s / ours_s for ours_s, theirs_s in zip(ours["seconds"], theirs["seconds"]))


def _goals(rows: list[dict]) -> dict:
    by = {(r["loop"], r["temperature"]): r for r in rows}
    out = {}
    for temperature in sorted({r["temperature"] for r in rows}):
        spec = _paired_ratio(by[("ours_speculative", temperature)], by[("hf_assisted", temperature)])
        ar = _paired_ratio(by[("ours_autoregressive", temperature)], by[("hf_plain", temperature)])
        out[f"T={temperature}"] = {"speculative_over_hf_assisted": round(spec, 3),
                                   "autoregressive_over_hf_plain": round(ar, 3),
                                   "speculative_goal_1.5x_met": spec >= 1.5, "autoregressive_goal_1x_met": ar >= 1.0}
    return out


def print_table(result: dict) -> None:
    table = [{"loop": r["loop"], "T": r["temperature"], "γ": r["gamma"], "tokens": r["new_tokens"],
              "tok/s": f"{r['tokens_per_second']:.1f}",
              "acceptance": "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.3f}"}
             for r in result["results"]]
    print(format_table(table, list(table[0])))
    for key, g in result["goals"].items():
        print(f"{key}: ours/HF speculative {g['speculative_over_hf_assisted']:.2f}x (goal >= 1.5x: "
              f"{'met' if g['speculative_goal_1.5x_met'] else 'NOT met'}), ours/HF autoregressive "
              f"{g['autoregressive_over_hf_plain']:.2f}x (goal >= 1x: "
              f"{'met' if g['autoregressive_goal_1x_met'] else 'NOT met'})")
