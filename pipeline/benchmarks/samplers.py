"""`specsweep bench samplers`: time every (sampler, backend) against HF's `_speculative_sampling`.

Median seconds per verify call over rotated inputs, for B x γ x V x logit dtype. HF's function is timed
directly (batch 1 only, as HF runs it) on fp32 logits already divided by T, prepared outside the timed
region, as HF's assisted-generation loop hands them over: that favours HF slightly.

Deterministic drafts (``draft_logits=None``, pipeline/samplers/contract.py) are timed against the one-hot-logits way
of verifying the same draft, as string mode does it today (pipeline/decoding/drafters/cross_tokenizer.py builds fp32
one-hot logits [B, γ, V_t] with torch.full and scatter_, then calls the rule with them): per configuration and rule
(exact, block and, at T = 0, greedy; the kernels too where a GPU is), the two calls alternate in one process, their
order flipping every repeat, and the ratio of each pair (one-hot time / deterministic time) gives a median with its
distribution-free 95 % interval (pipeline.measure.median_ci). Both ways emit the same tokens from the same uniforms
(tests/test_deterministic_drafts.py). ``run(deterministic_only=True)`` (``--deterministic-only``) times only these.
On CUDA the eager calls are mostly host time, so each way is also timed under CUDA-graph replay (device time;
pipeline/benchmarks/kernels.py's graph_times, the one-hot build captured with the step), in rounds that alternate the
two ways,
and the replays are paired by their index.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from tqdm import tqdm

from pipeline.benchmarks.kernels import GRAPH_CALLS, graph_times
from pipeline.benchmarks.timing import format_table, median, time_calls
from pipeline.dtypes import torch_dtype
from pipeline.env_info import provenance
from pipeline.io import write_json_atomic
from pipeline.measure import median_ci
from pipeline.samplers import available_samplers, get_sampler
from pipeline.samplers.hf import hf_speculative_sampling

FULL = {"batches": (1, 16), "gammas": (1, 4, 8), "vocabs": (32_000, 128_256, 256_000),
        "dtypes": ("float32", "bfloat16")}
QUICK = {"batches": (1,), "gammas": (4,), "vocabs": (32_000,), "dtypes": ("float32",)}
# --deterministic-only: a few sizes of the deterministic-draft comparison
DETERMINISTIC = {"batches": (1, 16), "gammas": (4, 8), "vocabs": (32_000, 128_256), "dtypes": ("float32", "bfloat16")}
# rules timed with a deterministic draft against one-hot logits, and the temperature each runs at (None: the run's)
DETERMINISTIC_RULES = {"exact": None, "block": None, "greedy": 0.0}


def _inputs(B, gamma, V, dtype, device, n_sets, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    sets = []
    for _ in range(n_sets):
        tl = (torch.randn(B, gamma + 1, V, generator=g) * 3).to(device=device, dtype=dtype)
        dl = (torch.randn(B, gamma, V, generator=g) * 3).to(device=device, dtype=dtype)
        dt = torch.randint(0, V, (B, gamma), generator=g).to(device)
        sets.append((dt, dl, tl))
    return sets


def _one_hot_as_string_mode(draft_tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """fp32 [B, γ, V] logits 0 at each drafted token and -inf elsewhere, built as string mode builds them."""
    one_hot = torch.full((*draft_tokens.shape, vocab), float("-inf"), device=draft_tokens.device)
    return one_hot.scatter_(-1, draft_tokens[..., None], 0.0)


def _paired_times(calls: tuple, device: str, repeats: int, warmup: int = 3) -> list[list[float]]:
    """Seconds of each of ``calls`` (functions of the repetition index) per repetition, the calls alternating and their
    order flipped every repetition, so drift and caches fall on both alike. [len(calls)][repeats]."""
    cuda = str(device).startswith("cuda")
    for i in range(warmup):
        for fn in calls:
            fn(i)
    times = [[0.0] * repeats for _ in calls]
    for i in range(repeats):
        order = range(len(calls)) if i % 2 == 0 else reversed(range(len(calls)))
        for k in order:
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            calls[k](i)
            if cuda:
                torch.cuda.synchronize()
            times[k][i] = time.perf_counter() - t0
    return times


def deterministic_rows(sets: list, base: dict, device: str, repeats: int, temperature: float) -> list[dict]:
    """The deterministic-draft comparison of one configuration (module docstring): one row per (rule, backend) with
    the medians of both ways, the paired ratio one-hot / deterministic with its 95 % interval, and the raw times."""
    rows = []
    usable = set(available_samplers())
    for name, rule_t in DETERMINISTIC_RULES.items():
        for backend in ("torch", "cupy"):
            if (name, backend) not in usable:
                continue
            t = temperature if rule_t is None else rule_t
            sampler = get_sampler(name, backend=backend, temperature=t)
            gen = torch.Generator(device=device).manual_seed(0)

            def det(i, s=sampler, g=gen):
                dt, _, tl = sets[i % len(sets)]
                return s(dt, None, tl, generator=g)

            def one_hot(i, s=sampler, g=gen):
                dt, _, tl = sets[i % len(sets)]
                return s(dt, _one_hot_as_string_mode(dt, tl.shape[-1]), tl, generator=g)

            det_s, one_hot_s = _paired_times((det, one_hot), device, repeats)
            ratio = median_ci([o / d for o, d in zip(one_hot_s, det_s)])
            row = {**base, "sampler": name, "backend": backend, "temperature": t,
                   "deterministic_median_s": median(det_s), "one_hot_median_s": median(one_hot_s),
                   "one_hot_over_deterministic": ratio.to_dict(), "deterministic_times_s": det_s,
                   "one_hot_times_s": one_hot_s}
            if str(device).startswith("cuda"):
                row.update(_paired_graph_times(sampler, sets))
            rows.append(row)
    return rows


def _paired_graph_times(sampler, sets: list, rounds: int = 4, replays: int = 5) -> dict:
    """Device seconds per call of the deterministic and the one-hot way under CUDA-graph replay (the default CUDA
    generator: a custom one cannot be captured), ``rounds`` rounds of ``replays`` replays each, the order of the two
    flipping every round; the ratio's median and interval over replays paired by index. graph_error where capture
    fails."""

    def det(i):
        dt, _, tl = sets[i % len(sets)]
        return sampler(dt, None, tl)

    def one_hot(i):
        dt, _, tl = sets[i % len(sets)]
        return sampler(dt, _one_hot_as_string_mode(dt, tl.shape[-1]), tl)

    times: list[list[float]] = [[], []]
    try:
        for r in range(rounds):
            for k in ((0, 1) if r % 2 == 0 else (1, 0)):
                times[k] += graph_times((det, one_hot)[k], GRAPH_CALLS, replays)
    except Exception as e:  # a capture failure is reported in the row, as bench kernels reports it
        return {"graph_error": f"{type(e).__name__}: {e}"}
    ratio = median_ci([o / d for o, d in zip(times[1], times[0])])
    return {"deterministic_graph_s": median(times[0]), "one_hot_graph_s": median(times[1]),
            "graph_one_hot_over_deterministic": ratio.to_dict()}


def run(device: str = "cpu", batches=FULL["batches"], gammas=FULL["gammas"], vocabs=FULL["vocabs"],
        dtypes=FULL["dtypes"], repeats: int = 20, rotate: int = 4, temperature: float = 1.0,
        out: Path | None = None, deterministic_only: bool = False) -> dict:
    pairs = [p for p in available_samplers() if p[0] != "hf"] if not deterministic_only else []
    hf_fn = hf_speculative_sampling()
    rows, det_rows = [], []
    configs = [(B, g, V, dt) for B in batches for g in gammas for V in vocabs for dt in dtypes]
    for B, gamma, V, dtype_name in tqdm(configs, desc="bench samplers", unit="config"):
        sets = _inputs(B, gamma, V, torch_dtype(dtype_name), device, rotate, seed=B * 1000 + gamma * 10 + V)
        gen = torch.Generator(device=device).manual_seed(0)
        base = {"B": B, "gamma": gamma, "V": V, "dtype": dtype_name}
        det_rows += deterministic_rows(sets, base, device, repeats, temperature)
        for name, backend in pairs:
            sampler = get_sampler(name, backend=backend, temperature=0.0 if name == "greedy" else temperature)
            times = time_calls(lambda i, s=sampler, x=sets, g=gen: s(*x[i % rotate], generator=g), device, repeats)
            rows.append({**base, "sampler": name, "backend": backend, "median_s": median(times), "times_s": times})
        if B == 1 and not deterministic_only:
            hf_sets = [(dt, (dl.float() / temperature), (tl.float() / temperature)) for dt, dl, tl in sets]
            times = time_calls(lambda i, x=hf_sets: hf_fn(*_hf_args(x[i % rotate])), device, repeats)
            rows.append({**base, "sampler": "hf", "backend": "transformers", "median_s": median(times),
                         "times_s": times})
    result = {"benchmark": "samplers-deterministic" if deterministic_only else "samplers",
              "provenance": provenance(device),
              "settings": {"repeats": repeats, "rotate": rotate, "temperature": temperature,
                           "hf_note": "HF timed directly on fp32 logits prepared outside the timed region",
                           "deterministic_note": "draft_logits=None against fp32 one-hot logits built per call as "
                                                 "string mode builds them; paired, order flipped every repeat"},
              "results": rows, "goal": _goal(rows), "deterministic": det_rows}
    if out is not None:
        write_json_atomic(out, result)
    return result


def _hf_args(s):
    dt, dl, tl = s
    return dt, dl, dt.shape[1], tl


def _goal(rows: list[dict]) -> dict:
    """The issue's CPU goal: torch `exact` faster than HF at B = 1 for every V (every γ and dtype measured)."""
    key = lambda r: (r["gamma"], r["V"], r["dtype"])  # noqa: E731
    hf = {key(r): r["median_s"] for r in rows if r["sampler"] == "hf"}
    ratios = {f"gamma={k[0]} V={k[1]} {k[2]}": round(hf[k] / r["median_s"], 2)
              for r in rows if r["B"] == 1 and r["sampler"] == "exact" and r["backend"] == "torch"
              for k in [key(r)] if k in hf}
    return {"exact_torch_speedup_over_hf_b1": ratios, "met": bool(ratios) and min(ratios.values()) > 1.0}


