"""`python -m pipeline.benchmarks.replay RUN.json`: drafters replayed on a greedy run's own texts, without the target:
tokens per step for every setting of a grid, and what they predict for decoding speed.

Why. At T = 0 every lossless rule emits the target's greedy tokens, whatever the drafter. A drafter that needs no
model (prompt lookup, suffix decoding: pipeline/decoding/drafters/lookup.py) proposes from the text alone, so its
steps over a text already decoded can be replayed on the host in milliseconds: each step it proposes from the prompt
and the tokens so far, the longest prefix equal to the next output tokens is accepted, and one more output token is
emitted (the target's correction or bonus); with a token tree (``--draft-tree``), the longest root path equal to the
next output tokens. These are the engine's own steps: the proposers are the engine's (the
same constructors and stop ids), and a step proposes at most γ and at most the room left before ``max_new_tokens``
less one, as the engine's does. Replaying a run's own
setting gives back its recorded steps exactly in float32, and in bfloat16 where its forwards are the one-token
forwards bit for bit (the Llama family's packed static forward on a CPU, up to 9 tokens: docs/results.md,
"Lossless in bfloat16");
elsewhere up to the near ties that a forward of another width rounds differently, after which the replayed texts are
the run's, not the other setting's. Batch 1: each sample alone (a batched step verifies as wide as its widest row).

What it reads. A results file of a greedy run (``specsweep run --temperature 0``, any drafter, γ = 0 included)
records each sample's prompt ids (``samples[i].prompt_ids``) and output ids (``token_ids``) and the stop ids the
drafters used (``resolved.eos_token_ids``); results written before those fields are refused in one line.

A draft model (``--drafters model,lookup-model`` with ``--draft MODEL``): its greedy tokens and confidences after
every prefix of each text come from one teacher-forced forward of the draft per sample (its ``--draft-quant``
weights), which is all a greedy step needs while the draft's tokens are the target's
(pipeline/benchmarks/replay_draft.py); each step also records the draft forwards it ran, as the engine's model and
lookup-model drafters run them, and ``--confidence`` replays the in-step stop at a draft confidence threshold.

Predicted speed (optional, ``--forward FILE``: a ``python -m pipeline.benchmarks.forward --model ...`` result of the
run's target and dtype, with 1 among its new tokens). A step that proposes k tokens costs one target forward over
q = k + 1 tokens (a tree: k its nodes, taken to cost what a chain of k tokens costs: the curve is of chains),
r(q) = ms(q) / ms(1) one-token forwards (linear between the measured q; a grid's γ beyond the largest measured
q - 1 is refused); a draft forward over n tokens costs c(n), the draft's ms(n) over the target's ms(1)
(``--draft-forward FILE``: a ``python -m pipeline.benchmarks.quant_linear --model`` result of the draft, for its
--draft-quant, or a forward benchmark's of it; linear between the measured n, the last slope past them; two
processes, so c moves with the machine's state as the runs' own c does). The predicted decoding speedup is the run's
tokens after each sample's first step over the sum of its later steps' r(q) and c(n): the models' forwards alone,
the drafter's host time, the verify step and the loop's overhead left out, the prefill (the draft's too) left out
as the runs' "decoding alone" column leaves it out. It is a
model, not a measurement: a setting worth using is then measured with `specsweep run` (paired, with its interval).

Output: a table, fastest predicted first (else most tokens per step), and JSON (``--out``, default
results/bench/replay-<run name>.json), written atomically.
"""

from __future__ import annotations

import itertools
import json
from bisect import bisect_left
from collections.abc import Callable, Sequence
from pathlib import Path

from pipeline.benchmarks.replay_draft import AFTER_MISS, DraftReplay, DraftTrace
from pipeline.benchmarks.timing import format_table
from pipeline.decoding.drafters.lookup import prompt_lookup, suffix_decoding
from pipeline.decoding.drafters.ngram import Proposer
from pipeline.env_info import provenance
from pipeline.errors import OneLineParser, SpecsweepError
from pipeline.io import write_json_atomic
from pipeline.result import read_result
from pipeline.tree_shape import TokenTree, parse_widths, place_paths

