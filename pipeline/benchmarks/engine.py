"""`specsweep bench engine`: our decoding loop against Hugging Face's, side by side in one process.

Seven loops over the same models (one dtype: ``--dtype``, ``auto`` resolved as `specsweep run` resolves it),
prompts and temperature, each prompt decoded alone (HF's assisted generation is batch 1) for exactly
``max_new_tokens`` tokens: EOS and the pad token are masked out of the logits in every loop (HF's min_new_tokens and
suppress_tokens, our suppress_tokens), so lengths are equal and all loops sample one distribution:

  ours_speculative     SpeculativeEngine, `exact` sampler, with the drafter `specsweep run` builds for the same
                       settings (pipeline/stack.py): γ, or an adaptive draft length from γ (--draft-schedule,
                       --draft-confidence, --gamma-max), the draft's head cut to K tokens (--draft-vocab K), and
                       its weights quantised (--draft-quant: this loop only)
  hf_assisted          target.generate(assistant_model=draft), constant schedule of γ draft tokens, no confidence
                       threshold (set on the draft's generation config, where transformers reads it), HF's own
                       verify step, the draft's whole head
  hf_assisted_default  target.generate(assistant_model=draft) out of the box: the draft's generation config
                       untouched, so transformers drafts with its own defaults (num_assistant_tokens, its schedule,
                       assistant_confidence_threshold, recorded as the installed version resolves them:
                       pipeline/decoding/hf_engine.py ``assistant_defaults``)
  ours_autoregressive  SpeculativeEngine with γ = 0
  hf_plain             target.generate()
  ours_speculative_hf_forward, ours_autoregressive_hf_forward
                       our two loops with transformers' forward and DynamicCache instead of the static-cache
                       forward (pipeline/decoding/static/): what the static cache buys (same tokens; with
                       --draft-quant the draft keeps its own weights here, so the speculative pair differs in that
                       too and emits the same tokens at T = 0 only)

"At equal γ" compares ours_speculative with hf_assisted; it holds when our draft length is constant (the JSON's
``equal_gamma``): with an adaptive one, γ is only where each of our steps starts. The prompts are the task's
(``--task prompts`` or ``cnn_dailymail`` from ``--data``, ``--chat-template``, ``--max-prompt-tokens``, ``--limit``),
built by the task's own encoder as `specsweep run` builds them (pipeline/benchmarks/prompts.py); without ``--data``,
the built-in prompts below.

Tokens/s is total new tokens over total seconds; the loops are interleaved and repeated, and the median of
the repeats is reported. The goals use paired ratios: within each repeat, ours over HF's, then the median over
repeats with its order-statistic interval (pipeline/measure.py; a load change between repeats cancels out of each
ratio). At T = 0 both speculative loops must emit
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

import dataclasses
import json
import statistics
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from tqdm import tqdm
from transformers.utils import is_sklearn_available

from pipeline.benchmarks.prompts import prompts_of
from pipeline.benchmarks.timing import format_table
from pipeline.config import LOOKUP_DRAFTERS, RunConfig
from pipeline.decoding.draft_policy import DraftPolicy
from pipeline.decoding.drafters.cross_tokenizer import build_bridge, same_vocabulary
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.decoding.hf_engine import (
    assistant_config,
    assistant_defaults,
    assistant_schedule,
    forward_timing,
    hf_verify_step,
)
from pipeline.decoding.timing import PhaseTimer
from pipeline.dtypes import AUTO
from pipeline.env_info import provenance
from pipeline.errors import SpecsweepError
from pipeline.io import write_json_atomic
from pipeline.measure import median_ci
from pipeline.models import auto_dtype, load_causal_lm, load_tokenizer, parse_dtype, resolve_device
from pipeline.samplers import get_sampler
from pipeline.stack import build_drafter
from pipeline.synthetic import save_pair
from pipeline.tasks.text import check_chat_template

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


def run(config: RunConfig, *, repeats: int = 3, temperatures=(0.0, 1.0), out: Path | None = None) -> dict:
    """Time the loops at each temperature with ``config``'s models (``target`` None: a synthetic pair), prompts
    (``data`` None: the built-in ones), dtype and our loop's draft settings, on ``config.device`` (resolved);
    returns the results JSON, also written to ``out`` when given."""
    with tempfile.TemporaryDirectory() as tmp:
        given = config
        if config.target is None:
            target, draft = (str(p) for p in save_pair(Path(tmp), **SYNTHETIC))
            config = dataclasses.replace(config, target=target, draft=draft)
        if config.data is None:
            path = Path(tmp) / "prompts.jsonl"
            path.write_text("".join(json.dumps({"id": f"s{i}", "prompt": p}) + "\n"
                                    for i, p in enumerate(SYNTHETIC_PROMPTS)))
            config = dataclasses.replace(config, data=str(path), task="prompts")
        used, why = resolve_bench_dtype(config)
        config = dataclasses.replace(config, dtype=used)
        bench = _Bench.load(config)
        if bench.bridge is not None:    # transformers' string-level drafting samples only at T = 0 (docstring)
            temperatures = tuple(t for t in temperatures if t == 0.0)
            if not temperatures:
                raise SpecsweepError("a draft with another tokenizer is compared at T = 0 only: add 0 to "
                                     "--temperature")
        loops = _loops(config.gamma, bench.hf_default["num_assistant_tokens"])
        rows = []
        for temperature in temperatures:
            runs = _time_loops(bench, loops, temperature, repeats)
            by_loop = {name: _row(name, gam, temperature, runs[name], bench) for name, (_, gam) in loops.items()}
            _check_identical(by_loop, runs, temperature)
            rows.extend(by_loop.values())
    result = {"benchmark": "engine", "provenance": provenance(config.device),
              "settings": _settings(given, bench, repeats, why), "results": rows,
              "goals": _goals(rows, equal_gamma=bench.equal_gamma)}
    if out is not None:
        write_json_atomic(out, result)
    return result


def resolve_bench_dtype(config: RunConfig) -> tuple[str, str | None]:
    """(the dtype both loops' models load in, why auto chose it or None): ``config.dtype``, ``auto`` resolved for
    its target as `specsweep run` resolves it; a dtype this CPU cannot run is a one-line SpecsweepError."""
    used, why = auto_dtype(config.target, config.device) if config.dtype == AUTO else (config.dtype, None)
    resolve_device(config.device, parse_dtype(used))
    return used, why


def _settings(given: RunConfig, bench: _Bench, repeats: int, dtype_choice: str | None) -> dict:
    """The JSON's settings: what was asked (``given``: None target or data for the built-in ones) and what ran."""
    config = bench.config
    return {"target": given.target or f"synthetic {SYNTHETIC}", "draft": given.draft or "synthetic",
            "gamma": config.gamma, "max_new_tokens": config.max_new_tokens, "repeats": repeats,
            "dtype": config.dtype, "dtype_choice": dtype_choice, "batch": 1,
            "prompts": {"task": config.task, "data": given.data or "built-in synthetic prompts",
                        "chat_template": config.chat_template, "max_prompt_tokens": config.max_prompt_tokens,
                        "limit": config.limit, "subset_seed": config.seed if config.limit else None},
            "ours": {"drafter": config.drafter, "gamma": config.gamma, "draft_schedule": config.draft_schedule,
                     **({"lookup_min": config.lookup_min, "lookup_max": config.lookup_max}
                        if config.drafter in LOOKUP_DRAFTERS else {}),
                     "draft_confidence": config.draft_confidence, "gamma_max": config.gamma_max,
                     "draft_vocab": config.draft_vocab, "draft_quant": config.draft_quant},
            "equal_gamma": bench.equal_gamma,
            "hf_assisted": {"num_assistant_tokens": config.gamma, "num_assistant_tokens_schedule": "constant",
                            "assistant_confidence_threshold": 0.0},
            "hf_assisted_default": {**bench.hf_default,
                                    "source": f"transformers {transformers.__version__}: the draft's generation "
                                              "config, its unset fields filled from GenerationConfig's defaults",
                                    # transformers tunes a confidence threshold during each call where scikit-learn
                                    # is installed (its ROC rule), else keeps it fixed
                                    "threshold_tuned": bool(bench.hf_default["assistant_confidence_threshold"])
                                    and is_sklearn_available()},
            "masked_tokens": (f"EOS {bench.eos}, pad {bench.tok.pad_token_id}" if bench.masked else
                              "none, and no loop stops at EOS") + ": every loop emits max_new_tokens",
            "draft_tokenizer": "shared" if bench.bridge is None else
            "another: ours in string mode, HF's Universal Assisted Generation; T = 0 only"}


@dataclass
class _Bench:
    """What every loop decodes: the settings of our loop (``config``: a RunConfig, its target and draft the folders
    loaded), the target and draft, the tokenizer, the tokenized prompts (and their texts), the ids masked in every
    loop (``eos``: the target's EOS ids; ``masked``: those and the pad id), and HF's out-of-the-box draft schedule
    (``hf_default``). ``bridge``: a VocabBridge where the draft has another tokenizer (``d_tok``), else None."""

    config: RunConfig
    t_model: object
    d_model: object
    tok: object
    prompts: list
    eos: list[int]
    masked: list[int]
    pad: int
    texts: list[str]
    hf_default: dict
    d_tok: object = None
    bridge: object = None

    @property
    def device(self) -> str:
        return self.config.device

    @property
    def max_new_tokens(self) -> int:
        return self.config.max_new_tokens

    @property
    def cpu(self) -> bool:
        """Whether the loops run on CPU, the only device where model forwards are timed."""
        return torch.device(self.device).type == "cpu"

    @property
    def equal_gamma(self) -> bool:
        """Whether our loop drafts as HF's assisted loop does: the draft model, a constant γ (no adaptive draft
        length, no other drafter); only then is ours against HF's assisted loop a comparison of loops."""
        return DraftPolicy.of(self.config) is None and self.config.drafter == "model"

    @classmethod
    def load(cls, config: RunConfig) -> _Bench:
        """Load the tokenizer and both models (in ``config.dtype`` on ``config.device``) and encode the prompts of
        ``config.data`` as `specsweep run` does."""
        device = config.device
        tok, d_tok = load_tokenizer(config.target), load_tokenizer(config.draft)
        if config.chat_template:        # before the models load: a bad flag costs no load
            check_chat_template(tok)
        dtype = parse_dtype(config.dtype)
        t_model = load_causal_lm(config.target, dtype, device)
        d_model = load_causal_lm(config.draft, dtype, device)
        if tok.pad_token_id is None:    # as `specsweep run` loads the pair (pipeline/stack.py)
            tok.pad_token = tok.eos_token or tok.unk_token
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        # HF's min_new_tokens = max_new_tokens masks EOS in target and draft logits until the end. The pad token is
        # masked in both loops too: a pad id inside the generated text makes HF's assistant propose tokens that
        # are not the draft's (checked against fresh draft forwards), which lowered HF's acceptance on the
        # synthetic pair, whose random models emit the pad token. Ours is given the same ids to suppress, so
        # both loops decode one distribution (and the same tokens at T = 0).
        eos = t_model.generation_config.eos_token_id
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        masked = sorted(set(eos) | ({tok.pad_token_id} if tok.pad_token_id is not None else set()))
        encoded = prompts_of(config, t_model, tok)
        prompts = [p["input_ids"].to(device) for p in encoded]
        texts = [p["prompt_texts"][0] for p in encoded]
        bridge = None if same_vocabulary(tok, d_tok) else build_bridge(
            tok, d_tok, t_model.get_output_embeddings().weight.shape[0],
            d_model.get_output_embeddings().weight.shape[0], device)
        if bridge is not None:
            # Our draft with another tokenizer masks nothing (its logits are in another vocabulary): no loop masks,
            # and none stops at EOS, so every loop still emits max_new_tokens, EOS ids included as plain tokens.
            masked = []
        return cls(config, t_model, d_model, tok, prompts, eos, masked, pad, texts, assistant_defaults(d_model),
                   d_tok, bridge)


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
    with the drafter and draft length `specsweep run` builds for the bench's settings at γ ``gam``, on the
    static-cache forward unless ``static`` is False. Returns the tokens of each prompt, accepted, drafted and verify
    steps summed over prompts, the accepted-count histogram of full steps (None at ``gam`` = 0) and the seconds in
    model forwards (None off CPU)."""

    sampler = get_sampler("exact", temperature=temperature)
    config = dataclasses.replace(bench.config, gamma=gam, temperature=temperature, static_cache=static)
    drafter = build_drafter(config, sampler, bench.t_model, bench.d_model, bench.tok, bench.device)
    engine = SpeculativeEngine(bench.t_model, drafter, sampler, gamma=gam, device=bench.device,
                               eos_token_ids=[], pad_token_id=bench.pad, suppress_tokens=bench.masked,
                               static_cache=static, draft_policy=DraftPolicy.of(config),
                               draft_quant=config.draft_quant if static else "none")
    g = torch.Generator(device=bench.device).manual_seed(seed)
    # engine.gamma: the most a step drafts (γ, or --gamma-max with an adaptive draft length)
    decoded = {"tokens": [], "accepted": 0, "drafted": 0, "steps": 0,
               "hist": [0] * (engine.gamma + 1) if gam else None}
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


def _hf(bench: _Bench, gam: int, temperature: float, seed: int, out_of_the_box: bool = False) -> dict:
    """One pass of Hugging Face's loop over every prompt: ``target.generate``, assisted by the draft when ``gam`` >
    0, with a constant schedule of ``gam`` tokens, or with ``out_of_the_box`` the draft's generation config as it is
    (transformers' own schedule; ``gam`` is then its num_assistant_tokens, the most a step drafts). Returns the same
    keys as :func:`_ours`; at T = 0 HF's assisted loop never calls the verify step, so its accepted and drafted
    counts come from the emitted tokens and the draft forwards (and there is no histogram)."""
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
        if gam:         # out of the box: nothing set, and what transformers writes back is undone after the pass
            stack.enter_context(assistant_config(bench.d_model, {}) if out_of_the_box else
                                assistant_schedule(bench.d_model, gam))
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


def _hf_default(bench: _Bench, gam: int, temperature: float, seed: int) -> dict:
    """:func:`_hf` assisted by the draft out of the box (transformers' own draft schedule)."""
    return _hf(bench, gam, temperature, seed, out_of_the_box=True)


def _loops(gamma: int, default_gamma: int) -> dict:
    """The seven loops, by name: each its pass function (:func:`_ours`, :func:`_hf`, :func:`_hf_default`,
    :func:`_ours_hf_forward`) and its γ (``gamma`` for the speculative loops, ``default_gamma`` (transformers'
    num_assistant_tokens) for HF's out-of-the-box one, 0 for the autoregressive ones)."""
    return {"ours_speculative": (_ours, gamma), "hf_assisted": (_hf, gamma),
            "hf_assisted_default": (_hf_default, default_gamma),
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
            # steps that drafted the full γ (the last steps of a prompt draft fewer; with an adaptive draft length,
            # the most a step drafts): how often k = 0..γ drafts were accepted, and accepted/drafted over those
            # steps alone
            **_full_steps([r["hist"] for r in reps]),
            "model_forward_seconds": fwd if bench.cpu else None}


def _check_identical(by_loop: dict[str, dict], runs: dict[str, list[dict]], temperature: float) -> None:
    """Add to the rows ``by_loop`` (one temperature's, by loop name) whether our loops' first repeat emitted the
    same tokens as on transformers' forward (``identical_to_hf_forward``, every temperature) and, at T = 0, as
    HF's matching loop (``identical_to_hf_assisted``, ``identical_to_hf_plain``; HF's out-of-the-box loop against
    its plain one too)."""
    for name, other in (("ours_speculative", "hf_assisted"), ("ours_autoregressive", "hf_plain")):
        # the static-cache forward emits the same tokens as transformers' forward, at every temperature
        by_loop[name]["identical_to_hf_forward"] = runs[name][0]["tokens"] == \
            runs[f"{name}_hf_forward"][0]["tokens"]
        if temperature == 0.0:
            by_loop[name][f"identical_to_{other}"] = runs[name][0]["tokens"] == runs[other][0]["tokens"]
    if temperature == 0.0:      # HF's out-of-the-box assisted loop against its own plain loop
        by_loop["hf_assisted_default"]["identical_to_hf_plain"] = \
            runs["hf_assisted_default"][0]["tokens"] == runs["hf_plain"][0]["tokens"]


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


def _full_steps(hists: list) -> dict:
    """The accepted-count histograms of one loop's passes (each [γ + 1] over its full-γ steps; None for a loop
    without one) summed, and the acceptance over those steps alone."""
    if not hists or any(h is None for h in hists):
        return {"full_step_histogram": None, "full_step_acceptance": None}
    total = [sum(col) for col in zip(*hists)]
    steps, gamma = sum(total), len(total) - 1
    return {"full_step_histogram": total,
            "full_step_acceptance": sum(k * n for k, n in enumerate(total)) / (gamma * steps) if steps else None}


def _paired_ratio(ours: dict, theirs: dict) -> float:
    """Median over repeats of (our tokens/s) / (their tokens/s) within the same repeat: the two loops ran back to
    back, so a change in machine load between repeats cancels out of each ratio."""
    return _paired_interval(ours, theirs).median


def _paired_interval(ours: dict, theirs: dict):
    """:func:`_paired_ratio` with its order-statistic interval (pipeline.measure.MedianCI); every loop emits the
    same number of tokens per repeat, so the ratio of tokens/s is their seconds over ours."""
    return median_ci([theirs_s / ours_s for ours_s, theirs_s in zip(ours["seconds"], theirs["seconds"])])


RATIOS = {
    "speculative_over_hf_assisted": ("ours_speculative", "hf_assisted"),
    "speculative_over_hf_assisted_default": ("ours_speculative", "hf_assisted_default"),
    "autoregressive_over_hf_plain": ("ours_autoregressive", "hf_plain"),
    # what speculation buys inside each engine (paired, same repeats)
    "ours_speculative_over_autoregressive": ("ours_speculative", "ours_autoregressive"),
    "hf_assisted_over_plain": ("hf_assisted", "hf_plain"),
    "hf_assisted_default_over_plain": ("hf_assisted_default", "hf_plain"),
    # paired: static-cache forward over transformers'
    "static_cache_speculative_speedup": ("ours_speculative", "ours_speculative_hf_forward"),
    "static_cache_autoregressive_speedup": ("ours_autoregressive", "ours_autoregressive_hf_forward"),
}
"""The paired ratios the goals report, by name: (the loop whose tokens/s is the numerator, the denominator's)."""


def _goals(rows: list[dict], equal_gamma: bool = True) -> dict:
    """Per temperature, each ratio of :data:`RATIOS` whose loops ran (its median, rounded; ``intervals``: median,
    interval and coverage) and the goals: ours at least HF's assisted loop at equal γ (None when our draft length
    is adaptive: ``equal_gamma`` False), ours >= 1.5x it (the earlier goal), ours >= 1.5x HF's out-of-the-box
    assisted loop, our autoregressive loop at least HF's plain one."""
    by = {(r["loop"], r["temperature"]): r for r in rows}
    out = {}
    for temperature in sorted({r["temperature"] for r in rows}):
        goal: dict = {"intervals": {}}
        for name, (a, b) in RATIOS.items():
            if (a, temperature) in by and (b, temperature) in by:
                ci = _paired_interval(by[(a, temperature)], by[(b, temperature)])
                goal[name] = round(ci.median, 3)
                goal["intervals"][name] = ci.to_dict()
        spec, default = goal["speculative_over_hf_assisted"], goal.get("speculative_over_hf_assisted_default")
        goal["speculative_at_least_hf_assisted_met"] = spec >= 1.0 if equal_gamma else None
        goal["speculative_goal_1.5x_met"] = spec >= 1.5
        goal["speculative_over_hf_default_goal_1.5x_met"] = default >= 1.5 if default is not None else None
        goal["autoregressive_goal_1x_met"] = goal["autoregressive_over_hf_plain"] >= 1.0
        ours = by[("ours_speculative", temperature)]
        if ours["model_forward_seconds"] is not None:
            # what a loop with no cost besides our forwards would reach: HF's seconds over our forward seconds
            goal["speculative_ceiling_over_hf_assisted"] = round(statistics.median(
                h / f for h, f in zip(by[("hf_assisted", temperature)]["seconds"], ours["model_forward_seconds"])), 3)
        out[f"T={temperature}"] = goal
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


def describe_ours(ours: dict) -> str:
    """Our loop's draft settings (the JSON's ``settings.ours``) in words: "γ 4", "heuristic from γ 4, at most 8
    per step, confidence 0.4, head cut to 32768 tokens"."""
    parts = [f"heuristic from γ {ours['gamma']}" if ours["draft_schedule"] == "heuristic" else f"γ {ours['gamma']}"]
    if ours.get("drafter", "model") != "model":      # files written before --drafter: the draft model
        parts.insert(0, ours["drafter"])
    if ours.get("drafter") in LOOKUP_DRAFTERS and "lookup_min" in ours:  # files before --lookup-min: n-grams 1-3
        parts.append(f"n-grams of {ours['lookup_min']}-{ours['lookup_max']} tokens")
    if ours["draft_confidence"]:
        parts.append(f"confidence {ours['draft_confidence']:g}")
    if ours["gamma_max"] is not None and ours["gamma_max"] != ours["gamma"]:
        parts.append(f"at most {ours['gamma_max']} per step")
    if ours["draft_vocab"] is not None:
        parts.append(f"head cut to {ours['draft_vocab']} tokens")
    if ours.get("draft_quant", "none") != "none":                  # results written before --draft-quant lack it
        parts.append(f"draft weights in {ours['draft_quant']}")
    return ", ".join(parts)


def _ratio_text(goal: dict, name: str) -> str:
    ci = goal["intervals"][name]
    return (f"{ci['median']:.2f}x [{ci['ci_low']:.2f}, {ci['ci_high']:.2f}] ({ci['ci_coverage']:.0%} interval, "
            f"{ci['n']} repeats)")


def _met(value: bool | None) -> str:
    return "met" if value else "NOT met"


def print_table(result: dict) -> None:
    table = [{"loop": r["loop"], "T": r["temperature"], "γ": r["gamma"], "tokens": r["new_tokens"],
              "tok/s": f"{r['tokens_per_second']:.1f}",
              "acceptance": _acceptance(r),
              "draft/step": "-" if r["drafted_per_step"] is None else f"{r['drafted_per_step']:.2f}",
              "acc (full-γ steps)": "-" if r["full_step_acceptance"] is None else f"{r['full_step_acceptance']:.3f}",
              "in forwards": _forward_share(r)}
             for r in result["results"]]
    print(format_table(table, list(table[0])))
    s = result["settings"]
    ours, default = describe_ours(s["ours"]), s["hf_assisted_default"]
    chat = " in the chat template" if s["prompts"]["chat_template"] else ""
    print(f"{s['dtype']}, {s['prompts']['task']} task{chat}; ours: {ours}; HF out of the box: "
          f"{default['num_assistant_tokens']} tokens, {default['num_assistant_tokens_schedule']} schedule, "
          f"confidence {default['assistant_confidence_threshold']}")
    for key, g in result["goals"].items():
        if s["equal_gamma"]:
            print(f"{key}: ours/HF assisted at equal γ {s['gamma']}: {_ratio_text(g, 'speculative_over_hf_assisted')}"
                  f"; goal >= 1x: {_met(g['speculative_at_least_hf_assisted_met'])}, >= 1.5x: "
                  f"{_met(g['speculative_goal_1.5x_met'])}")
        else:
            print(f"{key}: ours ({ours}) / HF assisted at constant γ {s['gamma']} (not equal γ: no goal): "
                  f"{_ratio_text(g, 'speculative_over_hf_assisted')}")
        print(f"{key}: ours ({ours}) / HF assisted out of the box: "
              f"{_ratio_text(g, 'speculative_over_hf_assisted_default')}; goal >= 1.5x: "
              f"{_met(g['speculative_over_hf_default_goal_1.5x_met'])}")
        print(f"{key}: ours/HF autoregressive {_ratio_text(g, 'autoregressive_over_hf_plain')}; goal >= 1x: "
              f"{_met(g['autoregressive_goal_1x_met'])}")
        print(f"{key}: speculative over autoregressive: ours {g['ours_speculative_over_autoregressive']:.2f}x, HF's "
              f"{g['hf_assisted_over_plain']:.2f}x at γ {s['gamma']}, "
              f"{g['hf_assisted_default_over_plain']:.2f}x out of the box")
        print(f"{key}: static-cache forward over transformers' forward in our loop: speculative "
              f"{g['static_cache_speculative_speedup']:.2f}x, "
              f"autoregressive {g['static_cache_autoregressive_speedup']:.2f}x")
        if "speculative_ceiling_over_hf_assisted" in g:
            print(f"{key}: a loop costing only our model forwards would be "
                  f"{g['speculative_ceiling_over_hf_assisted']:.2f}x HF assisted")
