"""`specsweep bench block`: how many more draft tokens block verification accepts than token-wise `exact`.

For each γ, the real speculative loop (:class:`pipeline.decoding.engine.SpeculativeEngine`, batch 1) decodes every
prompt
twice, once verifying with `exact` and once with `block`, from the same generator seed (seed + prompt index), so
the first step of both sees the same drafts and uniforms. The measure is accepted draft tokens per verify step
over the steps that drafted the full γ (the engine's accepted histogram; a prompt's last steps may draft fewer),
per prompt. Both rules are lossless, so both decode the target's distribution: the difference is acceptance
alone. Paired over prompts: per prompt block minus exact, its mean with a 95 % t interval. Also recorded:
emitted tokens per verify step (all steps) and the seconds spent in the verify step.

Prompts: a JSONL of {"prompt"} lines, or the summarisation task's {"article"} lines (the prompt is then the
article + " Summary:", as the cnn_dailymail task builds it). Generation stops at EOS as in a run (``ignore_eos``:
every prompt decodes ``steps`` new tokens).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import torch
from tqdm import tqdm

from pipeline.benchmarks.timing import format_table
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.env_info import provenance
from pipeline.io import atomic_file, write_json_atomic
from pipeline.models import eos_token_ids, load_causal_lm, load_tokenizer
from pipeline.samplers import get_sampler
from pipeline.tasks.cnn_dailymail import SUMMARY_CUE

GAMMAS = (2, 3, 4, 5, 6, 8)
RULES = ("exact", "block")


def load_prompts(data: str | Path, limit: int | None = None) -> list[str]:
    """Prompts of a JSONL file: each line's "prompt", else its "article" + the summarisation cue."""

    prompts = []
    for line in Path(data).read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            prompts.append(row["prompt"] if "prompt" in row else row["article"] + SUMMARY_CUE)
    return prompts[:limit] if limit else prompts


def _mean_interval(values: list[float]) -> dict:
    """Mean, standard error and 95 % t interval of ``values`` (None where fewer than two)."""
    n = len(values)
    if n < 2:
        return {"n": n, "mean": values[0] if values else None, "se": None, "ci95": None}
    from scipy import stats

    mean, se = statistics.fmean(values), statistics.stdev(values) / math.sqrt(n)
    half = float(stats.t.ppf(0.975, n - 1)) * se
    return {"n": n, "mean": mean, "se": se, "ci95": [mean - half, mean + half]}


def _decode(engine, ids: torch.Tensor, steps: int, seed: int, device: str) -> dict:
    """One prompt through ``engine``: accepted tokens and steps over full-γ steps, all steps, verify seconds."""
    g = torch.Generator(device=device).manual_seed(seed)
    r = engine.generate(ids, torch.ones_like(ids), steps, g)
    hist = r.extra["accepted_histogram"]
    return {"full_steps": sum(hist), "full_accepted": sum(k * n for k, n in enumerate(hist)),
            "steps": r.verify_steps, "new_tokens": r.row_stats[0]["new_tokens"],
            "verify_seconds": r.phase_time_s.get("verify", 0.0)}


def _summary(gamma: int, per_rule: dict[str, list[dict]]) -> dict:
    """The results row of one γ from each rule's per-prompt decodes."""
    row: dict = {"gamma": gamma}
    per_prompt = {}
    for rule, decodes in per_rule.items():
        per_prompt[rule] = [d["full_accepted"] / d["full_steps"] if d["full_steps"] else None for d in decodes]
        full_steps = sum(d["full_steps"] for d in decodes)
        steps = sum(d["steps"] for d in decodes)
        row[rule] = {
            # pooled over every full-γ step of every prompt
            "accepted_per_step": sum(d["full_accepted"] for d in decodes) / full_steps if full_steps else None,
            "per_prompt": _mean_interval([v for v in per_prompt[rule] if v is not None]),
            "tokens_per_step": sum(d["new_tokens"] for d in decodes) / steps if steps else None,
            "full_steps": full_steps, "steps": steps,
            "verify_ms_per_step": 1e3 * sum(d["verify_seconds"] for d in decodes) / steps if steps else None,
        }
    pairs = [(b, e) for b, e in zip(per_prompt["block"], per_prompt["exact"]) if b is not None and e is not None]
    row["difference"] = _mean_interval([b - e for b, e in pairs])   # block - exact, paired over prompts
    pooled = row["block"]["accepted_per_step"], row["exact"]["accepted_per_step"]
    row["relative_gain"] = pooled[0] / pooled[1] - 1 if None not in pooled and pooled[1] > 0 else None
    row["per_prompt_accepted_per_step"] = per_prompt
    return row


