"""`specsweep bench engine`: our decoding loop against Hugging Face's, side by side in one process.

Four loops over the same models, prompts, γ and temperature, each prompt decoded alone (HF's assisted
generation is batch 1) for exactly ``max_new_tokens`` tokens: EOS and the pad token are masked out of the
logits in every loop (HF's min_new_tokens and suppress_tokens, our suppress_tokens), so lengths are equal and
all loops sample one distribution:

  ours_speculative   SpeculativeEngine, `exact` sampler
  hf_assisted        target.generate(assistant_model=draft), constant schedule of γ draft tokens, no confidence
                     threshold (set on the draft's generation config, where transformers reads it), HF's own
                     verify step
  ours_autoregressive  SpeculativeEngine with γ = 0
  hf_plain           target.generate()
  ours_speculative_hf_forward, ours_autoregressive_hf_forward
                     our two loops with transformers' forward and DynamicCache instead of the static-cache
                     forward (pipeline/decoding/static/): what the static cache buys (same tokens)

Tokens/s is total new tokens over total seconds; the loops are interleaved and repeated, and the median of
the repeats is reported. The goals use paired ratios: within each repeat, ours over HF's, then the median over
repeats (a load change between repeats cancels out of each ratio). At T = 0 both speculative loops must emit
identical tokens (checked), so their acceptance is equal by construction; at T > 0 both acceptance rates are
reported, and for both speculative loops the draft tokens per verify step (counted: HF's from draft forwards)
show that both drafted γ. On CPU the model forwards are timed too (hooks on both loops alike): the share of each
loop's time spent in them, and the ceiling a loop with no cost beyond our forwards would reach over HF's.
Without --target/--draft a
synthetic random-init pair is built (pipeline.synthetic): it measures the loops, not language quality.

A draft with another tokenizer (its token -> id map differs from the target's) is compared at T = 0 only: our loop
drafts in string mode (pipeline/decoding/drafters/cross_tokenizer.py), HF's assisted loop is transformers' Universal
Assisted
Generation (``generate(..., tokenizer=, assistant_tokenizer=)``), which at T > 0 prunes the draft's LM head in
place. Both loops then emit the target's greedy output (checked). Their "drafted" counts are in different units:
ours counts the target tokens proposed, HF's the draft's forwards (draft tokens).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from pipeline.benchmarks.timing import format_table
from pipeline.decoding.drafters.cross_tokenizer import TextDrafter, build_bridge, resolve_mode, same_vocabulary
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.decoding.hf_engine import assistant_schedule, forward_timing, hf_verify_step
from pipeline.decoding.timing import PhaseTimer
from pipeline.env_info import provenance
from pipeline.io import write_json_atomic
from pipeline.models import load_causal_lm, load_tokenizer
from pipeline.samplers import get_sampler
from pipeline.synthetic import save_pair

SYNTHETIC = {"layers": 8, "width": 256, "draft_layers": 1, "noise": 0.02, "deep_layer_scale": 0.1}
SYNTHETIC_PROMPTS = [
    "the storm hit the city", "police said the plane was", "a new report on the state of the world",
    "the president said that the game was not", "water and power", "the court said that it would not",
    "people in the city said there was a fire", "the team had a new home",
]


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
    """Time the loops at each temperature (without ``target``, on a synthetic pair); returns the results JSON,
    also written to ``out`` when given."""

    tmp = None
    if target is None:
        tmp = tempfile.TemporaryDirectory()
        target, draft = (str(p) for p in save_pair(Path(tmp.name), **SYNTHETIC))
    bench = _Bench.load(target, draft, data, device, max_new_tokens)
    if bench.bridge is not None:    # transformers' string-level drafting samples only at T = 0 (module docstring)
        temperatures = tuple(t for t in temperatures if t == 0.0)
    loops = _loops(gamma)
    rows = []
    for temperature in temperatures:
        runs = _time_loops(bench, loops, temperature, repeats)
        by_loop = {name: _row(name, gam, temperature, runs[name], bench) for name, (_, gam) in loops.items()}
        _check_identical(by_loop, runs, temperature)
        rows.extend(by_loop.values())
    result = {"benchmark": "engine", "provenance": provenance(device),
              "settings": {"target": target if tmp is None else f"synthetic {SYNTHETIC}", "gamma": gamma,
                           "max_new_tokens": max_new_tokens, "repeats": repeats, "dtype": "float32",
                           "batch": 1,
                           "masked_tokens": (f"EOS {bench.eos}, pad {bench.tok.pad_token_id}" if bench.masked else
                                             "none, and no loop stops at EOS") + ": every loop emits max_new_tokens",
                           "draft_tokenizer": "shared" if bench.bridge is None else
                           "another: ours in string mode, HF's Universal Assisted Generation; T = 0 only"},
              "results": rows, "goals": _goals(rows)}
    if tmp is not None:
        tmp.cleanup()
    if out is not None:
        write_json_atomic(out, result)
    return result


@dataclass
class _Bench:
    """What every loop decodes: the target and draft, the tokenizer, the tokenized prompts (and their texts), the
    number of new tokens, and the ids masked in every loop (``eos``: the target's EOS ids; ``masked``: those and the
    pad id). ``bridge``: a VocabBridge where the draft has another tokenizer (``d_tok``), else None."""

    t_model: object
    d_model: object
    tok: object
    prompts: list
    eos: list[int]
    masked: list[int]
    pad: int
    device: str
    max_new_tokens: int
    texts: list[str]
    d_tok: object = None
    bridge: object = None

    @property
    def cpu(self) -> bool:
        """Whether the loops run on CPU, the only device where model forwards are timed."""
        return torch.device(self.device).type == "cpu"

    @classmethod
    def load(cls, target: str, draft: str, data: str | None, device: str, max_new_tokens: int) -> _Bench:
        """Load the tokenizer and both models (float32 on ``device``) and tokenize the prompts of ``data`` (the
        synthetic prompts when None)."""

        tok, d_tok = load_tokenizer(target), load_tokenizer(draft)
        t_model = load_causal_lm(target, torch.float32, device)
        d_model = load_causal_lm(draft, torch.float32, device)
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        # HF's min_new_tokens = max_new_tokens masks EOS in target and draft logits until the end. The pad token is
        # masked in both loops too: a pad id inside the generated text makes HF's assistant propose tokens that
        # are not the draft's (checked against fresh draft forwards), which lowered HF's acceptance on the
        # synthetic pair, whose random models emit the pad token. Ours is given the same ids to suppress, so
        # both loops decode one distribution (and the same tokens at T = 0).
        eos = t_model.generation_config.eos_token_id
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        masked = sorted(set(eos) | ({tok.pad_token_id} if tok.pad_token_id is not None else set()))
        texts = _load_prompts(data)
        prompts = [tok(p, return_tensors="pt").input_ids.to(device) for p in texts]
        bridge = None if same_vocabulary(tok, d_tok) else build_bridge(
            tok, d_tok, t_model.get_output_embeddings().weight.shape[0],
            d_model.get_output_embeddings().weight.shape[0], device)
        if bridge is not None:
            # Our draft with another tokenizer masks nothing (its logits are in another vocabulary): no loop masks,
            # and none stops at EOS, so every loop still emits max_new_tokens, EOS ids included as plain tokens.
            masked = []
        return cls(t_model, d_model, tok, prompts, eos, masked, pad, device, max_new_tokens, texts, d_tok, bridge)


@contextmanager
def _forwards(bench: _Bench):
    """Count every draft and target forward inside the block and, on CPU, time them (hooks on both loops
    alike; on a GPU a forward's host time is only its launches, so the time is not used there); yields the
    PhaseTimer (phases "draft" and "target")."""
    timer = PhaseTimer("cpu")
    with forward_timing(bench.d_model, timer, "draft"), forward_timing(bench.t_model, timer, "target"):
        yield timer


def _ours(bench: _Bench, gam: int, temperature: float, seed: int, static: bool = True) -> dict:
    """One pass of our loop (SpeculativeEngine, `exact` sampler; autoregressive at ``gam`` = 0) over every prompt,
    on the static-cache forward unless ``static`` is False. Returns the tokens of each prompt, accepted, drafted
    and verify steps summed over prompts, the accepted-count histogram (None at ``gam`` = 0) and the seconds in
    model forwards (None off CPU)."""

    sampler = get_sampler("exact", temperature=temperature)
    drafter = None
    if gam:
        drafter = bench.d_model if bench.bridge is None else TextDrafter(
            bench.d_model, bench.bridge, resolve_mode("auto", False, sampler.verifies_by_argmax))
    engine = SpeculativeEngine(bench.t_model, drafter, sampler, gamma=gam, device=bench.device,
                               eos_token_ids=[], pad_token_id=bench.pad, suppress_tokens=bench.masked,
                               static_cache=static)
    g = torch.Generator(device=bench.device).manual_seed(seed)
    decoded = {"tokens": [], "accepted": 0, "drafted": 0, "steps": 0, "hist": [0] * (gam + 1) if gam else None}
    with _forwards(bench) as timer:
        _time_static_forwards(engine, timer)
        for ids, text in zip(bench.prompts, bench.texts):
            r = engine.generate(ids, torch.ones_like(ids), bench.max_new_tokens, g, prompt_texts=[text])
            decoded["tokens"].append(r.tokens[0])
            decoded["accepted"] += r.row_stats[0]["accepted"]
            decoded["drafted"] += r.row_stats[0]["drafted"]
            decoded["steps"] += r.verify_steps
            if gam:
                decoded["hist"] = [a + b for a, b in zip(decoded["hist"], r.extra["accepted_histogram"])]
    decoded["forward_seconds"] = sum(timer.totals().values()) if bench.cpu else None
    return decoded


def _ours_hf_forward(bench: _Bench, gam: int, temperature: float, seed: int) -> dict:
    """:func:`_ours` on transformers' forward and DynamicCache instead of the static-cache forward."""
    return _ours(bench, gam, temperature, seed, static=False)


def _hf(bench: _Bench, gam: int, temperature: float, seed: int) -> dict:
    """One pass of Hugging Face's loop over every prompt: ``target.generate``, assisted by the draft with a constant
    schedule of ``gam`` tokens when ``gam`` > 0. Returns the same keys as :func:`_ours`; at T = 0 HF's assisted
    loop never calls the verify step, so its accepted and drafted counts come from the emitted tokens and the
    draft forwards (and there is no histogram)."""
    kw = _hf_kwargs(bench.max_new_tokens, temperature, bench.pad)
    pad_id = bench.tok.pad_token_id
    if not bench.masked:    # nothing masked (a draft with another tokenizer): no stop at EOS either
        kw["min_new_tokens"], kw["eos_token_id"] = 0, None
    elif pad_id is not None and pad_id not in bench.eos:
        kw["suppress_tokens"] = [pad_id]
    if gam:
        kw["assistant_model"] = bench.d_model
        if bench.bridge is not None:    # transformers' Universal Assisted Generation
            kw["tokenizer"], kw["assistant_tokenizer"] = bench.tok, bench.d_tok
    torch.manual_seed(seed)
    tokens, stats = [], {}
    with ExitStack() as stack, torch.inference_mode():
        stack.enter_context(hf_verify_step(None, None, stats))  # HF's own verify step, counted
        if gam:
            stack.enter_context(assistant_schedule(bench.d_model, gam))
        timer = stack.enter_context(_forwards(bench))
        for ids in bench.prompts:
            outp = bench.t_model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw)
            tokens.append(outp[0, ids.shape[1]:].tolist())
    steps = timer.counts["target"]  # HF: one target forward per step, the prompt's included in the first
    decoded = {"tokens": tokens, "steps": steps,
               "forward_seconds": sum(timer.totals().values()) if bench.cpu else None}
    if temperature > 0 or not gam:
        hist = stats.get("hist", {})
        return {**decoded, "accepted": stats.get("accepted", 0), "drafted": stats.get("drafted", 0),
                "hist": [hist.get((gam, k), 0) for k in range(gam + 1)] if gam else None}
    # T = 0: HF matched tokens itself and never called the verify step. One draft forward per draft token;
    # each step emits its accepted tokens plus one.
    emitted = sum(len(t) for t in tokens)
    return {**decoded, "accepted": emitted - steps, "drafted": timer.counts["draft"], "hist": None}