def print_table(result: dict) -> None:
    if result.get("deterministic"):
        table = [{"sampler": r["sampler"], "backend": r["backend"], "T": f"{r['temperature']:g}", "B": r["B"],
                  "γ": r["gamma"], "V": r["V"], "dtype": r["dtype"],
                  "deterministic µs": f"{r['deterministic_median_s'] * 1e6:.0f}",
                  "one-hot µs": f"{r['one_hot_median_s'] * 1e6:.0f}",
                  "one-hot / deterministic [95 %]": _ratio(r["one_hot_over_deterministic"]),
                  **({"graph µs det / one-hot": f"{r['deterministic_graph_s'] * 1e6:.1f} / "
                                                f"{r['one_hot_graph_s'] * 1e6:.1f}",
                      "graph ratio [95 %]": _ratio(r["graph_one_hot_over_deterministic"])}
                     if "deterministic_graph_s" in r else {})}
                 for r in result["deterministic"]]
        print("deterministic drafts: draft_logits=None against one-hot logits (string mode's way), paired")
        print(format_table(table, list(table[0])) + "\n")
    if not result["results"]:
        return
    rows = result["results"]
    hf = {(r["gamma"], r["V"], r["dtype"]): r["median_s"] for r in rows if r["sampler"] == "hf"}
    table = []
    for r in rows:
        ref = hf.get((r["gamma"], r["V"], r["dtype"])) if r["B"] == 1 else None
        table.append({"sampler": r["sampler"], "backend": r["backend"], "B": r["B"], "γ": r["gamma"], "V": r["V"],
                      "dtype": r["dtype"], "median µs": f"{r['median_s'] * 1e6:.0f}",
                      "HF / this": f"{ref / r['median_s']:.2f}x" if ref else "-"})
    print(format_table(table, list(table[0]) if table else []))
    goal = result["goal"]
    print(f"\ngoal (torch exact faster than HF at B=1 for every V): {'met' if goal['met'] else 'NOT met'}")


def _ratio(ci: dict) -> str:
    return f"{ci['median']:.2f}x [{ci['ci_low']:.2f}, {ci['ci_high']:.2f}]"
