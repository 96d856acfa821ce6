"""`specsweep init`: write a params profile (params.<name>.yaml) for a user's own draft/target pair, which
`make profile PROFILE=<name>` runs with the shared dvc.yaml in a workspace of its own (README, "Your own pair").

The profile reads the data file and local model folders in place (absolute paths: the workspace is another folder;
DVC tracks an absolute dependency outside the workspace like any other, so an edit of the data re-runs the stages
that read it), downloads registry models in its downloads stage (`specsweep fetch --model`), and runs the pair's
γ = 0 baseline, exact (lossless) verification over a few γ with the draft model and with prompt lookup, and a small
Optuna study (sweeps/optuna_space.own.yaml). A task without a quality metric (prompts) cannot be tuned, and
dvc.yaml tunes every entry of ``pairs``: its runs are then pair runs (``pair_runs``), and the profile says in its
``missing:`` list that no study runs."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from pipeline.dtypes import DTYPE_CHOICES
from pipeline.errors import SpecsweepError
from pipeline.tasks import TASK_NAMES, get_task, quality_metric
from pipeline.weights.registry import MODELS

HELP = ("write a params profile (params.NAME.yaml) for your own draft/target pair: its baseline, the draft model and "
        "prompt lookup over a few γ, and an Optuna study, for `make profile PROFILE=NAME`")

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
DEVICES = ("cpu", "cuda", "auto")
SPACE = "sweeps/optuna_space.own.yaml"
DEFAULTS = {"limit": 8, "max_new_tokens": 64, "max_prompt_tokens": 512, "repeats": 3, "samples_per_repeat": 2,
            "n_trials": 6}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME",
                   help="the profile's name: letters, digits, - and _ (the file params.NAME.yaml, the workspace "
                        "workspaces/NAME/ and the pair's name in the report)")
    p.add_argument("--target", required=True,
                   help="the target model: a local transformers folder (save_pretrained; read in place) or a registry "
                        "name (`specsweep fetch --help` lists them; downloaded by the profile's downloads stage)")
    p.add_argument("--draft", default=None,
                   help="the draft model, named as --target is (default: none; the profile then runs the drafters "
                        "that need no draft model)")
    p.add_argument("--data", required=True,
                   help="the prompts: a JSONL file in the task's form (prompts: {\"id\", \"prompt\"} lines; "
                        "`specsweep run --help`, --task), read in place")
    p.add_argument("--task", required=True, choices=TASK_NAMES, metavar="TASK",
                   help=f"what the data is and how quality is scored: one of {', '.join(TASK_NAMES)} (prompts has no "
                        "quality metric: no Optuna study)")
    p.add_argument("--device", default="cpu", choices=DEVICES,
                   help="the profile's run device (default: cpu; cuda needs a CUDA build of torch; auto: CUDA when "
                        "present)")
    p.add_argument("--dtype", default="auto",
                   help=f"the runs' dtypes, comma-separated, of {', '.join(DTYPE_CHOICES)} (default: auto, the "
                        "device's fastest native dtype, which the results record)")
    p.add_argument("--gamma", default="2,4,6",
                   help="the γ each drafter runs at, comma-separated (default: 2,4,6)")
    p.add_argument("--force", action="store_true", help="overwrite an existing profile file")
    p.add_argument("--out", type=Path, default=None,
                   help="the profile file to write (default: params.NAME.yaml in this folder, where `make profile` "
                        "reads it)")


def main(args: argparse.Namespace) -> int:
    name = check_name(args.name)
    task = check_task(args.task)
    out = args.out if args.out is not None else Path(f"params.{name}.yaml")
    if out.is_dir():
        raise SpecsweepError(f"--out {out} is a folder: give the profile file's path, e.g. "
                             f"{out / f'params.{name}.yaml'}")
    if out.exists() and not args.force:
        raise SpecsweepError(f"{out} exists: give --force to overwrite it, or choose another NAME")
    if not out.parent.is_dir():
        raise SpecsweepError(f"--out {out}: the folder {out.parent} does not exist")
    dtypes = check_dtypes(args.dtype)
    gammas = check_gammas(args.gamma)
    target = check_model("--target", args.target)
    draft = check_model("--draft", args.draft) if args.draft is not None else None
    data = check_data(task, args.data)
    text = profile_text(name, task, target, draft, data, device=args.device, dtypes=dtypes, gammas=gammas)
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out}: the profile {name!r}, {describe(target, draft)} on task {task} with {data}")
    print(next_command(name, out))
    return 0


# ------------------------------------------------------------------------------------------------- checks

def check_name(name: str) -> str:
    if name == "default":
        raise SpecsweepError("NAME default is the default profile's (params.yaml, `make`): choose another name")
    if not NAME.match(name):
        raise SpecsweepError(f"NAME {name!r} is not a file-name word: use letters, digits, - and _, starting with a "
                             "letter or digit (e.g. mine)")
    return name


def check_task(task: str) -> str:
    if task not in TASK_NAMES:
        raise SpecsweepError(f"unknown --task {task!r}: choose one of {list(TASK_NAMES)}")
    return task


def check_dtypes(text: str) -> list[str]:
    dtypes = [d.strip() for d in text.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in DTYPE_CHOICES]
    if not dtypes or bad or len(set(dtypes)) != len(dtypes):
        raise SpecsweepError(f"--dtype {text!r}: give distinct dtypes of {list(DTYPE_CHOICES)}, comma-separated")
    return dtypes


def check_gammas(text: str) -> list[int]:
    try:
        gammas = [int(g) for g in text.split(",")]
    except ValueError:
        gammas = []
    if not gammas or min(gammas) < 1 or len(set(gammas)) != len(gammas):
        raise SpecsweepError(f"--gamma {text!r}: give distinct whole numbers >= 1, comma-separated (e.g. 2,4,6)")
    return gammas


class Model:
    """A --target or --draft: a registry name (``folder`` None: downloaded) or a local folder (absolute)."""

    def __init__(self, given: str, folder: Path | None) -> None:
        self.given, self.folder = given, folder

    @property
    def registry(self) -> bool:
        return self.folder is None


def check_model(flag: str, given: str) -> Model:
    path = Path(given).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise SpecsweepError(f"{flag} {given}: the folder holds no config.json, so it is no transformers model "
                                 f"folder; convert it first (`specsweep fetch --model {given} --out DIR`) and give DIR")
        return Model(given, path.resolve())
    if given in MODELS:
        return Model(given, None)
    if path.exists():
        raise SpecsweepError(f"{flag} {given} is a file, not a model folder: give a transformers folder or a model "
                             "name (`specsweep fetch --help` lists them)")
    raise SpecsweepError(f"{flag} {given} is neither a folder nor a model name ({', '.join(MODELS)}); for a Hugging "
                         f"Face hub id, `specsweep fetch --model OWNER/NAME --out DIR` first and give DIR")


def check_data(task: str, given: str) -> Path:
    path = Path(given).expanduser()
    if not path.exists():
        raise SpecsweepError(f"--data {given} does not exist: give {get_task(task).source_hint}")
    from pipeline.data import load_task_data  # reads the file (and pyarrow for Parquet): kept out of --help

    try:
        load_task_data(task, path, limit=1)      # the whole file parsed, one example decoded
    except SpecsweepError as e:
        raise SpecsweepError(f"--data {given}: {e}") from None
    return path.resolve()


# ------------------------------------------------------------------------------------------------ profile

def _q(value: str) -> str:
    """A YAML scalar for ``value`` (a JSON string is a double-quoted YAML scalar)."""
    return json.dumps(str(value))


def describe(target: Model, draft: Model | None) -> str:
    return f"target {target.given}" + (f" with draft {draft.given}" if draft else " (no draft model)")


@dataclass(frozen=True)
class Plan:
    """What the profile's sections share: the pair's models and data, where each is read, and what runs."""
    name: str
    task: str
    target: Model
    draft: Model | None
    data: Path
    device: str
    dtypes: list[str]
    gamma: str                                 # the γ list, comma-separated
    models: list[tuple[str, Model]]            # (role, model) of the target and the draft
    downloaded: list[tuple[str, Model]]        # those the downloads stage fetches (registry names)
    where: dict[str, str]                      # role -> the folder a run reads
    model_dep: str                             # what DVC watches for the models
    data_dep: Path                             # what DVC watches for the data
    tuned: bool                                # whether the task has a quality metric, so a study runs
    drafters: list[tuple[str, str, str]]       # (grid name, --drafter, words)


def plan(name: str, task: str, target: Model, draft: Model | None, data: Path, *, device: str, dtypes: list[str],
         gammas: list[int]) -> Plan:
    models = [(role, m) for role, m in (("target", target), ("draft", draft)) if m is not None]
    downloaded = [(role, m) for role, m in models if m.registry]
    where = {role: (f"models/{name}/{role}" if m.registry else str(m.folder)) for role, m in models}
    return Plan(name=name, task=task, target=target, draft=draft, data=data, device=device, dtypes=dtypes,
                gamma=",".join(map(str, gammas)), models=models, downloaded=downloaded, where=where,
                # the stages that read the models wait for the download; with none, the target's folder
                model_dep=f"models/{name}" if downloaded else str(target.folder),
                # a LibriSpeech manifest names audio files relative to it: its folder is the dependency
                data_dep=data.parent if get_task(task).speech else data,
                tuned=quality_metric(task) is not None,
                drafters=([("model", "model", "the draft model")] if draft else [])
                + [("lookup", "prompt-lookup", "prompt lookup")])


def profile_text(name: str, task: str, target: Model, draft: Model | None, data: Path, *, device: str,
                 dtypes: list[str], gammas: list[int]) -> str:
    """The profile, commented for the user who edits it."""
    p = plan(name, task, target, draft, data, device=device, dtypes=dtypes, gammas=gammas)
    return "\n".join([*_header(p), *_prepare(p), *_run(p), *_pairs(p), *_pair_runs(p), *_tune(p)]) + "\n"


def _header(p: Plan) -> list[str]:
    name, target, draft = p.name, p.target, p.draft
    lines = [
        f"# specsweep profile {name!r}, written by `specsweep init` (README, \"Your own pair\"):",
        f"#   target  {target.given}" + ("  (a model name: the downloads stage fetches it)" if target.registry else ""),
    ]
    if draft:
        lines.append(f"#   draft   {draft.given}" + ("  (a model name: the downloads stage fetches it)"
                                                      if draft.registry else ""))
    return [
        *lines,
        f"#   task    {p.task}, prompts from {p.data}",
        f"# make profile PROFILE={name} copies dvc.yaml, sweeps/ and this file (as params.yaml) into",
        f"# workspaces/{name}/ and runs `dvc repro` there; the report is workspaces/{name}/reports/report.md. A later",
        "# `make profile` runs only what an edit changed. Paths are absolute or relative to the workspace. Settings",
        "# are `specsweep run`'s flags by their RunConfig names (--max-new-tokens is max_new_tokens; `specsweep run",
        "# --help` lists them).",
    ]


def _prepare(p: Plan) -> list[str]:
    """The prepare stages: data read in place (or the empty study folder), the downloads."""
    lines: list[str] = ["prepare:"]
    if p.tuned:
        lines.append("  data: {}          # the data file is read in place: an edit of it re-runs every stage")
    else:
        lines += [
            f"  # The {p.task} task has no quality metric, which an Optuna study trades speed against, so no study "
            "runs",
            "  # (`missing:` below); this stage makes the empty results/tune/ that the report stage reads.",
            "  data:",
            "    no-study:",
            "      cmd: mkdir -p results/tune",
            "      out: results/tune",
        ]
    lines.append("  models: {}")
    if p.downloaded:
        cmd = " && ".join(f"specsweep fetch --model {shlex.quote(m.given)} --out {p.where[role]} --no-progress"
                          for role, m in p.downloaded)
        lines += [
            "  # Registry models as float32 transformers folders (pipeline/weights/); a run loads them in its dtype.",
            "  downloads:",
            f"    {p.name}:",
            f"      cmd: {_q(cmd)}",
            f"      out: models/{p.name}",
        ]
    else:
        lines.append("  downloads: {}     # the model folders are read in place")
    return lines


def _run(p: Plan) -> list[str]:
    """What every run shares, and tracking."""
    return [
        "  speak: {}",
        "  distill: {}",
        "",
        "# Shared by every run, baseline and trial. device: cpu, or cuda on a GPU (after installing a CUDA build of",
        "# torch). temperature 0: greedy decoding, so every lossless run emits the target's own tokens (1: sampling).",
        "# Speed: `repeats` interleaved repeats of the speculative and the γ = 0 loop, each decoding the first",
        "# `samples_per_repeat` prompts (more of either: a narrower interval, a longer run).",
        "run:",
        f"  device: {p.device}",
        "  temperature: 0",
        "  seed: 0",
        "  batch_size: 1",
        f"  repeats: {DEFAULTS['repeats']}",
        f"  samples_per_repeat: {DEFAULTS['samples_per_repeat']}",
        "  no_progress: true",
        "",
        "# W&B: offline unless $WANDB_MODE says otherwise (`wandb sync wandb/offline-run-*` uploads later).",
        "tracking:",
        "  wandb_project: specsweep",
        f"  wandb_group: {p.name}",
        "",
    ]


def _settings_note(p: Plan) -> list[str]:
    note = [
        "# The pair's settings. limit: how many prompts of the data the runs decode (a seeded subset);",
        "# max_new_tokens: tokens generated per prompt; max_prompt_tokens: longer prompts are cut to it;",
        "# chat_template: true for an instruct or chat model (each prompt wrapped in the tokenizer's chat template).",
    ]
    unwatched = [role for role, m in p.models if not m.registry and str(m.folder) != p.model_dep]
    if unwatched:
        note += [f"# model_dep is what DVC watches for the models, {p.model_dep}; not the "
                 f"{' and '.join(unwatched)} folder: after",
                 f"# changing the weights there, `make profile PROFILE={p.name} FORCE=1` runs every stage again."]
    return note


def _config(p: Plan) -> list[str]:
    """The pair's settings, one YAML line each."""
    return [
        f"task: {p.task}",
        f"data: {_q(p.data)}",
        f"target: {_q(p.where['target'])}",
        *([f"draft: {_q(p.where['draft'])}"] if p.draft else []),
        # spec_bench decodes conversations and requires the chat template; the others read plain prompts
        f"chat_template: {'true' if p.task == 'spec_bench' else 'false'}",
        f"limit: {DEFAULTS['limit']}",
        f"max_new_tokens: {DEFAULTS['max_new_tokens']}",
        *([] if get_task(p.task).speech else [f"max_prompt_tokens: {DEFAULTS['max_prompt_tokens']}"]),
    ]


