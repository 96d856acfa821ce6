"""Two decoding settings compared prompt by prompt: the paired mean difference of emitted tokens per verify step, with
a bootstrap interval over prompts (docs/trees.md: a token tree against a chain).

    python -m pipeline.analysis.paired_tokens A.json[,A-s1.json,...] B.json[,B-s1.json,...] [--per-prompt pooled|mean]

Each side is one setting's `specsweep run` results files, one per seed (the same seeds on both sides, the same prompts
in every file: pairing needs both). A prompt's tokens per step on a side is, from its samples (``samples[].new_tokens``
and ``verify_steps``, as the run's ``mean_accepted_tokens`` counts them: accepted drafts plus the corrected or bonus
token), either its tokens over its steps summed over the side's files (``pooled``, the default) or the mean over the
files of each file's ratio (``mean``). The difference is A − B per prompt; its mean gets a percentile bootstrap
interval over prompts (scipy.stats.bootstrap, ``--resamples`` 10 000, ``--confidence`` 0.95, ``--seed`` 0). Also
printed: each side's tokens per step over all its samples, on how many prompts A is ahead, behind or equal, and on
how many both sides emitted the same tokens (under every seed, the files paired by seed). ``--out`` writes the figures
as JSON, with what each side ran (its files, the settings of its first file, its seeds, when and on what its runs
ran) and where the comparison was made (the date, the machine, specsweep's version and the git commit), so a page can
publish it (docs/trees.md, the trees profile).
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
from pathlib import Path

import numpy as np

from pipeline.env_info import git_commit, machine, versions
from pipeline.errors import SpecsweepError
from pipeline.io import write_json_atomic
from pipeline.result import read_result
from pipeline.results_table import device_label

COMBINE = ("pooled", "mean")
# the settings of a side that --out records (from its first file: the side's files differ in their seed only)
SETTINGS = ("task", "data", "target", "draft", "drafter", "draft_tree", "tree_children", "gamma", "sampler", "backend",
            "dtype", "temperature", "limit", "max_new_tokens", "max_prompt_tokens", "threads", "device", "repeats",
            "samples_per_repeat")


def side_paths(arg: str) -> list[str]:
    """One side's results files: comma-separated files, or a folder (a pipeline stage's output): its *.json files."""
    if Path(arg).is_dir():
        files = sorted(str(p) for p in Path(arg).glob("*.json"))
        if not files:
            raise SpecsweepError(f"{arg} holds no results files (*.json): run its stage first")
        return files
    return arg.split(",")


def load_side(paths: list[str]) -> list[dict]:
    """The results files of one side; a file that is not a `specsweep run` result is a one-line error."""
    results = []
    for path in paths:
        result = read_result(path)
        if result is None:
            raise SpecsweepError(f"{path} is not a specsweep run results file (`specsweep run --out` writes one)")
        results.append(result)
    return results


def per_prompt(results: list[dict], combine: str, side: str) -> dict[str, float]:
    """{prompt id: tokens per verify step} over one side's results files (see the module docstring for ``combine``)."""
    counts: dict[str, list[tuple[int, int]]] = {}
    ids = None
    for result in results:
        samples = {s["id"]: (s["new_tokens"], s["verify_steps"]) for s in result["samples"]}
        if ids is not None and set(samples) != ids:
            raise SpecsweepError(f"{side}: its files decoded different prompts; pair runs of the same --data and "
                                 "--limit")
        ids = set(samples)
        for key, value in samples.items():
            counts.setdefault(key, []).append(value)
    out = {}
    for key, pairs in counts.items():
        if any(steps == 0 for _, steps in pairs):
            raise SpecsweepError(f"{side}: prompt {key} has no verify step in some file (a γ = 0 run?)")
        if combine == "pooled":
            out[key] = sum(t for t, _ in pairs) / sum(s for _, s in pairs)
        else:
            out[key] = statistics.fmean(t / s for t, s in pairs)
    return out


def seeds(results: list[dict]) -> list:
    return sorted(r["config"].get("seed") for r in results)


def same_tokens(a: list[dict], b: list[dict]) -> int | None:
    """How many prompts both sides decoded to the same tokens under every seed (the files paired by seed); None
    where a sample has no ``token_ids``."""
    pairs = zip(sorted(a, key=lambda r: r["config"].get("seed")), sorted(b, key=lambda r: r["config"].get("seed")))
    same: set | None = None
    for ra, rb in pairs:
        ta = {s["id"]: s.get("token_ids") for s in ra["samples"]}
        tb = {s["id"]: s.get("token_ids") for s in rb["samples"]}
        if any(t is None for t in (*ta.values(), *tb.values())):
            return None
        equal = {key for key in ta if ta[key] == tb.get(key)}
        same = equal if same is None else same & equal
    return len(same or ())


