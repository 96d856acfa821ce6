"""`specsweep bench lossless`: does each lossless acceptance rule keep the target's output, in every dtype?

A rule the registry (pipeline/rules.py) calls lossless ("always") must decode exactly the target's distribution.
In exact arithmetic it does; in bfloat16 or float16 the target scores γ + 1 tokens in one forward where autoregressive
decoding scores one, the matrix shapes differ, and the logits may differ in the last bits, so a near-tie can flip (not
in the Llama family's packed static forward on a CPU up to 9 tokens a forward, whose logits are the one-token
forwards' bit for bit: pipeline/decoding/static/base.py's KEY_BLOCK, kernels/bf16_linear.cpp). This benchmark measures
that, per (rule, dtype), against the target alone (γ = 0) in the same engine
(:class:`pipeline.decoding.engine.SpeculativeEngine`) and dtype:

  greedy    T = 0, batch 1: every prompt decoded by the rule at γ and by the target alone; the rate of prompts
            whose tokens are identical token for token, and for each mismatch the first diverging position
            (0-based, in new tokens) and the two tokens there. A rule that needs T > 0 (hf) is skipped here.
  sampled   T = 1: from the first ``sample_prompts`` prompts, each cut to its first ``sample_prompt_tokens``
            tokens (by default, to the prefix whose next token the target, in the first dtype, is least sure of:
            the largest entropy, the most cells, the strongest test; a short prompt also keeps the prefill
            cheap), N continuations of ``max_new_tokens`` tokens drawn with the rule and N with
            γ = 0. Each is one row of a batch of N copies of the prompt (the rows draw disjoint random numbers
            from one generator, so they are independent samples); a rule that runs batch 1 only (hf) draws them
            with N generate calls, one generator carried from call to call. Two chi-square tests of homogeneity
            per prompt (2 x K contingency tables, cells with an expected count below 5 pooled): the first
            token's distribution, and the first two tokens' joint distribution (a continuation that ended at
            EOS has "end" as its second token). With ``max_new_tokens`` = 3 the first step drafts min(γ, 2)
            tokens, so both positions come through the verify step.

The verdict of a (rule, dtype) at level ``alpha`` (default 0.01) is Bonferroni-corrected over its tests (two per
sample prompt): "differs" when its smallest p-value is below alpha / tests. The γ = 0 reference of a dtype is
shared by its rules. The prompts: a JSONL of {"prompt"} lines or the summarisation task's {"article"} lines (the
prompt is then the article + " Summary:", as the cnn_dailymail task builds it).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from pipeline.benchmarks.engine import SYNTHETIC, SYNTHETIC_PROMPTS
from pipeline.benchmarks.timing import format_table
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.env_info import provenance
from pipeline.errors import SpecsweepError
from pipeline.io import write_json_atomic
from pipeline.models import eos_token_ids, load_causal_lm, load_tokenizer, parse_dtype, resolve_device
from pipeline.rules import RULES
from pipeline.samplers import get_sampler
from pipeline.synthetic import save_pair
from pipeline.tasks.cnn_dailymail import SUMMARY_CUE

TOY = ("models/toy/text/target", "models/toy/text/draft", "data/toy/text/test.jsonl")
MIN_EXPECTED = 5.0   # chi-square: cells with a smaller expected count are pooled
END = -1             # the "token" after a continuation that ended at EOS


@dataclass(frozen=True)
class RuleChoice:
    """A rule of the registry, with one of its presets or none (``--rules exact,sigmoid:paper``)."""

    name: str
    preset: str | None = None

    @property
    def label(self) -> str:
        return self.name if self.preset is None else f"{self.name}:{self.preset}"


def lossless_rules() -> list[RuleChoice]:
    """Every rule the registry calls lossless at any temperature, read at run time."""
    return [RuleChoice(name) for name, rule in RULES.items() if rule.lossless == "always"]


def parse_rules(text: str) -> list[RuleChoice]:
    """``name[:preset]`` comma-separated -> RuleChoices; a SpecsweepError (one line) for an unknown one."""
    choices = []
    for item in (s.strip() for s in text.split(",")):
        name, _, preset = item.partition(":")
        if name not in RULES:
            raise SpecsweepError(f"--rules: unknown rule {name!r}: choose from {', '.join(RULES)} (name or "
                                 "name:preset, comma-separated)")
        if preset and preset not in RULES[name].presets:
            raise SpecsweepError(f"--rules: rule {name} has no preset {preset!r}"
                                 f"{': it has ' + ', '.join(RULES[name].presets) if RULES[name].presets else ''}")
        choices.append(RuleChoice(name, preset or None))
    if not choices or len(set(choices)) != len(choices):
        raise SpecsweepError(f"--rules must name each rule once; got {text!r}")
    return choices


def default_dtypes(device: str) -> list[str]:
    """float32 and bfloat16; float16 too on CUDA."""
    return ["float32", "bfloat16", *(["float16"] if str(device).startswith("cuda") else [])]


def default_pair() -> tuple[str, str, str] | None:
    """The toy text pair and its test prompts when they exist here, else None (a synthetic pair is built)."""
    return TOY if all(Path(p).exists() for p in TOY) else None


def load_prompts(data: str | Path, limit: int | None = None) -> list[str]:
    """Prompts of a JSONL file: each line's "prompt", else its "article" + the summarisation cue."""

    prompts = []
    try:
        lines = Path(data).read_text(encoding="utf-8").splitlines()
        for line in lines:
            if line.strip():
                row = json.loads(line)
                prompts.append(row["prompt"] if "prompt" in row else row["article"] + SUMMARY_CUE)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SpecsweepError(f"--data {data}: not a JSONL of {{prompt}} or {{article}} lines "
                             f"({' '.join(str(e).split())[:100]})") from None
    if not prompts:
        raise SpecsweepError(f"--data {data} holds no prompts")
    return prompts[:limit] if limit else prompts


