"""README's headline table: the best of each published experiment, chosen from the committed results, not by hand.

One row per question a newcomer asks first; each CPU row is the published run with the highest median paired
speedup among those that answer it, on one CPU (:data:`CPU`, named once in the caption):

    the best lossless setting without a draft model   the pair profile's greedy runs on its most articles
    the best draft model                              the same runs, drafters with a draft model
    Spec-Bench coding                                 the spec-bench profile's runs
    the rules at T = 1                                exact and the paper's sigmoid (the sigmoid profile)
    the GPU verify kernel                             `bench kernels` on the last GPU run

Every figure's table, with its interval, settings and provenance, is on docs/results.md (linked from the caption).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config import MODEL_DRAFTERS
from pipeline.errors import SpecsweepError

from .doc_sources import micros, num, prose, read_source, table
from .gpu_blocks import KERNEL_ROWS, KERNELS, KERNELS_WRITER, card, kernel_figures, times
from .publish import summary_path
from .run_tables import agreement, cpu_name, speedup

CPU = "AMD EPYC"
"""The CPU whose runs the headline shows: the one that ran every published experiment (other CPUs' rows are on
docs/results.md)."""

HEADER = ["question", "setting", "paired speedup", "tokens per step", "output"]


def _runs(root: Path, profile: str) -> dict[str, dict]:
    """A published summary's runs; a record from before runs recorded their CPU was run by the machine that
    published it."""
    data = read_source(root, summary_path(profile), f"make publish PROFILE={profile}")
    return {name: {**r, "ran": {**r["ran"], "machine": r["ran"].get("machine") or data["machine"]["cpu"]}}
            for name, r in data["runs"].items()}


def _best(runs, keep, question: str) -> dict:
    """The record of ``runs`` with the highest median paired speedup among those ``keep`` accepts, on :data:`CPU`."""
    chosen = [r for r in runs if cpu_name(r) == CPU and r["metrics"].get("speedup") is not None
              and not r["metrics"].get("flagged") and keep(r)]
    if not chosen:
        raise SpecsweepError(f"no published run on {CPU} answers {question!r}: publish one (docs/results.md)")
    return max(chosen, key=lambda r: r["metrics"]["speedup"])


def _drafter(r: dict) -> str:
    """"prompt lookup, γ 12", "int4 draft, γ 6", "prompt lookup then the int4 draft, γ 5"."""
    c = r["config"]
    draft = "int4 draft" if c["draft_quant"] == "int4" else ("int8 draft" if c["draft_quant"] == "int8" else "draft")
    name = {"prompt-lookup": "prompt lookup", "suffix": "suffix decoding", "model": draft,
            "lookup-model": f"prompt lookup then the {draft}"}[c["drafter"] or "model"]
    if c.get("draft_confidence"):
        name += f" stopping below confidence {num(c['draft_confidence'], 1)}"
    if c.get("draft_vocab") and c["drafter"] in MODEL_DRAFTERS:
        name += f" ({c['draft_vocab']}-token head)"
    return f"{name}, γ {c['gamma']}"


def _greedy_row(question: str, r: dict) -> list[str]:
    return [question, _drafter(r), speedup(r), num(r["metrics"]["mean_accepted_tokens"]),
            f"{agreement(r)} identical to the target alone's"]


def render(root: Path) -> str:
    pair = _runs(root, "pair")
    most = max(r["config"]["limit"] for r in pair.values())
    greedy = [r for r in pair.values() if r["config"]["temperature"] == 0 and r["config"]["limit"] == most
              and r["config"]["dtype"] == "bfloat16"]
    lossless = _best(greedy, lambda r: (r["config"]["drafter"] or "model") not in MODEL_DRAFTERS,
                     "the best lossless setting without a draft model")
    model = _best(greedy, lambda r: (r["config"]["drafter"] or "model") in MODEL_DRAFTERS, "the best draft model")
    coding = _best(_runs(root, "pair-spec-bench").values(), lambda r: r["config"]["gamma"] > 0, "Spec-Bench coding")
    sigmoid_runs = _runs(root, "pair-sigmoid")
    rules = {name: sigmoid_runs[f"qwen-{name}-g4-t1-bfloat16"] for name in ("exact", "sigmoid")}
    alone = sigmoid_runs["qwen-ar-t1-bfloat16"]["quality"]["rougeL"]
    rows = [
        _greedy_row(f"Best without a draft model ({most} CNN/DailyMail articles)", lossless),
        _greedy_row(f"Best draft model ({most} articles)", model),
        _greedy_row(f"Spec-Bench coding ({coding['greedy_agreement']['samples']} turns)", coding),
        *([f"{label} at T = 1 ({r['config']['limit']} articles)", f"{name}, γ {r['config']['gamma']}", speedup(r),
           num(r["metrics"]["mean_accepted_tokens"]),
           f"ROUGE-L {num(r['quality']['rougeL'], 3)} (target alone {num(alone, 3)})"]
          for label, name, r in (("Lossless verify", "exact", rules["exact"]),
                                 ("The paper's sigmoid", "sigmoid", rules["sigmoid"]))),
    ]
    kernels = read_source(root, KERNELS, KERNELS_WRITER)
    f = kernel_figures(kernels)
    b, gamma, v, _ = KERNEL_ROWS[0]
    rows.append(["GPU verify kernel (one call)", f"exact, B = {b}, γ {gamma}, V = {v}",
                 f"{times(f['over_torch_b1'])} the torch reference ({micros(f['goal']['graph_s'])} µs)", "",
                 "exact (chi-square tested)"])
    best = _drafter(lossless).replace(", γ", " at γ")
    takeaway = (f"On a 2-core CPU, the fastest lossless way to speed up Qwen2.5-Coder-1.5B on news summaries is "
                f"{best} ({num(lossless['metrics']['speedup'])}x), which needs no draft model; its "
                f"0.5B sibling as a draft gives {num(model['metrics']['speedup'])}x there and "
                f"{num(coding['metrics']['speedup'])}x on coding questions.")
    caption = (f"Greedy unless it says T = 1; bfloat16; Qwen2.5-Coder-0.5B drafting for 1.5B; CPU rows on a 2-core "
               f"{CPU}, the GPU row on an {card(kernels)}. Paired speedup over the target alone, with its interval. "
               "Every run, its settings and provenance: [docs/results.md](docs/results.md).")
    return prose(f"**{takeaway}**") + "\n\n" + prose(caption) + "\n\n" + table(HEADER, rows)
