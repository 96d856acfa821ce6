"""Generated blocks of the GPU validation's figures (README.md, docs/benchmarks.md, docs/gpu.md), from what
``bash kernels/gpu_validate.sh`` and the GPU benchmarks committed: kernels/results/*.json and
results/bench/*-cuda*.json.

Each function takes the repository root and returns the block's Markdown (docs/README.md, "Generated figures").
"""

from __future__ import annotations

import statistics
from pathlib import Path

from .doc_sources import ci, interval, listing, micros, num, percent, prose, read_source, table

KERNELS = "kernels/results/kernels-nvidia-h100-80gb-hbm3.json"
KERNELS_WRITER = "bash kernels/gpu_validate.sh kernels"
ENGINE = "results/bench/engine-cuda.json"
ENGINE_WRITER = "bash kernels/gpu_validate.sh engine"
DETERMINISTIC = "kernels/results/samplers-deterministic-nvidia-h100-80gb-hbm3.json"
LOSSLESS = "results/bench/lossless-cuda-synthetic.json"
FORWARDS = (("SmolLM2-135M", "results/bench/forward-smollm2-135m-cuda.json"),
            ("TinyLlama-1.1B", "results/bench/forward-tinyllama-1.1b-cuda.json"))
SHORT_DTYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
# the kernel table's rows: (B, γ, V, dtype); the first is the goal configuration, the last the largest
KERNEL_ROWS = ((1, 5, 128256, "bfloat16"), (32, 5, 32000, "float16"), (128, 8, 128256, "bfloat16"))


def times(ratio: float) -> str:
    """A ratio as the pages write it: "10x" from 10 on, "1.7x" below."""
    return f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.1f}x"


def _kernel_rows(data: dict) -> dict[tuple, dict]:
    """{(B, γ, V, dtype, impl, sampler): row} of a `bench kernels` JSON."""
    return {(r["B"], r["gamma"], r["V"], r["dtype"], r["impl"], r["sampler"]): r for r in data["results"]}


def _kernel_figures(data: dict) -> dict:
    """The figures the README and benchmarks.md quote from a `bench kernels` JSON."""
    rows = _kernel_rows(data)
    goal, large = KERNEL_ROWS[0], KERNEL_ROWS[-1]
    ours = [r for r in data["results"] if r["impl"] == "cupy"]
    exact = {c: rows[(*c, "cupy", "exact")] for c in (goal, large)}
    torch_exact = {c: rows[(*c, "torch", "exact")] for c in (goal, large)}
    return {
        "goal": exact[goal], "n_configs": len({(r["B"], r["gamma"], r["V"], r["dtype"]) for r in ours}),
        "over_torch_b1": torch_exact[goal]["graph_s"] / exact[goal]["graph_s"],
        "over_torch_large": torch_exact[large]["graph_s"] / exact[large]["graph_s"],
        "over_floor_large": exact[large]["graph_s"] / exact[large]["floor_graph_s"],
        "over_floor_b1": exact[goal]["graph_s"] / exact[goal]["floor_graph_s"],
        "eager": (min(r["median_s"] for r in ours), max(r["median_s"] for r in ours)),
        "graph_small": (min(r["graph_s"] for r in ours if r["B"] < 128),
                        max(r["graph_s"] for r in ours if r["B"] < 128)),
        "hf_over_exact_b1": rows[(*goal, "hf", "exact")]["median_s"] / exact[goal]["median_s"],
    }


def _config(c: tuple) -> str:
    b, gamma, v, dtype = c
    return f"B = {b}, γ {gamma}, V = {v} in {SHORT_DTYPE[dtype]}"