DRAFTERS = ("prompt-lookup", "suffix", "model", "lookup-model")
MODEL_DRAFTERS = ("model", "lookup-model")


def load_texts(path: Path) -> tuple[dict, list[tuple[list[int], list[int]]], list[int]]:
    """(the run's results, [(prompt ids, output ids)] per sample, stop ids) of a greedy results file; a one-line
    SpecsweepError for anything else."""
    result = read_result(path)
    if result is None:
        raise SpecsweepError(f"{path}: not a specsweep results file")
    config = result.get("config", {})
    if config.get("temperature") not in (0, 0.0):
        raise SpecsweepError(f"{path} decoded at T = {config.get('temperature')}: a replay needs a greedy run "
                             "(--temperature 0), whose tokens every lossless setting shares")
    samples = result.get("samples") or []
    if not samples or any("prompt_ids" not in s or "token_ids" not in s for s in samples) \
            or "eos_token_ids" not in result.get("resolved", {}):
        raise SpecsweepError(f"{path} does not record its samples' prompt ids and stop ids (results from before "
                             "they were written): run it again with this version")
    texts = [(list(map(int, s["prompt_ids"])), list(map(int, s["token_ids"]))) for s in samples]
    return result, texts, [int(t) for t in result["resolved"]["eos_token_ids"]]


def cost_curve(path: Path, dtype: str) -> dict[int, float]:
    """q -> r(q) = ms(q) / ms(1) of the static forward in ``dtype``, from a `python -m pipeline.benchmarks.forward
    --model` result."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        rows = {int(r["new_tokens"]): float(r["static_ms"]) for r in data["results"] if r.get("dtype") == dtype}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SpecsweepError(f"--forward {path}: not a readable forward benchmark result ({e})") from None
    if 1 not in rows:
        raise SpecsweepError(f"--forward {path} has no {dtype} forward over 1 new token (the run's dtype): measure it "
                             "with `python -m pipeline.benchmarks.forward --model ... --dtypes "
                             f"{dtype} --new-tokens 1,...`")
    return {q: ms / rows[1] for q, ms in sorted(rows.items())}


def draft_cost_curve(path: Path, quant: str, target_ms: float) -> dict[int, float]:
    """n -> c(n): the draft's forward over n new tokens in ``target_ms`` (the target's one-token forward), from a
    ``quant_linear --model`` result (the fastest of its ways that runs ``quant``: int4's one-call forward where it
    has one) or a forward benchmark result (``static_ms``) of the draft."""
    ways = {"none": ("bfloat16_ms",), "int4": ("int4_layers_ms", "int4_linear_ms", "int4_ms")}.get(quant)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if data.get("benchmark") == "forward":
            rows = {int(r["new_tokens"]): float(r["static_ms"]) for r in data["results"]}
        elif ways is None:
            raise KeyError(f"no way of --draft-quant {quant} in it")
        else:
            rows = {int(r["new_tokens"]): float(next(r[w] for w in ways if r.get(w) is not None))
                    for r in data["results"]}
    except (OSError, ValueError, KeyError, TypeError, StopIteration) as e:
        raise SpecsweepError(f"--draft-forward {path}: not a readable draft forward result for --draft-quant "
                             f"{quant} ({e})") from None
    return {n: ms / target_ms for n, ms in sorted(rows.items())}


def verify_cost(curve: dict[int, float], q: int) -> float:
    """r(q), linear between the curve's measured points (q within them; past the last, its last slope: only a
    draft's curve is read there, the target's is checked to cover the grid)."""
    qs = list(curve)
    if q in curve:
        return curve[q]
    i = bisect_left(qs, q)
    if i == len(qs):
        if len(qs) == 1:
            return curve[qs[0]] * q / qs[0]
        i -= 1
    elif i == 0:
        return curve[qs[0]]
    lo, hi = qs[i - 1], qs[i]
    return curve[lo] + (curve[hi] - curve[lo]) * (q - lo) / (hi - lo)


def replay(texts: Sequence[tuple[list[int], list[int]]], make: Callable[[int], Proposer], gamma: int,
           max_new_tokens: int, widths: tuple[int, ...] | None = None) -> list[list[tuple[int, int, tuple]]]:
    """Greedy verify steps of ``make(k)``'s proposer over each (prompt, output) text k, batch 1 (module docstring):
    per sample, each step's (proposed, emitted) tokens and the widths of the draft forwards it ran (a replayed
    draft model's ``forwards``; none for a model-free drafter), in order. With ``widths``, each step proposes a
    token tree as the engine's tree drafter places it (pipeline/decoding/drafters/lookup.py: the proposer's branches
    merged by place_paths, no deeper than the tree or the step's limit) and accepts the longest root path equal to
    the next output tokens; ``proposed`` is then the tree's node count, what the target scores."""
    shape = None if widths is None else TokenTree.from_widths(widths)
    out = []
    for k, (prompt, output) in enumerate(texts):
        proposer = make(k)
        proposer.start(prompt)
        i, steps = 0, []
        while i < len(output):
            limit = min(gamma, max_new_tokens - i - 1)
            if shape is None:
                proposal = proposer.propose(limit)
                proposed, a = len(proposal), _chain_match(proposal, output, i)
            else:
                placed = place_paths(proposer.propose_many(min(limit, shape.depth), widths), widths,
                                     min(limit, shape.depth))
                proposed, a = len(placed), _tree_match(placed, shape.parents, output, i)
            emitted = output[i:i + a + 1]
            proposer.extend(emitted)
            i += len(emitted)
            steps.append((proposed, len(emitted), tuple(getattr(proposer, "forwards", ()))))
        out.append(steps)
    return out


