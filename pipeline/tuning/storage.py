"""Where a study lives and how its workers share it: the storage URL (SQLite in the study folder, or any RDB URL),
opening a study from several processes at once, heartbeats, orphaned and stale trials and their retries, and the
Pareto front read back from it."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

from pipeline.errors import SpecsweepError
from pipeline.tuning.space import OBJECTIVES

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
            raise SpecsweepError(f"cannot open the study storage {redact(url)} "
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


def redact(url: str) -> str:
    """The URL without its user and password."""
    return url.split("@", 1)[-1] if "@" in url else url




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
