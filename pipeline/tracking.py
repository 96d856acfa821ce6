"""Weights & Biases tracking: one W&B run per `specsweep run`, and a run per `specsweep tune` worker.

Where a run is logged comes from the same RunConfig as what it computes (``wandb_mode``, ``wandb_project``,
``wandb_group``). The mode is ``config.wandb_mode``, else ``$WANDB_MODE``, else ``offline``: no account is
ever needed, and ``wandb sync wandb/offline-run-*`` uploads offline runs later. Tracking never costs a
result: if W&B cannot start or fails part-way, a one-line warning goes to stderr and the command completes.

A W&B sweep agent starts ``specsweep run --<name>=<value> ...`` (see sweeps/*.yaml); ``wandb.init`` then
reads the sweep's parameters into ``wandb.config``, which :func:`config_from_wandb` turns back into a
RunConfig (``RunConfig.from_dict``) to check that the flags and the sweep agree.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from pipeline.config import RunConfig
from pipeline.objectives import tradeoff
from pipeline.origins import legend_html, pieces_for, render_html, sample_origins
from pipeline.rules import param_names

DEFAULT_MODE = "offline"


def resolve_mode(mode: str | None) -> str:
    """The W&B mode to use: the config's, else $WANDB_MODE, else offline."""
    return mode or os.environ.get("WANDB_MODE") or DEFAULT_MODE


def warn(message: str) -> None:
    """One-line warning on stderr (tracking problems never fail a command)."""
    print(f"specsweep: warning: {message}", file=sys.stderr)


def config_from_wandb(values: Mapping, base: RunConfig | None = None) -> RunConfig:
    """A RunConfig from ``wandb.config`` (a sweep's parameters), over ``base``'s settings.

    W&B's own keys (leading underscore) are dropped; any other unknown key is an error (RunConfig.from_dict).
    """
    merged = base.to_dict() if base is not None else {}
    merged.update({k: v for k, v in dict(values).items() if not str(k).startswith("_")})
    return RunConfig.from_dict(merged)


@contextlib.contextmanager
def wandb_run(*, mode: str | None, project: str, group: str | None, job_type: str, config: dict,
              name: str | None = None) -> Iterator[object | None]:
    """A started W&B run, or None when disabled or when W&B cannot start (with a warning).

    An exception inside the block propagates (it is the caller's), but the W&B run is still finished.
    """
    mode = resolve_mode(mode)
    if mode == "disabled":
        yield None
        return
    run = None
    try:
        import wandb

        run = wandb.init(project=project, group=group, job_type=job_type, config=config, name=name, mode=mode,
                         reinit="create_new", settings=wandb.Settings(silent=True, init_timeout=90))
    except Exception as e:  # W&B could not start: log without it
        warn(f"W&B could not start ({_one_line(e)}); continuing without tracking")
        yield None
        return
    failed = False
    try:
        yield run
    except BaseException:
        failed = True
        raise
    finally:
        try:
            run.finish(exit_code=1 if failed else 0)
        except Exception as e:
            warn(f"W&B run did not finish cleanly ({_one_line(e)})")


def run_summary(result: dict) -> dict:
    """The numbers of a results dict, flat: every metric, every numeric quality score, and the trade-off."""

    summary = {k: v for k, v in result["metrics"].items() if isinstance(v, (int, float)) and v is not None}
    summary.update({k: v for k, v in result.get("quality", {}).items() if isinstance(v, (int, float))})
    summary["samples"] = len(result.get("samples", []))
    score = tradeoff(result)
    if score is not None:
        summary["tradeoff"] = score
    return summary