# ---------------------------------------------------------------------------------------------- statistics

def homogeneity(a: list, b: list) -> dict:
    """Chi-square test of homogeneity of two samples of categories (hashables): a 2 x K table, columns whose
    expected count is below MIN_EXPECTED in either row pooled into one (merged into the smallest column when
    the pool is still too small). p = 1 where fewer than two columns remain (nothing to tell apart)."""
    from scipy.stats import chi2_contingency

    ca, cb = Counter(a), Counter(b)
    na, nb = len(a), len(b)
    cats = sorted(set(ca) | set(cb), key=lambda c: -(ca[c] + cb[c]))
    cols = [(ca[c], cb[c]) for c in cats]
    share = min(na, nb) / (na + nb)       # expected count of a column in its smaller row: total * share
    big = [col for col in cols if sum(col) * share >= MIN_EXPECTED]
    small = [col for col in cols if sum(col) * share < MIN_EXPECTED]
    if small:
        pool = (sum(c[0] for c in small), sum(c[1] for c in small))
        if sum(pool) * share >= MIN_EXPECTED or not big:
            big.append(pool)
        else:
            i = min(range(len(big)), key=lambda j: sum(big[j]))
            big[i] = (big[i][0] + pool[0], big[i][1] + pool[1])
    top = [{"value": list(c) if isinstance(c, tuple) else c, "rule": ca[c], "target": cb[c]} for c in cats[:5]]
    out = {"categories": len(cats), "columns_tested": len(big), "top": top}
    if len(big) < 2:
        return {**out, "p_value": 1.0, "statistic": 0.0, "dof": 0}
    table = [[c[0] for c in big], [c[1] for c in big]]
    stat, p, dof, _ = chi2_contingency(table, correction=False)
    return {**out, "p_value": float(p), "statistic": float(stat), "dof": int(dof)}


def first_divergence(reference: list[int], tokens: list[int]) -> int | None:
    """The first position where two token lists differ (one ending early counts), None when identical."""
    for i, (x, y) in enumerate(zip(reference, tokens)):
        if x != y:
            return i
    return None if len(reference) == len(tokens) else min(len(reference), len(tokens))


# ---------------------------------------------------------------------------------------------- the benchmark