def compare(a: list[dict], b: list[dict], combine: str = "pooled", resamples: int = 10_000,
            confidence: float = 0.95, seed: int = 0) -> dict:
    """The paired comparison of sides ``a`` and ``b`` (lists of results dicts)."""
    from scipy import stats

    if combine not in COMBINE:
        raise SpecsweepError(f"--per-prompt {combine!r}: choose one of {', '.join(COMBINE)}")
    if seeds(a) != seeds(b):
        raise SpecsweepError(f"the sides ran other seeds (A {seeds(a)}, B {seeds(b)}): pair runs of the same seeds")
    pa, pb = per_prompt(a, combine, "A"), per_prompt(b, combine, "B")
    if set(pa) != set(pb):
        raise SpecsweepError(f"the sides decoded other prompts ({len(set(pa) ^ set(pb))} differ): pair runs of the "
                             "same --data and --limit")
    keys = sorted(pa)
    diff = np.array([pa[k] - pb[k] for k in keys])
    if len(keys) < 2 or np.all(diff == diff[0]):
        low = high = float(diff.mean())          # no spread: every resample has the same mean
    else:
        boot = stats.bootstrap((diff,), np.mean, n_resamples=resamples, confidence_level=confidence,
                               method="percentile", random_state=np.random.default_rng(seed))
        low, high = float(boot.confidence_interval.low), float(boot.confidence_interval.high)

    def rate(results: list[dict]) -> float:
        samples = [s for r in results for s in r["samples"]]
        return sum(s["new_tokens"] for s in samples) / sum(s["verify_steps"] for s in samples)

    return {"prompts": len(keys), "seeds": seeds(a), "per_prompt": combine, "a_tokens_per_step": rate(a),
            "b_tokens_per_step": rate(b), "mean_difference": float(diff.mean()), "ci_low": low, "ci_high": high,
            "confidence": confidence, "resamples": resamples, "a_ahead": int((diff > 0).sum()),
            "a_behind": int((diff < 0).sum()), "equal": int((diff == 0).sum()), "same_tokens": same_tokens(a, b)}


def side(paths: list[str], results: list[dict]) -> dict:
    """What one side ran, for ``--out``: its files, its first file's :data:`SETTINGS`, its seeds, and the dates and
    devices of its runs."""
    dates = sorted((r.get("provenance") or {}).get("date") or "" for r in results)
    return {"files": paths, "settings": {k: results[0]["config"].get(k) for k in SETTINGS}, "seeds": seeds(results),
            "ran": {"first": dates[0] or None, "last": dates[-1] or None,
                    "devices": sorted({device_label((r.get("provenance") or {}).get("device"),
                                                    (r.get("resolved") or {}).get("device")) for r in results})}}


def published(command: str, a_paths: list[str], a: list[dict], b_paths: list[str], b: list[dict], figures: dict,
              root: Path = Path(".")) -> dict:
    """The ``--out`` file: the ``figures`` of :func:`compare`, each side (:func:`side`) and where the comparison was
    made (``root``: the checkout whose commit is recorded)."""
    commit = git_commit(root)
    return {"published": "a paired comparison of two decoding settings' emitted tokens per verify step, prompt by "
                         f"prompt, written by `{command}`",
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "version": versions().get("specsweep"), "commit": commit["commit"], "dirty": commit["dirty"],
            "machine": machine(), "sides": {"a": side(a_paths, a), "b": side(b_paths, b)}, **figures}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.analysis.paired_tokens",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("a", help="setting A: comma-separated results files (one per seed), or a folder of them")
    parser.add_argument("b", help="setting B: comma-separated results files, the same seeds and prompts, or a folder")
    parser.add_argument("--per-prompt", default="pooled", choices=COMBINE,
                        help="a prompt's tokens per step over the seeds: pooled (its tokens over its steps) or mean "
                             "(of each seed's ratio)")
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap's generator seed")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON")
    args = parser.parse_args(argv)
    try:
        a_paths, b_paths = side_paths(args.a), side_paths(args.b)
        a, b = load_side(a_paths), load_side(b_paths)
        r = compare(a, b, args.per_prompt, args.resamples, args.confidence, args.seed)
    except SpecsweepError as e:
        print(f"paired_tokens: error: {e}", file=sys.stderr)
        return 2
    print(f"A {r['a_tokens_per_step']:.3f} tokens per step, B {r['b_tokens_per_step']:.3f}; A − B per prompt "
          f"({r['per_prompt']} over seeds {r['seeds']}): {r['mean_difference']:+.3f} [{r['ci_low']:+.3f}, "
          f"{r['ci_high']:+.3f}] ({r['confidence']:.0%} bootstrap interval over {r['prompts']} prompts, "
          f"{r['resamples']} resamples); A ahead on {r['a_ahead']}, behind on {r['a_behind']}, equal on {r['equal']}"
          + ("" if r["same_tokens"] is None else f"; the same tokens on {r['same_tokens']}"))
    if args.out:
        command = " ".join(["python -m pipeline.analysis.paired_tokens", *(argv if argv is not None else sys.argv[1:])])
        write_json_atomic(args.out, published(command, a_paths, a, b_paths, b, r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
