"""One run: load the pair and the data, decode every sample with the chosen engine and sampler, measure,
score, and write the results JSON atomically. ``specsweep run``, DVC stages, W&B agents and Optuna trials all
come through :func:`run`.

Speed metrics (pipeline/paired.py: after the quality pass over every sample, the speculative loop and the
γ = 0 loop of the same engine are timed on the first --samples-per-repeat samples in --repeats interleaved repeats):
  tokens_per_second      median over the repeats of new tokens / seconds inside the engine's generate calls (no
                         loading, no scoring); ``_ci_low``/``_ci_high`` its interval, ``pass_tokens_per_second``
                         the quality pass's (one timing of every sample)
  acceptance_rate        accepted draft tokens / drafted tokens
  mean_accepted_tokens   new tokens per verify step, the corrected/bonus token included (Spec-Bench's MAT)
  cost_ratio             c = seconds per draft forward / seconds per target forward of autoregressive decoding
                         (one token each; Leviathan et al.'s cost coefficient), timed in the paired repeats
  verify_cost_ratio      r = seconds per speculative target forward (γ + 1 tokens) / seconds per target forward of
                         autoregressive decoding; draft_forward_s, target_forward_s, verify_forward_s: the three
                         per-forward times (pipeline/paired.py: forward_costs)
  iid_alpha              per-token acceptance probability α of the i.i.d. model, estimated from the accepted
                         counts (see iid_alpha()); not the same as acceptance_rate
  theoretical_speedup    (1 - α^(γ+1)) / ((1 - α)(γc + 1))  (Leviathan et al. 2023; assumes r = 1)
  predicted_speedup      mean_accepted_tokens / (γc + r): the same with the measured tokens per step and the
                         measured cost of the γ + 1-token forward; the measured speedup is checked against it
  speedup                paired: the median over repeats of (speculative tokens/s) / (γ = 0 tokens/s) within
                         the repeat, with an order-statistic interval (``speedup_ci_low``/``_high``)
  unpaired_speedup       with ``--baseline`` (a γ = 0 run of the same target, task, data, dtype, device and length
                         settings): tokens_per_second / the baseline's, timed in another process; for reference
  flagged                True when the measurement should not be trusted (pipeline/measure.py): its reasons are in
                         ``results["measurement"]["flags"]`` and on stderr
"""

from __future__ import annotations

import dataclasses
import sys

import torch
from tqdm.auto import tqdm

from pipeline import distributed, paired, roofline, stack
from pipeline import origins as prov
from pipeline.config import LLAMA_CPP, MODEL_DRAFTERS, RunConfig
from pipeline.data import load_task_data
from pipeline.decoding.drafters.base import add_counts
from pipeline.decoding.drafters.cross_tokenizer import merge_statistics
from pipeline.decoding.llama_cpp import server as llama_servers
from pipeline.dtypes import AUTO
from pipeline.env_info import LoadProbe, ThreadSettings, default_threads, provenance
from pipeline.errors import SpecsweepError
from pipeline.models import auto_dtype, eos_token_ids, parse_dtype, resolve_device
from pipeline.objectives import iid_alpha, position_acceptance, predicted_speedup, theoretical_speedup
from pipeline.quality import greedy_agreement
from pipeline.result import make_result, read_result, write_result
from pipeline.rng import RowGenerators
from pipeline.rules import SPEED_ONLY_NOTE, is_speed_only
from pipeline.tasks import get_task
from pipeline.tasks.base import Cuts
from pipeline.tree_plan import add_node_counts, node_rates

# Settings that must match between a run and the AR baseline its speedup is measured against.
BASELINE_KEYS = ("target", "task", "data", "dtype", "max_new_tokens", "max_prompt_tokens", "limit", "seed",
                 "temperature", "batch_size", "ignore_eos", "chat_template", "long_inputs", "categories",
                 "per_category")


