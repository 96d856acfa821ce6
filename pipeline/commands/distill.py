"""`specsweep distill`: train a small draft for a target on the target's own next-token laws (pipeline/distill/).

One flag per :class:`~pipeline.distill.settings.DistillSettings` field (name, type, default, choices, help)."""

from __future__ import annotations

import argparse
import dataclasses

from pipeline.distill.settings import DistillSettings, settings_fields

HELP = ("distil a draft for a target: a small model trained on the target's own next-token distributions over a "
        "task's prompts, saved as a folder `specsweep run --draft DIR` uses as is")
_TYPES = {"str": str, "int": int, "float": float}
_REQUIRED = ("target", "data", "out")


def add_arguments(p: argparse.ArgumentParser) -> None:
    for f in settings_fields():
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata["help"]
        if f.type == "bool":
            p.add_argument(flag, dest=f.name, action="store_true", help=help_text)
            continue
        kind = _TYPES[f.type.split("|")[0].strip()]
        default = None if f.name in _REQUIRED else f.default
        choices = f.metadata.get("choices")     # checked by DistillSettings.validate: a bad one is one line
        suffix = (f" (one of {', '.join(choices)})" if choices else "") + (
            f" (default: {default})" if default is not None else "")
        p.add_argument(flag, dest=f.name, type=kind, default=default, required=f.name in _REQUIRED,
                       help=help_text + suffix)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def main(args: argparse.Namespace) -> int:
    from pipeline.distill.recipe import distill  # kept local: imports torch and transformers

    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(DistillSettings) if hasattr(args, f.name)}
    settings = DistillSettings(**values, progress=not args.no_progress).validate()
    record = distill(settings)
    final = record["final"].get("heldout") or {}
    start = record["start"].get("heldout") or {}
    agreement = (f"; held-out agreement (T = 0 per token) {start.get('agreement', float('nan')):.3f} untrained -> "
                 f"{final['agreement']:.3f}" if final else "")
    print(f"wrote the draft to {settings.out}: {record['draft']['layers']} layers x {record['draft']['width']}, "
          f"{record['draft']['vocab']} tokens, {record['training']['steps']} steps in "
          f"{record['training']['seconds']:.0f} s{agreement}")
    return 0
