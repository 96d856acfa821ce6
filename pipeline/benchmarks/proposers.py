"""`python -m pipeline.benchmarks.proposers`: host cost and acceptance proxy of the model-free proposers.

Text: the CNN/DailyMail fixture articles and their highlights (the reference summaries), split into words and
punctuation (``\\w+|[^\\w\\s]``, case kept), one id per distinct string. A subword tokenizer gives more tokens per
word, so its contexts are longer and its matches span fewer words. Without the fixture the benchmark says so and
exits 0.

Every measure runs the same teacher-forced loop, a verify step with greedy acceptance against known text: the
proposer proposes up to γ tokens, the accepted ones are the longest prefix equal to the next true tokens, the step
emits them and one more true token (the target's correction or bonus), and the proposer reads those emitted tokens.

Cost: the microseconds per step of extend (the emitted tokens) + propose (γ), over ``steps`` steps from each of
``windows`` contexts of 512, 2048 and 8192 tokens cut from the articles laid end to end (the text after a window
is its continuation). transformers' prompt lookup (``PromptLookupCandidateGenerator.get_candidates`` on the
context's ids, written into a preallocated tensor) runs the same steps with the same n-gram size, so both propose
the same tokens (tests/test_ngram.py) and the loops take the same steps. Each repeat runs every proposer over every
window, interleaved; a cell is the median over repeats of the mean step time, with its order-statistic
interval, and the paired ratio is transformers' time over ours, repeat by repeat. Suffix decoding runs the same
windows with its request tree alone, and with an output cache of all the highlights. ``start`` (indexing the
context; for transformers, copying its ids into the tensor) is reported apart. The machine's load while timing is
recorded (pipeline.env_info.LoadProbe) and flagged past pipeline.measure.MAX_CPU_WAIT: on a contended machine
most of our repeats see no preemption (a 4 ms time slice) and the median ignores those that do, while every repeat
of transformers' sees several, so its median and the ratio grow with the load. Memory: what ``start`` leaves
allocated (tracemalloc) for the first window of each length.

Acceptance proxy: each article's highlight, teacher-forced after the article and the summary cue, per setting:
tokens per step (emitted tokens over steps: the mean accepted + 1, as Spec-Bench reports it, 1.00 without
speculation), the accepted share of proposed tokens, and the share of steps that proposed anything. Suffix
decoding runs with its request tree alone, and with an output cache that holds the earlier articles' highlights
(file order; the first article sees none), standing in for earlier outputs.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from pipeline.benchmarks.timing import format_table
from pipeline.decoding.drafters.ngram import NgramIndex, Proposer
from pipeline.decoding.drafters.suffix_tree import OutputCache, SuffixDecoder
from pipeline.env_info import LoadProbe, provenance
from pipeline.errors import OneLineParser
from pipeline.io import write_json_atomic
from pipeline.measure import MAX_CPU_WAIT, median_ci
from pipeline.tasks.cnn_dailymail import SUMMARY_CUE

WORDS = re.compile(r"\w+|[^\w\s]")
CONTEXTS = (512, 2048, 8192)
GAMMAS = (4, 10)
COST_NGRAM = 3   # max_n of the cost comparison (transformers' max_matching_ngram_size)


def default_data() -> Path:
    """The fixture articles: $SPECSWEEP_FIXTURES, else the repository's ../shared/fixtures (as the tests)."""
    root = os.environ.get("SPECSWEEP_FIXTURES") or Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
    return Path(root) / "cnn_dailymail" / "test.jsonl"