def _load_baseline(path: str, config: RunConfig, device: str) -> dict:
    baseline = read_result(path)
    try:
        base_cfg, tps = baseline["config"], baseline["metrics"]["tokens_per_second"]
    except (KeyError, TypeError) as e:
        raise SpecsweepError(f"--baseline {path} is not a specsweep results file (no {e})") from None
    if base_cfg.get("gamma") != 0:
        raise SpecsweepError(f"--baseline {path} is a γ = {base_cfg.get('gamma')} run: the baseline must be γ = 0")
    ours = config.to_dict()
    differ = [k for k in BASELINE_KEYS if base_cfg.get(k) != ours.get(k)]
    if baseline.get("resolved", {}).get("device") != device:
        differ.append("device")
    if differ:
        raise SpecsweepError(f"--baseline {path} differs from this run in {differ}: the AR baseline must use the "
                             "same settings")
    return {"path": path, "tokens_per_second": tps, "quality": baseline.get("quality")}


def run(config: RunConfig, progress: bool = True, models: dict | None = None) -> dict:
    """Run one configuration end to end; returns the results dict (also written to ``config.out``).

    torch's intra-op threads are set for the run (``--threads``, default :func:`default_threads`) and put back
    afterwards; its inter-op threads can only be set once per process (see ThreadSettings). ``models``: a dict
    the caller keeps across runs of one process (a grid, :func:`run_grid`) to load each pair once; the models are
    never modified by a run, so sharing them changes no token."""
    config.validate()
    previous = torch.get_num_threads()
    try:
        return _run(config, ThreadSettings(config.threads or default_threads(), config.interop_threads).apply(),
                    progress, models)
    finally:
        torch.set_num_threads(previous)
        llama_servers.stop_all()    # --engine llama.cpp: no server outlives its run, also on error


def run_grid(configs: list[RunConfig], progress: bool = True, on_result=None) -> list[dict]:
    """Run several configurations in this process, one after another, loading each model pair once (the grid of
    ``specsweep run --sampler a,b --gamma 2,4``: the import and load costs are paid once instead of per run).
    Every configuration is validated before the first runs, so a bad one loses no time; each result is written
    as its run ends. ``on_result(config, result)`` is called after each run (printing, W&B logging)."""
    for config in configs:
        config.validate()
    models: dict = {}
    results = []
    for i, config in enumerate(configs):
        if len(configs) > 1:
            tqdm.write(f"run {i + 1}/{len(configs)}: {config.out}", file=sys.stderr)
        results.append(run(config, progress, models))
        if on_result is not None:
            on_result(config, results[-1])
    return results


