"""The Optuna study: a worker's trials, their AR baselines, and one study per batch size and prompt length.

Search space (a YAML file, by default sweeps/optuna_space.yaml): γ, the acceptance rule (the tunable ones of
pipeline/rules.py, e.g. exact, sigmoid, typical), each rule's parameters over the registry's ranges (sampled only
in that rule's trials: the sigmoid's alpha and beta; integer ones such as relaxed's top_k with suggest_int),
optionally dtype, and the draft length (``draft``: fixed γ, the heuristic schedule up to a sampled γ_max, or a
sampled confidence threshold; pipeline/decoding/draft_policy.py). Each trial is one :func:`pipeline.runner.run`
of the base RunConfig with the trial's settings; its objectives are

    speedup   the paired median speedup: tokens/s over the γ = 0 loop's of the same engine and target, timed in
              interleaved repeats inside the trial's run (pipeline/paired.py)
    quality   ROUGE-L (cnn_dailymail) or -WER (librispeech): both maximised

A trial whose speed measurement is flagged (too wide an interval, implausible against its theoretical
speedup, or contended for the CPU; pipeline/measure.py) is measured once more; if it stays flagged the trial
fails with the reasons, so no flagged speedup reaches the study (:func:`measured_run`).

Workers: any number of processes, on any number of machines, run the same command against one storage
(SQLite in the study folder by default; any RDB URL through ``--storage`` or $OPTUNA_STORAGE). Trials are
claimed through the storage, so none is run twice; a worker writes a heartbeat while it runs a trial, and the
next worker to start a trial marks trials whose heartbeat went stale (a dead worker's) as failed and enqueues
a retry of the same parameters (RetryFailedTrialCallback); a trial whose worker died before its first heartbeat
gets one from the next worker to start (:func:`adopt_orphaned_trials`), and so goes stale the same way. A trial
that raises is recorded as failed and the study goes on. ``--n-trials`` is the study's total number of completed
trials, shared by all workers.

AR baseline (for the quality reference and ``tradeoff``; the speedup is paired inside each trial): one per
(study, dtype). ``--baseline FILE`` reuses a γ = 0 results file (the DVC pipeline passes
the shared one); otherwise the first worker that needs one measures it into the study folder
(``baseline-<dtype>.json``, under a lock file) and every later trial and worker reuses it. Speedups are only
comparable on one kind of machine: on many machines without a shared folder, each measures its own.

The Pareto front (``study.best_trials``) is written atomically to JSON after every trial and at the end.

Batch size and prompt length (:func:`tune_schedule`, ``--batch-sizes``, ``--context-buckets``): one study per cell,
then the schedule of what to deploy per cell (pipeline/tuning/schedule.py), written next to the front by each worker as
it finishes.
"""


from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import socket
from pathlib import Path

from pipeline.config import RunConfig
from pipeline.data import load_task_data
from pipeline.errors import SpecsweepError
from pipeline.io import file_lock, write_json_atomic, write_text_atomic
from pipeline.models import load_tokenizer
from pipeline.objectives import QUALITY, quality_value, tradeoff
from pipeline.result import read_result
from pipeline.runner import BASELINE_KEYS, run
from pipeline.tasks import get_task
from pipeline.tracking import log_trial, wandb_run, warn
from pipeline.tuning.schedule import (
    MAX_QUALITY_LOSS,
    PENALTY,
    build_schedule,
    cells_of,
    context_label,
    schedule_path,
    write_cell,
    write_schedule,
)
from pipeline.tuning.space import OBJECTIVES, SearchSpace
from pipeline.tuning.storage import (
    adopt_orphaned_trials,
    effective_grace,
    open_study,
    pareto_front,
    redact,
    storage_url,
)
from pipeline.weights import resolve

# ---------------------------------------------------------------------------------------------- baselines

def baseline_for(base: RunConfig, dtype: str, study_dir: Path, given: list[str], progress: bool) -> str:
    """Path of the AR baseline (γ = 0) results for ``dtype``: a given file with matching settings, else the
    study folder's ``baseline-<dtype>.json``, measured once (under a lock) when missing or stale."""

    want = dataclasses.replace(base, dtype=dtype, gamma=0, sampler="exact", rule_params={}, preset=None,
                               baseline=None).to_dict()

    def matches(path: Path) -> bool:
        try:
            cfg = read_result(path)["config"]
        except (SpecsweepError, KeyError, TypeError):
            return False
        return cfg.get("gamma") == 0 and all(cfg.get(k) == want[k] for k in BASELINE_KEYS)

    for path in given:
        if matches(Path(path)):
            return str(path)
    out = study_dir / f"baseline-{dtype}.json"
    with file_lock(study_dir / f".baseline-{dtype}.lock"):
        if not matches(out):
            cfg = dataclasses.replace(RunConfig.from_dict(want), out=str(out), wandb_mode="disabled")
            run(cfg, progress=progress)
    return str(out)