def _grid_note(p: Plan) -> list[str]:
    return _wrap("# Exact verification is lossless: the output is the target's. "
                 + ("model: the draft model at each γ; " if p.draft else "")
                 + "lookup: prompt lookup, the tokens after an earlier occurrence of the last n tokens (no draft "
                   "model).")


def _pairs(p: Plan) -> list[str]:
    """The pair and its grids (none for a task without a study), and the dtypes."""
    if p.tuned:
        lines = [
            *_settings_note(p),
            "pairs:",
            f"  - name: {p.name}",
            f"    data_dep: {_q(p.data_dep)}",
            f"    model_dep: {_q(p.model_dep)}",
            f"    config: &{p.name}",
            *[f"      {c}" for c in _config(p)],
            "",
            "# Run grids: every combination of a grid's comma-separated settings in one process per dtype, the pair",
            "# loaded once; each run's speedup is paired with the γ = 0 loop timed beside it.",
            *_grid_note(p),
            "grids:",
            *[f"  - name: {short}\n    config: {{drafter: {drafter}, sampler: exact, backend: torch, gamma: "
              f"\"{p.gamma}\"}}" for short, drafter, _ in p.drafters],
            "",
        ]
    else:
        lines = [
            f"# dvc.yaml runs an Optuna study of every pair listed under `pairs`, which the {p.task} task cannot have:",
            "# its runs are the pair runs below, each a process that runs the drafter at each γ, every speedup paired",
            "# with the γ = 0 loop timed beside it.",
            "pairs: []",
            "grids: []",
            "",
        ]
    return [
        *lines,
        "# auto: the fastest dtype the device multiplies natively (on a CPU with AVX-512 BF16, AMX or Arm's BF16,",
        "# bfloat16 for a target of 50M parameters or more, else float32; on a GPU bfloat16, or float16 without it).",
        "# The results record the dtype used.",
        f"dtypes: [{', '.join(p.dtypes)}]",
        "",
    ]