def _run(config: RunConfig, threads: dict, progress: bool, models: dict | None) -> dict | None:
    """One run in this process, or this rank's part of a data-parallel run (pipeline/distributed.py: the ranks
    decode their shares of the examples, rank 0 gathers them, measures speed, scores and writes; the other ranks
    return None)."""
    world = _world(config)
    asked_device = config.device if world is None else distributed.rank_device(world, config.device)
    config, dtype, dtype_choice, asked_device = _resolve_dtype(config, asked_device)
    device = resolve_device(asked_device, dtype)
    # a data-parallel run is compared with its baseline on rank 0's device, the same on every rank
    main_device = device if world is None else resolve_device(
        distributed.rank_device(distributed.World(0, world.size, 0), config.device), dtype)
    baseline = _load_baseline(config.baseline, config, main_device) if config.baseline else None
    sampler = stack.build_sampler(config)  # before loading models: a bad sampler request fails fast
    task = get_task(config.task)
    if config.engine != LLAMA_CPP:  # (a GGUF target's tokenizer is read with the file)
        task.check_target(config)  # e.g. a target without the chat template the task needs: refused before loading it
    if not progress:
        from transformers.utils import logging as hf_logging  # kept local: imports transformers

        hf_logging.disable_progress_bar()
    records = load_task_data(config.task, config.data, config.limit, config.seed if config.limit else None,
                             categories=config.categories_list(), per_category=config.per_category)
    records = task.decode_units(records)  # what the run decodes: one prompt each (spec_bench: a question's turns)
    if world is not None and len(records) < world.size:
        raise SpecsweepError(f"{len(records)} examples for {world.size} processes: use at most {len(records)} "
                             "processes (or more data, --limit)")
    decoding = _Decoding(config, sampler, device, dtype, records, models, world, progress)
    if world is None:
        (loaded, engine, loops, encode), (samples, totals) = decoding(distributed.Where())
    else:
        distributed.start(device)
        local, shares = distributed.gather_shares(world, decoding)
        if not world.main:
            return None
        loaded, engine, loops, encode = local
        samples = distributed.unshard([s for s, _ in shares])
        totals = distributed.merge_totals([t for _, t in shares])
    target, draft, tokenizer, _ = loaded
    metrics = _summarize(samples, totals)
    metrics["roofline"] = _roofline(config, target, draft, samples, totals, device)
    measurement = _measure(config, loops, records, encode, device, metrics, threads, progress, task)
    metrics.update(paired.metrics_of(measurement))
    if baseline is not None:
        metrics["baseline_tokens_per_second"] = baseline["tokens_per_second"]
        metrics["unpaired_speedup"] = metrics["tokens_per_second"] / baseline["tokens_per_second"]
    paired.warn_if_flagged(measurement, config.out)

    ar_samples, ar_source = _ar_outputs(config, task, loops, lambda: task.encoder(target, tokenizer, loaded[3], config),
                                        records, samples, baseline, tokenizer, device, progress)
    quality, per_sample = task.score_run(samples, records, tokenizer, config.seed, ar_samples)
    if config.temperature == 0 and config.gamma > 0:     # lossless, token by token: against the target alone
        metrics["greedy_agreement"] = _greedy_agreement(samples, ar_samples, baseline, measurement)
    for s, q in zip(samples, per_sample):
        s["quality"] = q
    metrics.update(task.run_metrics(records, samples, measurement))  # e.g. per category (spec_bench)
    resolved = {"device": device, "dtype_choice": dtype_choice, "samples": len(samples),
                "baseline": baseline["path"] if baseline else None,
                "baseline_quality": baseline["quality"] if baseline else None,
                **stack.forwards_record(engine), **encode.record(totals["cuts"]),
                "eos_token_ids": [] if config.ignore_eos else eos_token_ids(target, tokenizer),   # benchmarks/replay.py
                "processes": 1 if world is None else world.size, "seed_per_example": decoding.per_example,
                "draft_tokenizer_mode": stack.draft_tokenizer_mode(config, sampler, draft, tokenizer),
                "drafter": engine.drafter.settings if getattr(engine, "drafter", None) is not None else None}
    resolved.update(_draft_record(config, sampler, loops))
    if task.wants_ar_outputs:
        resolved["ar_outputs"] = ar_source
    if world is not None:
        # the quality pass ran on every rank; the paired speed measurement (a per-device property) on rank 0 alone
        resolved["rank_wall_time_s"] = totals["rank_wall"]
        resolved["speed_measured_on"] = f"rank 0 ({device})"
    # the config as it was in effect: --processes > 1 implies per-example randomness; a drafter without a model
    # loads no draft
    effective = dataclasses.replace(config, seed_per_example=decoding.per_example,
                                    draft=config.draft if config.drafter in MODEL_DRAFTERS else None)
    results = make_result(effective.to_dict(), resolved, provenance(device), metrics, measurement, quality, samples)
    write_result(config.out, results)
    return results