@dataclass
class _Pair:
    """One dtype's loaded pair and what every engine of it shares."""

    t_model: object
    d_model: object
    tok: object
    eos: list[int]
    pad: int
    device: str
    gamma: int

    def engine(self, choice: RuleChoice | None, temperature: float):
        """The rule's speculative engine at γ, or the target alone (``choice`` None: γ = 0, `exact` sampler)."""

        if choice is None:
            return SpeculativeEngine(self.t_model, None, get_sampler("exact", temperature=temperature), gamma=0,
                                     device=self.device, eos_token_ids=self.eos, pad_token_id=self.pad)
        sampler = get_sampler(choice.name, preset=choice.preset, temperature=temperature)
        return SpeculativeEngine(self.t_model, self.d_model, sampler, gamma=self.gamma, device=self.device,
                                 eos_token_ids=self.eos, pad_token_id=self.pad)


def _skip_reason(choice: RuleChoice, part: str) -> str | None:
    rule = RULES[choice.name]
    if part == "greedy" and rule.needs_sampling:
        return f"{choice.name} needs temperature > 0 (at T = 0 use greedy verification): greedy part skipped"
    return None


def _greedy(pair: _Pair, choices: list[RuleChoice], prompts: list[torch.Tensor], new_tokens: int,
            bar) -> dict[RuleChoice, dict]:
    """T = 0, batch 1: the target alone and each rule on every prompt; per rule the match rate and divergences."""
    engines = {c: pair.engine(c, 0.0) for c in choices}
    reference = pair.engine(None, 0.0)
    per_rule: dict[RuleChoice, list] = {c: [] for c in choices}
    for i, ids in enumerate(prompts):
        mask = torch.ones_like(ids)
        ref = reference.generate(ids, mask, new_tokens).tokens[0]
        bar.update(1)
        for c, engine in engines.items():
            got = engine.generate(ids, mask, new_tokens).tokens[0]
            bar.update(1)
            pos = first_divergence(ref, got)
            row = {"prompt": i, "prompt_tokens": ids.shape[1], "identical": pos is None,
                   "target_length": len(ref), "rule_length": len(got)}
            if pos is not None:
                a, b = (ref[pos] if pos < len(ref) else None), (got[pos] if pos < len(got) else None)
                row["first_divergence"] = {"position": pos, "target_token": a, "rule_token": b,
                                           "target_text": _text(pair.tok, a), "rule_text": _text(pair.tok, b)}
            per_rule[c].append(row)
    out = {}
    for c, rows in per_rule.items():
        n_same = sum(r["identical"] for r in rows)
        out[c] = {"prompts": len(rows), "identical": n_same, "match_rate": n_same / len(rows) if rows else None,
                  "max_new_tokens": new_tokens, "per_prompt": rows}
    return out


def _text(tok, token: int | None) -> str | None:
    return None if token is None else tok.convert_ids_to_tokens(int(token))


def _draw(pair: _Pair, choice: RuleChoice | None, ids: torch.Tensor, n: int, new_tokens: int, seed: int,
          one_per_call: bool) -> list[tuple[int, int]]:
    """n continuations of ``ids`` [1, L] at T = 1: (first token, second token or END) each."""
    engine = pair.engine(choice, 1.0)
    g = torch.Generator(device=pair.device).manual_seed(seed)
    if one_per_call:
        mask = torch.ones_like(ids)
        tokens = [engine.generate(ids, mask, new_tokens, g).tokens[0] for _ in range(n)]
    else:
        batch = ids.expand(n, -1).contiguous()
        tokens = engine.generate(batch, torch.ones_like(batch), new_tokens, g).tokens
    return [(t[0], t[1] if len(t) > 1 else END) for t in tokens]


@torch.inference_mode()
def _most_uncertain(model, ids: torch.Tensor) -> int:
    """The prefix length of ``ids`` [1, L] whose next token the model is least sure of (largest entropy at T = 1)."""
    logits = model(input_ids=ids).logits[0].float()                                     # [L, V]
    entropy = -(logits.softmax(-1) * logits.log_softmax(-1)).nan_to_num().sum(-1)
    return int(entropy.argmax()) + 1


