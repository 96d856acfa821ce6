"""Optuna search over verify settings: a multi-objective study maximising speedup and quality.

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
then the schedule of what to deploy per cell (pipeline/schedule.py), written next to the front by each worker as it
finishes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import socket
import sys
import time
from pathlib import Path

import yaml

from pipeline.config import RunConfig
from pipeline.dtypes import DTYPES
from pipeline.errors import SpecsweepError
from pipeline.io import write_json_atomic
from pipeline.objectives import QUALITY, quality_value, tradeoff
from pipeline.result import read_result
from pipeline.rules import get_rule, param_names, tunable
from pipeline.schedule import MAX_QUALITY_LOSS, PENALTY
from pipeline.tasks import get_task

OBJECTIVES = ("speedup", "quality")


# ---------------------------------------------------------------------------------------------- search space

Range = tuple[float, float, bool]  # (low, high, log scale)


def _rule_ranges(rule_name: str) -> dict[str, Range]:
    """A rule's parameter ranges as the registry gives them (pipeline/rules.py)."""
    return {p.name: (p.low, p.high, p.log) for p in get_rule(rule_name).params}


def _integer_params(rule_name: str) -> set[str]:
    """The rule's integer-valued parameters (sampled with suggest_int over the integers in their range)."""
    return {p.name for p in get_rule(rule_name).params if p.integer}


DRAFT_MODES = ("fixed", "heuristic", "confidence")
"""How a trial drafts (pipeline/decoding/draft_policy.py): fixed γ; the heuristic schedule from γ up to γ_max; or the
confidence threshold with γ as the most a step drafts."""
_DRAFT_DEFAULTS = {"drafts": ("fixed",), "draft_confidence": (0.1, 0.9, False), "gamma_max": (2, 8)}