def _resolve_dtype(config: RunConfig, asked_device: str) -> tuple[RunConfig, torch.dtype, str | None, str]:
    """(the config with --dtype auto resolved, its torch dtype, why auto chose it, the device to ask for). --dtype
    auto: the device's fastest native dtype; the results record the dtype used and why (dtype_choice). --engine
    llama.cpp runs GGUF files in their own quantisation on the CPU: --dtype stays auto."""
    if config.engine == LLAMA_CPP:
        return config, torch.float32, "the GGUF files' own (resolved.llama_cpp)", "cpu"
    used, dtype_choice = auto_dtype(config.target, asked_device) if config.dtype == AUTO else (config.dtype, None)
    config = dataclasses.replace(config, dtype=used)
    return config, parse_dtype(config.dtype), dtype_choice, asked_device


def _draft_record(config: RunConfig, sampler, loops: dict) -> dict:
    """The ``resolved`` entries of a token tree (the tree it decoded with: best:N is planned from its profile), of
    synthetic acceptance (the rates it ran at; its quality is no claim) and of --engine llama.cpp (``llama_cpp``: the
    build, the GGUF files and the server's flags of each loop)."""
    record = {}
    if config.engine == LLAMA_CPP:
        record["llama_cpp"] = {name: loop.record() for name, loop in loops.items()}
    if config.draft_tree is not None:
        record["tree_parents"] = list(stack.run_tree(config).parents)
    if is_speed_only(config.sampler):
        record["speed_only"] = {"note": SPEED_ONLY_NOTE, "rates": sampler.rates_for(config.gamma_max or config.gamma),
                                "rates_from": config.synthetic_rates or "--synthetic-acceptance"}
    return record


def _greedy_agreement(samples: list[dict], ar_samples: list[dict] | None, baseline: dict | None,
                      measurement: dict) -> dict | None:
    """:func:`pipeline.quality.greedy_agreement` of a greedy run against the target alone's tokens: the γ = 0
    outputs the task compared (spec_bench), else the --baseline file's samples, else the paired timing's γ = 0
    loop's outputs on the timed samples (its first repeat); ``reference`` in the record says which."""
    if ar_samples is None and baseline is not None:
        ar_samples, source = read_result(baseline["path"])["samples"], baseline["path"]
    elif ar_samples is not None:
        source = "the γ = 0 outputs the task scored against"
    else:
        outputs = measurement.get("outputs", {}).get(paired.AUTOREGRESSIVE) or []
        ar_samples = [{"id": s["id"], "token_ids": t} for s, t in zip(samples, outputs)]
        source = f"the paired γ = 0 loop ({len(ar_samples)} timed samples)"
    if not ar_samples:
        return None
    return {"reference": source, **greedy_agreement(samples, ar_samples)}


def _world(config: RunConfig):
    """The data-parallel world this process is part of (None: a run in this process alone), checked against
    --processes."""
    world = distributed.current_world()
    if config.processes > 1 and world is None:
        raise SpecsweepError(f"--processes {config.processes} needs its processes started: run it through "
                             "`specsweep run` (which starts accelerate launch) or `accelerate launch -m pipeline "
                             "run ...`")
    if world is not None and config.processes not in (1, world.size):
        raise SpecsweepError(f"--processes {config.processes} but accelerate started {world.size} processes: make "
                             "them agree (or leave --processes out under accelerate launch)")
    return world


