"""`specsweep bench distortion`: how far a lossy rule's emitted tokens are from the target's distribution, over a
grid of its parameters, from one run of the pair.

The run is the pair's own (`specsweep run`'s models, prompts, drafter and engine) with exact verification at T > 0,
so the tokens follow the target and the contexts are the target's own. At every verify step a probe beside the
sampler takes each setting's step distribution in closed form (``Sampler.step_distribution`` at the drafted
positions, ``bonus_distribution`` after a full block; pipeline/samplers/torch_ref.py) and compares it with the
target's softmax p:

    distortion   total variation ½ Σ_x |P(x) − p(x)| per emitted token: the mean over the positions that emitted a
                 token in the run (drafted positions 0..a of a step that accepted a < γ, and all γ plus the bonus
                 position of a full step); 0 for a lossless rule, at most 1
    acceptance   the setting's probability of accepting the draft token, averaged over the drafted positions that
                 emitted a token; tokens/step is Leviathan et al.'s (1 − α^(γ+1)) / (1 − α) at that α

Each setting is read on the same positions, so one run maps a rule's parameters with no sampling noise in the
measure itself (ROUGE-L on a few sampled summaries moves by tens of percent between two seeds of a lossless rule).
What it does not see: a lossy rule's own run visits its own contexts, so the map is the distortion of one token
given a target-like prefix (first order), and how that distortion changes a summary's score is for the run to
measure. The interval is a bootstrap over verify steps (95 %).

    probe  pipeline/benchmarks/distortion.py:_Probe wraps the exact sampler; no host sync per step (the sums stay on
           the device; read once at the end)
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from pipeline.benchmarks.prompts import prompts_of
from pipeline.benchmarks.timing import format_table
from pipeline.config import RunConfig
from pipeline.env_info import provenance
from pipeline.io import atomic_file, write_json_atomic
from pipeline.models import auto_dtype, parse_dtype, resolve_device
from pipeline.rules import RULES
from pipeline.samplers import get_sampler
from pipeline.samplers.torch_ref import softmax_fp32
from pipeline.settings_file import settings_document
from pipeline.tasks import get_task

ALPHAS = (0.5, 0.7, 0.85, 1.0, 1.2, 1.4, 2.0)
BETAS = (-60.0, -50.0, -45.0, -40.0, -35.0, -30.0, -25.0, -20.0, -10.0, 0.0)
"""The default grid. β reaches past the registry's search range [−30, 0], below −(the largest α z / T) of a real
model's logits (the JSON's ``target_max_logit``), where no weight saturates: what is left of the distortion there is
the acceptance ratio's missing normalisers (pipeline/samplers/torch_ref.py, SigmoidSampler), which no β removes."""
BOOTSTRAP = 2000


@dataclasses.dataclass(frozen=True)
class Setting:
    """One rule with its parameters (the registry's where not given), verifying the draft's sampled token
    (``draft`` "sampled": the run's own proposals' law) or its argmax ("argmax": a point-mass draft, as llama.cpp's
    draft model proposes at any temperature; exact rejection sampling then accepts it with probability p(argmax q)
    and stays lossless, so with exact this is llama.cpp's verify rule: keep the draft token while the target's own
    sample equals it)."""

    rule: str
    params: tuple[tuple[str, float], ...] = ()
    draft: str = "sampled"

    def sampler(self, temperature: float):
        return get_sampler(self.rule, temperature=temperature, **dict(self.params))

    def label(self) -> str:
        return self.rule + "".join(f" {k} {v:g}" for k, v in self.params) + \
            (", argmax draft" if self.draft == "argmax" else "")


def settings_grid(alphas=ALPHAS, betas=BETAS) -> list[Setting]:
    """exact (its distortion is 0: the probe's own check), exact against the draft's argmax (llama.cpp's rule:
    :class:`Setting`), typical at the registry's ε and δ, sigmoid at the registry's α and β, then sigmoid over
    alphas x betas."""
    sigmoid = RULES["sigmoid"].defaults()
    typical = RULES["typical"].defaults()
    grid = [Setting("exact"), Setting("exact", draft="argmax"), Setting("typical", tuple(typical.items())),
            Setting("sigmoid", (("alpha", sigmoid["alpha"]), ("beta", sigmoid["beta"])))]
    grid += [Setting("sigmoid", (("alpha", float(a)), ("beta", float(b)))) for a, b in itertools.product(alphas, betas)
             if (float(a), float(b)) != (sigmoid["alpha"], sigmoid["beta"])]
    return grid