def run(target: str, draft: str, data: str, *, gammas=GAMMAS, steps: int = 64, seed: int = 0,
        out: Path | None = None, temperature: float = 1.0, limit: int | None = None, device: str = "cpu",
        ignore_eos: bool = False, progress: bool = True) -> dict:
    """Decode every prompt of ``data`` with `exact` and with `block` at each γ in ``gammas`` (``steps``: the most
    new tokens per prompt); returns the results JSON, also written to ``out`` (and its figure beside it, .png)."""

    tok = load_tokenizer(target)
    t_model = load_causal_lm(target, torch.float32, device)
    d_model = load_causal_lm(draft, torch.float32, device)
    eos = [] if ignore_eos else eos_token_ids(t_model, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else 0)
    prompts = [tok(p, return_tensors="pt").input_ids.to(device) for p in load_prompts(data, limit)]
    rows = []
    for gamma in gammas:
        engines = {rule: SpeculativeEngine(t_model, d_model, get_sampler(rule, temperature=temperature), gamma=gamma,
                                           device=device, eos_token_ids=eos, pad_token_id=pad) for rule in RULES}
        per_rule: dict[str, list[dict]] = {rule: [] for rule in RULES}
        for i, ids in enumerate(tqdm(prompts, desc=f"bench block γ={gamma}", unit="prompt", disable=not progress)):
            for rule in RULES:
                per_rule[rule].append(_decode(engines[rule], ids, steps, seed + i, device))
        rows.append(_summary(gamma, per_rule))
    result = {"benchmark": "block_gain", "provenance": provenance(device),
              "settings": {"target": target, "draft": draft, "data": data, "prompts": len(prompts),
                           "gammas": list(gammas), "max_new_tokens": steps, "seed": seed,
                           "temperature": temperature, "ignore_eos": ignore_eos, "batch": 1, "dtype": "float32",
                           "measure": "accepted draft tokens per verify step over full-γ steps; difference "
                                      "block - exact paired over prompts (same seed per prompt), 95 % t interval"},
              "results": rows}
    if out is not None:
        write_json_atomic(out, result)
        plot(result, Path(out).with_suffix(".png"))
    return result


def _fmt(x, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def print_table(result: dict) -> None:
    table = []
    for r in result["results"]:
        d = r["difference"]
        ci = "-" if d["ci95"] is None else f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"
        table.append({"γ": r["gamma"], "exact acc/step": _fmt(r["exact"]["accepted_per_step"]),
                      "block acc/step": _fmt(r["block"]["accepted_per_step"]),
                      "block - exact (paired)": f"{_fmt(d['mean'], '+.3f')} {ci}",
                      "gain": _fmt(None if r["relative_gain"] is None else 100 * r["relative_gain"], "+.1f") + " %",
                      "tokens/step exact": _fmt(r["exact"]["tokens_per_step"]),
                      "tokens/step block": _fmt(r["block"]["tokens_per_step"]),
                      "verify ms exact/block": f"{_fmt(r['exact']['verify_ms_per_step'], '.2f')}/"
                                               f"{_fmt(r['block']['verify_ms_per_step'], '.2f')}",
                      "prompts": d["n"]})
    print(format_table(table, list(table[0])))


def plot(result: dict, path: Path) -> Path:
    """Accepted tokens per full-γ verify step against γ, both rules (per-prompt means, 95 % intervals)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["results"]
    gammas = [r["gamma"] for r in rows]
    fig, (ax, ax_d) = plt.subplots(1, 2, figsize=(10, 4))
    for rule, marker in (("exact", "o"), ("block", "s")):
        stats = [r[rule]["per_prompt"] for r in rows]
        means = [s["mean"] for s in stats]
        err = [0.0 if s["ci95"] is None else s["mean"] - s["ci95"][0] for s in stats]
        ax.errorbar(gammas, means, yerr=err, marker=marker, capsize=3, label=rule)
    ax.set_xlabel("γ (draft tokens per step)")
    ax.set_ylabel("accepted tokens per verify step")
    ax.set_title("accepted draft tokens per full-γ step")
    ax.legend()
    diffs = [r["difference"] for r in rows]
    ax_d.errorbar(gammas, [d["mean"] for d in diffs],
                  yerr=[0.0 if d["ci95"] is None else d["mean"] - d["ci95"][0] for d in diffs],
                  marker="s", capsize=3, color="tab:green")
    ax_d.axhline(0.0, color="grey", linewidth=0.8)
    ax_d.set_xlabel("γ (draft tokens per step)")
    ax_d.set_ylabel("block - exact (paired over prompts)")
    ax_d.set_title("gain of block verification, 95 % interval")
    s = result["settings"]
    for a in (ax, ax_d):
        a.set_xticks(gammas)
    fig.suptitle(f"target {s['target']}, draft {s['draft']}: {s['prompts']} prompts, T = {s['temperature']:g}, "
                 f"up to {s['max_new_tokens']} new tokens{' (EOS ignored)' if s['ignore_eos'] else ''}", fontsize=10)
    fig.tight_layout()
    with atomic_file(path, "wb") as f:
        fig.savefig(f, format="png", dpi=120)
    plt.close(fig)
    return path
