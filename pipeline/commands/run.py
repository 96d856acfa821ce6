"""`specsweep run`: decode a dataset with a draft/target pair and one verify sampler; write results JSON."""

from __future__ import annotations

import argparse
import dataclasses
import itertools

from pipeline.config import LLAMA_CPP, RunConfig
from pipeline.dtypes import AUTO
from pipeline.errors import SpecsweepError
from pipeline.rules import param_help, param_is_integer, param_names
from pipeline.tree_shape import CHAIN

HELP = "run speculative (or, with --gamma 0, autoregressive) decoding over a dataset and write results JSON"

_TYPES = {"int": int, "float": float, "str": str}
# Settings that take a comma-separated list: `specsweep run` then runs every combination in one process.
GRID = ("sampler", "backend", "gamma", "dtype", "drafter", "draft_tree", "draft_vocab", "draft_quant")
# A grid lists values with commas; a token tree's widths are comma-separated themselves, so trees are listed with "/"
# ("--draft-tree chain/2,2,1/3,1,1": a chain, then two trees).
LIST_SEPARATORS = {"draft_tree": "/"}


_GRID_HELP = ("; a comma-separated list runs every combination of the listed settings in this process (--out then "
              "names them, e.g. results/runs/{sampler}-g{gamma}.json)")


# flags that change what the command prints, not what it runs: not RunConfig settings
DISPLAY_FLAGS = ("no_progress", "verbose")


def add_arguments(p: argparse.ArgumentParser, exclude: tuple[str, ...] = ()) -> None:
    """One flag per run setting, derived from the :class:`RunConfig` fields (name, type, default, choices, help)
    and one per acceptance-rule parameter (pipeline/rules.py). Each ``--a-b`` flag is also ``--a_b``: W&B sweep
    agents pass settings as ``--<config name>=value`` (``--max_new_tokens=32``), and DVC's dict unpacking of
    params.yaml does the same. Settings named in ``exclude`` get no flag (``specsweep tune`` chooses γ, sampler,
    ... itself)."""
    for f in dataclasses.fields(RunConfig):
        if f.name in exclude or not f.metadata.get("help"):
            continue
        flag = f.metadata["flag"] or "--" + f.name.replace("_", "-")
        names = [flag, "--" + flag[2:].replace("-", "_")] if "-" in flag[2:] else [flag]
        help_text = f.metadata["help"].replace("%", "%%")
        if f.type == "bool":
            p.add_argument(*names, dest=f.name, action="store_false" if f.default else "store_true", help=help_text)
            continue
        required = f.default is dataclasses.MISSING
        if not required and f.default is not None and "(default" not in help_text:
            help_text += f" (default: {f.default})"
        if f.name in GRID:  # a comma-separated list runs each value (expand_grid); RunConfig checks the choices
            choices = f" (one of {', '.join(f.metadata['choices'])})" if f.metadata["choices"] else ""
            p.add_argument(*names, dest=f.name, default=f.default, help=help_text + choices + _GRID_HELP)
            continue
        optional_value = {"nargs": "?", "const": f.metadata["const"]} if f.metadata.get("const") else {}
        p.add_argument(*names, dest=f.name, type=_TYPES[f.type.split("|")[0].strip()], required=required,
                       default=None if required else f.default, choices=f.metadata["choices"], help=help_text,
                       **optional_value)
    for name in param_names():
        if name not in exclude:     # --synthetic-acceptance, also as --synthetic_acceptance (the parameter's name)
            names = [f"--{name.replace('_', '-')}", f"--{name}"] if "_" in name else [f"--{name}"]
            p.add_argument(*names, dest=name, type=int if param_is_integer(name) else float, help=param_help(name))
    p.add_argument("--no-progress", "--no_progress", action="store_true", help="no progress bar")
    if not exclude:  # `specsweep run`'s own display flag (tune, which excludes what it chooses, prints no samples)
        p.add_argument("-v", "--verbose", action="store_true",
                       help="print each sample's output coloured by where each token came from (accepted draft token, "
                            "the target's correction, bonus token; plain markers when not a terminal), with a legend "
                            "and the sample's acceptance (`specsweep show` does the same from a results file)")