def _loops(gamma: int) -> dict:
    """The six loops, by name: each its pass function (:func:`_ours`, :func:`_hf`, :func:`_ours_hf_forward`) and
    its γ (``gamma`` for the speculative loops, 0 for the autoregressive ones)."""
    return {"ours_speculative": (_ours, gamma), "hf_assisted": (_hf, gamma),
            "ours_autoregressive": (_ours, 0), "hf_plain": (_hf, 0),
            "ours_speculative_hf_forward": (_ours_hf_forward, gamma),
            "ours_autoregressive_hf_forward": (_ours_hf_forward, 0)}


def _time_loops(bench: _Bench, loops: dict, temperature: float, repeats: int) -> dict[str, list[dict]]:
    """Run every loop ``repeats`` times at ``temperature``, interleaved (repeat ``rep`` of each loop is seeded with
    ``rep``); returns each loop's passes, in repeat order, each with its wall-clock ``seconds`` added."""
    runs: dict[str, list[dict]] = {k: [] for k in loops}
    for rep in tqdm(range(repeats), desc=f"bench engine T={temperature}", unit="repeat"):
        for name, (fn, gam) in loops.items():
            t0 = time.perf_counter()
            decoded = fn(bench, gam, temperature, seed=rep)
            decoded["seconds"] = time.perf_counter() - t0
            runs[name].append(decoded)
    return runs