def tune(base: RunConfig, space: SearchSpace, *, study_name: str, study_dir: str | os.PathLike, out: str,
         n_trials: int, storage: str | None = None, baselines: list[str] | None = None, worker: int = 0,
         heartbeat_interval: int = 30, grace_period: int | None = None, max_retry: int = 2,
         progress: bool = True) -> dict:
    """Run this worker's share of the study until it has ``n_trials`` completed trials; returns the front."""
    import optuna


    _check_tune_args(base, n_trials)
    study_dir = Path(study_dir)
    (study_dir / "trials").mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = _open_worker_study(space, study_name, storage_url(storage, study_dir), base.seed + 1000 * worker,
                               heartbeat_interval, grace_period, max_retry)
    worker_id = f"{socket.gethostname()}:{os.getpid()}"
    ran: list[int] = []
    failed: list[int] = []

    with wandb_run(mode=base.wandb_mode, project=base.wandb_project, group=base.wandb_group or study_name,
                   job_type=f"tune-{base.task}", name=f"{study_name}-{worker_id}",
                   config={**base.to_dict(), "study": study_name, "n_trials": n_trials,
                           "space": dataclasses.asdict(space)}) as wb:

        def objective(trial) -> tuple[float, float]:
            """One trial's (speedup, quality), recorded in ``ran``; a trial that raises is recorded in ``failed``
            with its reason (user attribute ``fail_reason``) and fails; a pruned one is neither."""
            try:
                ran.append(trial.number)
                params, result, speedup, quality = _run_trial(trial, base, space, study_dir, baselines or [],
                                                              worker_id, run)
                score = tradeoff(result)
                trial.set_user_attr("tradeoff", score)
                if wb is not None:
                    log_trial(wb, pareto_front(study)["best_trials"], trial.number, params, speedup, quality, score)
                return speedup, quality
            except optuna.TrialPruned:       # a combination the space does not run (pipeline/tuning/space.py)
                raise
            except Exception as e:
                failed.append(trial.number)
                trial.set_user_attr("fail_reason", " ".join(str(e).split())[:1000])
                raise

        _optimize(study, objective, n_trials, failed, out, progress)
        front = _write_front(study, out, wb)
    front["worker"] = {"id": worker_id, "trials": ran}
    return front


def tune_schedule(base: RunConfig, space: SearchSpace, *, study_name: str, study_dir: str | os.PathLike, out: str,
                  batch_sizes: list[int] | None = None, context_buckets: list | None = None,
                  penalty: float = PENALTY, max_quality_loss: float = MAX_QUALITY_LOSS, progress: bool = True,
                  **study_kwargs) -> dict:
    """The study per (batch size, prompt-length bucket) cell (pipeline/tuning/schedule.py), then the schedule, written
    next to the front (:func:`pipeline.tuning.schedule.schedule_path`); returns {"fronts": [(cell, front)],
    "schedule", "path"}.

    The cell of the base batch size over every prompt is the study itself (``study_dir``, ``study_name``, ``out``:
    what a study without these dimensions writes, and what the report reads); every other cell is a study of its
    own in ``study_dir/cells/<key>/`` named ``<study_name>-<key>``, on the prompts of its bucket. Each trial's
    speedup is paired against the γ = 0 loop at the cell's batch size, inside its run; each cell measures its own
    AR baseline unless a ``--baseline`` file matches it. With no cell left at the base, ``out`` lists the cells."""
    check_quality_objective(base)     # before any cell's baseline runs
    study_dir = Path(study_dir)
    if context_buckets and get_task(base.task).speech:
        raise SpecsweepError(f"--context-buckets splits text prompts by their length; --task {base.task} is speech: "
                             "leave --context-buckets out")
    cells = cells_of(batch_sizes, context_buckets, base.batch_size)
    fronts, folders = [], []
    for cell in cells:
        root = cell.context is None and cell.batch_size == base.batch_size
        folder = study_dir if root else study_dir / "cells" / cell.key
        name = study_name if root else f"{study_name}-{cell.key}"
        cell_out = out if root else str(folder / "pareto.json")
        data = base.data if cell.context is None else str(bucket_data(base, cell, folder))
        cell_base = dataclasses.replace(base, batch_size=cell.batch_size, data=data, out=cell_out).validate()
        if not root:
            write_cell(folder, cell, name)
        if progress and len(cells) > 1:
            print(f"study {name}: {cell.label}", flush=True)
        fronts.append((cell, tune(cell_base, space, study_name=name, study_dir=folder, out=cell_out,
                                  progress=progress, **study_kwargs)))
        folders.append((cell, folder))
    if not any(c.context is None and c.batch_size == base.batch_size for c in cells):
        listed = [{**cell.to_dict(), "study": front["study"], "front": str(folder / "pareto.json"),
                   "n_complete": front["n_complete"], "n_failed": front["n_failed"]}
                  for (cell, front), (_, folder) in zip(fronts, folders)]
        write_json_atomic(out, {"study": study_name, "objectives": list(OBJECTIVES), "best_trials": [],
                                "cells": listed})
    schedule = build_schedule(folders, study=study_name, penalty=penalty, max_quality_loss=max_quality_loss)
    path = write_schedule(schedule_path(out), schedule)
    return {"fronts": fronts, "schedule": schedule, "path": str(path)}