def _chain_match(proposal: Sequence[int], output: Sequence[int], i: int) -> int:
    """How many of ``proposal`` equal output[i:], from the first."""
    a = 0
    while a < len(proposal) and i + a < len(output) and proposal[a] == output[i + a]:
        a += 1
    return a


def _tree_match(placed: dict[int, int], parents: Sequence[int], output: Sequence[int], i: int) -> int:
    """The depth of the deepest node of the tree ``placed`` ({node: token}) whose root path equals output[i:]."""
    children: dict[int, dict[int, int]] = {}
    for node in sorted(placed):
        children.setdefault(parents[node], {})[placed[node]] = node
    node, a = -1, 0
    while i + a < len(output) and output[i + a] in children.get(node, {}):
        node = children[node][output[i + a]]
        a += 1
    return a


def summarize(steps: list[list[tuple[int, int, tuple]]], curve: dict[int, float] | None,
              draft_curve: dict[int, float] | None = None) -> dict:
    """Tokens per step (emitted over steps, the runs' ``mean_accepted_tokens``), acceptance (accepted over proposed),
    the share of steps that proposed anything, draft forwards per step, and with a cost curve the predicted decoding
    speedup: the tokens after each sample's first step over the r(q) of its later steps, plus c(n) of their draft
    forwards with a draft's curve (module docstring)."""
    flat = [s for sample in steps for s in sample]
    proposed = sum(k for k, _, _ in flat)
    accepted = sum(e - 1 for _, e, _ in flat)
    row = {"steps": len(flat), "emitted": sum(e for _, e, _ in flat), "proposed": proposed,
           "tokens_per_step": sum(e for _, e, _ in flat) / len(flat) if flat else None,
           "acceptance_rate": accepted / proposed if proposed else None,
           "proposing_share": sum(k > 0 for k, _, _ in flat) / len(flat) if flat else None,
           "draft_forwards_per_step": sum(len(f) for _, _, f in flat) / len(flat) if flat else None}
    if curve is not None:
        later = [s for sample in steps for s in sample[1:]]
        cost = sum(verify_cost(curve, k + 1) for k, _, _ in later)
        if draft_curve is not None:
            row["predicted_draft_cost"] = sum(verify_cost(draft_curve, n) for _, _, f in later for n in f)
            cost += row["predicted_draft_cost"]
        row["predicted_decode_speedup"] = sum(e for _, e, _ in later) / cost if cost else None
    return row


