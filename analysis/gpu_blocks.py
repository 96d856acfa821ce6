"""Generated blocks of the GPU validation's figures (README.md, docs/benchmarks.md, docs/gpu.md), from what
``bash kernels/gpu_validate.sh`` and the GPU benchmarks committed: kernels/results/*.json and
results/bench/*-cuda*.json.

No block names a card in its code: each takes the GPU from its source's provenance. The last run's files
(:data:`KERNELS`, :data:`HOST`, :data:`ENGINE`, :data:`FORWARDS_QWEN`) are one card's; the first run's files that no
later run replaced (:data:`DETERMINISTIC`, :data:`FORWARDS`, :data:`LOSSLESS`) another's, and their blocks say which.

Each function takes the repository root and returns the block's Markdown (docs/README.md, "Generated figures").
"""

from __future__ import annotations

import statistics
from pathlib import Path

from pipeline.errors import SpecsweepError

from .doc_sources import ci, interval, listing, micros, num, percent, prose, read_source, table

KERNELS = "kernels/results/kernels-nvidia-h200.json"
KERNELS_WRITER = "bash kernels/gpu_validate.sh kernels"
# the first GPU run's kernels (an H100, before issue 43's plans cut the eager host path): the eager figure before
KERNELS_BEFORE = "kernels/results/kernels-nvidia-h100-80gb-hbm3.json"
HOST = "results/bench/host-cuda.json"
HOST_WRITER = "bash kernels/gpu_validate.sh host"
HOST_GOAL_US = 50.0         # issue 43: the host side of one eager exact call at the goal row, at most this
ENGINE = "results/bench/engine-cuda.json"
ENGINE_WRITER = "bash kernels/gpu_validate.sh engine"
DETERMINISTIC = "kernels/results/samplers-deterministic-nvidia-h100-80gb-hbm3.json"
LOSSLESS = "results/bench/lossless-cuda-synthetic.json"
FORWARDS = (("SmolLM2-135M", "results/bench/forward-smollm2-135m-cuda.json"),
            ("TinyLlama-1.1B", "results/bench/forward-tinyllama-1.1b-cuda.json"))
# the forward step of gpu_validate.sh: random weights of the shapes in kernels/shapes/*/config.json
FORWARDS_QWEN = (("Qwen2.5-Coder-1.5B", "results/bench/forward-qwen2.5-coder-1.5b-shape-cuda.json"),
                 ("Qwen2.5-Coder-0.5B", "results/bench/forward-qwen2.5-coder-0.5b-shape-cuda.json"))
FORWARD_WRITER = "bash kernels/gpu_validate.sh forward"
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
SHORT_DTYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
# the kernel table's rows: (B, γ, V, dtype); the first is the goal configuration, the last the largest
KERNEL_ROWS = ((1, 5, 128256, "bfloat16"), (32, 5, 32000, "float16"), (128, 8, 128256, "bfloat16"))


def times(ratio: float) -> str:
    """A ratio as the pages write it: "10x" from 10 on, "1.7x" below."""
    return f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.1f}x"


def met(goal: bool) -> str:
    """A goal's verdict as the pages write it."""
    return "met" if goal else "not met"


def card(data: dict) -> str:
    """The GPU a source's figures were measured on, from its provenance ("NVIDIA H200")."""
    return data["provenance"]["device"]["gpu"]


def _chain_results(data: dict) -> list[dict]:
    """A `bench kernels` JSON's rows of the chain samplers (the token-tree rows carry ``tree``)."""
    return [r for r in data["results"] if "tree" not in r]


def _kernel_rows(data: dict) -> dict[tuple, dict]:
    """{(B, γ, V, dtype, impl, sampler): row} of a `bench kernels` JSON's chain rows."""
    return {(r["B"], r["gamma"], r["V"], r["dtype"], r["impl"], r["sampler"]): r for r in _chain_results(data)}