class _Probe:
    """The exact sampler, and beside it every setting's distortion and acceptance at the positions each step emits
    from. Per step and setting: [tv_sum, tokens, acceptance_sum, drafted] on the device (read once, :meth:`steps`)."""

    def __init__(self, sampler, settings: list[Setting], temperature: float) -> None:
        self.inner = sampler
        self.settings = settings
        self.samplers = [s.sampler(temperature) for s in settings]
        self.temperature = temperature
        self.records: list[torch.Tensor] = []         # each float64 [S, 4]
        self.max_logits: list[torch.Tensor] = []      # each float32 [B * (γ + 1)]: the target's largest logit

    def __getattr__(self, name):                      # draft_temperature, verifies_by_argmax, rule, ...
        return getattr(self.inner, name)

    def __call__(self, draft_tokens, draft_logits, target_logits, generator=None, lengths=None, **kwargs):
        result = self.inner(draft_tokens, draft_logits, target_logits, generator=generator, lengths=lengths, **kwargs)
        gamma = draft_tokens.shape[1]                  # the last steps of a prompt draft fewer, down to none
        if (gamma and draft_logits is None) or lengths is not None or kwargs:
            raise ValueError("the distortion probe reads chains of a draft model (no per-row lengths, trees or "
                             "deterministic drafts)")
        B, V = target_logits.shape[0], target_logits.shape[2]
        positions = torch.arange(gamma, device=draft_tokens.device)
        drafted = (positions[None] <= result.accepted[:, None]).double()          # [B, γ]: emitted from
        bonus = (result.accepted == gamma).double()                                 # [B]
        z_t = target_logits.float()
        self.max_logits.append(z_t.amax(dim=-1).flatten())
        p = softmax_fp32(z_t, 1.0 / self.temperature)                              # [B, γ+1, V]
        rows_t = z_t[:, :gamma].reshape(B * gamma, V)
        rows_d = draft_logits.float().reshape(B * gamma, -1) if gamma else None
        rows_argmax = None                             # [B * γ, V_d]: the draft's argmax as one-hot logits
        if gamma and any(s.draft == "argmax" for s in self.settings):
            rows_argmax = torch.full_like(rows_d, float("-inf")).scatter_(1, rows_d.argmax(dim=1, keepdim=True), 0.0)
        out = torch.empty(len(self.settings), 4, dtype=torch.float64, device=draft_tokens.device)
        for i, (setting, sampler) in enumerate(zip(self.settings, self.samplers)):
            if gamma:
                dist, acceptance = sampler.step_distribution(rows_t, rows_argmax if setting.draft == "argmax"
                                                             else rows_d)
                tv = 0.5 * (dist - p[:, :gamma].reshape(B * gamma, V)).abs().sum(dim=1).double().view(B, gamma)
            else:
                tv = acceptance = drafted                                      # [B, 0]: nothing drafted
            tv_bonus = 0.5 * (sampler.bonus_distribution(z_t[:, gamma]) - p[:, gamma]).abs().sum(dim=1).double()
            out[i, 0] = (tv * drafted).sum() + (tv_bonus * bonus).sum()
            out[i, 1] = drafted.sum() + bonus.sum()
            out[i, 2] = (acceptance.double().view(B, gamma) * drafted).sum()
            out[i, 3] = drafted.sum()
        self.records.append(out)
        return result

    def steps(self) -> np.ndarray:
        """float64 [steps, S, 4]: per verify step and setting, tv_sum, tokens, acceptance_sum, drafted."""
        return torch.stack(self.records).cpu().numpy()