def settings_grid(drafters: Sequence[str], gammas: Sequence[int], lookup_min: Sequence[int],
                  lookup_max: Sequence[int], suffix_factor: Sequence[float], suffix_min_prob: Sequence[float],
                  suffix_depth: int, trees: Sequence[str] = (), confidence: Sequence[float] = (0.0,)) -> list[dict]:
    """Every setting to replay: prompt lookup over γ x lookup_min x lookup_max (min <= max), suffix decoding over
    γ x factor x min_prob, a draft model over γ x confidence, prompt lookup then the draft over all four; the
    model-free ones as a chain, and once as each token tree of ``trees`` (widths such as "2,1,1")."""
    grid = []
    if "prompt-lookup" in drafters:
        grid += [{"drafter": "prompt-lookup", "gamma": g, "lookup_min": lo, "lookup_max": hi}
                 for g, lo, hi in itertools.product(gammas, lookup_min, lookup_max) if lo <= hi]
    if "suffix" in drafters:
        grid += [{"drafter": "suffix", "gamma": g, "suffix_depth": suffix_depth, "suffix_factor": f,
                  "suffix_min_prob": p} for g, f, p in itertools.product(gammas, suffix_factor, suffix_min_prob)]
    # a tree's γ is its node count, as the run's (pipeline/config.py), so the grid's γ values give one tree setting
    shapes = {",".join(map(str, parse_widths(t))): TokenTree.from_widths(parse_widths(t)).n_nodes for t in trees}
    tree_settings = [{**s, "gamma": n, "draft_tree": t} for t, n in shapes.items() for s in grid]
    grid += [s for i, s in enumerate(tree_settings) if s not in tree_settings[:i]]
    if "model" in drafters:
        grid += [{"drafter": "model", "gamma": g, "draft_confidence": c}
                 for g, c in itertools.product(gammas, confidence)]
    if "lookup-model" in drafters:
        grid += [{"drafter": "lookup-model", "gamma": g, "lookup_min": lo, "lookup_max": hi, "draft_confidence": c}
                 for g, lo, hi, c in itertools.product(gammas, lookup_min, lookup_max, confidence) if lo <= hi]
    return grid


def proposer_of(setting: dict, stop_ids: Sequence[int], traces: Sequence[DraftTrace] | None = None,
                after_miss: str = "draft") -> Callable[[int], Proposer]:
    """sample index -> the engine's proposer for a setting (a chain, or the tree of its ``draft_tree``; suffix
    decoding without earlier outputs), or a draft model's replay over that sample's trace."""
    if setting["drafter"] in MODEL_DRAFTERS:
        if traces is None:
            raise SpecsweepError(f"--drafters {setting['drafter']} replays a draft model: give --draft MODEL")
        lookup = ((setting["lookup_min"], setting["lookup_max"], stop_ids)
                  if setting["drafter"] == "lookup-model" else None)
        return lambda k: DraftReplay(traces[k], lookup, setting["draft_confidence"], after_miss)
    widths = tree_widths(setting)
    if setting["drafter"] == "prompt-lookup":
        drafter = prompt_lookup(setting["lookup_min"], setting["lookup_max"], stop_ids, widths)
    else:
        drafter = suffix_decoding(setting["suffix_depth"], setting["suffix_factor"], setting["suffix_min_prob"],
                                  keep_outputs=False, widths=widths)
    return lambda k: drafter.make(None)


def tree_widths(setting: dict) -> tuple[int, ...] | None:
    """A setting's token tree as widths per depth; None for a chain."""
    return parse_widths(setting["draft_tree"]) if setting.get("draft_tree") else None