def _sampled(pair: _Pair, choices: list[RuleChoice], prompts: list[torch.Tensor], *, samples: int, new_tokens: int,
             seed: int, alpha: float, bar) -> dict[RuleChoice, dict]:
    """T = 1: per prompt, N draws with each rule and N with the target alone; two homogeneity tests per prompt."""
    per_rule: dict[RuleChoice, list] = {c: [] for c in choices}
    for i, ids in enumerate(prompts):
        ref = _draw(pair, None, ids, samples, new_tokens, seed * 1000 + 10 * i, one_per_call=False)
        bar.update(1)
        for k, c in enumerate(choices, start=1):
            one = RULES[c.name].batch_one
            got = _draw(pair, c, ids, samples, new_tokens, seed * 1000 + 10 * i + k, one_per_call=one)
            bar.update(1)
            per_rule[c].append({
                "prompt": i, "prompt_tokens": ids.shape[1], "draws": "one per generate call" if one else "batched",
                "first_token": homogeneity([t[0] for t in got], [t[0] for t in ref]),
                "first_two_tokens": homogeneity(got, ref)})
    out = {}
    for c, rows in per_rule.items():
        ps = [r[key]["p_value"] for r in rows for key in ("first_token", "first_two_tokens")]
        threshold = alpha / len(ps)
        out[c] = {"samples": samples, "max_new_tokens": new_tokens, "temperature": 1.0, "alpha": alpha,
                  "tests": len(ps), "threshold": threshold, "min_p_value": min(ps),
                  "verdict": "differs" if min(ps) < threshold else "same", "per_prompt": rows}
    return out


def run(*, target: str | None = None, draft: str | None = None, data: str | None = None,
        rules: list[RuleChoice] | None = None, dtypes=("float32",), gamma: int = 4, greedy_tokens: int = 32,
        limit: int | None = None, samples: int = 400, max_new_tokens: int = 3, sample_prompts: int = 1,
        sample_prompt_tokens: int | None = None, seed: int = 0, alpha: float = 0.01, ignore_eos: bool = False,
        device: str = "cpu", out: Path | None = None, progress: bool = True) -> dict:
    """Both checks for every (rule, dtype); without ``target``, on a synthetic pair (that of `bench engine`).
    Returns the results JSON, also written to ``out`` when given."""
    import tempfile


    choices = list(rules) if rules is not None else lossless_rules()
    for name in dtypes:
        resolve_device(device, parse_dtype(name))       # refuses a dtype this CPU cannot run, before any work
    tmp = None
    if target is None:
        tmp = tempfile.TemporaryDirectory()
        target, draft = (str(p) for p in save_pair(Path(tmp.name), **SYNTHETIC))
    try:
        texts = load_prompts(data, limit) if data is not None else SYNTHETIC_PROMPTS[:limit]
        tok = load_tokenizer(target)
        prompts = [tok(p, return_tensors="pt").input_ids.to(device) for p in texts]
        short = None
        skipped = [{"rule": c.label, "part": "greedy", "reason": r} for c in choices
                   if (r := _skip_reason(c, "greedy"))]
        greedy_choices = [c for c in choices if _skip_reason(c, "greedy") is None]
        results = []
        n_short = min(sample_prompts, len(prompts))
        units = len(dtypes) * (len(prompts) * (1 + len(greedy_choices)) + n_short * (1 + len(choices)))
        with tqdm(total=units, desc="bench lossless", unit="decode", disable=not progress) as bar:
            for name in dtypes:
                dtype = parse_dtype(name)
                t_model = load_causal_lm(target, dtype, device)
                d_model = load_causal_lm(draft, dtype, device)
                eos = [] if ignore_eos else eos_token_ids(t_model, tok)
                pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else 0)
                pair = _Pair(t_model, d_model, tok, eos, pad, device, gamma)
                if short is None:      # the same prompts for every dtype
                    short = [ids[:, :sample_prompt_tokens or _most_uncertain(t_model, ids)]
                             for ids in prompts[:n_short]]
                bar.set_postfix_str(f"{name} greedy")
                greedy = _greedy(pair, greedy_choices, prompts, greedy_tokens, bar)
                bar.set_postfix_str(f"{name} sampled")
                sampled = _sampled(pair, choices, short, samples=samples, new_tokens=max_new_tokens, seed=seed,
                                   alpha=alpha, bar=bar)
                for c in choices:
                    results.append({"rule": c.name, "preset": c.preset, "label": c.label,
                                    "lossless": RULES[c.name].lossless, "dtype": name, "greedy": greedy.get(c),
                                    "greedy_skipped": _skip_reason(c, "greedy"), "sampled": sampled[c]})
    finally:
        if tmp is not None:
            tmp.cleanup()
    result = {"benchmark": "lossless", "provenance": provenance(device),
              "settings": {"target": target if tmp is None else f"synthetic {SYNTHETIC}",
                           "draft": draft if tmp is None else "synthetic", "data": data,
                           "rules": [c.label for c in choices], "dtypes": list(dtypes), "gamma": gamma,
                           "greedy": {"temperature": 0.0, "prompts": len(prompts), "max_new_tokens": greedy_tokens,
                                      "batch": 1},
                           "sampled": {"temperature": 1.0, "samples": samples, "max_new_tokens": max_new_tokens,
                                       "prompts": len(short), "prompt_tokens": [ids.shape[1] for ids in short],
                                       "prompt_cut": "given" if sample_prompt_tokens else
                                       "auto: the prefix of largest next-token entropy under the target, in "
                                       f"{dtypes[0]}",
                                       "prompt_text": [tok.decode(ids[0]) for ids in short], "seed": seed,
                                       "alpha": alpha, "correction": "Bonferroni over a row's tests",
                                       "min_expected": MIN_EXPECTED},
                           "ignore_eos": ignore_eos, "reference": "the target alone (γ = 0), same engine and dtype"},
              "skipped": skipped, "results": results}
    if out is not None:
        write_json_atomic(out, result)
    return result