def summarize(steps: np.ndarray, settings: list[Setting], gamma: int, seed: int = 0) -> list[dict]:
    """Per setting: distortion (per emitted token) and acceptance, each with its 95 % bootstrap interval over steps,
    and tokens per step at that acceptance (Leviathan et al.'s i.i.d. formula)."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(steps), size=(BOOTSTRAP, len(steps)))
    rows = []
    for i, setting in enumerate(settings):
        tv, tokens, acc, drafted = (steps[:, i, k] for k in range(4))
        boot = tv[draws].sum(axis=1) / tokens[draws].sum(axis=1)
        boot_alpha = acc[draws].sum(axis=1) / np.maximum(drafted[draws].sum(axis=1), 1e-12)
        alpha = float(acc.sum() / drafted.sum())
        rows.append({"rule": setting.rule, "params": dict(setting.params), "draft": setting.draft,
                     "label": setting.label(),
                     "distortion": float(tv.sum() / tokens.sum()),
                     "distortion_ci95": [float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975))],
                     "acceptance": alpha,
                     "acceptance_ci95": [float(np.quantile(boot_alpha, 0.025)), float(np.quantile(boot_alpha, 0.975))],
                     "tokens_per_step": expected_tokens(alpha, gamma),
                     "tokens": int(tokens.sum())})
    return rows


def _quantiles(values: torch.Tensor) -> dict:
    """The 10th, 50th and 90th percentiles of ``values`` (the target's largest logit at every scored position)."""
    q = torch.quantile(values.double().cpu(), torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64))
    return {"p10": float(q[0]), "p50": float(q[1]), "p90": float(q[2])}