def own_setting(config: dict) -> dict | None:
    """The run's own drafter setting, as the grid writes settings; None for a run of another drafter or γ = 0, or
    one the replay does not model (a draft model's tree, a reduced head, an adaptive schedule). (A model-free
    drafter's --draft-tree is always widths: pipeline/config.py refuses the other forms.)"""
    if not config.get("gamma") or config.get("drafter") not in DRAFTERS:
        return None
    if config["drafter"] in MODEL_DRAFTERS:
        if config.get("draft_tree") or config.get("draft_vocab") not in (None, "all") \
                or config.get("draft_schedule", "constant") != "constant":
            return None
        confidence = float(config.get("draft_confidence") or 0.0)
        # with a threshold a step drafts up to γ_max (the in-step stop: pipeline/decoding/draft_policy.py)
        gamma = int(config.get("gamma_max") or config["gamma"]) if confidence else int(config["gamma"])
        own = {"drafter": config["drafter"], "gamma": gamma, "draft_confidence": confidence}
        if config["drafter"] == "lookup-model":
            own.update(lookup_min=int(config["lookup_min"]), lookup_max=int(config["lookup_max"]))
        return own
    if config["drafter"] == "prompt-lookup":
        own = {"drafter": "prompt-lookup", "gamma": int(config["gamma"]), "lookup_min": int(config["lookup_min"]),
               "lookup_max": int(config["lookup_max"])}
    elif config.get("suffix_outputs"):
        return None
    else:
        own = {"drafter": "suffix", "gamma": int(config["gamma"]), "suffix_depth": int(config["suffix_depth"]),
               "suffix_factor": float(config["suffix_factor"]), "suffix_min_prob": float(config["suffix_min_prob"])}
    if config.get("draft_tree"):
        own["draft_tree"] = ",".join(map(str, parse_widths(config["draft_tree"])))
    return own


def run(path: Path, grid: list[dict], forward: Path | None = None, draft: dict | None = None) -> dict:
    """Replay every setting of ``grid`` (and the run's own, first, where the replay models it) on the run's texts;
    returns the JSON document. ``draft``: {"model", "quant", "forward" (a path or None), "after_miss"} for the
    grid's draft-model settings."""
    result, texts, stops = load_texts(path)
    config = result["config"]
    curve = cost_curve(forward, config["dtype"]) if forward is not None else None
    own = own_setting(config)
    if own is not None and own["drafter"] in MODEL_DRAFTERS and (draft is None or draft["model"] != config["draft"]
                                                                  or draft["quant"] != config.get("draft_quant")):
        own = None          # the run's draft is not the one replayed
    if own is not None and own not in grid:
        grid = [own, *grid]
    traces = draft_curve = None
    if any(s["drafter"] in MODEL_DRAFTERS for s in grid):
        if draft is None:
            raise SpecsweepError("--drafters model and lookup-model replay a draft model: give --draft MODEL")
        traces = draft_traces(draft["model"], config["dtype"], draft["quant"], texts)
        if draft.get("forward") is not None and curve is not None:
            draft_curve = draft_cost_curve(draft["forward"], draft["quant"], _one_token_ms(forward, config["dtype"]))
    if curve is not None:
        top = max(curve) - 1
        beyond = sorted({s["gamma"] for s in grid if s["gamma"] > top})
        if beyond:
            raise SpecsweepError(f"γ {beyond} (a tree's: its node count) needs the forward over up to "
                                 f"{max(beyond) + 1} tokens, and --forward {forward} measured up to {top + 1}: "
                                 "measure more --new-tokens, or drop those γ")
    rows = []
    after_miss = draft["after_miss"] if draft is not None else "draft"
    for setting in grid:
        steps = replay(texts, proposer_of(setting, stops, traces, after_miss), setting["gamma"],
                       int(config["max_new_tokens"]), tree_widths(setting))
        rows.append({**setting, **summarize(steps, curve, draft_curve if setting["drafter"] in MODEL_DRAFTERS
                                            else None), "own": setting == own})
    measured = result.get("metrics", {})
    return {"benchmark": "replay", "run": str(path), "provenance": provenance("cpu"),
            "source": {k: config.get(k) for k in ("task", "target", "dtype", "limit", "max_new_tokens",
                                                 "max_prompt_tokens", "drafter", "gamma")},
            "samples": len(texts), "forward": None if forward is None else str(forward),
            "cost_curve": None if curve is None else {str(q): r for q, r in curve.items()},
            "draft": None if draft is None else {**draft, "forward": None if draft.get("forward") is None
                                                 else str(draft["forward"])},
            "draft_cost_curve": None if draft_curve is None else {str(n): c for n, c in draft_curve.items()},
            "run_measured": {k: measured.get(k) for k in ("mean_accepted_tokens", "acceptance_rate",
                                                          "decode_speedup", "speedup")},
            "results": rows}