@dataclasses.dataclass
class SearchSpace:
    """Ranges a trial samples from (see sweeps/optuna_space.yaml). ``params``: per acceptance rule, the range of
    each of its parameters; a rule's parameters are sampled only in trials that chose it. Unset ranges are the
    registry's. ``drafts``: the draft-length modes (:data:`DRAFT_MODES`) a trial chooses from, with the confidence
    threshold's range (confidence trials) and γ_max's (heuristic trials, at least the trial's γ). ``tokenizer_modes``:
    for a draft with another tokenizer, the draft-tokenizer modes a trial chooses from
    (pipeline/decoding/drafters/cross_tokenizer.py;
    empty: not searched, the run's own setting)."""

    gamma: tuple[int, int] = (1, 8)
    samplers: tuple[str, ...] = dataclasses.field(default_factory=tunable)
    params: dict[str, dict[str, Range]] = dataclasses.field(default_factory=dict)
    dtypes: tuple[str, ...] = ("float32",)
    known_good: dict = dataclasses.field(default_factory=lambda: {"sampler": "exact", "gamma": 4})
    drafts: tuple[str, ...] = ("fixed",)
    draft_confidence: Range = (0.1, 0.9, False)
    gamma_max: tuple[int, int] = (2, 8)
    tokenizer_modes: tuple[str, ...] = ()

    @classmethod
    def load(cls, path: str | os.PathLike) -> SearchSpace:
        """Read and check a search-space YAML; a problem is a one-line SpecsweepError."""
        try:
            raw = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as e:
            raise SpecsweepError(f"search space {path}: cannot read it ({' '.join(str(e).split())[:160]})") from None
        if not isinstance(raw, dict):
            raise SpecsweepError(f"search space {path}: expected a mapping of settings")
        known = {"gamma", "sampler", "params", "dtype", "known_good", "draft", "draft_confidence", "gamma_max"}
        if set(raw) - known:
            moved = sorted(set(raw) & set(param_names()))
            hint = (f" (rule parameters go under params: <rule>:, e.g. params: {{sigmoid: {{{moved[0]}: ...}}}})"
                    if moved else "")
            raise SpecsweepError(f"search space {path}: unknown keys {sorted(set(raw) - known)}; known: "
                                 f"{sorted(known)}{hint}")
        try:
            space = cls(
                gamma=tuple(int(v) for v in _range(raw.get("gamma", {"low": 1, "high": 8}))[:2]),
                samplers=tuple(raw.get("sampler", tunable())),
                params={rule: {name: _range(spec) for name, spec in (ranges or {}).items()}
                        for rule, ranges in (raw.get("params") or {}).items()},
                dtypes=tuple(raw.get("dtype", ("float32",))),
                known_good=dict(raw.get("known_good", {"sampler": "exact", "gamma": 4})),
                drafts=tuple(raw.get("draft", ("fixed",))),
                draft_confidence=_range(raw.get("draft_confidence", {"low": 0.1, "high": 0.9})),
                gamma_max=tuple(int(v) for v in _range(raw.get("gamma_max", {"low": 2, "high": 8}))[:2]),
            )
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise SpecsweepError(f"search space {path}: {e}") from None
        return space.check(path)

    def check(self, where: object = "search space") -> SearchSpace:
        if not self.samplers or set(self.samplers) - set(tunable()):
            raise SpecsweepError(f"{where}: sampler must be a non-empty list from {list(tunable())}")
        if not self.dtypes or set(self.dtypes) - set(DTYPES):
            raise SpecsweepError(f"{where}: dtype must be a non-empty list from {list(DTYPES)}")
        if self.gamma[0] < 1 or self.gamma[0] > self.gamma[1]:
            raise SpecsweepError(f"{where}: gamma needs 1 <= low <= high; got {list(self.gamma)}")
        if not self.drafts or set(self.drafts) - set(DRAFT_MODES):
            raise SpecsweepError(f"{where}: draft must be a non-empty list from {list(DRAFT_MODES)}")
        lo, hi, _ = self.draft_confidence
        if not 0 < lo <= hi < 1:
            raise SpecsweepError(f"{where}: draft_confidence needs 0 < low <= high < 1 (a probability); got {[lo, hi]}")
        if self.gamma_max[0] > self.gamma_max[1] or self.gamma_max[1] < self.gamma[0]:
            raise SpecsweepError(f"{where}: gamma_max needs low <= high and high >= gamma's low; got "
                                 f"{list(self.gamma_max)}")
        for rule, ranges in self.params.items():
            if rule not in self.samplers:
                raise SpecsweepError(f"{where}: params for {rule!r}, which is not in sampler {list(self.samplers)}")
            unknown = sorted(set(ranges) - set(_rule_ranges(rule)))
            if unknown:
                raise SpecsweepError(f"{where}: {rule} has no parameter(s) {unknown}; it has "
                                     f"{list(_rule_ranges(rule))}")
        for rule in self.samplers:
            for name, (lo, hi, log) in self.ranges(rule).items():
                if lo > hi or (log and lo <= 0) or (name in _integer_params(rule) and math.ceil(lo) > math.floor(hi)):
                    raise SpecsweepError(f"{where}: bad {rule} {name} range {[lo, hi]}{' (log scale)' if log else ''}")
        return self

    def ranges(self, rule: str) -> dict[str, Range]:
        """The search range of each of ``rule``'s parameters: the space's where it sets one, else the registry's."""
        return {**_rule_ranges(rule), **self.params.get(rule, {})}

    def first_point(self, gamma: int | None = None) -> dict:
        """The known-good point enqueued before any sampled trial: the exact sampler (lossless)."""
        point = {"sampler": "exact", "gamma": self.known_good.get("gamma", 4), "dtype": self.dtypes[0],
                 **{k: v for k, v in self.known_good.items() if k in ("sampler", "gamma", "dtype")}}
        if gamma is not None:
            point["gamma"] = gamma
        point["gamma"] = min(max(int(point["gamma"]), self.gamma[0]), self.gamma[1])
        if point["sampler"] not in self.samplers:
            point["sampler"] = self.samplers[0]
        if self.searches_drafts:
            point["draft"] = "fixed" if "fixed" in self.drafts else self.drafts[0]
        if self.tokenizer_modes:
            point["draft_tokenizer_mode"] = self.tokenizer_modes[0]
        return point

    @property
    def searches_drafts(self) -> bool:
        """Whether trials choose a draft-length mode (else every trial drafts a fixed γ, as before)."""
        return self.drafts != ("fixed",)

    def recorded(self) -> dict:
        """The space as a study records it (JSON types); the draft-length settings only when they are searched, so a
        study created before they existed continues with the same space."""
        space = json.loads(json.dumps(dataclasses.asdict(self)))
        if not self.searches_drafts:
            for key in _DRAFT_DEFAULTS:
                space.pop(key)
        if not self.tokenizer_modes:
            space.pop("tokenizer_modes")
        return space

    def suggest(self, trial) -> dict:
        """Sample one trial's settings (a rule's parameters exist only in trials of that rule)."""
        params = {"gamma": trial.suggest_int("gamma", *self.gamma),
                  "sampler": trial.suggest_categorical("sampler", list(self.samplers)),
                  "dtype": trial.suggest_categorical("dtype", list(self.dtypes))}
        integers = _integer_params(params["sampler"])
        for name, (lo, hi, log) in self.ranges(params["sampler"]).items():
            if name in integers:
                params[name] = trial.suggest_int(name, math.ceil(lo), math.floor(hi), log=log)
            else:
                params[name] = trial.suggest_float(name, lo, hi, log=log)
        if self.searches_drafts:
            params.update(self._suggest_draft(trial, params["gamma"]))
        if self.tokenizer_modes:
            params["draft_tokenizer_mode"] = trial.suggest_categorical("draft_tokenizer_mode",
                                                                       list(self.tokenizer_modes))
        return params

    def _suggest_draft(self, trial, gamma: int) -> dict:
        """The trial's draft length as run settings (draft_schedule, draft_confidence, gamma_max)."""
        mode = trial.suggest_categorical("draft", list(self.drafts))
        if mode == "heuristic":
            top = max(gamma, self.gamma_max[1])
            return {"draft_schedule": "heuristic", "draft_confidence": 0.0,
                    "gamma_max": trial.suggest_int("gamma_max", min(max(gamma, self.gamma_max[0]), top), top)}
        if mode == "confidence":
            lo, hi, log = self.draft_confidence
            return {"draft_schedule": "constant", "gamma_max": None,
                    "draft_confidence": trial.suggest_float("draft_confidence", lo, hi, log=log)}
        return {"draft_schedule": "constant", "draft_confidence": 0.0, "gamma_max": None}