def expand_grid(values: dict, auto_dtype: str | None = None) -> list[dict]:
    """One settings dict per point of the grid: each of :data:`GRID` may be a comma-separated list
    (``--sampler exact,block --gamma 2,4``), and the points are every combination, in order. ``--out`` (and
    ``--baseline``) may name any setting as ``{name}`` (``results/runs/text-{sampler}-g{gamma}.json``); it must
    name every setting that takes several values, so no two runs write one file. ``{dtype}`` of a point whose
    dtype is ``auto`` names ``auto_dtype`` (the dtype auto resolves to) when it is given."""
    axes = {name: [None] if values.get(name) is None else
            [_grid_value(name, item) for item in str(values[name]).split(LIST_SEPARATORS.get(name, ","))]
            for name in GRID}
    several = [name for name, items in axes.items() if len(items) > 1]
    missing = [name for name in several if "{" + name + "}" not in (values.get("out") or "")]
    if missing:
        raise SpecsweepError(f"--{missing[0]} lists several values: --out must name {{{missing[0]}}} so each run "
                             f"writes its own file, e.g. results/runs/{'-'.join('{' + n + '}' for n in several)}.json")
    points = []
    for combination in itertools.product(*axes.values()):
        point = {**values, **dict(zip(axes, combination))}
        for key in ("baseline", "out"):
            # Templates such as results/runs/text-ar-{dtype}.json: each point of a grid or of a W&B sweep names
            # its own files.
            template = point.get(key)
            if template and "{" in template:
                names = {**point, "dtype": auto_dtype} if point.get("dtype") == AUTO and auto_dtype else point
                try:
                    point[key] = template.format(**names)
                except (KeyError, IndexError, ValueError) as e:
                    raise SpecsweepError(f"--{key} {template}: bad template ({e}); use {{name}} of a run setting, "
                                         "e.g. {dtype}") from None
        points.append(point)
    return points


def _grid_value(name: str, item: str):
    if (name, item.strip()) in (("draft_tree", CHAIN), ("draft_vocab", "all")):   # a chain; the whole vocabulary
        return None
    kind = _TYPES[next(f.type for f in dataclasses.fields(RunConfig) if f.name == name).split("|")[0].strip()]
    try:
        return kind(item.strip())
    except ValueError:
        raise SpecsweepError(f"--{name} {item.strip()!r}: expected {kind.__name__} values, one or a comma-separated "
                             "list") from None


def main(args: argparse.Namespace) -> int:
    from pipeline import distributed  # imports torch: kept out of `specsweep --help`
    from pipeline.runner import run_grid  # imports torch: kept out of `specsweep --help`

    values = {k: v for k, v in vars(args).items() if k not in ("command", "_module", *DISPLAY_FLAGS)}
    auto = None
    if AUTO in str(values.get("dtype")).split(",") and "{dtype}" in f"{values.get('out')}{values.get('baseline')}" \
            and values.get("engine") != LLAMA_CPP:           # (a GGUF file's dtype is its own: {dtype} names auto)
        from pipeline.models import auto_dtype  # kept local: imports torch

        auto, _ = auto_dtype(values["target"], values["device"])   # --out names the dtype auto picks
    configs = [RunConfig.from_dict(point) for point in expand_grid(values, auto)]
    verbose = getattr(args, "verbose", False)
    processes = max(c.processes for c in configs)
    if processes > 1 and distributed.current_world() is None:
        # not started by accelerate yet: check every run here (one line, before any process starts), then run the
        # same command in N processes; rank 0 prints and writes each run's results
        for config in configs:
            config.validate()
        cpu = all(c.device == "cpu" for c in configs) or not _has_cuda()
        distributed.launch(processes, cpu, ["run", *argv_of(values, args.no_progress, verbose)])
        return 0
    try:
        run_grid(configs, progress=not args.no_progress, on_result=lambda c, r: _report(c, r, verbose))
    except SpecsweepError as e:
        if distributed.report_failure(e):  # a rank of `--processes N`: the launching process prints the line
            return 0
        raise
    finally:
        distributed.finish()
    return 0


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def argv_of(values: dict, no_progress: bool = False, verbose: bool = False) -> list[str]:
    """The `specsweep run` arguments that give these parsed settings (as :func:`add_arguments` reads them): what
    `specsweep run --processes N` hands each process it starts."""
    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    out = []
    for name, value in values.items():
        f = fields.get(name)
        if f is None:  # a rule parameter
            if value is not None:
                out.append(f"--{name}={value}")
            continue
        if not f.metadata.get("help") or value is None:
            continue
        flag = f.metadata["flag"] or "--" + name.replace("_", "-")
        if f.type == "bool":
            if bool(value) != bool(f.default):
                out.append(flag)
            continue
        out.append(f"{flag}={value}")
    return out + (["--no-progress"] if no_progress else []) + (["--verbose"] if verbose else [])