def kernel_figures(data: dict) -> dict:
    """The figures the README and benchmarks.md quote from a `bench kernels` JSON."""
    rows = _kernel_rows(data)
    goal, large = KERNEL_ROWS[0], KERNEL_ROWS[-1]
    ours = [r for r in _chain_results(data) if r["impl"] == "cupy"]
    exact = {c: rows[(*c, "cupy", "exact")] for c in (goal, large)}
    torch_exact = {c: rows[(*c, "torch", "exact")] for c in (goal, large)}
    return {
        "goal": exact[goal], "n_configs": len({(r["B"], r["gamma"], r["V"], r["dtype"]) for r in ours}),
        "over_torch_b1": torch_exact[goal]["graph_s"] / exact[goal]["graph_s"],
        "over_torch_large": torch_exact[large]["graph_s"] / exact[large]["graph_s"],
        "over_floor_large": exact[large]["graph_s"] / exact[large]["floor_graph_s"],
        "eager": (min(r["median_s"] for r in ours), max(r["median_s"] for r in ours)),
        "graph_small": (min(r["graph_s"] for r in ours if r["B"] < 128),
                        max(r["graph_s"] for r in ours if r["B"] < 128)),
        "hf_goal": rows[(*goal, "hf", "exact")],
    }


def _eager_before(root: Path) -> str:
    """The eager exact call at the goal row in the first GPU run's JSON, before issue 43's plans: "422 µs on an
    NVIDIA H100 80GB HBM3"."""
    before = read_source(root, KERNELS_BEFORE, KERNELS_WRITER + " (the first GPU run, committed)")
    row = _kernel_rows(before)[(*KERNEL_ROWS[0], "cupy", "exact")]
    return f"{micros(row['median_s'])} µs on an {card(before)}"


def _config(c: tuple) -> str:
    b, gamma, v, dtype = c
    return f"B = {b}, γ {gamma}, V = {v} in {SHORT_DTYPE[dtype]}"


def gpu_summary(root: Path) -> str:
    """gpu.md's summary paragraph: the exact kernel at the goal configuration, eager and replayed, and our loop against
    HF's, from the last GPU run (its card named from the provenance)."""
    kernels = read_source(root, KERNELS, KERNELS_WRITER)
    f = kernel_figures(kernels)
    eager = kernels["goals"]["eager"]
    engine = _engine_ratios(read_source(root, ENGINE, ENGINE_WRITER))
    large = KERNEL_ROWS[-1]
    return prose(f"**In short** (`bash kernels/gpu_validate.sh`; the last run on an "
            f"{card(kernels)}): the exact verify kernel takes {micros(f['goal']['graph_s'])} µs at "
            f"{_config(KERNEL_ROWS[0])} under a CUDA graph, {times(f['over_torch_b1'])} faster than the torch "
            f"reference, and at B = {large[0]} (γ {large[1]}, V = {large[2]}) is within "
            f"{times(f['over_floor_large'])} of reading the logits once; called eagerly it takes "
            f"{micros(f['goal']['median_s'])} µs there ({_eager_before(root)} before the host path was cut), "
            f"{eager['b1_speedup_over_hf']:.1f}x faster than HF's step (goal 20x: "
            f"{met(eager['b1_20x_faster_than_hf'])}). Our loop against transformers' assisted generation on a "
            f"launch-bound synthetic pair: {engine[0.0]['spec_over_hf']} at T = 0, {engine[1.0]['spec_over_hf']} at "
            "T = 1 ([benchmarks.md](benchmarks.md#bench-engine-on-a-gpu)).")