def _range(spec) -> Range:
    """{low, high[, log]} or [low, high] -> (low, high, log)."""
    if isinstance(spec, dict):
        return float(spec["low"]), float(spec["high"]), bool(spec.get("log", False))
    lo, hi = spec
    return float(lo), float(hi), False


# ---------------------------------------------------------------------------------------------- storage

def storage_url(storage: str | None, study_dir: str | os.PathLike) -> str:
    """--storage, else $OPTUNA_STORAGE, else SQLite in the study folder."""
    url = storage or os.environ.get("OPTUNA_STORAGE")
    if url:
        return url
    path = Path(study_dir).resolve() / "study.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def open_study(name: str, url: str, seed: int, heartbeat_interval: int = 30, grace_period: int | None = None,
               max_retry: int = 2):
    """Create or load a two-objective study (both maximised) with heartbeats and retries of stale trials."""
    import optuna
    from optuna.storages import RDBStorage

    url = _with_driver(url)
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    for attempt in range(_SCHEMA_RACE_ATTEMPTS):
        try:
            storage = RDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat_interval,
                                 grace_period=effective_grace(heartbeat_interval, grace_period),
                                 heartbeat_stale_trial_callback=retry_callback()(max_retry=max_retry))
            break
        except Exception as e:
            if _lost_schema_race(e) and attempt + 1 < _SCHEMA_RACE_ATTEMPTS:
                time.sleep(0.2 + random.random() * 0.8 * (attempt + 1))  # the winner finishes creating it
                continue
            raise SpecsweepError(f"cannot open the study storage {_redact(url)} "
                                 f"({' '.join(str(e).split())[:160]})") from None
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=4)
    return optuna.create_study(study_name=name, storage=storage, directions=["maximize", "maximize"],
                               sampler=sampler, load_if_exists=True)


_SCHEMA_RACE_ATTEMPTS = 6


def _lost_schema_race(error: Exception) -> bool:
    """True when opening a fresh database failed because another worker was creating its tables at that moment.

    Optuna creates its schema (and Alembic's version table) on first use without a lock, so workers started
    together on an empty PostgreSQL or SQLite database can collide: one gets "already exists" or a unique
    violation on the catalogue (optuna/optuna#1092). The tables exist once the winner is done, so the loser
    just opens the storage again.
    """
    import sqlalchemy.exc

    if not isinstance(error, (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError,
                              sqlalchemy.exc.OperationalError)):
        return False
    text = str(error).lower()
    return any(key in text for key in ("already exists", "duplicate key", "unique constraint"))


def effective_grace(heartbeat_interval: int, grace_period: int | None) -> int:
    """Seconds without a heartbeat after which a trial counts as dead (default: two intervals and 10 s)."""
    return grace_period or 2 * heartbeat_interval + 10