def readme_h100(root: Path) -> str:
    """README's "On an H100" paragraph: the exact kernel at the goal configuration, and our loop against HF's."""
    kernels = read_source(root, KERNELS, KERNELS_WRITER)
    f = _kernel_figures(kernels)
    engine = _engine_ratios(read_source(root, ENGINE, ENGINE_WRITER))
    gpu = kernels["provenance"]["device"]["gpu"]
    large = KERNEL_ROWS[-1]
    return prose(f"**On an H100** (`bash kernels/gpu_validate.sh`, [docs/gpu.md](docs/gpu.md); {gpu}): the exact "
            f"verify kernel takes {micros(f['goal']['graph_s'])} µs at {_config(KERNEL_ROWS[0])} under a CUDA graph, "
            f"{times(f['over_torch_b1'])} faster than the torch reference, and at B = {large[0]} (γ {large[1]}, "
            f"V = {large[2]}) is within {times(f['over_floor_large'])} of reading the logits once; called eagerly "
            f"the kernels take {micros(f['eager'][0])}-{micros(f['eager'][1])} µs a call over the "
            f"{f['n_configs']} configurations measured, mostly host time (open). Our loop against transformers' "
            f"assisted generation on a launch-bound synthetic pair: {engine[0.0]['spec_over_hf']} at T = 0, "
            f"{engine[1.0]['spec_over_hf']} at T = 1 "
            "([docs/benchmarks.md](docs/benchmarks.md#bench-engine-on-an-h100)).")


def bench_kernels_h100(root: Path) -> str:
    """benchmarks.md's `bench kernels` on an H100: the source, three rows of the grid, what they show."""
    data = read_source(root, KERNELS, KERNELS_WRITER)
    prov, settings = data["provenance"], data["settings"]
    rows = _kernel_rows(data)
    f = _kernel_figures(data)
    shown = [rows[(*c, impl, s)] for c in KERNEL_ROWS for impl, s in
             (("cupy", "exact"), ("cupy", "sigmoid"), ("cupy", "greedy"), ("torch", "exact"))]
    spread = max((max(r["graph_times_s"]) - min(r["graph_times_s"])) / r["graph_s"] for r in shown)
    fi = data["flashinfer"]
    fi_note = "" if fi.get("available") else "; FlashInfer not installed there, so its columns are empty"
    complete = "All" if data.get("complete") else "Not all"
    intro = (f"`{KERNELS}` (`{KERNELS_WRITER}`, i.e. `specsweep bench kernels --repeats {settings['repeats']}`; "
             f"{prov['device']['gpu']}, CuPy {data['cupy']['version']}, torch {prov['versions']['torch']}"
             f"{fi_note}). {complete} {f['n_configs']} configurations ran. µs per verify call, median (graph: of "
             f"{settings['graph_replays']} replays of {settings['graph_calls']} calls, whose spread was at most "
             f"{percent(spread)} in these rows; eager: of {settings['repeats']} calls):")
    body = []
    for i, c in enumerate(KERNEL_ROWS):
        b, gamma, v, dtype = c
        label = f"{b}, {gamma}, {v}, {SHORT_DTYPE[dtype]}" + (" (the goal row)" if i == 0 else "")
        cells = [f"{micros(rows[(*c, 'cupy', s)]['graph_s'])} / {micros(rows[(*c, 'cupy', s)]['median_s'])}"
                 for s in ("exact", "sigmoid", "greedy")]
        hf = rows.get((*c, "hf", "exact"))
        body.append([label, *cells, micros(rows[(*c, "torch", "exact")]["graph_s"]),
                     micros(hf["median_s"]) if hf else "-", micros(rows[(*c, "cupy", "exact")]["floor_graph_s"])])
    header = ["B, γ, V, dtype", "exact graph / eager", "sigmoid graph / eager", "greedy graph / eager",
              "torch exact graph", "HF eager", "floor graph"]
    return "\n".join([prose(intro), "", table(header, body), "", *map(prose, _kernel_bullets(data, f))])


