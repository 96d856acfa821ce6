"""`specsweep tune`: an Optuna multi-objective search (speedup, quality) over γ, sampler, its parameters, the draft
length and dtype; with --batch-sizes / --context-buckets one study per cell, and the schedule of what to deploy."""

from __future__ import annotations

import argparse
import dataclasses
import os

from pipeline.commands import run as run_command
from pipeline.config import RunConfig
from pipeline.errors import SpecsweepError
from pipeline.rules import param_names
from pipeline.tuning.schedule import (
    MAX_QUALITY_LOSS,
    PENALTY,
    Cell,
    describe_pick,
    parse_batch_sizes,
    parse_context_buckets,
)

HELP = "search γ, sampler, sigmoid alpha/beta (and dtype) with Optuna for the speedup/quality Pareto front"

# Run settings the study chooses per trial (or derives), so they are not flags here.
_CHOSEN = ("gamma", "sampler", "preset", "baseline", "out", "draft_schedule", "draft_confidence", "gamma_max",
           "from_config", *param_names())


def add_arguments(p: argparse.ArgumentParser) -> None:
    run_command.add_arguments(p, exclude=_CHOSEN)
    p.add_argument("--space", default="sweeps/optuna_space.yaml",
                   help="search space YAML (default: sweeps/optuna_space.yaml)")
    p.add_argument("--n-trials", "--n_trials", type=int, default=20,
                   help="completed trials the study should have, shared by all workers (default: 20)")
    p.add_argument("--study-name", "--study_name", help="study name (default: specsweep-<task>)")
    p.add_argument("--study-dir", "--study_dir", default=None,
                   help="folder for the SQLite study, trial results and baselines (default: results/tune/<task>)")
    p.add_argument("--storage", help="Optuna storage URL, e.g. postgresql://user:pw@host/db (default: "
                                     "$OPTUNA_STORAGE, else sqlite:///<study-dir>/study.db)")
    p.add_argument("--out", help="Pareto front JSON, written atomically (default: <study-dir>/pareto.json)")
    p.add_argument("--baseline", action="append", default=[],
                   help="γ = 0 results JSON to reuse as the AR baseline (repeat for several dtypes); "
                        "otherwise measured once into the study folder")
    p.add_argument("--worker", type=int, default=0,
                   help="worker number: seeds this worker's sampler with --seed + 1000 x N (default: 0)")
    p.add_argument("--heartbeat-interval", "--heartbeat_interval", type=int, default=30,
                   help="seconds between a running trial's heartbeats (default: 30)")
    p.add_argument("--grace-period", "--grace_period", type=int, default=None,
                   help="seconds without a heartbeat after which a trial counts as dead and is retried "
                        "(default: 2 x interval + 10)")
    p.add_argument("--max-retry", "--max_retry", type=int, default=2,
                   help="retries of a dead worker's trial (default: 2)")
    p.add_argument("--batch-sizes", "--batch_sizes",
                   help="comma-separated batch sizes, e.g. 1,4,16: one study per batch size (each speedup against the "
                        "γ = 0 loop at that batch size) and a schedule of the best setting per batch size, with no "
                        "speculation where nothing is faster (default: --batch-size only)")
    p.add_argument("--context-buckets", "--context_buckets",
                   help="prompt-length buckets in target tokens, LOW-HIGH (HIGH empty: no end), e.g. "
                        "0-128,128-512,512-: one study per batch size and bucket, on the prompts of that length "
                        "(text tasks)")
    p.add_argument("--spread-penalty", "--spread_penalty", type=float, default=PENALTY,
                   help="the schedule scores a setting by its median paired speedup minus this times the median "
                        f"absolute deviation of its repeats (default: {PENALTY:g})")
    p.add_argument("--max-quality-loss", "--max_quality_loss", type=float, default=MAX_QUALITY_LOSS,
                   help="quality loss a lossy rule may have to enter the schedule, against the cell's AR baseline "
                        f"(default: {MAX_QUALITY_LOSS:g})")


def main(args: argparse.Namespace) -> int:
    from pipeline.tuning.space import SearchSpace, space_for_pair  # imports torch: kept out of `specsweep --help`
    from pipeline.tuning.study import check_quality_objective, tune_schedule  # imports torch, as above

    skip = {"command", "_module", "no_progress", "space", "n_trials", "study_name", "study_dir", "storage",
            "out", "baseline", "worker", "heartbeat_interval", "grace_period", "max_retry", "batch_sizes",
            "context_buckets", "spread_penalty", "max_quality_loss"}
    values = {k: v for k, v in vars(args).items() if k not in skip}
    base = RunConfig.from_dict({**values, "out": os.devnull}).validate()
    check_quality_objective(base)   # before the space reads the models
    for path in args.baseline:
        if not os.path.isfile(path):
            raise SpecsweepError(f"--baseline {path} does not exist: run the γ = 0 baseline first")
    if args.heartbeat_interval < 1:
        raise SpecsweepError(f"--heartbeat-interval must be >= 1; got {args.heartbeat_interval}")
    space = space_for_pair(SearchSpace.load(args.space), base)
    batch_sizes, buckets = parse_batch_sizes(args.batch_sizes), parse_context_buckets(args.context_buckets)
    name = args.study_name or f"specsweep-{base.task}"
    study_dir = args.study_dir or os.path.join("results", "tune", base.task)
    out = args.out or os.path.join(study_dir, "pareto.json")
    done = tune_schedule(dataclasses.replace(base, out=out), space, study_name=name, study_dir=study_dir, out=out,
                         batch_sizes=batch_sizes, context_buckets=buckets, penalty=args.spread_penalty,
                         max_quality_loss=args.max_quality_loss, n_trials=args.n_trials, storage=args.storage,
                         baselines=args.baseline, worker=args.worker, heartbeat_interval=args.heartbeat_interval,
                         grace_period=args.grace_period, max_retry=args.max_retry, progress=not args.no_progress)
    for cell, front in done["fronts"]:
        ran = front["worker"]["trials"]
        print(f"study {front['study']} ({cell.label}): {front['n_complete']} complete, {front['n_failed']} failed of "
              f"{front['n_trials']} trials; this worker ran {len(ran)} {ran}; Pareto front "
              f"{len(front['best_trials'])} trial(s)")
        for t in front["best_trials"]:
            print(f"  trial {t['number']}: speedup {t['values']['speedup']:.3f}, quality "
                  f"{t['values']['quality']:.4f}, {t['params']}")
    for cell in done["schedule"]["cells"]:
        print(f"schedule, {Cell.from_dict(cell).label}: {describe_pick(cell['choice'])}")
    print(f"wrote {out} and the schedule {done['path']}")
    return 0
