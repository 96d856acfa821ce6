"""`specsweep distill`'s settings: one dataclass, each field's default and help in one place, validated in one place
(a bad setting is a one-line :class:`~pipeline.errors.SpecsweepError`, exit 2 at the command line)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path

from pipeline.errors import SpecsweepError

DIVERGENCES = ("fkl", "rkl", "tv")
INITS = ("target", "fresh")
TASKS = ("prompts", "cnn_dailymail", "librispeech")
"""The tasks whose prompts do not depend on what was decoded (spec_bench's second turns do); librispeech distils a
Whisper draft decoder on the target's encoder (pipeline/distill/whisper.py)."""


def option(default, help: str, *, choices=None):
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass
class DistillSettings:
    """What a distillation run does. ``None`` budgets: unset (one of ``time_budget`` / ``steps`` must be set)."""

    target: str = option(None, "the target model: registry name, local folder or Hub id (its tokenizer is the draft's)")
    data: str = option(None, "the task's data: a JSONL file or a folder written by `specsweep fetch`")
    out: str = option(None, "the draft's folder (must not exist or be empty): a plain transformers folder that "
                            "`specsweep run --draft DIR` uses as is")
    task: str = option("prompts", "whose prompts the draft is trained on (as in `specsweep run`)", choices=TASKS)
    time_budget: float | None = option(None, "training budget in seconds (after the target's pass over the data)")
    steps: int | None = option(None, "training budget in optimizer steps")
    layers: int = option(2, "the draft's decoder layers")
    width: int | None = option(None, "the draft's hidden width (default: the target's; another width needs "
                                     "--init fresh)")
    init: str = option("target", "target: the target's embedding, final norm, head and the layers of --init-layers, "
                                 "embedding and head then kept frozen; fresh: random weights, all trained",
                       choices=INITS)
    init_layers: str | None = option(None, "which target layers the draft's start from, comma-separated (default: "
                                           "the first --layers, an early exit of the target)")
    draft_vocab: int | None = option(None, "K: the draft predicts only the K most frequent target tokens on the data "
                                           "(a vocabulary map saved with the draft; lossless verification)")
    divergence: str = option("fkl", "what the draft minimises against the target's next-token law: fkl (forward KL), "
                                    "rkl (reverse KL) or tv (total variation, 1 - the acceptance probability)",
                             choices=DIVERGENCES)
    on_policy: float = option(0.0, "share of the training steps (after the first quarter) on the draft's own samples "
                                   "scored by the target (0: teacher-forced only)")
    on_policy_tokens: int = option(16, "tokens the draft samples per prompt in an on-policy step")
    teacher_temperature: float = option(0.0, "how the target continues each prompt: 0 = greedy, else sampled at "
                                             "this temperature")
    max_new_tokens: int = option(64, "the target's continuation per prompt, in tokens")
    max_prompt_tokens: int | None = option(None, "cut longer prompts (articles) to this many tokens (as in `run`)")
    chat_template: bool = option(False, "wrap prompts in the target tokenizer's chat template (as in `run`)")
    limit: int | None = option(None, "use N records of the data (a seeded subset)")
    exclude: str | None = option(None, "data of the same task whose records (by id) are never used, e.g. what "
                                       "`specsweep run` measures the draft on")
    eval_data: str | None = option(None, "data of the same task the curve's held-out agreement is also measured on "
                                         "(e.g. what `specsweep run` measures the draft on); its records (by id) are "
                                         "never trained on")
    holdout: int = option(4, "records kept out of training, written to <out>/heldout.jsonl for `specsweep run`; "
                             "their teacher sequences measure the curve's held-out agreement")
    top_k: int = option(32, "the target's most probable tokens kept per position (the rest is one bin)")
    prompt_weight: float = option(0.25, "weight of the prompt positions' loss against the continuation's")
    prompt_positions: int = option(128, "prompt positions per sequence and step, drawn at random (the most)")
    batch_size: int = option(4, "sequences per training step")
    lr: float = option(1e-3, "peak learning rate (AdamW, warm-up then cosine decay)")
    eval_every: float = option(0.1, "held-out evaluation every this share of the budget")
    seed: int = option(0, "initialisation, data order and sampling seed")
    device: str = option("auto", "cpu, cuda, cuda:N or auto")
    threads: int | None = option(None, "torch intra-op threads (default: every usable core; nothing here is timed)")
    progress: bool = True

    def validate(self) -> DistillSettings:
        """Raise a one-line SpecsweepError for the first bad setting."""
        if (self.time_budget is None) == (self.steps is None):
            raise SpecsweepError("give one budget: --time-budget SECONDS or --steps N")
        if self.time_budget is not None and not (math.isfinite(self.time_budget) and self.time_budget > 0):
            raise SpecsweepError(f"--time-budget must be a positive number of seconds; got {self.time_budget}")
        if self.steps is not None and self.steps < 1:
            raise SpecsweepError(f"--steps must be >= 1; got {self.steps}")
        if self.divergence not in DIVERGENCES:
            raise SpecsweepError(f"unknown divergence {self.divergence!r}: choose {', '.join(DIVERGENCES)}")
        if self.init not in INITS:
            raise SpecsweepError(f"unknown --init {self.init!r}: choose {', '.join(INITS)}")
        if self.task not in TASKS:
            raise SpecsweepError(f"--task {self.task} is not distilled yet: choose {', '.join(TASKS)} (a task whose "
                                 "prompts do not depend on the decoded text)")
        if self.task == "librispeech" and self.teacher_temperature > 0:
            raise SpecsweepError("--task librispeech distils on the target's greedy transcripts: drop "
                                 "--teacher-temperature")
        if self.draft_vocab is not None and self.draft_vocab < 2:
            raise SpecsweepError(f"--draft-vocab K must be >= 2 (the draft's tokens); got {self.draft_vocab}")
        positive = {"layers": self.layers, "top_k": self.top_k, "batch_size": self.batch_size,
                    "max_new_tokens": self.max_new_tokens, "on_policy_tokens": self.on_policy_tokens,
                    "prompt_positions": self.prompt_positions}
        for name, value in positive.items():
            if value < 1:
                raise SpecsweepError(f"--{name.replace('_', '-')} must be >= 1; got {value}")
        if self.width is not None and self.width < 1:
            raise SpecsweepError(f"--width must be >= 1; got {self.width}")
        if not 0 <= self.on_policy <= 1:
            raise SpecsweepError(f"--on-policy is a share of the steps, in [0, 1]; got {self.on_policy}")
        if not (self.lr > 0 and self.teacher_temperature >= 0 and self.prompt_weight >= 0 and 0 < self.eval_every <= 1):
            raise SpecsweepError("--lr must be > 0, --teacher-temperature and --prompt-weight >= 0, --eval-every in "
                                 f"(0, 1]; got {self.lr}, {self.teacher_temperature}, {self.prompt_weight}, "
                                 f"{self.eval_every}")
        if self.holdout < 0 or (self.limit is not None and self.limit < 2):
            raise SpecsweepError(f"--holdout must be >= 0 and --limit >= 2; got {self.holdout}, {self.limit}")
        self.check_paths()
        return self

    def check_paths(self) -> None:
        if not self.target or not self.data or not self.out:
            raise SpecsweepError("--target, --data and --out are required")
        if not Path(self.data).exists():
            raise SpecsweepError(f"--data {self.data} does not exist: give a JSONL file or a folder written by "
                                 "specsweep fetch")
        for flag, path in (("--exclude", self.exclude), ("--eval-data", self.eval_data)):
            if path is not None and not Path(path).exists():
                raise SpecsweepError(f"{flag} {path} does not exist: give a JSONL file or a folder written by "
                                     "specsweep fetch")
        out = Path(self.out)
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise SpecsweepError(f"--out {self.out} exists and is not an empty folder: give a new folder")

    def layer_choice(self, target_layers: int) -> list[int]:
        """The target layers the draft's layers start from: ``--init-layers``, else the first ``layers`` (an early
        exit: the final norm and head then read a residual stream that consecutive layers built; SmolLM2's first
        and last layer start far from the target, docs/distill.md)."""
        if self.init_layers is None:
            if self.layers > target_layers:
                raise SpecsweepError(f"--layers {self.layers} is more than the target's {target_layers}: a draft has "
                                     "fewer layers than its target")
            return list(range(self.layers))
        try:
            chosen = [int(x) for x in self.init_layers.split(",") if x.strip()]
        except ValueError:
            chosen = []
        if len(chosen) != self.layers or not all(0 <= i < target_layers for i in chosen):
            raise SpecsweepError(f"--init-layers must name {self.layers} target layers in [0, {target_layers}) "
                                 f"(one per draft layer); got {self.init_layers!r}")
        return chosen

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "progress"}


def settings_fields():
    """The settings that have a flag (every field but ``progress``), with their help and choices."""
    return [f for f in fields(DistillSettings) if f.metadata.get("help")]