def expected_tokens(alpha: float, gamma: int) -> float:
    """Tokens per verify step at i.i.d. acceptance α: (1 − α^(γ+1)) / (1 − α) (γ + 1 at α = 1)."""
    return float(gamma + 1) if alpha >= 1.0 else (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def choose(rows: list[dict], rule: str, max_distortion: float) -> dict | None:
    """Among ``rule``'s settings, the one that accepts most with distortion at most ``max_distortion`` (ties: the
    lower distortion); None when none is that close."""
    within = [r for r in rows if r["rule"] == rule and r["distortion"] <= max_distortion]
    return max(within, key=lambda r: (r["acceptance"], -r["distortion"])) if within else None


def run(config: RunConfig, settings: list[Setting], *, max_distortion: float, rule: str = "sigmoid",
        out: Path, settings_out: Path | None = None, progress: bool = True) -> dict:
    """Decode ``config``'s prompts with exact verification at ``config.temperature`` through the probe; write the
    results JSON (and the chosen setting as a settings file of `specsweep export --format json`, if one is within
    ``max_distortion``) and the figure beside the JSON."""
    from pipeline import stack  # imports the models' code

    used, dtype_choice = auto_dtype(config.target, config.device) if config.dtype == "auto" else (config.dtype, None)
    config = dataclasses.replace(config, dtype=used, sampler="exact")
    dtype = parse_dtype(config.dtype)
    device = resolve_device(config.device, dtype)
    previous = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        task = get_task(config.task)
        pair = stack.load_pair(config, task, dtype, device)
        probe = _Probe(stack.build_sampler(config), settings, config.temperature)
        engine = stack.build_engine(config, probe, pair.target, pair.draft, pair.tokenizer, device)
        generator = torch.Generator(device=device).manual_seed(config.seed)
        for prompt in tqdm(prompts_of(config, pair.target, pair.tokenizer), desc="bench distortion", unit="prompt",
                           disable=not progress):
            engine.generate(prompt["input_ids"].to(device), prompt["attention_mask"].to(device),
                            config.max_new_tokens, generator, prompt_texts=prompt["prompt_texts"])
    finally:
        torch.set_num_threads(previous)
    rows = summarize(probe.steps(), settings, config.gamma, config.seed)
    chosen = choose(rows, rule, max_distortion)
    result = {"bench": "distortion",
              "settings": {"target": config.target, "draft": config.draft, "task": config.task, "data": config.data,
                           "limit": config.limit, "chat_template": config.chat_template,
                           "max_prompt_tokens": config.max_prompt_tokens, "max_new_tokens": config.max_new_tokens,
                           "gamma": config.gamma, "temperature": config.temperature, "dtype": config.dtype,
                           "dtype_choice": dtype_choice, "draft_quant": config.draft_quant,
                           "draft_vocab": config.draft_vocab, "threads": config.threads, "seed": config.seed,
                           "steps": len(probe.records), "max_distortion": max_distortion, "rule": rule},
              "target_max_logit": _quantiles(torch.cat(probe.max_logits)),
              "results": rows, "choice": chosen, "provenance": provenance(device)}
    if chosen is not None and settings_out is not None:
        pick = (f"the {rule} setting that accepts most with distortion <= {max_distortion:g} per token "
                "(specsweep bench distortion)")
        entry = {"gamma": config.gamma, "sampler": rule, "params": chosen["params"],
                 "temperature": config.temperature}
        write_json_atomic(settings_out, settings_document(
            str(out), pick, {"task": config.task, "target": config.target, "draft": config.draft,
                             "dtype": config.dtype, "temperature": config.temperature, "device": device},
            [{"batch_size": 1, "context": None, "settings": entry}]))
    write_json_atomic(out, result)
    plot(result, out.with_suffix(".png"))
    return result


def print_table(result: dict) -> None:
    choice = result["choice"]
    table = [{"rule": r["label"], "distortion": f"{r['distortion']:.4f}",
              "95 % interval": f"[{r['distortion_ci95'][0]:.4f}, {r['distortion_ci95'][1]:.4f}]",
              "acceptance": f"{r['acceptance']:.3f}", "tokens/step": f"{r['tokens_per_step']:.2f}",
              "chosen": "<-" if choice is not None and r["label"] == choice["label"] else ""}
             for r in result["results"]]
    print(format_table(table, list(table[0])))
    s = result["settings"]
    if choice is None:
        print(f"no {s['rule']} setting has distortion <= {s['max_distortion']:g} per token")
    else:
        print(f"chosen: {choice['label']} (distortion {choice['distortion']:.4f}, acceptance "
              f"{choice['acceptance']:.3f}), the {s['rule']} setting that accepts most within {s['max_distortion']:g}")


def plot(result: dict, path: Path) -> Path | None:
    """Sigmoid's distortion and acceptance over its (α, β) grid, the registry's default and the choice marked."""
    grid = [r for r in result["results"] if r["rule"] == "sigmoid"]
    alphas = sorted({r["params"]["alpha"] for r in grid})
    betas = sorted({r["params"]["beta"] for r in grid})
    if len(alphas) < 2 or len(betas) < 2:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cell = {(r["params"]["alpha"], r["params"]["beta"]): r for r in grid}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, title in ((axes[0], "distortion", "distortion (total variation per token)"),
                           (axes[1], "acceptance", "acceptance")):
        values = np.array([[cell[(a, b)][key] if (a, b) in cell else np.nan for a in alphas] for b in betas])
        image = ax.imshow(values, origin="lower", aspect="auto", cmap="viridis")
        ax.set_xticks(range(len(alphas)), [f"{a:g}" for a in alphas])
        ax.set_yticks(range(len(betas)), [f"{b:g}" for b in betas])
        ax.set_xlabel("α")
        ax.set_ylabel("β")
        ax.set_title(title)
        fig.colorbar(image, ax=ax)
        default = RULES["sigmoid"].defaults()
        if default["alpha"] in alphas and default["beta"] in betas:
            ax.plot(alphas.index(default["alpha"]), betas.index(default["beta"]), "wo", markersize=9,
                    fillstyle="none", label="registry default")
        choice = result["choice"]
        if choice is not None and choice["rule"] == "sigmoid":
            ax.plot(alphas.index(choice["params"]["alpha"]), betas.index(choice["params"]["beta"]), "r*",
                    markersize=12, label="chosen")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=len(handles), fontsize=8, facecolor="0.55")
    s = result["settings"]
    fig.suptitle(f"sigmoid on {Path(str(s['target'])).name} with {Path(str(s['draft'])).name}: "
                 f"T = {s['temperature']:g}, γ {s['gamma']}, {s['dtype']}, {s['steps']} verify steps of an exact run",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    with atomic_file(path, "wb") as f:
        fig.savefig(f, format="png", dpi=120)
    plt.close(fig)
    return path