class _Decoding:
    """Load, warm up and decode this process's examples: called with a distributed ``Where``, returns ((loaded pair,
    engine, loops, encode), (samples, totals)); ``models`` keeps the loaded pairs across the runs of a grid."""

    def __init__(self, config: RunConfig, sampler, device: str, dtype, records: list[dict], models: dict | None,
                 world, progress: bool) -> None:
        self.config, self.sampler, self.device, self.dtype = config, sampler, device, dtype
        self.records, self.models, self.world, self.progress = records, models, world, progress
        self.per_example = config.seed_per_example or world is not None

    def __call__(self, where) -> tuple[tuple, tuple[list[dict], dict]]:
        config, device, world = self.config, self.device, self.world
        task = get_task(config.task)
        key = (config.target, config.draft if config.gamma > 0 else None, config.dtype, device, config.task,
               config.draft_decoder_only, config.drafter, config.target_quant)
        # a rank's models stay on its own device (never spread over the GPUs of the other ranks)
        loading = config if world is None else dataclasses.replace(config, device=device)
        loaded = (self.models or {}).get(key) or stack.load_pair(loading, task, self.dtype, device)
        if self.models is not None:
            self.models[key] = loaded
        target, _, tokenizer, processor = loaded
        engine = stack.build_engine(config, self.sampler, target, loaded.draft, tokenizer, device)
        loops = {paired.SPECULATIVE: engine,
                 paired.AUTOREGRESSIVE: stack.autoregressive_engine(config, target, tokenizer, device)} \
            if config.gamma > 0 else {paired.AUTOREGRESSIVE: engine}
        encode = task.encoder(target, tokenizer, processor, config)  # cuts long inputs by the run's long-inputs rule
        share = self.records if world is None else world.shard(self.records)
        self._warm_up(loops, encode, share, where)
        torch.manual_seed(config.seed)
        generators = _generators(config, device, self.per_example)
        shared = _quality_pass(config, engine, encode, share, tokenizer, task, generators, self.progress and
                               (world is None or world.main), where)
        return (loaded, engine, loops, encode), shared

    def _warm_up(self, loops: dict, encode, share: list[dict], where) -> None:
        """One short, untimed generation of the first batch by each loop, so one-time costs (allocations, lazy
        initialisation, kernel loading on a GPU) stay out of the measured tokens/s. Its own generator leaves the
        run's random stream, and so its tokens, unchanged."""
        config = self.config
        first_batch = get_task(config.task).batches(share, config.batch_size)[0]
        where.on(first_batch)
        first, _ = encode(first_batch)
        for loop in loops.values():
            loop.generate(first["input_ids"], first["attention_mask"], min(4, config.max_new_tokens),
                          torch.Generator(device=self.device).manual_seed(config.seed + 1),
                          encoder_inputs=first.get("encoder_inputs"), **paired.prompt_texts(loop, first))


def _generators(config: RunConfig, device: str, per_example: bool):
    """The quality pass's randomness, as batch (records) -> what ``generate`` takes: one generator seeded with --seed
    for the whole run, or with per-example randomness a :class:`pipeline.rng.RowGenerators` per batch (seeded from
    --seed and each example's id; ``--engine hf`` runs batch 1 and takes its one row's plain generator)."""

    if not per_example:
        generator = torch.Generator(device=device).manual_seed(config.seed)
        return lambda batch: generator

    def per_batch(batch: list[dict]):
        rows = RowGenerators(config.seed, [r["id"] for r in batch], device)
        return rows if config.engine == "specsweep" else rows.row_generator(0)
    return per_batch