def draft_traces(model: str, dtype: str, quant: str, texts) -> list[DraftTrace]:
    """The teacher-forced traces of the draft ``model`` (a registry name or a local model) in the run's dtype, on
    the CPU, with a progress bar (one forward per sample)."""
    from tqdm import tqdm

    from pipeline.benchmarks.replay_draft import trace  # kept local: a model-free replay loads no model code
    from pipeline.models import load_causal_lm, parse_dtype  # kept local: likewise

    draft = load_causal_lm(model, parse_dtype(dtype), "cpu")
    with tqdm(total=len(texts), desc="draft traces", unit="sample") as bar:
        return trace(draft, texts, quant, packed=True, progress=bar.update)


def _one_token_ms(forward: Path, dtype: str) -> float:
    """The target's one-token static forward (ms) in a forward benchmark result (cost_curve has checked it)."""
    data = json.loads(Path(forward).read_text(encoding="utf-8"))
    return next(float(r["static_ms"]) for r in data["results"] if r.get("dtype") == dtype and r["new_tokens"] == 1)


def _label(s: dict) -> str:
    tree = f", tree {s['draft_tree']}" if s.get("draft_tree") else ""
    if s["drafter"] in MODEL_DRAFTERS:
        stop = f", stop below {s['draft_confidence']:g}" if s["draft_confidence"] else ""
        if s["drafter"] == "model":
            return f"draft model{stop}"
        return f"prompt lookup n {s['lookup_min']}-{s['lookup_max']}, then the draft{stop}"
    if s["drafter"] == "prompt-lookup":
        return f"prompt lookup, n {s['lookup_min']}-{s['lookup_max']}{tree}"
    return f"suffix, factor {s['suffix_factor']:g}, min prob {s['suffix_min_prob']:g}{tree}"