def adopt_orphaned_trials(study, grace: float) -> list[int]:
    """Give a heartbeat to every RUNNING trial that started more than ``grace`` seconds ago; returns their numbers.

    Optuna fails a dead worker's trial once its heartbeat is older than the grace period, but only if it ever
    had one: a worker killed between claiming a trial and its first heartbeat (a few milliseconds) leaves a
    trial that would stay RUNNING for ever, and its parameters would never be retried. Called when a worker
    starts, after Optuna has failed the stale trials it knows: a trial still RUNNING and older than the grace
    period is either alive (its heartbeat is fresh, and one more changes nothing) or such an orphan, which
    now goes stale after one grace period and is failed and retried like any dead worker's trial.
    """
    import datetime

    import optuna

    storage = study._storage  # what optuna.storages.fail_stale_trials uses too
    if not hasattr(storage, "record_heartbeat"):
        return []
    optuna.storages.fail_stale_trials(study)
    cutoff = datetime.datetime.now() - datetime.timedelta(seconds=grace)  # Optuna stores local naive times
    adopted = []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if trial.datetime_start is not None and trial.datetime_start < cutoff:
            storage.record_heartbeat(trial._trial_id)
            adopted.append(trial.number)
    return adopted


def retry_callback():
    """Optuna's callback that re-enqueues a dead worker's trial (RetryHeartbeatStaleTrialCallback, formerly
    RetryFailedTrialCallback)."""
    import optuna.storages

    storages = optuna.storages
    return getattr(storages, "RetryHeartbeatStaleTrialCallback", None) or storages.RetryFailedTrialCallback


def _with_driver(url: str) -> str:
    """``postgresql://`` with the installed driver: SQLAlchemy 2.1 defaults to psycopg 3, we ship psycopg2."""
    if url.startswith(("postgresql://", "postgres://")):
        import importlib.util

        if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2") is not None:
            return "postgresql+psycopg2://" + url.split("://", 1)[1]
    return url


def _redact(url: str) -> str:
    return url.split("@", 1)[-1] if "@" in url else url


# ---------------------------------------------------------------------------------------------- baselines

def baseline_for(base: RunConfig, dtype: str, study_dir: Path, given: list[str], progress: bool) -> str:
    """Path of the AR baseline (γ = 0) results for ``dtype``: a given file with matching settings, else the
    study folder's ``baseline-<dtype>.json``, measured once (under a lock) when missing or stale."""
    from pipeline.runner import BASELINE_KEYS, run

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
    with _file_lock(study_dir / f".baseline-{dtype}.lock"):
        if not matches(out):
            cfg = dataclasses.replace(RunConfig.from_dict(want), out=str(out), wandb_mode="disabled")
            run(cfg, progress=progress)
    return str(out)


@contextlib.contextmanager
def _file_lock(path: Path):
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ---------------------------------------------------------------------------------------------- the study

def pareto_front(study) -> dict:
    """The study's Pareto front (study.best_trials) and counts, as a JSON-ready dict."""
    import optuna

    states = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)
    try:
        best = study.best_trials
    except (ValueError, RuntimeError):
        best = []
    return {
        "study": study.study_name,
        "objectives": list(OBJECTIVES),
        "directions": [d.name.lower() for d in study.directions],
        "n_trials": len(trials),
        "n_complete": sum(t.state == states.COMPLETE for t in trials),
        "n_failed": sum(t.state == states.FAIL for t in trials),
        "best_trials": [{"number": t.number, "values": dict(zip(OBJECTIVES, t.values)), "params": t.params,
                         "results": t.user_attrs.get("results"), "worker": t.user_attrs.get("worker")}
                        for t in sorted(best, key=lambda t: t.number)],
    }


def space_for_pair(space: SearchSpace, base: RunConfig) -> SearchSpace:
    """``space`` for the run's pair. A draft with another tokenizer than the target's
    (pipeline/decoding/drafters/cross_tokenizer.py)
    drafts a fixed γ (an adaptive trial could only fail), and its trials choose how to bridge the tokenizers
    (intersection or string; which is faster depends on the pair) unless ``--draft-tokenizer-mode`` fixes it."""
    from pipeline.decoding.drafters.cross_tokenizer import same_vocabulary
    from pipeline.models import load_tokenizer

    if not base.draft or get_task(base.task).speech \
            or same_vocabulary(load_tokenizer(base.target), load_tokenizer(base.draft)):
        return space
    modes = ("intersection", "string") if base.draft_tokenizer_mode == "auto" else ()
    print(f"the draft {base.draft} has another tokenizer than the target's: trials draft a fixed γ"
          + (f" and choose the draft-tokenizer mode from {list(modes)}" if modes else ""), file=sys.stderr)
    return dataclasses.replace(space, drafts=("fixed",), tokenizer_modes=modes)