def bench_kernels_gpu(root: Path) -> str:
    """benchmarks.md's `bench kernels` on a GPU: the source, three rows of the grid, what they show."""
    data = read_source(root, KERNELS, KERNELS_WRITER)
    prov, settings = data["provenance"], data["settings"]
    rows = _kernel_rows(data)
    f = kernel_figures(data)
    shown = [rows[(*c, impl, s)] for c in KERNEL_ROWS for impl, s in
             (("cupy", "exact"), ("cupy", "sigmoid"), ("cupy", "greedy"), ("torch", "exact"))]
    spread = max((max(r["graph_times_s"]) - min(r["graph_times_s"])) / r["graph_s"] for r in shown)
    fi = data["flashinfer"]
    fi_note = "" if fi.get("available") else "; FlashInfer not installed there, so its columns are empty"
    complete = "All" if data.get("complete") else "Not all"
    intro = (f"`{KERNELS}` (`{KERNELS_WRITER}`, i.e. `specsweep bench kernels --repeats {settings['repeats']}`; "
             f"{prov['device']['gpu']}, CuPy {data['cupy']['version']}, torch {prov['versions']['torch']}, "
             f"{prov['date'][:10]}{fi_note}). {complete} {f['n_configs']} configurations ran. µs per verify call, "
             f"median (graph: of {settings['graph_replays']} replays of {settings['graph_calls']} calls, whose spread "
             f"was at most {percent(spread)} in these rows; eager: of {settings['repeats']} calls):")
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
    return "\n".join([prose(intro), "", table(header, body), "", *map(prose, _kernel_bullets(root, data, f))])


def _kernel_bullets(root: Path, data: dict, f: dict) -> list[str]:
    goals, floor = data["goals"], data["floor"]
    eager = goals["eager"]
    large = KERNEL_ROWS[-1]
    graph_count = goals["basis"]["sigmoid"].get("graph", 0)
    sigmoid = (f"- The sigmoid kernel is at least as fast as exact under graph replay in all {graph_count} "
               f"configurations (the paper's trade)" if goals["sigmoid_at_least_as_fast_as_exact"] else
               f"- The sigmoid kernel is slower than exact under graph replay in "
               f"{len(goals['sigmoid_slower_configs'])} configurations")
    sigmoid += f"; eagerly it is slower in {len(eager['sigmoid_slower_configs'])} of the {f['n_configs']}."
    return [
        f"- On the device, the exact kernel is {times(f['over_torch_b1'])} faster than the torch reference at B = 1 "
        f"and {times(f['over_torch_large'])} at B = {large[0]}, and within {times(f['over_floor_large'])} of the "
        f"memory floor (one read of the logits, at the {floor['d2d_bandwidth_bytes_per_s'] / 1e12:.1f} TB/s this "
        f"card copied) at B = {large[0]}, γ {large[1]}, V = {large[2]}.",
        f"- At B = 1 it is {times(goals['b1_over_floor'])} over the floor under graph replay (goal 2x: "
        f"{met(goals['b1_within_2x_of_floor'])}): the floor's {micros(f['goal']['floor_graph_s'])} µs is a single "
        "launch, and the exact step is several dependent launches of a few µs each.",
        f"- **Eager calls cost {micros(f['eager'][0])}-{micros(f['eager'][1])} µs** over the {f['n_configs']} "
        f"configurations, while under graph replay the kernels take {micros(f['graph_small'][0])}-"
        f"{micros(f['graph_small'][1])} µs of device time below B = 128. At the goal row the eager exact call takes "
        f"{micros(f['goal']['median_s'])} µs by CUDA events ({_eager_before(root)}, `{KERNELS_BEFORE}`, before "
        f"issue 43's plans cut the host path), against {micros(f['goal']['graph_s'])} µs of device time under graph "
        f"replay; an empty launch costs {micros(floor['empty_launch_s'])} µs timed the same way. Judged on eager "
        f"times (`goals.eager`) the goal row is {eager['b1_speedup_over_hf']:.1f}x faster than HF's step "
        f"({micros(f['hf_goal']['median_s'])} µs; goal 20x: {met(eager['b1_20x_faster_than_hf'])}) and "
        f"{eager['b1_over_floor']:.1f}x over the eager floor, an empty launch (goal 2x: "
        f"{met(eager['b1_within_2x_of_floor'])}). The host side of that call is timed on its own "
        "[below](#bench-host-on-a-gpu); `specsweep run --verify-graphs` replays the verify step from a CUDA graph "
        "and pays the device time only; the whole decoding step under CUDA graphs (issue 43's other half) is not "
        "built.",
        sigmoid,
    ]