def _row(name: str, gam: int, temperature: float, reps: list[dict], bench: _Bench) -> dict:
    """The results row of loop ``name`` from its passes ``reps`` (one per repeat): tokens/s over the median
    seconds, pooled and per-repeat acceptance, verify steps per repeat, drafts per step, full-γ step counts and,
    on CPU, the seconds in model forwards."""
    secs = [r["seconds"] for r in reps]
    n_tokens = sum(len(t) for t in reps[0]["tokens"])
    acc, dr, steps = (sum(r[k] for r in reps) for k in ("accepted", "drafted", "steps"))
    fwd = [r["forward_seconds"] for r in reps]
    return {"loop": name, "gamma": gam, "temperature": temperature, "prompts": len(bench.prompts),
            "new_tokens": n_tokens, "seconds": secs,
            "tokens_per_second": n_tokens / statistics.median(secs),
            "acceptance_rate": acc / dr if dr else None,
            # per repeat (each its own seed): shows how much sampled acceptance varies
            "acceptance_per_repeat": [r["accepted"] / r["drafted"] if r["drafted"] else None for r in reps],
            "verify_steps": steps // len(reps),
            "drafted_per_step": dr / steps if gam and steps else None,
            # steps that drafted the full γ (the last steps of a prompt draft fewer): how often
            # k = 0..γ drafts were accepted, and accepted/drafted over those steps alone
            **_full_steps([r["hist"] for r in reps], gam),
            "model_forward_seconds": fwd if bench.cpu else None}