def bucket_data(base: RunConfig, cell, folder: Path) -> Path:
    """``folder/prompts.jsonl``: the records of ``base.data`` whose prompt, as the run encodes it (the target's
    tokenizer, --max-prompt-tokens, the long-inputs rule), has a length in the cell's bucket; in the task's source
    schema, so the cell's runs read it as they read any data file (and take its --limit subset)."""
    from types import SimpleNamespace

    from transformers import AutoConfig

    task = get_task(base.task)
    records = load_task_data(base.task, base.data)
    tokenizer = load_tokenizer(base.target)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    try:
        target_config = AutoConfig.from_pretrained(resolve(base.target))   # a registry name: its folder
    except (OSError, ValueError) as e:
        raise SpecsweepError(f"--target {base.target}: cannot read its config ({' '.join(str(e).split())[:120]})") \
            from None
    encode = task.encoder(SimpleNamespace(config=target_config), tokenizer, None, base)
    kept = []
    for start in range(0, len(records), 64):
        batch = records[start: start + 64]
        lengths = encode(batch)[0]["attention_mask"].sum(dim=1).tolist()
        kept += [r for r, n in zip(batch, lengths) if cell.holds(int(n))]
    if not kept:
        raise SpecsweepError(f"--context-buckets: no prompt of {base.data} has a length in "
                             f"{context_label(cell.context)} (of {len(records)}, as the target's tokenizer counts "
                             "them after --max-prompt-tokens): "
                             "widen or drop that bucket")
    path = folder / "prompts.jsonl"
    write_text_atomic(path, "".join(json.dumps({k: r[k] for k in task.columns}) + "\n" for r in kept))
    return path


def check_quality_objective(base: RunConfig) -> None:
    """Raise SpecsweepError unless ``base.task`` has a quality metric defined at ``base.temperature``."""
    if base.task not in QUALITY:
        raise SpecsweepError(f"specsweep tune needs a task with a quality metric ({sorted(QUALITY)}); "
                             f"got --task {base.task}")
    undefined = get_task(base.task).quality_error(base.temperature)
    if undefined is not None:
        raise SpecsweepError(f"specsweep tune optimises the quality, and {undefined}")


def _check_tune_args(base: RunConfig, n_trials: int) -> None:
    """Raise SpecsweepError unless ``base.task`` has a quality metric (:func:`check_quality_objective`) and
    ``n_trials`` >= 1."""
    check_quality_objective(base)
    if n_trials < 1:
        raise SpecsweepError(f"--n-trials must be >= 1; got {n_trials}")


def _open_worker_study(space: SearchSpace, name: str, url: str, seed: int, heartbeat_interval: int,
                       grace_period: int | None, max_retry: int):
    """:func:`open_study`, then give a heartbeat to orphaned trials (:func:`adopt_orphaned_trials`) and enqueue the
    space's known-good point unless it already is; returns the study."""
    study = open_study(name, url, seed, heartbeat_interval, grace_period, max_retry)
    _check_same_space(study, space, name, url)
    # trials a worker claimed and died before its first heartbeat
    adopt_orphaned_trials(study, effective_grace(heartbeat_interval, grace_period))
    study.enqueue_trial(space.first_point(), skip_if_exists=True)
    return study


