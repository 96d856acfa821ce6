"""The settings file of ``specsweep export --format json`` (kind "specsweep-settings"), read back: by ``specsweep run
--from-config FILE`` (:func:`apply_settings`, which RunConfig calls) and by anything serving with our engine
(:func:`load_settings`, :meth:`Settings.entry`). pipeline/tuning/export.py writes it.

    {"kind": "specsweep-settings", "version": 1, "study", "pick", "task", "target", "draft", "dtype", "temperature",
     "device", "entries": [{"batch_size": int, "context": [low, high or null] or null, "settings": {"gamma",
     "sampler", "params", "draft_schedule", "draft_confidence", "gamma_max", "temperature", "draft_tokenizer_mode",
     "draft_tree", "tree_children"}, ...}, ...]}
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import SpecsweepError

SETTINGS_KIND = "specsweep-settings"
SETTINGS_VERSION = 1


def in_bucket(context, prompt_tokens: int) -> bool:
    """Whether a prompt of ``prompt_tokens`` tokens lies in the prompt-length bucket ``context``: [low, high) in
    tokens (high None: no upper end; context None: every prompt)."""
    low, high = context or (0, None)
    return prompt_tokens >= low and (high is None or prompt_tokens < high)


@dataclass
class Settings:
    """A settings file of ``specsweep export --format json``."""

    path: str
    data: dict

    def entry(self, batch_size: int, prompt_tokens: int | None = None) -> dict:
        """The entry for ``batch_size``: the smallest measured batch size at or above it (the largest beyond them);
        with several prompt-length buckets, the one that holds ``prompt_tokens``."""
        rows = [r for r in self.data["entries"] if r.get("context") is None or prompt_tokens is None
                or in_bucket(r["context"], prompt_tokens)]
        contexts = {tuple(r["context"]) if r.get("context") else None for r in rows}
        if len(contexts) > 1:
            raise SpecsweepError(f"{self.path} has settings for several prompt-length buckets: give the prompt length "
                                 "(--max-prompt-tokens for `specsweep run`), or export one bucket (--context-bucket)")
        if not rows:
            raise SpecsweepError(f"{self.path}: no prompt-length bucket holds {prompt_tokens} tokens")
        rows = sorted(rows, key=lambda r: r["batch_size"])
        return next((r for r in rows if r["batch_size"] >= batch_size), rows[-1])


def settings_document(study: str | None, pick: str, run: dict, entries: list[dict]) -> dict:
    """A settings file's contents: where the settings came from (``study``, how they were picked), the run they are
    for (``run``: task, target, draft, dtype, temperature, device) and its entries (module docstring)."""
    return {"kind": SETTINGS_KIND, "version": SETTINGS_VERSION, "study": study, "pick": pick,
            **{k: run.get(k) for k in ("task", "target", "draft", "dtype", "temperature", "device")},
            "entries": entries}


def load_settings(path: str | os.PathLike) -> Settings:
    """Read a settings file of ``specsweep export --format json``; anything else is a one-line SpecsweepError."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SpecsweepError(f"--from-config {path}: not a readable JSON file ({' '.join(str(e).split())[:120]})") \
            from None
    if not isinstance(data, dict) or data.get("kind") != SETTINGS_KIND or not data.get("entries"):
        raise SpecsweepError(f"--from-config {path}: not a settings file of `specsweep export --format json`")
    if not isinstance(data.get("version"), int) or data["version"] > SETTINGS_VERSION:
        raise SpecsweepError(f"--from-config {path}: settings version {data.get('version')!r} is newer than this "
                             "specsweep reads")
    return Settings(str(path), data)


def run_values(entry: dict, draft: str | None, rule_keys) -> dict:
    """An entry's settings as RunConfig names (every rule parameter: the entry's, else None)."""
    s = entry["settings"]
    values = {"gamma": s["gamma"], "sampler": s["sampler"], "draft_schedule": s.get("draft_schedule") or "constant",
              "draft_confidence": float(s.get("draft_confidence") or 0.0), "gamma_max": s.get("gamma_max"),
              **{k: (s.get("params") or {}).get(k) for k in rule_keys}}
    if s.get("temperature") is not None:
        values["temperature"] = s["temperature"]
    if s.get("draft_tokenizer_mode"):
        values["draft_tokenizer_mode"] = s["draft_tokenizer_mode"]
    if s.get("draft_tree") and s["gamma"] > 0:
        values["draft_tree"] = s["draft_tree"]
        values["tree_children"] = s.get("tree_children") or "without-replacement"
    if draft and s["gamma"] > 0:
        values["draft"] = draft
    return values


def apply_settings(path: str, values: dict, defaults: dict, rule_keys) -> dict:
    """``values`` (flat run settings) with the settings file's entry for their batch size filled in: a setting still
    at its default (or absent) takes the file's; one set to another value than both is a one-line SpecsweepError."""
    settings = load_settings(path)
    batch = values.get("batch_size") or defaults.get("batch_size") or 1
    entry = settings.entry(int(batch), values.get("max_prompt_tokens"))
    merged = dict(values)
    for key, value in run_values(entry, settings.data.get("draft"), rule_keys).items():
        given = values.get(key)
        if given is None or (key in defaults and given == defaults[key]) or given == value:
            merged[key] = value
            continue
        raise SpecsweepError(f"--{key.replace('_', '-')} {given} disagrees with --from-config {path} ({key} {value} "
                             f"at batch size {entry['batch_size']}): pass one or the other")
    return merged