def load_examples(path: Path) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, highlight ids) per article: the prompt is the article and the summary cue."""
    vocab: dict[str, int] = {}

    def ids(text: str) -> list[int]:
        return [vocab.setdefault(word, len(vocab)) for word in WORDS.findall(text)]

    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [(ids(row["article"] + SUMMARY_CUE), ids(row["highlights"])) for row in rows]


class HFPromptLookup:
    """transformers' prompt lookup behind the :class:`Proposer` protocol (proposing for the γ in ``gammas``): the
    context in a preallocated tensor, each proposal one ``get_candidates`` call on it."""

    def __init__(self, max_n: int, capacity: int, gammas: Sequence[int]) -> None:
        from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

        self.ids = torch.zeros(1, capacity, dtype=torch.long)
        self.length = 0
        self.generators = {gamma: PromptLookupCandidateGenerator(
            num_output_tokens=gamma, max_matching_ngram_size=max_n, max_length=capacity + gamma + 2)
            for gamma in gammas}

    def start(self, prompt_ids: Sequence[int]) -> None:
        self.length = 0
        self.extend(prompt_ids)

    def extend(self, new_ids: Sequence[int]) -> None:
        self.ids[0, self.length:self.length + len(new_ids)] = torch.tensor(new_ids, dtype=torch.long)
        self.length += len(new_ids)

    def propose(self, max_tokens: int) -> list[int]:
        out, _ = self.generators[max_tokens].get_candidates(self.ids[:, :self.length])
        return out[0, self.length:].tolist()


def teacher_forced(proposer: Proposer, text: Sequence[int], gamma: int, steps: int | None = None,
                   clock: Callable[[], float] | None = None) -> dict:
    """Verify steps with greedy acceptance over ``text`` (the tokens after the proposer's context), until the
    text ends or after ``steps`` steps: steps, emitted, proposed and accepted tokens, steps that proposed, and
    with ``clock``, the seconds spent in extend + propose."""
    i = n = proposed = accepted = proposing = 0
    seconds = 0.0
    emitted: Sequence[int] = ()
    while i < len(text) and (steps is None or n < steps):
        t0 = clock() if clock else 0.0
        proposer.extend(emitted)
        proposal = proposer.propose(gamma)
        if clock:
            seconds += clock() - t0
        a = 0
        while a < len(proposal) and i + a < len(text) and proposal[a] == text[i + a]:
            a += 1
        emitted = text[i:i + a + 1]
        i += len(emitted)
        n += 1
        proposed += len(proposal)
        accepted += a
        proposing += bool(proposal)
    return {"steps": n, "emitted": i, "proposed": proposed, "accepted": accepted, "proposing": proposing,
            "seconds": seconds}


def cost_proposers(outputs: list[list[int]], capacity: int, gammas: Sequence[int]) -> dict[str, Callable[[], Proposer]]:
    """The proposers timed: prompt lookup (ours and transformers', same n) and suffix decoding (request tree,
    and with an output cache of ``outputs``)."""
    cache = OutputCache()
    for out in outputs:
        cache.add(out)
    return {"ngram": lambda: NgramIndex(1, COST_NGRAM),
            "transformers": lambda: HFPromptLookup(COST_NGRAM, capacity, gammas),
            "suffix": SuffixDecoder,
            "suffix+outputs": lambda: SuffixDecoder(outputs=cache)}


def measure_cost(examples, contexts=CONTEXTS, gammas=GAMMAS, windows: int = 4, steps: int = 64,
                 repeats: int = 15) -> list[dict]:
    """The cost rows (module docstring): per context length, γ and proposer, µs per step and per start."""
    stream = [t for prompt, _ in examples for t in prompt]
    outputs = [highlight for _, highlight in examples]
    rows = []
    most = steps * (max(gammas) + 1)   # tokens the steps can emit
    for context in contexts:
        room = len(stream) - context - most
        if room < 0:
            print(f"skipping context {context}: the articles hold {len(stream)} tokens")
            continue
        offsets = [room * w // max(windows - 1, 1) for w in range(windows)]
        makers = cost_proposers(outputs, context + most, gammas)
        for gamma in gammas:
            step_us: dict[str, list[float]] = {name: [] for name in makers}
            start_us: dict[str, list[float]] = {name: [] for name in makers}
            emitted = dict.fromkeys(makers, 0)
            for _ in range(repeats):
                per_repeat = {name: [0.0, 0, 0.0] for name in makers}   # step seconds, steps, start seconds
                for offset in offsets:
                    for name, make in makers.items():
                        proposer = make()
                        t0 = time.perf_counter()
                        proposer.start(stream[offset:offset + context])
                        per_repeat[name][2] += time.perf_counter() - t0
                        r = teacher_forced(proposer, stream[offset + context:], gamma, steps, time.perf_counter)
                        per_repeat[name][0] += r["seconds"]
                        per_repeat[name][1] += r["steps"]
                        emitted[name] += r["emitted"]
                for name, (seconds, n, start) in per_repeat.items():
                    step_us[name].append(1e6 * seconds / n)
                    start_us[name].append(1e6 * start / len(offsets))
            for name in makers:
                row = {"context": context, "gamma": gamma, "proposer": name,
                       "step_us": median_ci(step_us[name]).to_dict(), "start_us": median_ci(start_us[name]).to_dict(),
                       "tokens_per_step": emitted[name] / (repeats * len(offsets) * steps),
                       "step_us_repeats": step_us[name]}
                if name == "ngram":
                    ratios = [hf / ours for hf, ours in zip(step_us["transformers"], step_us["ngram"])]
                    row["transformers_over_ours"] = median_ci(ratios).to_dict()
                rows.append(row)
    return rows


def measure_memory(examples, contexts=CONTEXTS) -> list[dict]:
    """Bytes held after ``start`` on the first window of each length the articles hold (tracemalloc), and the
    suffix tree's nodes."""
    stream = [t for prompt, _ in examples for t in prompt]
    rows = []
    for context in (c for c in contexts if c <= len(stream)):
        for name, make in (("ngram", lambda: NgramIndex(1, COST_NGRAM)), ("suffix", SuffixDecoder)):
            tracemalloc.start()
            proposer = make()
            proposer.start(stream[:context])
            held = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
            rows.append({"context": context, "proposer": name, "bytes": held, "bytes_per_token": held / context,
                         "nodes": len(proposer.tree) if isinstance(proposer, SuffixDecoder) else None})
    return rows


PROXY_SETTINGS: dict[str, Callable[[OutputCache], Proposer]] = {
    "ngram first 1-2 (transformers' default n)": lambda _: NgramIndex(1, 2, "first"),
    "ngram first 1-3": lambda _: NgramIndex(1, 3, "first"),
    "ngram last 1-3": lambda _: NgramIndex(1, 3, "last"),
    "ngram first 2-4": lambda _: NgramIndex(2, 4, "first"),
    "ngram last 2-4": lambda _: NgramIndex(2, 4, "last"),
    "ngram first 5-5 (vLLM's default n)": lambda _: NgramIndex(5, 5, "first"),
    "suffix (vLLM's defaults: depth 24, factor 1, p 0.1)": lambda _: SuffixDecoder(),
    "suffix factor 2": lambda _: SuffixDecoder(max_spec_factor=2.0),
    "suffix factor 2, p 0.3": lambda _: SuffixDecoder(max_spec_factor=2.0, min_token_prob=0.3),
    "suffix + outputs": lambda cache: SuffixDecoder(outputs=cache),
    "suffix + outputs, factor 2": lambda cache: SuffixDecoder(max_spec_factor=2.0, outputs=cache),
}


def measure_proxy(examples, gammas=GAMMAS) -> list[dict]:
    """The acceptance-proxy rows (module docstring): per setting and γ, summed over the articles."""
    rows = []
    for name, make in PROXY_SETTINGS.items():
        for gamma in gammas:
            cache = OutputCache()
            totals = dict.fromkeys(("steps", "emitted", "proposed", "accepted", "proposing"), 0)
            per_article = []
            for prompt, highlight in examples:
                proposer = make(cache)
                proposer.start(prompt)
                r = teacher_forced(proposer, highlight, gamma)
                if isinstance(proposer, SuffixDecoder):
                    proposer.finish()
                for key in totals:
                    totals[key] += r[key]
                per_article.append(r["emitted"] / r["steps"])
            rows.append({"setting": name, "gamma": gamma, **totals,
                         "tokens_per_step": totals["emitted"] / totals["steps"],
                         "accepted_share": totals["accepted"] / totals["proposed"] if totals["proposed"] else None,
                         "proposing_share": totals["proposing"] / totals["steps"],
                         "tokens_per_step_median_article": statistics.median(per_article)})
    return rows


def print_tables(cost: list[dict], memory: list[dict], proxy: list[dict]) -> None:
    def cell(d: dict) -> str:
        return f"{d['median']:.1f} [{d['ci_low']:.1f}, {d['ci_high']:.1f}]"

    print(format_table([{"context": r["context"], "γ": r["gamma"], "proposer": r["proposer"],
                         "µs/step": cell(r["step_us"]), "start µs": cell(r["start_us"]),
                         "tokens/step": f"{r['tokens_per_step']:.2f}",
                         "transformers/ours": cell(r["transformers_over_ours"]) if "transformers_over_ours" in r
                         else ""} for r in cost],
                       ["context", "γ", "proposer", "µs/step", "start µs", "tokens/step", "transformers/ours"]))
    print("median over repeats [order-statistic interval]; transformers/ours paired by repeat")
    print()
    print(format_table([{"context": r["context"], "proposer": r["proposer"], "KiB": f"{r['bytes'] / 1024:.0f}",
                         "bytes/token": f"{r['bytes_per_token']:.0f}", "nodes": r["nodes"] or "-"} for r in memory],
                       ["context", "proposer", "KiB", "bytes/token", "nodes"]))
    print()
    print(format_table([{"setting": r["setting"], "γ": r["gamma"], "tokens/step": f"{r['tokens_per_step']:.3f}",
                         "accepted/proposed": "-" if r["accepted_share"] is None else f"{r['accepted_share']:.3f}",
                         "steps proposing": f"{r['proposing_share']:.3f}",
                         "median article": f"{r['tokens_per_step_median_article']:.3f}"} for r in proxy],
                       ["setting", "γ", "tokens/step", "accepted/proposed", "steps proposing", "median article"]))


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m pipeline.benchmarks.proposers", description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=default_data())
    p.add_argument("--windows", type=int, default=4, help="contexts per length")
    p.add_argument("--steps", type=int, default=64, help="steps per context")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--out", type=Path, default=Path("results/bench/proposers-cpu.json"))
    args = p.parse_args(argv)
    if not args.data.is_file():
        print(f"skipping: the CNN/DailyMail fixture is not at {args.data} (set SPECSWEEP_FIXTURES or --data)")
        return 0
    examples = load_examples(args.data)
    torch.set_num_threads(1)
    probe = LoadProbe("cpu")
    cost = measure_cost(examples, windows=args.windows, steps=args.steps, repeats=args.repeats)
    load = probe.finish()
    memory = measure_memory(examples)
    proxy = measure_proxy(examples)
    print_tables(cost, memory, proxy)
    wait = load["runqueue_wait"]
    contended = wait is not None and wait["wait_fraction"] > MAX_CPU_WAIT
    print(f"while timing: other processes kept {load['others_busy_cores']:.2f} of {load['cores']} cores busy"
          + (f"; this process waited for a CPU {wait['wait_fraction']:.0%} of its ready time" if wait else "")
          + (" -- FLAGGED: a contended machine, transformers' times and the ratio are inflated" if contended else ""))
    write_json_atomic(args.out, {
        "benchmark": "proposers", "provenance": provenance("cpu"),
        "settings": {"data": str(Path(*args.data.resolve().parts[-3:])), "articles": len(examples),
                     "windows": args.windows, "steps": args.steps, "repeats": args.repeats,
                     "contexts": CONTEXTS, "gammas": GAMMAS, "cost_ngram": COST_NGRAM, "torch_threads": 1,
                     "tokenizer": WORDS.pattern},
        "load": load, "contended": contended, "cost": cost, "memory": memory, "proxy": proxy})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