def _check_same_space(study, space: SearchSpace, name: str, url: str) -> None:
    """Record the search space on a new study; refuse to continue a study with another one (Optuna cannot change a
    categorical choice list mid-study, and mixing spaces would make its front meaningless)."""
    ours = space.recorded()  # tuples as lists, as the storage returns them
    stored = study.user_attrs.get("space")
    if stored is None:
        study.set_user_attr("space", ours)
    elif stored != ours:
        differ = sorted(k for k in set(stored) | set(ours) if stored.get(k) != ours.get(k))
        raise SpecsweepError(f"study {name} in {redact(url)} was created with another search space (it differs in "
                             f"{differ}): give a new --study-name, or delete the study (its folder) to start over")


def _run_trial(trial, base: RunConfig, space: SearchSpace, study_dir: Path, baselines: list[str], worker_id: str,
               run) -> tuple[dict, dict, float, float]:
    """Sample the trial's settings and run them on ``base`` (:func:`measured_run` of ``run``, results in
    ``study_dir/trials/<number>.json``), recording the worker, results path and re-measurement on the trial.
    Returns (params, results, speedup, quality); raises SpecsweepError when speedup or quality is missing or not
    finite."""
    params = space.suggest(trial, base.temperature)
    trial.set_user_attr("worker", worker_id)
    baseline = baseline_for(base, params["dtype"], study_dir, baselines, progress=False)
    results_path = study_dir / "trials" / f"{trial.number:05d}.json"
    cfg = RunConfig.from_dict({**base.to_dict(), **params, "preset": None, "baseline": baseline,
                               "out": str(results_path), "wandb_mode": "disabled"}).validate()
    trial.set_user_attr("results", str(results_path))
    result = measured_run(cfg, run, f"trial {trial.number}")
    trial.set_user_attr("remeasured", result["measurement"].get("remeasured", False))
    speedup = result["metrics"].get("speedup")
    quality = quality_value(base.task, result["quality"])
    if speedup is None or quality is None or not (math.isfinite(speedup) and math.isfinite(quality)):
        raise SpecsweepError(f"trial {trial.number}: no speedup/quality in {results_path}")
    return params, result, speedup, quality


def _optimize(study, objective, n_trials: int, failed: list[int], out: str, progress: bool) -> None:
    """Run ``objective`` until the study has ``n_trials`` completed trials, writing the Pareto front to ``out``
    after each trial. Failed trials do not count towards ``n_trials``, but the worker stops (with a warning) once
    ``failed``, this worker's failed trials as ``objective`` records them, holds ``n_trials``."""
    import optuna
    from optuna.study import MaxTrialsCallback


    def write_front(study, _trial=None) -> None:
        write_json_atomic(out, pareto_front(study))

    complete = (optuna.trial.TrialState.COMPLETE,)
    # Failed trials do not count towards --n-trials: go on until the study has enough completed ones, but
    # stop a worker whose own trials keep failing (--n-trials failures) instead of looping for ever.
    while (done := len(study.get_trials(deepcopy=False, states=complete))) < n_trials:
        if len(failed) >= n_trials:
            warn(f"stopping this worker: {len(failed)} of its trials failed (see the errors above)")
            break
        study.optimize(objective, n_trials=n_trials - done, catch=(Exception,), gc_after_trial=False,
                       callbacks=[MaxTrialsCallback(n_trials, states=complete), write_front],
                       show_progress_bar=progress)


def _write_front(study, out: str, wb) -> dict:
    """Write the study's Pareto front to ``out`` and, with a W&B run ``wb``, its counts to the run's summary
    (best effort); returns the front."""
    front = pareto_front(study)
    write_json_atomic(out, front)
    if wb is not None:
        with contextlib.suppress(Exception):
            wb.summary.update({"n_complete": front["n_complete"], "n_failed": front["n_failed"],
                               "pareto_size": len(front["best_trials"])})
    return front


def measured_run(cfg: RunConfig, run, name: str) -> dict:
    """``run(cfg)``, re-measured once when its speed measurement is flagged (pipeline/measure.py); a measurement
    flagged twice raises SpecsweepError with the reasons, which fails the trial. The results record whether it
    was re-measured (``measurement.remeasured``)."""
    result = run(cfg, progress=False)
    if not result["metrics"].get("flagged"):
        return result
    result = run(cfg, progress=False)
    result["measurement"]["remeasured"] = True
    if result["metrics"].get("flagged"):
        raise SpecsweepError(f"{name}: speed measurement flagged twice ({'; '.join(result['measurement']['flags'])})")
    write_json_atomic(cfg.out, result)
    return result