def tune(base: RunConfig, space: SearchSpace, *, study_name: str, study_dir: str | os.PathLike, out: str,
         n_trials: int, storage: str | None = None, baselines: list[str] | None = None, worker: int = 0,
         heartbeat_interval: int = 30, grace_period: int | None = None, max_retry: int = 2,
         progress: bool = True) -> dict:
    """Run this worker's share of the study until it has ``n_trials`` completed trials; returns the front."""
    import optuna

    from pipeline.runner import run
    from pipeline.tracking import wandb_run

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
            with its reason (user attribute ``fail_reason``) and fails."""
            try:
                ran.append(trial.number)
                params, result, speedup, quality = _run_trial(trial, base, space, study_dir, baselines or [],
                                                              worker_id, run)
                score = tradeoff(result)
                trial.set_user_attr("tradeoff", score)
                if wb is not None:
                    _log_trial_or_warn(wb, study, trial.number, params, speedup, quality, score)
                return speedup, quality
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
    """The study per (batch size, prompt-length bucket) cell (pipeline/schedule.py), then the schedule, written next
    to the front (:func:`pipeline.schedule.schedule_path`); returns {"fronts": [(cell, front)], "schedule", "path"}.

    The cell of the base batch size over every prompt is the study itself (``study_dir``, ``study_name``, ``out``:
    what a study without these dimensions writes, and what the report reads); every other cell is a study of its
    own in ``study_dir/cells/<key>/`` named ``<study_name>-<key>``, on the prompts of its bucket. Each trial's
    speedup is paired against the γ = 0 loop at the cell's batch size, inside its run; each cell measures its own
    AR baseline unless a ``--baseline`` file matches it. With no cell left at the base, ``out`` lists the cells."""
    from pipeline.schedule import build_schedule, cells_of, schedule_path, write_cell, write_schedule

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

    from pipeline.data import load_task_data
    from pipeline.io import write_text_atomic
    from pipeline.models import load_tokenizer
    from pipeline.schedule import context_label

    task = get_task(base.task)
    records = load_task_data(base.task, base.data)
    tokenizer = load_tokenizer(base.target)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    try:
        target_config = AutoConfig.from_pretrained(base.target)
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


def _check_tune_args(base: RunConfig, n_trials: int) -> None:
    """Raise SpecsweepError unless ``base.task`` has a quality metric and ``n_trials`` >= 1."""
    if base.task not in QUALITY:
        raise SpecsweepError(f"specsweep tune needs a task with a quality metric ({sorted(QUALITY)}); "
                             f"got --task {base.task}")
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
        raise SpecsweepError(f"study {name} in {_redact(url)} was created with another search space (it differs in "
                             f"{differ}): give a new --study-name, or delete the study (its folder) to start over")


def _run_trial(trial, base: RunConfig, space: SearchSpace, study_dir: Path, baselines: list[str], worker_id: str,
               run) -> tuple[dict, dict, float, float]:
    """Sample the trial's settings and run them on ``base`` (:func:`measured_run` of ``run``, results in
    ``study_dir/trials/<number>.json``), recording the worker, results path and re-measurement on the trial.
    Returns (params, results, speedup, quality); raises SpecsweepError when speedup or quality is missing or not
    finite."""
    params = space.suggest(trial)
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

    from pipeline.tracking import warn

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


def _log_trial_or_warn(wb, study, number: int, params: dict, speedup: float, quality: float, score) -> None:
    """:func:`_log_trial`, with a warning instead of an error when W&B logging fails (the trial goes on)."""
    from pipeline.tracking import warn

    try:
        _log_trial(wb, study, number, params, speedup, quality, score)
    except Exception as e:
        warn(f"W&B logging of trial {number} failed ({' '.join(str(e).split())[:160]})")


def _log_trial(wb, study, number: int, params: dict, speedup: float, quality: float, score) -> None:
    """Inside the objective: this trial's values, and the Pareto front so far as a table."""
    import wandb

    wb.log({"trial": number, "speedup": speedup, "quality": quality,
            **({"tradeoff": score} if score is not None else {}),
            **{f"param/{k}": v for k, v in params.items() if not isinstance(v, str)}})
    front = pareto_front(study)["best_trials"]
    table = wandb.Table(columns=["trial", "speedup", "quality", "sampler", "gamma", "dtype", *param_names()])
    for t in [*front, {"number": number, "values": {"speedup": speedup, "quality": quality}, "params": params}]:
        p = t["params"]
        table.add_data(t["number"], t["values"]["speedup"], t["values"]["quality"], p.get("sampler"),
                       p.get("gamma"), p.get("dtype"), *(p.get(name) for name in param_names()))
    wb.log({"pareto_front": table})