# ---------------------------------------------------------------------------------------------- the table

def divergences(greedy: dict | None, most: int = 3) -> str:
    """'p3@5 (x→y), p7@0 (a→b) +2 more': prompt, first diverging position and the tokens there (target → rule)."""
    if not greedy:
        return "-"
    rows = [r for r in greedy["per_prompt"] if not r["identical"]]
    if not rows:
        return "none"
    parts = []
    for r in rows[:most]:
        d = r["first_divergence"]
        parts.append(f"p{r['prompt']}@{d['position']} ({d['target_text'] or 'end'}→{d['rule_text'] or 'end'})")
    return ", ".join(parts) + (f" +{len(rows) - most} more" if len(rows) > most else "")


def table_rows(result: dict) -> list[dict]:
    rows = []
    for r in result["results"]:
        g, s = r["greedy"], r["sampled"]
        p1 = ", ".join(f"{p['first_token']['p_value']:.3g}" for p in s["per_prompt"])
        p2 = ", ".join(f"{p['first_two_tokens']['p_value']:.3g}" for p in s["per_prompt"])
        rows.append({"rule": r["label"], "lossless": r["lossless"], "dtype": r["dtype"],
                     "greedy match": "skipped (T > 0 only)" if g is None else
                     f"{g['match_rate']:.0%} ({g['identical']}/{g['prompts']})",
                     "first divergences (prompt@position)": divergences(g),
                     "p first token": p1, "p first two": p2,
                     f"verdict (α {s['alpha']:g})": s["verdict"]})
    return rows


def print_table(result: dict) -> None:
    rows = table_rows(result)
    print(format_table(rows, list(rows[0])))
    s = result["settings"]
    print(f"greedy: T = 0, {s['greedy']['prompts']} prompts x up to {s['greedy']['max_new_tokens']} tokens, batch 1, "
          f"against γ = 0; sampled: T = 1, {s['sampled']['samples']} draws x {s['sampled']['max_new_tokens']} tokens "
          f"per rule and per reference from {s['sampled']['prompts']} prompt(s) of "
          f"{', '.join(map(str, s['sampled']['prompt_tokens']))} token(s) "
          f"({', '.join(repr(t) for t in s['sampled']['prompt_text'])}), chi-square homogeneity, Bonferroni over "
          "each row's tests")
    for skip in result["skipped"]:
        print(f"skipped: {skip['reason']}")
