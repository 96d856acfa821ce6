"""`specsweep run`: decode a dataset with a draft/target pair and one verify sampler; write results JSON."""

from __future__ import annotations

import argparse

from pipeline.config import DTYPES, ENGINES, SAMPLERS, TASKS, WANDB_MODES, RunConfig

HELP = "run speculative (or, with --gamma 0, autoregressive) decoding over a dataset and write results JSON"


class _ConfigFlags:
    """Adds each ``--a-b`` flag also as ``--a_b``: W&B sweep agents pass settings as ``--<config name>=value``
    (``--max_new_tokens=32``), and DVC's dict unpacking of params.yaml does the same. Flags named in ``exclude``
    are left out (``specsweep tune`` reuses these flags but chooses γ, sampler, ... itself)."""

    def __init__(self, parser: argparse.ArgumentParser, exclude: tuple[str, ...] = ()):
        self._parser, self._exclude = parser, exclude

    def add_argument(self, *names: str, **kwargs):
        if any(n in self._exclude for n in names):
            return None
        aliases = ["--" + n[2:].replace("-", "_") for n in names if n.startswith("--") and "-" in n[2:]]
        return self._parser.add_argument(*names, *aliases, **kwargs)


def add_arguments(p: argparse.ArgumentParser, exclude: tuple[str, ...] = ()) -> None:
    p = _ConfigFlags(p, exclude)
    p.add_argument("--target", required=True, help="target model: hub id or local directory (save_pretrained)")
    p.add_argument("--draft", help="draft model sharing the target's tokenizer (needed when --gamma > 0)")
    p.add_argument("--data", required=True, help="JSONL file, or a folder written by `specsweep fetch`")
    p.add_argument("--task", default="prompts", choices=TASKS,
                   help="prompts: JSONL of {id, prompt}; cnn_dailymail: article + ' Summary:', scored with ROUGE; "
                        "librispeech: Whisper ASR from a manifest of audio files, scored with WER")
    p.add_argument("--sampler", default="exact", choices=SAMPLERS, help="verify step (default: exact)")
    p.add_argument("--backend", default="torch", help="sampler backend: torch (reference) or cupy (CUDA kernels)")
    p.add_argument("--alpha", type=float, help="sigmoid: scale of the tempered logit (default 1)")
    p.add_argument("--beta", type=float, help="sigmoid: shift (default -20)")
    p.add_argument("--preset", choices=["paper"], help="sigmoid: the paper's kernel constants sigmoid((z+1e4)/2e4)")
    p.add_argument("--gamma", type=int, default=4, help="draft tokens per step; 0 = autoregressive (default: 4)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature; 0 = greedy (default 1)")
    p.add_argument("--dtype", default="float32", choices=DTYPES, help="model dtype (default: float32)")
    p.add_argument("--device", default="auto",
                   help="cpu, cuda (one GPU), cuda:N or auto (default: CUDA when present; with several GPUs the "
                        "target is spread over all of them)")
    p.add_argument("--batch-size", type=int, default=1, help="prompts decoded together (default: 1)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per sample at most (default: 64)")
    p.add_argument("--max-prompt-tokens", type=int, help="truncate longer prompts/articles from the end")
    p.add_argument("--chat-template", action="store_true", help="wrap prompts in the tokenizer's chat template")
    p.add_argument("--limit", type=int, help="use N samples (a seeded subset when the data has more)")
    p.add_argument("--seed", type=int, default=0, help="seed for sampling and subset selection (default: 0)")
    p.add_argument("--engine", default="specsweep", choices=ENGINES,
                   help="specsweep: our loop; hf: transformers' generate(assistant_model=...) with our sampler")
    p.add_argument("--draft-decoder-only", action="store_true",
                   help="librispeech: the draft is a decoder-only assistant (WhisperForCausalLM, as distil-large-v2) "
                        "that reads the target's encoder outputs")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    p.add_argument("--verify-graphs", action="store_true",
                   help="replay each verify step from a CUDA graph (--backend cupy on a GPU; same tokens)")
    p.add_argument("--no-static-cache", dest="static_cache", action="store_false",
                   help="use transformers' forward and DynamicCache for every model (default: the engine's "
                        "static-cache forward for model families that have one, GPT-2; same tokens, less overhead)")
    p.add_argument("--baseline", help="results JSON of a γ = 0 run with the same settings: its quality is the "
                                      "reference, and it adds `unpaired_speedup` (the speedup itself is always "
                                      "paired: measured against this run's own γ = 0 loop)")
    p.add_argument("--repeats", type=int, default=6,
                   help="timed repeats of the speculative and the γ = 0 loop, interleaved (default: 6, which gives "
                        "a 97 %% interval for the median speedup)")
    p.add_argument("--samples-per-repeat", type=int, default=4,
                   help="samples each timed repeat decodes: the first N of the data (default: 4)")
    p.add_argument("--max-spread", type=float, default=1.0,
                   help="flag the speed measurement when its interval is wider than this times its median "
                        "(default: 1)")
    p.add_argument("--max-cpu-wait", type=float, default=0.1,
                   help="flag the speed measurement when its threads spent more than this part of their ready time "
                        "waiting for a CPU that other processes held (default: 0.1; 1 turns the check off)")
    p.add_argument("--threads", type=int,
                   help="torch intra-op threads (default: half the usable cores, at least 1, at most 8)")
    p.add_argument("--interop-threads", type=int, default=1, help="torch inter-op threads (default: 1)")
    p.add_argument("--out", default="results/run.json", help="results JSON (written atomically)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--wandb-mode", choices=WANDB_MODES,
                   help="W&B mode for this run's log (default: $WANDB_MODE, else offline: no account needed)")
    p.add_argument("--wandb-project", default="specsweep", help="W&B project (default: specsweep)")
    p.add_argument("--wandb-group", help="W&B group, e.g. the DVC profile or sweep name")


def main(args: argparse.Namespace) -> int:
    from pipeline.runner import run

    values = {k: v for k, v in vars(args).items() if k not in ("command", "_module", "no_progress")}
    for key in ("baseline", "out"):
        # Templates such as results/runs/text-ar-{dtype}.json: each point of a W&B sweep names its own files.
        template = values.get(key)
        if template and "{" in template:
            try:
                values[key] = template.format(**values)
            except (KeyError, IndexError, ValueError) as e:
                from pipeline.errors import SpecsweepError

                raise SpecsweepError(f"--{key} {template}: bad template ({e}); use {{name}} of a run setting, "
                                     "e.g. {dtype}") from None
    config = RunConfig(**values)
    result = run(config, progress=not args.no_progress)
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
    if "unpaired_speedup" in m:
        parts.append(f"unpaired {m['unpaired_speedup']:.2f}x against --baseline")
    if m.get("theoretical_speedup") is not None:
        parts.append(f"theoretical {m['theoretical_speedup']:.2f}x")
    for k, v in result["quality"].items():
        if isinstance(v, float):
            parts.append(f"{k} {v:.4f}")
    if m["flagged"]:
        parts.append("FLAGGED (see the warnings above)")
    print("; ".join(parts))
    print(f"wrote {config.out}")
    from pipeline.tracking import log_run

    log_run(config, result)  # never fails the run: a W&B problem is a warning
    return 0