def _quality_pass(config: RunConfig, engine, encode, records: list[dict], tokenizer, task, generators,
                  progress: bool, where=None) -> tuple[list[dict], dict]:
    """Decode every record once, in the task's batches, with the run's randomness (``generators``: batch ->
    generator, see :func:`_generators`) -> (per-sample results, totals: engine seconds, phase times and calls, draft
    forwards, accepted-count histogram, peak memory, and the task's Cuts of inputs too long for the model, about
    which it warns once). ``where`` (pipeline/distributed.py Where) is told which examples each batch holds; the
    encoder is told each batch's output texts (a conversation's later turns read them)."""

    samples, cuts = [], Cuts()
    totals = {"wall": 0.0, "phase_time": {}, "phase_calls": {}, "draft_forwards": 0, "peak": 0.0}
    bar = tqdm(total=len(records), desc=f"{config.sampler} γ={config.gamma}", unit="sample", disable=not progress)
    for batch in task.batches(records, config.batch_size):
        if where is not None:
            where.on(batch)
        inputs, cut = encode(batch)
        cuts += cut
        result = engine.generate(inputs["input_ids"], inputs["attention_mask"], config.max_new_tokens,
                                 generators(batch), encoder_inputs=inputs.get("encoder_inputs"),
                                 **paired.prompt_texts(engine, inputs))
        totals["wall"] += result.wall_time_s
        totals["draft_forwards"] += result.extra.get("draft_forwards", 0)
        totals["drafter_counts"] = add_counts(totals.get("drafter_counts"), result.extra.get("drafter_counts"))
        hist = result.extra.get("accepted_histogram")
        if hist:
            hist = hist[: accepted_at_most(config) + 1]   # a tree's step accepts at most its depth
            totals["hist"] = [a + b for a, b in zip(totals.get("hist", [0] * len(hist)), hist)]
        if result.extra.get("node_acceptance"):
            totals["nodes"] = add_node_counts(totals.get("nodes"), result.extra["node_acceptance"])
        totals["peak"] = max(totals["peak"], result.peak_memory_mb)
        if "cross_tokenizer" in result.extra:

            parts = [totals["cross_tokenizer"]] if "cross_tokenizer" in totals else []
            totals["cross_tokenizer"] = merge_statistics([*parts, result.extra["cross_tokenizer"]])
        for key, values in (("phase_time", result.phase_time_s), ("phase_calls", result.phase_calls)):
            for k, v in values.items():
                totals[key][k] = totals[key].get(k, 0) + v
        for i, (tokens, stats) in enumerate(zip(result.tokens, result.row_stats)):
            real = inputs["attention_mask"][i].bool()
            samples.append({"id": batch[i]["id"], "text": tokenizer.decode(tokens, skip_special_tokens=True),
                            "token_ids": tokens, "prompt_ids": inputs["input_ids"][i][real].tolist(),
                            "prompt_tokens": int(real.sum()), **stats,
                            "acceptance_rate": stats["accepted"] / stats["drafted"] if stats["drafted"] else None,
                            "mean_accepted_tokens": stats["new_tokens"] / max(1, stats["verify_steps"]),
                            "reference": task.reference(batch[i])})
            if result.origins is not None:  # None from --engine hf, which cannot know them
                _add_origins(samples[-1], result.origins[i], result.origin_steps[i], tokenizer, config.gamma, totals)
        encode.answered(batch, [s["text"] for s in samples[-len(batch):]])
        bar.update(len(batch))
    bar.close()
    if cuts.too_long:
        tqdm.write(f"warning: {encode.warning(cuts)}", file=sys.stderr)
    totals["cuts"] = cuts
    return samples, totals


def _add_origins(sample: dict, origins: list[int], steps: list[int], tokenizer, gamma: int, totals: dict) -> None:
    """A sample's token origins, compactly (pipeline/origins.py): ``origins``, one letter per token, and
    ``origin_steps``, tokens per verify step; and its tokens counted into the run's acceptance by token class."""

    sample["origins"] = prov.encode_origins(origins)
    sample["origin_steps"] = prov.run_lengths(steps)
    if gamma > 0:  # at γ = 0 no draft token is ever on offer
        special = set(tokenizer.all_special_ids)
        pieces = prov.token_pieces(tokenizer, sample["token_ids"])
        classes = prov.token_classes(pieces, [t in special for t in sample["token_ids"]])
        totals["token_classes"] = prov.class_counts(classes, origins, totals.get("token_classes"))


def _roofline(config: RunConfig, target, draft, samples: list[dict], totals: dict, device: str) -> dict | None:
    """The quality pass's roofline (pipeline/roofline.py): analytic FLOPs and bytes of each phase against its
    measured time and the machine's peak (on a CPU probed once per machine and cached)."""

    if config.engine == LLAMA_CPP:   # llama.cpp's forwards are not ours to count, nor its GGUF types' widths
        return None
    dtype = parse_dtype(config.dtype)
    try:
        shape = roofline.ModelShape.from_config(target.config)
        draft_shape = roofline.ModelShape.from_config(draft.config) if draft is not None and config.gamma else None
    except (ValueError, AttributeError, TypeError) as e:
        tqdm.write(f"warning: no roofline for this pair ({' '.join(str(e).split())[:120]})", file=sys.stderr)
        return None
    width = torch.empty((), dtype=dtype).element_size()
    return roofline.run_roofline(shape, draft_shape, config.gamma, width, samples, totals["phase_time"],
                                 totals["phase_calls"], totals["draft_forwards"], roofline.machine_peak(device, dtype))