def _pair_runs(p: Plan) -> list[str]:
    """The pair runs: none, or for a task without a study every drafter's run in every dtype."""
    if p.tuned:
        return [f"# Runs of the pair with other settings than the grids' (its own by `<<: *{p.name}`, e.g. another",
                "# temperature; dvc.yaml's pair_run stage): none.",
                "pair_runs: {}"]
    lines = [*_grid_note(p), *_settings_note(p), "pair_runs:"]
    first = True
    for dtype in p.dtypes:
        for short, drafter, _ in p.drafters:
            lines += [f"  {p.name}-{short}-{dtype}:",
                      f"    data_dep: {_q(p.data_dep)}",
                      f"    model_dep: {_q(p.model_dep)}",
                      "    config:"]
            if first:
                lines += [f"      <<: &{p.name}", *[f"        {c}" for c in _config(p)]]
                first = False
            else:
                lines.append(f"      <<: *{p.name}")
            lines += [f"      drafter: {drafter}", "      sampler: exact", "      backend: torch",
                      f"      gamma: \"{p.gamma}\"", f"      dtype: {dtype}"]
    return lines


def _tune(p: Plan) -> list[str]:
    """The study, the benchmarks and what the profile does not run."""
    lines = [
        "",
        f"# Optuna: a study of the pair ({SPACE}: the drafters, γ and the drafters' settings, with",
        f"# exact verification), in SQLite in the workspace's results/tune/{p.name}/, so a later `make profile` "
        "resumes",
        "# it. Its trials run in the space's dtype, float32: for bfloat16, copy the space to",
        "# sweeps/optuna_space.<name>.yaml, set `dtype: [bfloat16]` there and name it here. More trials find a better",
        "# front; each costs about as much as one run.",
        "tune:",
        f"  space: {SPACE}",
        f"  n_trials: {DEFAULTS['n_trials']}",
        f"  dtype: {p.dtypes[0]}",
        f"  study_prefix: {p.name}",
        "",
        "# Benchmarks the bench stage runs (`specsweep bench`): none.",
        "benchmarks: {}",
        "",
        "# What the profile does not run and why: the report's first section.",
    ]
    if p.tuned:
        lines.append("missing: []")
    else:
        lines += [
            "missing:",
            "  - what: an Optuna study of the pair",
            f"    why: the {p.task} task has no quality metric for a study to trade speed against; `specsweep init`",
            "      with a task that has one (cnn_dailymail, librispeech, spec_bench) writes a profile that tunes.",
        ]
    return lines


def _wrap(comment: str, width: int = 116) -> list[str]:
    """``comment`` (one "# ..." line) wrapped into "# " lines of at most ``width`` characters."""
    words, lines, line = comment.removeprefix("# ").split(), [], "#"
    for word in words:
        if len(line) + 1 + len(word) > width:
            lines.append(line)
            line = "#"
        line += " " + word
    return [*lines, line]


def next_command(name: str, out: Path) -> str:
    """What to run next: `make profile PROFILE=name` where the file is params.<name>.yaml in this folder."""
    report = f"workspaces/{name}/reports/report.md"
    if out.name == f"params.{name}.yaml" and out.resolve().parent == Path.cwd().resolve():
        return f"next: make profile PROFILE={name}   (the report: {report})"
    return (f"next: copy {out} to params.{name}.yaml in the specsweep checkout, then `make profile PROFILE={name}` "
            f"there (the report: {report})")