def _kernel_bullets(data: dict, f: dict) -> list[str]:
    goals, floor = data["goals"], data["floor"]
    large = KERNEL_ROWS[-1]
    eager_slower = len(goals["eager"]["sigmoid_slower_configs"])
    graph_count = goals["basis"]["sigmoid"].get("graph", 0)
    sigmoid = (f"- The sigmoid kernel is at least as fast as exact under graph replay in all {graph_count} "
               f"configurations (the paper's trade)" if goals["sigmoid_at_least_as_fast_as_exact"] else
               f"- The sigmoid kernel is slower than exact under graph replay in "
               f"{len(goals['sigmoid_slower_configs'])} configurations")
    sigmoid += f"; eagerly it is slower in {eager_slower} of the {f['n_configs']}."
    return [
        f"- On the device, the exact kernel is {times(f['over_torch_b1'])} faster than the torch reference at B = 1 "
        f"and {times(f['over_torch_large'])} at B = {large[0]}, and within {times(f['over_floor_large'])} of the "
        f"memory floor (one read of the logits, at the {floor['d2d_bandwidth_bytes_per_s'] / 1e12:.1f} TB/s this "
        f"card copied) at B = {large[0]}, γ {large[1]}, V = {large[2]}.",
        f"- At B = 1 it is {times(f['over_floor_b1'])} over the floor: the floor's "
        f"{micros(f['goal']['floor_graph_s'])} µs is a single launch, and the exact step is several dependent "
        "launches of a few µs each.",
        f"- **Eager calls cost {micros(f['eager'][0])}-{micros(f['eager'][1])} µs** over the {f['n_configs']} "
        f"configurations, while under graph replay the kernels take {micros(f['graph_small'][0])}-"
        f"{micros(f['graph_small'][1])} µs of device time below B = 128. That is the host-side cost of the Python "
        "launch path (argument packing, workspace, CuPy/torch hand-offs); an empty launch costs "
        f"{micros(floor['empty_launch_s'])} µs timed the same way. So the goals judged at B = 1 are not met: "
        f"{num(f['hf_over_exact_b1'])}x faster than HF's step (goal 20x), {times(f['over_floor_b1'])} over the "
        "floor (goal 2x). `specsweep run --verify-graphs` replays the step from a CUDA graph and pays the device "
        "time only. Cutting the eager host path is open work.",
        sigmoid,
    ]


def _engine_ratios(data: dict) -> dict[float, dict[str, str]]:
    """Per temperature, `bench engine`'s paired ratios (median of the per-repeat ratios, with their range)."""
    loops = {(r["loop"], r["temperature"]): r for r in data["results"]}

    def ratio(a: str, b: str, t: float, with_range: bool = True) -> str:
        ra, rb = loops[(a, t)], loops[(b, t)]
        per = [(ra["new_tokens"] / sa) / (rb["new_tokens"] / sb) for sa, sb in zip(ra["seconds"], rb["seconds"])]
        med = statistics.median(per)
        return interval(med, min(per), max(per), suffix="x") if with_range else f"{num(med)}x"

    temps = sorted({r["temperature"] for r in data["results"]})
    return {t: {"spec_over_hf": ratio("ours_speculative", "hf_assisted", t),
                "ar_over_hf": ratio("ours_autoregressive", "hf_plain", t),
                "spec_over_ar": ratio("ours_speculative", "ours_autoregressive", t),
                "hf_spec_over_plain": ratio("hf_assisted", "hf_plain", t, with_range=False),
                "static": ratio("ours_speculative", "ours_speculative_hf_forward", t)} for t in temps}