def bench_kernels_trees(root: Path) -> str:
    """benchmarks.md's token-tree rows of `bench kernels`: `tree_verify` with and without replacement against the
    torch reference, graph replay and eager, per tree and B."""
    data = read_source(root, KERNELS, KERNELS_WRITER)
    trees = [r for r in data["results"] if "tree" in r]
    if not trees:
        raise SpecsweepError(f"source {KERNELS} has no token-tree rows: `{KERNELS_WRITER}` times them")
    rows = {(r["tree"], r["B"], r["impl"], r["rule"]): r for r in trees}
    cases = sorted({(r["tree"], r["B"]) for r in trees}, key=lambda c: (len(c[0]), c[0], c[1]))

    def cell(r: dict) -> str:
        return f"{num(r['graph_s'] * 1e3)} / {num(r['median_s'] * 1e3)}"

    body, slower, faster_eager, previous = [], 0, 0, None
    for t, b in cases:
        ref = rows[(t, b, "torch", "with-replacement")]
        ours = [rows[(t, b, "cupy", rule)] for rule in ("with-replacement", "without-replacement")]
        slower += sum(r["graph_s"] > ref["graph_s"] for r in ours)
        faster_eager += sum(r["median_s"] < ref["median_s"] for r in ours)
        body.append([f"{t} ({ref['gamma']} nodes)" if t != previous else "", str(b), *map(cell, ours), cell(ref)])
        previous = t
    first = trees[0]
    intro = (f"The token-tree rows of the same run (`{KERNELS}`, V = {first['V']}, {SHORT_DTYPE[first['dtype']]}): "
             "ms per verify call, graph replay / eager:")
    header = ["tree", "B", "`tree_verify` with replacement", "`tree_verify` without replacement",
              "torch reference (with replacement)"]
    after = (f"Under graph replay the kernel is slower than the torch reference in {slower} of its "
             f"{2 * len(cases)} rows: its walk runs in one block per row, a pass over the vocabulary for each rejected "
             "child ([trees.md](trees.md#the-kernel)), so at these batches most of the GPU's multiprocessors have no "
             f"block. Eagerly it is faster in {faster_eager} of the {2 * len(cases)}: the reference pays for its many "
             "launches there. No goal judges these rows.")
    return "\n".join([prose(intro), "", table(header, body), "", prose(after)])


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