def _check_identical(by_loop: dict[str, dict], runs: dict[str, list[dict]], temperature: float) -> None:
    """Add to the rows ``by_loop`` (one temperature's, by loop name) whether our loops' first repeat emitted the
    same tokens as on transformers' forward (``identical_to_hf_forward``, every temperature) and, at T = 0, as
    HF's matching loop (``identical_to_hf_assisted``, ``identical_to_hf_plain``)."""
    for name, other in (("ours_speculative", "hf_assisted"), ("ours_autoregressive", "hf_plain")):
        # the static-cache forward emits the same tokens as transformers' forward, at every temperature
        by_loop[name]["identical_to_hf_forward"] = runs[name][0]["tokens"] == \
            runs[f"{name}_hf_forward"][0]["tokens"]
        if temperature == 0.0:
            by_loop[name][f"identical_to_{other}"] = runs[name][0]["tokens"] == runs[other][0]["tokens"]


class _TimedForward:
    """A static-cache forward whose calls are timed as phase ``name`` (it bypasses the model's forward hooks)."""

    def __init__(self, inner, timer: PhaseTimer, name: str) -> None:
        self.inner, self.timer, self.name = inner, timer, name

    def __call__(self, *args, **kwargs):
        self.timer.start(self.name)
        try:
            return self.inner(*args, **kwargs)
        finally:
            self.timer.stop(self.name)

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


def _time_static_forwards(engine: SpeculativeEngine, timer: PhaseTimer) -> None:
    for name, cached in (("target", engine.target), ("draft", engine.drafter.model if engine.drafter else None)):
        if cached is not None and cached.static is not None:
            cached.static = _TimedForward(cached.static, timer, name)