def bench_engine_h100(root: Path) -> str:
    """benchmarks.md's `bench engine` on an H100: settings, the paired ratios per temperature, what they measure."""
    data = read_source(root, ENGINE, ENGINE_WRITER)
    s = data["settings"]
    ratios = _engine_ratios(data)
    intro = (f"`{ENGINE}` (`{ENGINE_WRITER}`, i.e. `specsweep bench engine --device cuda --repeats {s['repeats']}`): "
             f"the synthetic pair above, {SHORT_DTYPE[s['dtype']]}, batch {s['batch']}, γ {s['gamma']}, "
             f"{data['results'][0]['prompts']} prompts x {s['max_new_tokens']} tokens. Paired per-repeat ratios, "
             f"median with the range of the {s['repeats']} repeats:")
    header = ["T", "ours / HF assisted", "ours AR / HF plain", "ours speculative / ours AR", "HF assisted / HF plain",
              "static forward / transformers' (speculative)"]
    body = [[f"{t:g}", r["spec_over_hf"], r["ar_over_hf"], r["spec_over_ar"], r["hf_spec_over_plain"], r["static"]]
            for t, r in ratios.items()]
    spec0 = next(r for r in data["results"] if r["loop"] == "ours_speculative" and r["temperature"] == 0.0)
    same = "The same tokens as HF at T = 0 in both loops." if spec0.get("identical_to_hf_assisted") else \
        "At T = 0 our tokens differ from HF's."
    after = (f"{same} This pair is launch-bound on a GPU ({spec0['tokens_per_second']:.0f} tokens/s speculative at "
             "T = 0, about what the 2-core CPU gives), so these ratios measure the loops' host overhead, not the GPU; "
             "a pair that fills the GPU needs the paper's models.")
    return "\n".join([prose(intro), "", table(header, body), "", prose(after)])


def bench_deterministic_gpu(root: Path) -> str:
    """benchmarks.md's deterministic drafts against one-hot logits on the GPU: eager and graph-replay figures."""
    data = read_source(root, DETERMINISTIC, "specsweep bench samplers --device cuda --deterministic-only")
    rows = {(r["B"], r["gamma"], r["sampler"], r["backend"]): r for r in data["deterministic"]}
    kernels = [r for r in data["deterministic"] if r["backend"] == "cupy"]
    det = [r["deterministic_median_s"] for r in kernels]
    one_hot = [r["one_hot_over_deterministic"]["median"] for r in kernels]
    half = max(max(r["graph_one_hot_over_deterministic"]["ci_high"] - r["graph_one_hot_over_deterministic"]["median"],
                   r["graph_one_hot_over_deterministic"]["median"] - r["graph_one_hot_over_deterministic"]["ci_low"])
               for r in data["deterministic"])
    first = data["deterministic"][0]
    intro = (f"**GPU** (an H100, `bench samplers` with `deterministic_only=True` over B "
             f"{', '.join(str(b) for b in sorted({r['B'] for r in kernels}))} × γ "
             f"{', '.join(str(g) for g in sorted({r['gamma'] for r in kernels}))} × V {first['V']} × "
             f"{SHORT_DTYPE[first['dtype']]}, {data['settings']['repeats']} eager repeats; `{DETERMINISTIC}`; one "
             "run). "
             f"Eager calls are mostly host time (the kernels' {micros(min(det))}-{micros(max(det))} µs "
             f"deterministic, {num(min(one_hot))}-{num(max(one_hot))}x for one-hot); device time under CUDA-graph "
             f"replay ({first['graph_one_hot_over_deterministic']['n']} replays each way, the two ways alternating, "
             f"ratios paired by replay: their intervals are within ±{half:.2f} of the median):")

    def cell(r: dict) -> str:
        return (f"{micros(r['deterministic_graph_s'])} / {micros(r['one_hot_graph_s'])} "
                f"({num(r['graph_one_hot_over_deterministic']['median'])}x)")

    body = [[f"{b}, {g}", cell(rows[(b, g, "exact", "cupy")]), cell(rows[(b, g, "greedy", "cupy")]),
             cell(rows[(b, g, "exact", "torch")])]
            for b, g in sorted({(r["B"], r["gamma"]) for r in kernels})]
    header = [f"B, γ (V {first['V']}, {SHORT_DTYPE[first['dtype']]} target)", "exact kernels µs, det / one-hot",
              "greedy kernel µs", "exact torch µs"]
    return "\n".join([prose(intro), "", table(header, body)])