def bench_engine_gpu(root: Path) -> str:
    """benchmarks.md's `bench engine` on a GPU: settings, the paired ratios per temperature, what they measure."""
    data = read_source(root, ENGINE, ENGINE_WRITER)
    s = data["settings"]
    ratios = _engine_ratios(data)
    intro = (f"`{ENGINE}` (`{ENGINE_WRITER}`, i.e. `specsweep bench engine --device cuda --repeats {s['repeats']}`; "
             f"{card(data)}, {data['provenance']['date'][:10]}): the synthetic pair above, "
             f"{SHORT_DTYPE[s['dtype']]}, batch {s['batch']}, γ {s['gamma']}, {data['results'][0]['prompts']} prompts "
             f"x {s['max_new_tokens']} tokens. Paired per-repeat ratios, median with the range of the {s['repeats']} "
             "repeats:")
    header = ["T", "ours / HF assisted", "ours AR / HF plain", "ours speculative / ours AR", "HF assisted / HF plain",
              "static forward / transformers' (speculative)"]
    body = [[f"{t:g}", r["spec_over_hf"], r["ar_over_hf"], r["spec_over_ar"], r["hf_spec_over_plain"], r["static"]]
            for t, r in ratios.items()]
    spec0 = next(r for r in data["results"] if r["loop"] == "ours_speculative" and r["temperature"] == 0.0)
    same = "The same tokens as HF at T = 0 in both loops." if spec0.get("identical_to_hf_assisted") else \
        "At T = 0 our tokens differ from HF's."
    after = (f"{same} This pair is far too small to occupy a GPU ({spec0['tokens_per_second']:.0f} tokens/s "
             "speculative at T = 0): its steps are bound by launching kernels from Python, so these ratios measure "
             "the loops' host overhead, not the GPU; a pair that fills the GPU needs the paper's models.")
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
    intro = (f"**GPU** (an {card(data)}, {data['provenance']['date'][:10]}, before issue 43's plans cut the eager "
             "host path; `bench samplers` with `deterministic_only=True` over B "
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
    """benchmarks.md's one-forward benchmark on the first GPU run's card (an H100, float32): transformers' forward
    against ours, per model shape."""
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


def forward_bytes(folder: Path, context: int, dtype: str) -> int:
    """Bytes one one-token forward of ``folder``'s config.json must read, as pipeline/roofline.py counts them for
    every run's roofline: each matrix weight (the layers and the output projection) once, the K/V cache of
    ``context`` positions, the logits written; in ``dtype``."""
    config_file = Path(folder) / "config.json"
    if not config_file.is_file():
        raise SpecsweepError(f"{config_file} is missing: the forward benchmark's --model folder must be committed")
    from transformers import AutoConfig  # kept local: only the forward blocks read a model config

    from pipeline.roofline import ModelShape, forward_cost  # kept local: as transformers

    shape = ModelShape.from_config(AutoConfig.from_pretrained(str(folder)))
    return int(forward_cost(shape, rows=1, new=1, context=context, logits=1, weight_bytes=DTYPE_BYTES[dtype]).bytes)


def _forward_rooflines(root: Path) -> list[dict]:
    """Per Qwen2.5-Coder shape of :data:`FORWARDS_QWEN`: its forward JSON (``data``), its one-token row (``one``), the
    bytes that forward reads (:func:`forward_bytes`), the roofline tokens/s (the copy bandwidth `bench kernels`
    measured on the same card over those bytes) and ours (1 / the one-token ms)."""
    kernels = read_source(root, KERNELS, KERNELS_WRITER)
    bandwidth = kernels["floor"]["d2d_bandwidth_bytes_per_s"]
    out = []
    for name, path in FORWARDS_QWEN:
        data = read_source(root, path, FORWARD_WRITER)
        if card(data) != card(kernels):
            raise SpecsweepError(f"source {path} was measured on an {card(data)}, {KERNELS} on an {card(kernels)}: "
                                 "the roofline needs the copy bandwidth of the same card; run both steps there")
        one = next(r for r in data["results"] if r["new_tokens"] == 1)
        read = forward_bytes(root / data["model"], data["settings"]["context"], one["dtype"])
        out.append({"name": name, "data": data, "one": one, "bandwidth": bandwidth, "bytes": read,
                    "roofline": bandwidth / read, "ours": 1e3 / one["static_ms"]})
    return out


def bench_forward_qwen_cuda(root: Path) -> str:
    """benchmarks.md: one forward of the Qwen2.5-Coder shapes on the last GPU run's card (gpu_validate.sh's forward
    step): ours against transformers', and the one-token forward's tokens/s against its memory roofline."""
    shapes = _forward_rooflines(root)
    timed = []
    for f in shapes:
        cfg = f["data"]["config"]
        label = (f"{f['name']} shape ({cfg['num_hidden_layers']} layers, {cfg['hidden_size']} wide, "
                 f"{cfg['num_attention_heads']}/{cfg['num_key_value_heads']} heads)")
        for i, r in enumerate(f["data"]["results"]):
            timed.append([label if i == 0 else "", SHORT_DTYPE[r["dtype"]], str(r["new_tokens"]),
                          num(r["transformers_ms"]), num(r["static_ms"]), ci(r["speedup"], 3)])
    roof = [[f"{f['name']} shape", f"{f['bytes'] / 1e9:.2f} GB", f"{f['roofline']:.0f}", f"{f['ours']:.0f}",
             percent(f["ours"] / f["roofline"])] for f in shapes]
    data, one = shapes[-1]["data"], shapes[-1]["one"]
    s = data["settings"]
    shares = [f["ours"] / f["roofline"] for f in shapes]
    intro = (f"`{FORWARD_WRITER}` (`python -m pipeline.benchmarks.forward --model kernels/shapes/<shape>/ --device "
             f"cuda --dtypes bfloat16`; {card(data)}, {data['provenance']['date'][:10]}): random weights of the "
             f"shapes in `kernels/shapes/*/config.json`, batch {s['batch']}, context {s['context']}, {s['rounds']} "
             f"rounds of {s['calls']} calls; `results/bench/forward-qwen2.5-coder-{{1.5b,0.5b}}-shape-cuda.json`:")
    roof_intro = (f"Our one-token forward against its memory roofline: the bytes it must read as every run's roofline "
                  f"counts them (`pipeline/roofline.py`: each matrix weight once, the K/V cache of the "
                  f"{s['context']} cached positions, the logits; {SHORT_DTYPE[one['dtype']]}; the embedding table is "
                  f"not read whole, one row per token) at the {shapes[0]['bandwidth'] / 1e12:.2f} TB/s that `bench "
                  f"kernels` copied on the same card (`{KERNELS}`, `floor.d2d_bandwidth_bytes_per_s`):")
    after = (f"Ours reaches {min(shares) * 100:.0f}-{max(shares) * 100:.0f} % of the roofline. Both forwards launch "
             "one kernel at a time from Python (eager), so the GPU waits on the host; that is why issue 43 asks for "
             "the whole decoding step under CUDA graphs, which is not built.")
    return "\n".join([prose(intro), "", table(["model shape", "dtype", "new tokens", "transformers ms", "ours ms",
                                                "speedup"], timed), "", prose(roof_intro), "",
                      table(["model shape", "bytes read", "roofline tokens/s", "ours tokens/s", "ours / roofline"],
                            roof), "", prose(after)])


def gpu_forward_bullet(root: Path) -> str:
    """docs/gpu.md: the `forward` step's outcome."""
    shapes = _forward_rooflines(root)
    each = listing([f"the {f['name']} shape {num(f['one']['speedup']['median'])}x and "
                    f"{percent(f['ours'] / f['roofline'])}" for f in shapes])
    return prose(f"- `forward`: at one new token our static forward over transformers', and ours against its "
                 f"memory roofline: {each} ([benchmarks.md](benchmarks.md#one-forward-benchmark)).")


def gpu_host_bullet(root: Path) -> str:
    """docs/gpu.md: the `host` step's outcome: its rows and issue 43's goal."""
    data = read_source(root, HOST, HOST_WRITER)
    shapes = len(data["settings"]["configs"])
    return prose(f"- `host`: {len(data['results'])} rows ({shapes} shapes x {len(data['results']) // shapes} "
                 f"samplers). {host_goal(data).rstrip('.')} ([benchmarks.md](benchmarks.md#bench-host-on-a-gpu)).")


def bench_host_gpu(root: Path) -> str:
    """benchmarks.md's `bench host` on a GPU: the host side of one eager call of each kernel sampler through the
    production launcher, launches included, and issue 43's goal at the goal row."""
    data = read_source(root, HOST, HOST_WRITER)
    prov, s, load = data["provenance"], data["settings"], data["load"]
    rows = [[f"{r['B']}, {r['gamma']}, {r['V']}, {SHORT_DTYPE[r['dtype']]}", r["sampler"], ci(r["host_us"], 1),
             str(r["dispatches"]), str(r["python_bytes"]["peak"])] for r in data["results"]]
    intro = (f"`{HOST}` (`{HOST_WRITER}`, i.e. `specsweep bench host --device cuda`; {prov['device']['gpu']}, torch "
             f"{prov['versions']['torch']}, CuPy {prov['versions'].get('cupy-cuda13x', '?')}, "
             f"{prov['date'][:10]}, at {data['commit']}): {s['launcher']}. µs per call, the median of "
             f"{s['repeats']} blocks of {s['calls_per_block']} calls with its 95 % interval; other processes kept "
             f"{load['others_busy_cores']:.2f} cores busy and the run waited for a CPU "
             f"{load['runqueue_wait']['wait_fraction'] * 100:.1f} % of its ready time:")
    header = ["B, γ, V, dtype", "sampler", "host µs [95 %]", "dispatches per call", "Python peak bytes"]
    kernels = read_source(root, KERNELS, KERNELS_WRITER)
    events = _kernel_rows(kernels)[(*KERNEL_ROWS[0], "cupy", "exact")]["median_s"]
    same = "on the same card" if card(kernels) == card(data) else f"on an {card(kernels)}"
    after = (f"{host_goal(data)} `bench kernels` timed the same call {same} at {micros(events)} µs by another clock, "
             "CUDA events around it: from the call's start as the stream sees it to its last kernel's end "
             "([above](#bench-kernels-on-a-gpu)).")
    return "\n".join([prose(intro), "", table(header, rows), "", prose(after)])


def host_goal(data: dict) -> str:
    """Issue 43's goal judged on a `bench host` JSON: the exact call's host µs at the goal row, at most
    :data:`HOST_GOAL_US` over its whole interval (held), at its median only, or not."""
    b, gamma, v, dtype = KERNEL_ROWS[0]
    row = next((r for r in data["results"] if (r["B"], r["gamma"], r["V"], r["dtype"], r["sampler"]) ==
                (b, gamma, v, dtype, "exact")), None)
    if row is None:
        raise SpecsweepError(f"source {HOST} has no exact row at B = {b}, γ {gamma}, V = {v}, {dtype}: the goal row")
    us = row["host_us"]
    verdict = ("it holds: the whole interval is below the goal" if us["ci_high"] <= HOST_GOAL_US else
               "it holds at the median, not over the whole interval" if us["median"] <= HOST_GOAL_US else
               "it does not hold")
    return (f"Issue 43's goal row ({_config(KERNEL_ROWS[0])}, exact: at most {HOST_GOAL_US:.0f} µs of host time per "
            f"eager call): {ci(us, 1)} µs, so {verdict}.")


def gpu_machine(root: Path) -> str:
    """docs/gpu.md: the GPU, driver and versions the last GPU run measured with."""
    data = read_source(root, KERNELS, KERNELS_WRITER)
    prov = data["provenance"]
    dev, ver = prov["device"], prov["versions"]
    return prose(f"{dev['gpu']}, driver {dev['driver']}, CUDA runtime {dev['cuda_runtime']}, torch {ver['torch']}, "
            f"CuPy {data['cupy']['version']}, transformers {ver['transformers']} (the provenance of `{KERNELS}`, "
            f"{prov['date'][:10]} {prov['date'][11:16]} UTC).")


def gpu_kernels_bullet(root: Path) -> str:
    """docs/gpu.md: the `kernels` step's outcome."""
    data = read_source(root, KERNELS, KERNELS_WRITER)
    f = kernel_figures(data)
    trees = [r for r in data["results"] if "tree" in r]
    done = "all" if data.get("complete") else f"not all (stopped: {len(data.get('stopped') or [])})"
    return prose(f"- `kernels`: {done} {f['n_configs']} chain configurations and {len(trees)} token-tree rows, "
            f"{int(data['settings']['repeats'])} repeats ([benchmarks.md](benchmarks.md#bench-kernels-on-a-gpu)).")


def gpu_lossless_bullet(root: Path) -> str:
    """docs/gpu.md: `bench lossless` on a GPU (synthetic pair; its card from the provenance): greedy matches and the
    sampled tests' verdicts."""
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
    return prose(f"- Not a step of the script, run once on the {card(data)} ({data['provenance']['date'][:10]}) and "
            f"not since: `specsweep bench lossless --device cuda --synthetic --dtypes {','.join(dtypes)}` "
            f"(`{LOSSLESS}`): {rules_greedy} give the target's greedy tokens on {match} prompts in "
            f"{'both dtypes' if len(dtypes) == 2 else 'every dtype'}, and {rules_sampled} "
            f"{'keep' if same else 'do not all keep'} its distribution at T = {s['temperature']:g} (chi-square, "
            f"Bonferroni, α {s['alpha']:g}; the lowest p, {lowest['label']} in {SHORT_DTYPE[lowest['dtype']]} on the "
            f"{which}, {lowest['sampled']['min_p_value']:.2g} against a corrected threshold of "
            f"{lowest['sampled']['threshold']:g}).")