def _full_steps(hists: list, gamma: int) -> dict:
    if not gamma or any(h is None for h in hists):
        return {"full_step_histogram": None, "full_step_acceptance": None}
    total = [sum(col) for col in zip(*hists)]
    steps = sum(total)
    return {"full_step_histogram": total,
            "full_step_acceptance": sum(k * n for k, n in enumerate(total)) / (gamma * steps) if steps else None}


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
                                   "speculative_goal_1.5x_met": spec >= 1.5, "autoregressive_goal_1x_met": ar >= 1.0,
                                   # what speculation buys inside each engine (paired, same repeats)
                                   "ours_speculative_over_autoregressive": round(_paired_ratio(
                                       by[("ours_speculative", temperature)],
                                       by[("ours_autoregressive", temperature)]), 3),
                                   "hf_assisted_over_plain": round(_paired_ratio(
                                       by[("hf_assisted", temperature)], by[("hf_plain", temperature)]), 3)}
        for loop in ("speculative", "autoregressive"):   # paired: static-cache forward over transformers'
            out[f"T={temperature}"][f"static_cache_{loop}_speedup"] = round(_paired_ratio(
                by[(f"ours_{loop}", temperature)], by[(f"ours_{loop}_hf_forward", temperature)]), 3)
        ours = by[("ours_speculative", temperature)]
        if ours["model_forward_seconds"] is not None:
            # what a loop with no cost besides our forwards would reach: HF's seconds over our forward seconds
            out[f"T={temperature}"]["speculative_ceiling_over_hf_assisted"] = round(statistics.median(
                h / f for h, f in zip(by[("hf_assisted", temperature)]["seconds"], ours["model_forward_seconds"])), 3)
    return out


def _acceptance(row: dict) -> str:
    """Pooled acceptance, with the standard deviation over repeats (seeds) where it varies (T > 0)."""
    if row["acceptance_rate"] is None:
        return "-"
    per = [a for a in row.get("acceptance_per_repeat") or () if a is not None]
    spread = f" ± {statistics.stdev(per):.3f}" if row["temperature"] > 0 and len(per) > 1 else ""
    return f"{row['acceptance_rate']:.3f}{spread}"


def _forward_share(row: dict) -> str:
    if row["model_forward_seconds"] is None:
        return "-"
    return f"{statistics.median(f / s for f, s in zip(row['model_forward_seconds'], row['seconds'])):.0%}"


def print_table(result: dict) -> None:
    table = [{"loop": r["loop"], "T": r["temperature"], "γ": r["gamma"], "tokens": r["new_tokens"],
              "tok/s": f"{r['tokens_per_second']:.1f}",
              "acceptance": _acceptance(r),
              "draft/step": "-" if r["drafted_per_step"] is None else f"{r['drafted_per_step']:.2f}",
              "acc (full-γ steps)": "-" if r["full_step_acceptance"] is None else f"{r['full_step_acceptance']:.3f}",
              "in forwards": _forward_share(r)}
             for r in result["results"]]
    print(format_table(table, list(table[0])))
    for key, g in result["goals"].items():
        print(f"{key}: ours/HF speculative {g['speculative_over_hf_assisted']:.2f}x (goal >= 1.5x: "
              f"{'met' if g['speculative_goal_1.5x_met'] else 'NOT met'}), ours/HF autoregressive "
              f"{g['autoregressive_over_hf_plain']:.2f}x (goal >= 1x: "
              f"{'met' if g['autoregressive_goal_1x_met'] else 'NOT met'})")
        print(f"{key}: speculative over autoregressive: ours {g['ours_speculative_over_autoregressive']:.2f}x, HF's "
              f"{g['hf_assisted_over_plain']:.2f}x")
        print(f"{key}: static-cache forward over transformers' forward in our loop: speculative "
              f"{g['static_cache_speculative_speedup']:.2f}x, "
              f"autoregressive {g['static_cache_autoregressive_speedup']:.2f}x")
        if "speculative_ceiling_over_hf_assisted" in g:
            print(f"{key}: a loop costing only our model forwards would be "
                  f"{g['speculative_ceiling_over_hf_assisted']:.2f}x HF assisted")