def bench_forward_cuda(root: Path) -> str:
    """benchmarks.md's one-forward benchmark on an H100: transformers' forward against ours, per model shape."""
    body = []
    for name, path in FORWARDS:
        data = read_source(root, path, "python -m pipeline.benchmarks.forward --model PATH --device cuda")
        cfg = data["config"]
        label = (f"{name} ({cfg['num_hidden_layers']} layers, {cfg['hidden_size']} wide, "
                 f"{cfg['num_attention_heads']}/{cfg['num_key_value_heads']} heads)")
        for i, r in enumerate(data["results"]):
            body.append([label if i == 0 else "", str(r["new_tokens"]), num(r["transformers_ms"]),
                         num(r["static_ms"]), ci(r["speedup"], 3)])
    header = ["model shape", "new tokens", "transformers ms", "ours ms", "speedup"]
    return table(header, body)


def gpu_machine(root: Path) -> str:
    """docs/gpu.md: the GPU, driver and versions the committed GPU results were measured with."""
    data = read_source(root, KERNELS, KERNELS_WRITER)
    prov = data["provenance"]
    dev, ver = prov["device"], prov["versions"]
    return prose(f"{dev['gpu']}, driver {dev['driver']}, CUDA runtime {dev['cuda_runtime']}, torch {ver['torch']}, "
            f"CuPy {data['cupy']['version']}, transformers {ver['transformers']} (the provenance of `{KERNELS}`, "
            f"{prov['date'][:10]}).")


def gpu_kernels_bullet(root: Path) -> str:
    """docs/gpu.md: the `kernels` step's outcome."""
    data = read_source(root, KERNELS, KERNELS_WRITER)
    f = _kernel_figures(data)
    done = "all" if data.get("complete") else f"not all (stopped: {len(data.get('stopped') or [])})"
    return prose(f"- `kernels`: {done} {f['n_configs']} configurations "
            "([benchmarks.md](benchmarks.md#bench-kernels-on-an-h100)).")


def gpu_lossless_bullet(root: Path) -> str:
    """docs/gpu.md: `bench lossless` on the GPU (synthetic pair): greedy matches and the sampled tests' verdicts."""
    data = read_source(root, LOSSLESS, "specsweep bench lossless --device cuda --synthetic --dtypes float32,bfloat16")
    rows = data["results"]
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    greedy = [r for r in rows if r["greedy"]]
    matches = sorted({(r["greedy"]["identical"], r["greedy"]["prompts"]) for r in greedy})
    match = " and ".join(f"{a} of {b}" for a, b in matches)
    lowest = min(rows, key=lambda r: r["sampled"]["min_p_value"])
    p = lowest["sampled"]["per_prompt"][0]
    which = "first token" if p["first_token"]["p_value"] == lowest["sampled"]["min_p_value"] else "first two tokens"
    same = all(r["sampled"]["verdict"] == "same" for r in rows)
    rules_greedy = listing(list(dict.fromkeys(r["label"] for r in greedy)))
    rules_sampled = listing(list(dict.fromkeys(r["label"] for r in rows)))
    s = data["settings"]["sampled"]
    return prose(f"- Also run: `specsweep bench lossless --device cuda --synthetic --dtypes {','.join(dtypes)}` "
            f"(`{LOSSLESS}`): {rules_greedy} give the target's greedy tokens on {match} prompts in "
            f"{'both dtypes' if len(dtypes) == 2 else 'every dtype'}, and {rules_sampled} "
            f"{'keep' if same else 'do not all keep'} its distribution at T = {s['temperature']:g} (chi-square, "
            f"Bonferroni, α {s['alpha']:g}; the lowest p, {lowest['label']} in {SHORT_DTYPE[lowest['dtype']]} on the "
            f"{which}, {lowest['sampled']['min_p_value']:.2g} against a corrected threshold of "
            f"{lowest['sampled']['threshold']:g}).")