def samples_table(result: dict):
    """A wandb.Table with one row per sample: id, output, reference, its quality scores, accepted tokens, and the
    output coloured by each token's origin (an HTML column; None where the engine recorded no origins)."""
    import wandb

    samples = result.get("samples", [])
    pieces = None
    quality_keys = sorted({k for s in samples for k, v in (s.get("quality") or {}).items()
                           if isinstance(v, (int, float))})
    columns = ["id", "output", "reference", *quality_keys, "accepted_tokens", "drafted_tokens", "new_tokens",
               "acceptance_rate", "token_origins"]
    table = wandb.Table(columns=columns)
    for s in samples:
        q = s.get("quality") or {}
        origins, coloured = sample_origins(s), None
        if origins is not None and len(origins) == len(s.get("token_ids") or []):
            pieces = pieces or pieces_for(result.get("config") or {})[0]
            coloured = wandb.Html(legend_html() + render_html(pieces(s["token_ids"]), origins, s.get("origin_steps")),
                                  inject=False)
        table.add_data(str(s["id"]), s.get("text"), s.get("reference"), *[q.get(k) for k in quality_keys],
                       s.get("accepted"), s.get("drafted"), s.get("new_tokens"), s.get("acceptance_rate"), coloured)
    return table


def log_run(config: RunConfig, result: dict) -> str | None:
    """Log one finished run to W&B: config, summary metrics, per-sample table, results JSON as an artifact.

    Returns the W&B run's local folder, or None when tracking was disabled or failed (with a warning).
    """
    job_type = config.task
    with wandb_run(mode=config.wandb_mode, project=config.wandb_project, group=config.wandb_group,
                   job_type=job_type, config=config.to_dict(), name=Path(config.out).stem) as run:
        if run is None:
            return None
        try:
            import wandb

            differ = _sweep_disagreement(config, run.config)
            if differ:
                warn(f"the W&B sweep's parameters differ from the flags in {differ}; the flags were used")
            run.summary.update(run_summary(result))
            run.log({"samples": samples_table(result)})
            if Path(config.out).is_file():
                artifact = wandb.Artifact(_artifact_name(config.out), type="results",
                                          metadata={"task": config.task, "sampler": config.sampler,
                                                    "gamma": config.gamma, "dtype": config.dtype})
                artifact.add_file(str(config.out), name="results.json")
                run.log_artifact(artifact)
            return str(Path(run.dir).parent)
        except Exception as e:
            warn(f"W&B logging failed part-way ({_one_line(e)}); the results are in {config.out}")
            return None


def _sweep_disagreement(config: RunConfig, wandb_config) -> list[str]:
    """Names whose value in wandb.config (e.g. set by a sweep) differs from the config the run used."""
    try:
        from_wandb = config_from_wandb(wandb_config, base=config)
    except Exception:
        return []
    ours, theirs, given = config.to_dict(), from_wandb.to_dict(), dict(wandb_config)
    templated = {k for k, v in given.items() if isinstance(v, str) and "{" in v}  # filled by specsweep run
    return [name for name, value in ours.items() if name not in templated and theirs[name] != value]


def _artifact_name(path: str | os.PathLike) -> str:
    return "results-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(path).stem)[:100]


def _one_line(e: BaseException, limit: int = 200) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:limit]


def log_trial(wb, front: list[dict], number: int, params: dict, speedup: float, quality: float, score) -> None:
    """An Optuna trial's values and the Pareto front so far (``front``: pipeline/tuning/storage.py pareto_front's
    best_trials) as a table, in the study's W&B run; a warning instead of an error when W&B fails (the trial goes
    on)."""
    try:
        import wandb

        wb.log({"trial": number, "speedup": speedup, "quality": quality,
                **({"tradeoff": score} if score is not None else {}),
                **{f"param/{k}": v for k, v in params.items() if not isinstance(v, str)}})
        table = wandb.Table(columns=["trial", "speedup", "quality", "sampler", "gamma", "dtype", *param_names()])
        for t in [*front, {"number": number, "values": {"speedup": speedup, "quality": quality}, "params": params}]:
            p = t["params"]
            table.add_data(t["number"], t["values"]["speedup"], t["values"]["quality"], p.get("sampler"),
                           p.get("gamma"), p.get("dtype"), *(p.get(name) for name in param_names()))
        wb.log({"pareto_front": table})
    except Exception as e:
        warn(f"W&B logging of trial {number} failed ({_one_line(e, 160)})")