def _report(config: RunConfig, result: dict, verbose: bool = False) -> None:
    """One line of what the run measured (with ``verbose``, each sample coloured by token origin first), then its
    W&B log (which never fails the run: a problem is a warning)."""
    if result is None:  # a rank other than 0 of a data-parallel run: rank 0 reports
        return
    if verbose:
        from pipeline.origins import pieces_for, print_samples  # imports torch: kept out of `specsweep --help`

        pieces, note = pieces_for(result["config"])
        print_samples(result["samples"], pieces, note=note)
    m = result["metrics"]
    meas = result["measurement"]
    parts = [f"{m['new_tokens']} tokens in {m['wall_time_s']:.2f} s; median {m['tokens_per_second']:.1f} tok/s "
             f"over {meas['repeats']} repeats [{m['tokens_per_second_ci_low']:.1f}, "
             f"{m['tokens_per_second_ci_high']:.1f}]"]
    if m["acceptance_rate"] is not None:
        parts.append(f"acceptance {m['acceptance_rate']:.3f}, {m['mean_accepted_tokens']:.2f} tokens/step")
    if "speedup" in m:
        parts.append(f"paired speedup {m['speedup']:.2f}x [{m['speedup_ci_low']:.2f}, {m['speedup_ci_high']:.2f}] "
                     f"({meas['speedup']['ci_coverage']:.0%} interval)")
    if "decode_speedup" in m:
        parts.append(f"decoding alone (prefill left out) {m['decode_speedup']:.2f}x [{m['decode_speedup_ci_low']:.2f}, "
                     f"{m['decode_speedup_ci_high']:.2f}]")
    if "unpaired_speedup" in m:
        parts.append(f"unpaired {m['unpaired_speedup']:.2f}x against --baseline")
    if m.get("theoretical_speedup") is not None:
        parts.append(f"theoretical {m['theoretical_speedup']:.2f}x")
    if result["resolved"].get("speed_only"):      # synthetic acceptance: its scores are no claim, so not shown
        parts.append(result["resolved"]["speed_only"]["note"])
    else:
        for k, v in result["quality"].items():
            if isinstance(v, float):
                parts.append(f"{k} {v:.4f}")
    if m["flagged"]:
        parts.append("FLAGGED (see the warnings above)")
    print("; ".join(parts))
    if m.get("by_group"):  # a task with categories (spec_bench): speedup and tokens/step per group
        from pipeline.categories import summary_lines  # imports torch: kept out of `specsweep --help`

        print("per group (paired speedup [interval], mean accepted tokens):", *summary_lines(m["by_group"]), sep="\n")
    print(f"wrote {config.out}")
    from pipeline.tracking import log_run  # imports torch: kept out of `specsweep --help`

    log_run(config, result)