def print_table(doc: dict, top: int) -> None:
    """The ``top`` settings, fastest predicted first (else most tokens per step), and the run's own against its
    measurement."""
    rows = doc["results"]
    key = "predicted_decode_speedup" if doc["cost_curve"] else "tokens_per_step"
    ranked = sorted(rows, key=lambda r: -(r[key] or 0.0))[:top]
    columns = ["drafter", "γ", "tokens/step", "acceptance", "steps proposing", "draft forwards/step",
               "predicted decoding speedup", ""]
    print(format_table([{"drafter": _label(r), "γ": r["gamma"], "tokens/step": f"{r['tokens_per_step']:.2f}",
                         "acceptance": "–" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.2f}",
                         "steps proposing": f"{r['proposing_share']:.0%}",
                         "draft forwards/step": f"{r['draft_forwards_per_step']:.2f}"
                         if r["drafter"] in MODEL_DRAFTERS else "–",
                         "predicted decoding speedup": f"{r['predicted_decode_speedup']:.2f}x"
                         if r.get("predicted_decode_speedup") else "–",
                         "": "the run's own" if r["own"] else ""} for r in ranked], columns))
    m = doc["run_measured"]
    own = next((r for r in rows if r["own"]), None)
    if own is not None and m.get("mean_accepted_tokens") is not None:
        print(f"the run's own setting: {own['tokens_per_step']:.3f} tokens/step replayed, "
              f"{m['mean_accepted_tokens']:.3f} measured"
              + (f"; decoding alone {own['predicted_decode_speedup']:.2f}x predicted, {m['decode_speedup']:.2f}x "
                 "measured" if own.get("predicted_decode_speedup") and m.get("decode_speedup") else ""))


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m pipeline.benchmarks.replay", description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="a greedy run's results file")
    p.add_argument("--forward", type=Path, help="the target's `python -m pipeline.benchmarks.forward --model` "
                   "result in the run's dtype: predicted decoding speedups")
    p.add_argument("--drafters", default="prompt-lookup,suffix",
                   help="comma-separated, of " + ", ".join(DRAFTERS) + " (the last two need --draft)")
    p.add_argument("--gamma", type=_ints, default=[4, 6, 8, 10, 12, 16])
    p.add_argument("--lookup-min", type=_ints, default=[1, 2])
    p.add_argument("--lookup-max", type=_ints, default=[2, 3, 4])
    p.add_argument("--suffix-factor", type=_floats, default=[1.0, 2.0, 4.0])
    p.add_argument("--suffix-min-prob", type=_floats, default=[0.1])
    p.add_argument("--suffix-depth", type=int, default=24)
    p.add_argument("--draft-tree", action="append", default=[], metavar="WIDTHS",
                   help="also replay each model-free setting as this token tree (children per depth, e.g. 2,1,1; "
                        "repeatable)")
    p.add_argument("--draft", help="the draft model of --drafters model and lookup-model (a registry name or a "
                   "local model), run in the run's dtype on the CPU")
    p.add_argument("--draft-quant", default="none", choices=("none", "int8", "int4"),
                   help="the draft's weights, as `specsweep run --draft-quant` runs them")
    p.add_argument("--draft-forward", type=Path, help="the draft's `python -m pipeline.benchmarks.quant_linear "
                   "--model` (or forward benchmark) result: its forward costs in the predicted speedups")
    p.add_argument("--confidence", type=_floats, default=[0.0],
                   help="draft confidence thresholds: a step stops drafting after the first position below it (0: "
                        "never)")
    p.add_argument("--after-miss", default="draft", choices=AFTER_MISS,
                   help="the forwards counted past a draft token that is not the target's, whose confidences the "
                        "replay cannot know: to the step's length (draft: the most) or none (stop: the least)")
    p.add_argument("--top", type=int, default=15, help="rows printed (the JSON has every setting)")
    p.add_argument("--out", type=Path, help="default: results/bench/replay-<run file's name>.json")
    args = p.parse_args(argv)
    drafters = args.drafters.split(",")
    try:
        if set(drafters) - set(DRAFTERS) or min(args.gamma) < 1:
            raise SpecsweepError(f"--drafters must be of {list(DRAFTERS)} and every --gamma >= 1; got "
                                 f"{args.drafters}, {args.gamma}")
        if not all(0 <= c < 1 for c in args.confidence):
            raise SpecsweepError(f"--confidence values must be in [0, 1) (0: never stop); got {args.confidence}")
        if args.draft_forward is not None and args.forward is None:
            raise SpecsweepError("--draft-forward prices the draft's forwards in the target's: give --forward too")
        grid = settings_grid(drafters, args.gamma, args.lookup_min, args.lookup_max, args.suffix_factor,
                             args.suffix_min_prob, args.suffix_depth, args.draft_tree, args.confidence)
        draft = None if args.draft is None else {"model": args.draft, "quant": args.draft_quant,
                                                 "forward": args.draft_forward, "after_miss": args.after_miss}
        doc = run(args.run, grid, args.forward, draft)
    except SpecsweepError as e:
        p.error(str(e))
    print_table(doc, args.top)
    out = args.out or Path("results/bench") / f"replay-{args.run.stem}.json"
    write_json_atomic(out, doc)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