def _measure(config: RunConfig, loops: dict, records: list[dict], encode, device: str, metrics: dict, threads: dict,
             progress: bool, task) -> dict:
    """The paired timing (pipeline/paired.py) on the first ``samples_per_repeat`` samples (encoded by the run's
    ``encode``), or where the task times groups apart (spec_bench: categories) on each group's, with the machine's
    load recorded around it; returns the measurement record (with ``groups``: each group's timing)."""
    groups = task.timing_groups(records, config.samples_per_repeat)
    if groups is None:
        subset = records[: config.samples_per_repeat]
        batches = [encode(subset[i: i + config.batch_size])[0]
                   for i in range(0, len(subset), config.batch_size)]
    else:
        subset = [u for units in groups.values() for u in units]
        grouped = {g: [([u["id"] for u in b], encode(b)[0]) for b in task.batches(units, config.batch_size)]
                   for g, units in groups.items()}
    load = LoadProbe(device)
    if groups is None:
        timings, by_group = paired.time_repeats(loops, batches, config.max_new_tokens, config.repeats, config.seed,
                                                device, progress), None
    else:
        timings, by_group = paired.time_groups(loops, grouped, config.max_new_tokens, config.repeats, config.seed,
                                               device, progress)
    metrics.update(_theory(metrics, paired.forward_costs(timings), accepted_at_most(config)))
    record = paired.summarize(timings, metrics["predicted_speedup"], load.finish(), threads, len(subset),
                              config.max_spread, config.max_cpu_wait)
    if by_group is not None:
        record["groups"] = by_group
    return record


def _ar_outputs(config: RunConfig, task, loops: dict, fresh_encoder, records: list[dict], samples: list[dict],
                baseline: dict | None, tokenizer, device: str, progress: bool) -> tuple[list[dict] | None, str | None]:
    """For a task that scores against the γ = 0 loop's own outputs (spec_bench), at T = 0 (sampled outputs are not
    compared token by token): those outputs and where they came from, the run's own at γ = 0, else the --baseline
    file's samples, else one more pass of the γ = 0 loop over every record with a fresh encoder (``fresh_encoder()``:
    a conversation then follows the γ = 0 loop's own answers). (None, None) otherwise."""
    if not task.wants_ar_outputs or task.quality_error(config.temperature) is not None:
        return None, None
    if config.gamma == 0:
        return samples, "this run (γ = 0)"
    if baseline is not None:
        return read_result(baseline["path"])["samples"], baseline["path"]
    ar = dataclasses.replace(config, gamma=0, sampler="exact")
    decoded, _ = _quality_pass(ar, loops[paired.AUTOREGRESSIVE], fresh_encoder(), records, tokenizer, task,
                               _generators(ar, device, False), progress)
    return decoded, "a pass of the γ = 0 loop in this run"


def accepted_at_most(config: RunConfig) -> int:
    """The most draft tokens a step accepts, and the draft forwards it costs: γ, or a token tree's depth (its γ is its
    node count, what the target scores; its draft reads one level per forward, docs/trees.md)."""
    return stack.run_tree(config).depth if config.draft_tree else config.gamma


