"""One typed configuration for a run, validated in one place.

Filled from CLI flags (``specsweep run``), and by the same ``from_dict`` from params.yaml or a W&B sweep's
``wandb.config``. The results JSON records ``to_dict()`` of the resolved config.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.errors import SpecsweepError

SAMPLERS = ("exact", "sigmoid", "greedy", "hf")
BACKENDS = ("torch", "cupy")
TASKS = ("prompts", "cnn_dailymail", "librispeech")
ENGINES = ("specsweep", "hf")
DTYPES = ("float32", "float16", "bfloat16")
WANDB_MODES = ("online", "offline", "disabled")


@dataclass
class RunConfig:
    """Everything that determines a run's outputs (plus where they go)."""

    target: str
    data: str
    draft: str | None = None
    task: str = "prompts"
    sampler: str = "exact"
    backend: str = "torch"
    alpha: float | None = None
    beta: float | None = None
    preset: str | None = None
    gamma: int = 4
    temperature: float = 1.0
    dtype: str = "float32"
    device: str = "auto"
    batch_size: int = 1
    max_new_tokens: int = 64
    max_prompt_tokens: int | None = None
    chat_template: bool = False
    limit: int | None = None
    seed: int = 0
    engine: str = "specsweep"
    draft_decoder_only: bool = False
    ignore_eos: bool = False
    verify_graphs: bool = False
    static_cache: bool = True  # the engine's static-cache forward where the model family has one (GPT-2)
    baseline: str | None = None
    # Speed measurement (pipeline/paired.py): repeats of the speculative and the γ = 0 loop, interleaved, each on
    # the first samples_per_repeat samples; torch's intra-op threads (None: half the usable cores, at most 8) and
    # inter-op threads (the engine runs no inter-op parallel work: 1).
    repeats: int = 6
    samples_per_repeat: int = 4
    max_spread: float = 1.0  # flag a measurement whose interval is wider than this x its median (pipeline/measure.py)
    max_cpu_wait: float = 0.1  # flag it when its threads waited for a CPU more than this part of their ready time
    threads: int | None = None
    interop_threads: int = 1
    out: str = "results/run.json"
    tags: dict = field(default_factory=dict)
    # Tracking (pipeline/tracking.py): where the run is logged, not what it computes. wandb_mode None means
    # $WANDB_MODE, else "offline" (no account needed; `wandb sync wandb/offline-run-*` uploads later).
    wandb_mode: str | None = None
    wandb_project: str = "specsweep"
    wandb_group: str | None = None

    def validate(self) -> RunConfig:
        """Raise SpecsweepError (one line: what is wrong, what to do) for the first problem found."""
        def bad(msg: str) -> SpecsweepError:
            return SpecsweepError(msg)

        choices = {"sampler": SAMPLERS, "backend": BACKENDS, "task": TASKS, "engine": ENGINES, "dtype": DTYPES}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise bad(f"--{name.replace('_', '-')} {getattr(self, name)!r} is not one of {list(allowed)}")
        if self.gamma < 0:
            raise bad(f"--gamma must be >= 0 (0 = autoregressive decoding); got {self.gamma}")
        if not self.temperature >= 0:
            raise bad(f"--temperature must be >= 0 (0 = greedy); got {self.temperature}")
        if self.gamma > 0 and not self.draft:
            raise bad("--gamma > 0 needs --draft MODEL (or use --gamma 0 for autoregressive decoding)")
        for name in ("batch_size", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise bad(f"--{name.replace('_', '-')} must be >= 1; got {getattr(self, name)}")
        if self.repeats < 3:
            raise bad(f"--repeats must be >= 3 (the speedup's interval needs several repeats; 6 gives a 97 % "
                      f"interval); got {self.repeats}")
        for name in ("samples_per_repeat", "interop_threads"):
            if getattr(self, name) < 1:
                raise bad(f"--{name.replace('_', '-')} must be >= 1; got {getattr(self, name)}")
        if not self.max_spread > 0:
            raise bad(f"--max-spread must be > 0 (the widest interval, relative to its median, that is not flagged; "
                      f"default 1); got {self.max_spread}")
        if not 0 < self.max_cpu_wait <= 1:
            raise bad(f"--max-cpu-wait must be in (0, 1] (the part of its threads' ready time a measurement may spend "
                      f"waiting for a CPU before it is flagged; default 0.1, 1 turns the check off); got "
                      f"{self.max_cpu_wait}")
        if self.threads is not None and self.threads < 1:
            raise bad(f"--threads must be >= 1 (or leave it out: half the usable cores, at most 8); got {self.threads}")
        if self.limit is not None and self.limit < 1:
            raise bad(f"--limit must be >= 1; got {self.limit}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise bad(f"--max-prompt-tokens must be >= 1; got {self.max_prompt_tokens}")
        if self.sampler != "sigmoid" and (self.alpha is not None or self.beta is not None or self.preset):
            raise bad("--alpha/--beta/--preset apply to --sampler sigmoid only")
        if self.sampler == "hf":
            if self.backend != "torch":
                raise bad("--sampler hf is transformers' own code: use --backend torch")
            if self.temperature == 0:
                raise bad("--sampler hf needs --temperature > 0 (HF verifies by token matching at T = 0): "
                          "use --sampler greedy")
            if self.engine == "specsweep" and self.batch_size != 1:
                raise bad("--sampler hf runs batch 1, as HF does: use --batch-size 1")
        if self.verify_graphs and (self.backend != "cupy" or self.engine != "specsweep" or self.device == "cpu"):
            raise bad("--verify-graphs replays the CUDA kernels' verify step from CUDA graphs: use it with "
                      "--backend cupy, --engine specsweep and a CUDA device")
        if self.engine == "hf" and self.batch_size != 1:
            raise bad("--engine hf runs HF's assisted generation, which is batch 1: use --batch-size 1")
        if self.wandb_mode is not None and self.wandb_mode not in WANDB_MODES:
            raise bad(f"--wandb-mode {self.wandb_mode!r} is not one of {list(WANDB_MODES)}")
        if not Path(self.data).exists():
            raise bad(f"--data {self.data} does not exist: give a JSONL file or a folder written by specsweep fetch")
        if self.baseline is not None and not Path(self.baseline).is_file():
            raise bad(f"--baseline {self.baseline} does not exist: run the γ = 0 baseline first with --out")
        return self

    def sampler_params(self) -> dict:
        params: dict = {"temperature": self.temperature}
        if self.sampler == "greedy":
            params = {}
        if self.sampler == "sigmoid":
            if self.preset:
                params["preset"] = self.preset
            for k in ("alpha", "beta"):
                if getattr(self, k) is not None:
                    params[k] = getattr(self, k)
        return params

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> RunConfig:
        """Build from a mapping (params.yaml, wandb.config); unknown keys are an error, not silently dropped."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise SpecsweepError(f"unknown run settings {unknown}: known settings are {sorted(names)}")
        return cls(**values)