def _theory(metrics: dict, costs: dict, gamma: int) -> dict:
    """The per-forward costs of the paired repeats, and the theoretical and predicted speedups they give with the
    quality pass's acceptance (α) and tokens per step, for a draft of ``gamma`` tokens per step (a tree's depth: a
    tree then counts as the chain of its depth with its own, higher, α; r is the measured cost of its target
    forward). Where the timed samples all ended within their first step
    (whose target forward is timed as prefill), the speculative target forward's cost comes from the quality pass,
    which timed it over every sample in the same process."""
    if costs["verify_forward_s"] is None and metrics.get("target_forwards") and costs["target_forward_s"]:
        verify = metrics["target_time_s"] / metrics["target_forwards"]
        costs = {**costs, "verify_forward_s": verify, "verify_cost_ratio": verify / costs["target_forward_s"]}
    c, r = costs["cost_ratio"], costs["verify_cost_ratio"]
    return {**costs, "theoretical_speedup": theoretical_speedup(metrics["iid_alpha"], gamma, c),
            "predicted_speedup": predicted_speedup(metrics["mean_accepted_tokens"], gamma, c, r)}


def _summarize(samples: list[dict], totals: dict) -> dict:
    new_tokens = sum(s["new_tokens"] for s in samples)
    accepted = sum(s["accepted"] for s in samples)
    drafted = sum(s["drafted"] for s in samples)
    steps = sum(s["verify_steps"] for s in samples)
    t, calls = totals["phase_time"], totals["phase_calls"]
    acceptance = accepted / drafted if drafted else None
    accepted_chars = sum(s.get("accepted_chars", 0) for s in samples)
    drafted_chars = sum(s.get("drafted_chars", 0) for s in samples)
    return {
        "pass_tokens_per_second": new_tokens / totals["wall"] if totals["wall"] > 0 else None,
        "wall_time_s": totals["wall"],
        "new_tokens": new_tokens,
        "verify_steps": steps,
        "accepted_tokens": accepted,
        "drafted_tokens": drafted,
        "acceptance_rate": acceptance,
        "mean_accepted_tokens": new_tokens / steps if steps else None,
        # the same in characters (each token's text as it decodes), comparable across tokenizers
        "accepted_chars": accepted_chars,
        "drafted_chars": drafted_chars,
        "acceptance_rate_chars": accepted_chars / drafted_chars if drafted_chars else None,
        "chars_per_step": sum(len(s["text"]) for s in samples) / steps if steps else None,
        # a draft with another tokenizer (pipeline/decoding/drafters/cross_tokenizer.py): the mode, the intersection's
        # size and the
        # probability mass it covers
        "cross_tokenizer": totals.get("cross_tokenizer"),
        "prefill_time_s": t.get("prefill", 0.0),
        "draft_time_s": t.get("draft", 0.0),
        "target_time_s": t.get("target", 0.0),
        "verify_time_s": t.get("verify", 0.0),
        # a draft with another tokenizer: re-reading the emitted text on the host
        # (pipeline/decoding/drafters/cross_tokenizer.py)
        "bridge_time_s": t.get("bridge", 0.0),
        "draft_forwards": totals["draft_forwards"],
        # what the drafter counted beyond its forwards (lookup-model: its proposals by source, docs/engine.md)
        "drafter_counts": totals.get("drafter_counts"),
        "target_forwards": calls.get("target", 0),
        "peak_memory_mb": totals["peak"],
        # False where HF's loop matched tokens itself (T = 0): acceptance is then estimated from call counts
        "acceptance_counted": all(s.get("acceptance_counted", True) for s in samples),
        "iid_alpha": iid_alpha(totals.get("hist")),
        # over the positions where a draft token was on offer: the share accepted, by the emitted token's class and
        # the class of the token before it (pipeline/origins.py)
        "token_class_acceptance": totals.get("token_classes"),
        # full-γ verify steps (per row) that accepted k = 0..γ draft tokens, and from it the rate at which draft
        # position i is accepted once reached: P(accepted > i | accepted >= i)
        "accepted_histogram": totals.get("hist"),
        "position_acceptance": position_acceptance(totals.get("hist")),
        # per depth, per sibling rank (a chain: rank 0): nodes the verify steps tried (parent accepted, earlier
        # siblings rejected), those accepted, and the rate; every step counts (docs/trees.md, --tree-profile)
        "node_acceptance": node_rates(totals.get("nodes")),
    }
