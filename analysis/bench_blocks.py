"""Generated blocks of docs/benchmarks.md from the CPU benchmarks' committed JSON (results/bench/*-cpu*.json).

Each function takes the repository root and returns the block's Markdown (docs/README.md, "Generated figures").
"""

from __future__ import annotations

from pathlib import Path

from .doc_sources import at_commit, ci, interval, micros, num, percent, prose, read_source, signed, table
from .pareto import pareto_mask
from .run_tables import rule_params, short_cpu


def machine_of(provenance: dict) -> str:
    """The short name of the CPU a result's provenance recorded ("AMD EPYC")."""
    device = provenance["device"]
    return short_cpu(device.get("cpu_model") or device["cpu"])


def measured_on(provenance: dict) -> str:
    """"AMD EPYC, 2026-12-08 at 1a2b3c4": the machine, the day and the commit a result was measured on."""
    return f"{machine_of(provenance)}, {provenance['date'][:10]}{at_commit(provenance)}"


REDESIGN = "results/bench/redesign-engine-cpu.json"
REDESIGN_LOOPS = (("ours_speculative", "ours, speculative"), ("ours_autoregressive", "ours, γ = 0"),
                  ("ours_speculative_hf_forward", "ours with transformers' forward, speculative"),
                  ("ours_autoregressive_hf_forward", "ours with transformers' forward, γ = 0"))
FORWARD_SMOLLM2 = "results/bench/forward-smollm2-135m-instruct.q4_1-cpu.json"
FORWARD_WHISPER = (("whisper-base decoder (6 layers, 512 wide, 51865-token head)",
                    "results/bench/forward-base-cpu.json"),
                   ("distilled draft decoder (2 layers, whole head)",
                    "results/bench/forward-whisper-base-distilled-cpu.json"))
FORWARD_WRITER = "python -m pipeline.benchmarks.forward --model PATH"
BLOCK_GAIN = "results/bench/block-gain-cpu-toy-text.json"
DISTORTION_QWEN = "results/bench/distortion-cpu-qwen-t1-g4.json"   # the sigmoid profile writes it (docs/results.md)
RULES_T1 = "results/published/llama-cpp/results/bench/rules-t1/qwen-t1-g4.json"   # the llama-cpp profile writes it
REPLAY_QWEN = "results/bench/replay-cpu-qwen-lookup-a24.json"       # the pair profile writes it (docs/results.md)
REPLAY_DRAFT = "results/bench/replay-cpu-qwen-draft-a24.json"       # the pair profile writes it on an AMX CPU
REPLAY_ROWS = 8                                                      # the block's settings, fastest predicted first
DETERMINISTIC = "results/bench/samplers-deterministic-cpu.json"
# the CPU table's rows: (B, γ, V, dtype); the rows with a time in brackets: the exact column's own times
DETERMINISTIC_ROWS = ((1, 4, 32000, "float32"), (1, 8, 128256, "float32"), (16, 4, 32000, "bfloat16"),
                      (16, 4, 128256, "float32"), (16, 8, 32000, "float32"), (16, 8, 128256, "float32"),
                      (16, 8, 128256, "bfloat16"))
DETERMINISTIC_TIMED = {(1, 4, 32000, "float32"), (1, 8, 128256, "float32"), (16, 4, 128256, "float32"),
                       (16, 8, 128256, "float32")}
LOSSLESS = "results/bench/lossless-cpu.json"
OMP_WAIT = "results/bench/omp-wait-cpu.json"
PROCESSES = "results/bench/processes-cpu.json"
QUANT_LINEAR = "results/bench/quant-linear-cpu.json"
QUANT_LINEAR_PREFILL = "results/bench/quant-linear-prefill-cpu.json"
QUANT_FORWARD = "results/bench/quant-forward-qwen2.5-coder-0.5b-instruct-cpu.json"
BF16_LINEAR = "results/bench/bf16-linear-cpu.json"
FORWARD_CURVE = "results/bench/forward-qwen2.5-coder-1.5b-instruct-curve-cpu.json"
FORWARD_AMX = "results/bench/forward-qwen2.5-coder-1.5b-instruct-amx-cpu.json"
FORWARD_AMX_WRITER = ("python -m pipeline.benchmarks.forward --model qwen2.5-coder-1.5b-instruct --dtypes bfloat16 "
                      "--threads 2 --context 450 --new-tokens 1,2,3,5,7,9,11,13,15,16,17 --rounds 6 --calls 3 "
                      "--ways static,bf16_linear (on a CPU with AMX)")
FORWARD_CURVE_WRITER = ("python -m pipeline.benchmarks.forward --model qwen2.5-coder-1.5b-instruct --dtypes bfloat16 "
                        "--threads 2 --context 450 --new-tokens 1,2,3,5,7,9,11,13,17 --rounds 6 --calls 3 "
                        "(the pair profile)")
SERVE_TOY = "results/bench/serve-cpu-toy-text.json"
SERVE_SMOLLM2 = "results/bench/serve-cpu-smollm2-prompt-lookup.json"
SHORT_DTYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
# `bench engine` on the Qwen2.5-Coder pair, one file per setting of our loop (docs/benchmarks.md has the commands)
ENGINE_QWEN = ("results/bench/engine-cpu-qwen-bfloat16-int4-g5.json",
               "results/bench/engine-cpu-qwen-bfloat16-g4.json",
               "results/bench/engine-cpu-qwen-bfloat16-lookup-g4.json",
               "results/bench/engine-cpu-xeon-qwen-bfloat16-lookup-g12.json",
               "results/bench/engine-cpu-xeon-qwen-bfloat16-g4.json")
# results written before provenance recorded the CPU model (2026-12-02) all ran on this machine (CHANGELOG.md,
# "Pretrained pairs and dtypes", 2026-12-02)
UNRECORDED_CPU = "AMD EPYC"
ENGINE_QWEN_RATIOS = (("speculative_over_hf_assisted", "ours / HF assisted at equal γ"),
                      ("speculative_over_hf_assisted_default", "ours / HF assisted out of the box"),
                      ("ours_speculative_over_autoregressive", "ours / our γ = 0 loop"),
                      ("hf_assisted_default_over_plain", "HF out of the box / HF plain"),
                      ("autoregressive_over_hf_plain", "our γ = 0 loop / HF plain"))


def bench_redesign(root: Path) -> str:
    """Tokens/s of our loops before and after the decoding package: median [min, max] per tree."""
    data = read_source(root, REDESIGN, "specsweep bench engine --device cpu --repeats 3 (in both checkouts)")
    rows = {(r["temperature"], r["loop"]): r for r in data["results"]}
    body = []
    for t in sorted({r["temperature"] for r in data["results"]}):
        for loop, label in REDESIGN_LOOPS:
            r = rows[(t, loop)]
            body.append([f"{t:g}", label, *(f"{r[s]['median']:.0f} [{r[s]['min']:.0f}, {r[s]['max']:.0f}]"
                                            for s in ("before", "after"))])
    return table(["T", "loop", "before", "after"], body)


def bench_forward_smollm2_cpu(root: Path) -> str:
    """SmolLM2-135M-Instruct's one forward, transformers' against ours, on the CPU."""
    data = read_source(root, FORWARD_SMOLLM2, FORWARD_WRITER)
    load = data["load_average"]
    low, high = sorted((load["before"][0], load["after"][0]))
    header = ["new tokens", "transformers ms", "ours ms",
              f"speedup, {data['settings']['rounds']} rounds (load {low:.1f}-{high:.1f})"]
    body = [[str(r["new_tokens"]), num(r["transformers_ms"], 1), num(r["static_ms"], 1), ci(r["speedup"], 3)]
            for r in data["results"]]
    return table(header, body)


def bench_forward_whisper_cpu(root: Path) -> str:
    """Whisper base's decoder and its distilled draft decoder: one forward, transformers' against ours."""
    body = []
    for label, path in FORWARD_WHISPER:
        data = read_source(root, path, FORWARD_WRITER)
        for i, r in enumerate(data["results"]):
            body.append([label if i == 0 else "", str(r["new_tokens"]), num(r["transformers_ms"]),
                         num(r["static_ms"]), ci(r["speedup"], 3)])
    return table(["model", "new tokens", "transformers ms", "ours ms", "speedup"], body)


def bench_block_gain(root: Path) -> str:
    """Accepted draft tokens per full-γ step, exact against block, paired over prompts."""
    data = read_source(root, BLOCK_GAIN, f"specsweep bench block --device cpu --temperature 1 --out {BLOCK_GAIN}")
    body = []
    for r in data["results"]:
        d = r["difference"]
        body.append([str(r["gamma"]), num(r["exact"]["accepted_per_step"], 3), num(r["block"]["accepted_per_step"], 3),
                     f"{signed(d['mean'], 3)} [{signed(d['ci95'][0], 3)}, {signed(d['ci95'][1], 3)}]"])
    return table(["γ", "exact", "block", "block − exact [95 % CI]"], body)


def _count(n: int) -> str:
    return ("none", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")[n] if n < 10 else str(n)


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.2f}" if ms < 10 else f"{ms:.1f}"


def _within(r: dict, share: float) -> bool:
    o = r["one_hot_over_deterministic"]
    return o["ci_low"] >= (1 - share) * o["median"] and o["ci_high"] <= (1 + share) * o["median"]


def bench_deterministic_cpu(root: Path) -> str:
    """Deterministic drafts against one-hot logits on the CPU: what the medians and intervals were, and a table."""
    data = read_source(root, DETERMINISTIC, "OMP_NUM_THREADS=1 specsweep bench samplers --deterministic-only "
                                            "--device cpu --repeats 60")
    runs = data["deterministic"]
    rows = {(r["B"], r["gamma"], r["V"], r["dtype"], r["sampler"]): r for r in runs}
    samplers = list(dict.fromkeys(r["sampler"] for r in runs))
    spans = []
    for s in samplers:
        medians = [r["one_hot_over_deterministic"]["median"] for r in runs if r["sampler"] == s]
        spans.append(f"{num(min(medians))}-{num(max(medians))}x for {s}")
    wide = [r for r in runs if not _within(r, 0.1)]
    widest = max(wide, key=lambda r: r["one_hot_over_deterministic"]["relative_width"]) if wide else None
    configs = len({(r["B"], r["gamma"], r["V"], r["dtype"]) for r in runs})
    text = (f"Torch reference, one-hot time / deterministic time, median of {data['settings']['repeats']} paired "
            f"ratios with its 95 % interval; over all {configs} configurations the medians were "
            f"{', '.join(spans[:-1])} and {spans[-1]}; {len(runs) - len(wide)} of the {len(runs)} intervals lie "
            "within ±10 % of their median")
    if widest is not None:
        w = widest["one_hot_over_deterministic"]
        vs = sorted({r["V"] for r in wide})
        where = f" (all at V {vs[0]})" if len(vs) == 1 else ""
        text += (f", the other {_count(len(wide))}{where} reach up to [{num(w['ci_low'])}, {num(w['ci_high'])}] "
                 f"({widest['sampler']}, B {widest['B']}, γ {widest['gamma']}, {SHORT_DTYPE[widest['dtype']]})")
    text += ":"

    def cell(c: tuple, sampler: str) -> str:
        r = rows[(*c, sampler)]
        out = ci(r["one_hot_over_deterministic"], suffix="x")
        if sampler == samplers[0] and c in DETERMINISTIC_TIMED:
            a, b = r["deterministic_median_s"], r["one_hot_median_s"]
            out += f" ({micros(a)} → {micros(b)} µs)" if b < 1e-3 else f" ({_ms(a)} → {_ms(b)} ms)"
        return out

    body = [[f"{c[0]}, {c[1]}, {c[2]}, {SHORT_DTYPE[c[3]]}", *(cell(c, s) for s in samplers)]
            for c in DETERMINISTIC_ROWS]
    header = ["B, γ, V, dtype", *(f"{s} (T = 0)" if s == "greedy" else s for s in samplers)]
    return "\n".join([prose(text), "", table(header, body)])


def _divergences(greedy: dict) -> str:
    rows = [r for r in greedy["per_prompt"] if not r["identical"]]
    return ", ".join(f"prompt {r['prompt']} at new token {r['first_divergence']['position']}" for r in rows) or "none"


def bench_lossless_cpu(root: Path) -> str:
    """`bench lossless` on the CPU: per rule and dtype, greedy matches and the sampled tests."""
    data = read_source(root, LOSSLESS, "specsweep bench lossless --device cpu")
    body = []
    for r in data["results"]:
        g, s = r["greedy"], r["sampled"]
        first = s["per_prompt"][0]
        greedy = ("skipped (T > 0 only)" if g is None else
                  f"{percent(g['match_rate'])} ({g['identical']}/{g['prompts']})")
        body.append([r["label"], r["dtype"], greedy, "-" if g is None else _divergences(g),
                     num(first["first_token"]["p_value"], 3), num(first["first_two_tokens"]["p_value"], 3),
                     s["verdict"]])
    header = ["rule", "dtype", "greedy match", "first divergences", "p first token", "p first two tokens", "sampled"]
    return table(header, body)


OURS_OVER = {"int4_linear_over_int4": "int4_linear over int4", "bf16_linear_over_packed": "bf16_linear over packed"}
"""A row's ratios of our kernels over torch's, and their column headers."""


def bench_quant_linear(root: Path, path: str = QUANT_LINEAR) -> str:
    """One projection in bfloat16 against the ways the file has (oneDNN's packed bfloat16, our bf16_linear, torch's
    int8 and int4 kernels, our int4_linear, the int8-by-int8 product a8): µs per call with the speedup over bfloat16,
    ours over torch's (int4) and oneDNN's (bf16_linear), and the errors. A way that did not run at a row count leaves
    its cell empty."""
    data = read_source(root, path, "python -m pipeline.benchmarks.quant_linear")
    results = data["results"]
    ways = [w for w in ("packed", "bf16_linear", "int8", "int4", "int4_linear", "a8")
            if any(f"{w}_us" in r for r in results)]
    ours = [k for k in OURS_OVER if any(k in r for r in results)]

    def cell(r: dict, w: str) -> str:
        return f"{r[f'{w}_us']:.0f}: {interval(r[f'{w}_speedup'], *r[f'{w}_speedup_ci'])}" if f"{w}_us" in r else ""

    body = [[r["shape"] if i == 0 or r["shape"] != results[i - 1]["shape"] else "", str(r["rows"]),
             f"{r['bfloat16_us']:.0f}", *(cell(r, w) for w in ways),
             *(interval(r[k], *r[f"{k}_ci"]) if k in r else "" for k in ours),
             " / ".join(f"{r[f'{w}_error']:.3f}" if f"{w}_error" in r else "-" for w in ways)]
            for i, r in enumerate(results)]
    s, load = data["settings"], data["load_average"]
    low, high = sorted((load["before"][0], load["after"][0]))
    header = ["N x K", "rows", "bf16 µs", *(f"{w}: µs, speedup" for w in ways), *(OURS_OVER[k] for k in ours),
              f"relative error {' / '.join(ways)}"]
    coverage = results[0].get("ci_coverage")
    theirs = {"int4_linear_over_int4": "torch's int4 time over int4_linear's",
              "bf16_linear_over_packed": "oneDNN's packed time over bf16_linear's"}
    note = (f"{s['threads']} threads, median of {s['rounds']} rounds of {s['calls']} calls each, speedup = bfloat16's "
            f"time over the other way's per round (median over rounds"
            + (f" with its {percent(coverage)} interval" if coverage else " and interval") +
            "".join(f", and {theirs[k]} the same way" for k in ours) +
            f"); load average {low:.1f}-{high:.1f}, {data['provenance']['date'][:10]}.")
    return table(header, body) + "\n\n" + prose(note)


def bench_bf16_linear(root: Path) -> str:
    """The 1.5B target's projections over a decode's or a verify forward's rows: oneDNN's packed product against ours
    (kernels/bf16_linear.cpp)."""
    return bench_quant_linear(root, BF16_LINEAR)


def bench_forward_few_rows(root: Path) -> str:
    """The 1.5B target's whole forward over q new tokens, as the engine runs it (bf16_linear's product up to 9 rows)
    and with oneDNN's packed product over every row count, paired by round: ms, ours over oneDNN's, the verify cost
    r = ms(q) / ms(1) of each."""
    data = read_source(root, FORWARD_CURVE, FORWARD_CURVE_WRITER)
    rows = []
    for r in data["results"]:
        if "onednn_ms" not in r:
            raise ValueError(f"{FORWARD_CURVE} has no oneDNN timings: rerun {FORWARD_CURVE_WRITER}")
        rows.append([str(r["new_tokens"]), num(r["onednn_ms"], 1), num(r["static_ms"], 1), ci(r["few_rows_speedup"]),
                     ci(r["onednn_verify_cost"]), ci(r["verify_cost"]), f"{r['onednn_max_abs_logit_diff']:.2g}"])
    s, load = data["settings"], data["load_average"]
    low, high = sorted((load["before"][0], load["after"][0]))
    note = (f"Qwen2.5-Coder-1.5B-Instruct in bfloat16, one forward of q new tokens after {s['context']} cached ones, "
            f"{s['threads']} threads, median of {s['rounds']} rounds of {s['calls']} calls; ours over oneDNN's: "
            f"oneDNN's time over ours per round, the median over rounds with its interval; r: ms(q) over ms(1) per "
            f"round. Past 9 new tokens both run oneDNN's product (a control). Load average {low:.1f}-{high:.1f}, "
            f"{data['provenance']['date'][:10]}.")
    return table(["new tokens", "oneDNN ms", "bf16_linear ms", "bf16_linear over oneDNN", "r oneDNN",
                  "r bf16_linear", "max logit diff"], rows) + "\n\n" + prose(note)


def bench_forward_amx(root: Path) -> str:
    """The 1.5B target's whole forward over q new tokens on a CPU with AMX, as the engine runs it there (amx_linear's
    product up to 16 rows) and with bf16_linear's up to 9, paired by round: ms, amx_linear over bf16_linear, the
    verify cost r = ms(q) / ms(1) of each."""
    data = read_source(root, FORWARD_AMX, FORWARD_AMX_WRITER)
    rows = []
    for r in data["results"]:
        if "bf16_linear_ms" not in r:
            raise ValueError(f"{FORWARD_AMX} has no bf16_linear timings (not an AMX CPU's): rerun "
                             f"{FORWARD_AMX_WRITER}")
        rows.append([str(r["new_tokens"]), num(r["bf16_linear_ms"], 1), num(r["static_ms"], 1), ci(r["amx_speedup"]),
                     ci(r["bf16_linear_verify_cost"]), ci(r["verify_cost"]),
                     f"{r['bf16_linear_max_abs_logit_diff']:.2g}"])
    s, load, device = data["settings"], data["load_average"], data["provenance"]["device"]
    low, high = sorted((load["before"][0], load["after"][0]))
    note = (f"Qwen2.5-Coder-1.5B-Instruct in bfloat16 on {short_cpu(device.get('cpu_model') or device['cpu'])} "
            f"({s['threads']} threads), one forward of q new tokens after {s['context']} cached ones, median of "
            f"{s['rounds']} rounds of {s['calls']} calls; amx_linear over bf16_linear: bf16_linear's time over "
            "amx_linear's per round, the median over rounds with its interval; r: ms(q) over ms(1) per round. Past 16 "
            f"new tokens both run oneDNN's product, past 9 bf16_linear's forward does. Load average {low:.1f}-"
            f"{high:.1f}, {data['provenance']['date'][:10]}.")
    return table(["new tokens", "bf16_linear ms", "amx_linear ms", "amx_linear over bf16_linear", "r bf16_linear",
                  "r amx_linear", "max logit diff"], rows) + "\n\n" + prose(note)


def bench_quant_forward(root: Path) -> str:
    """The 0.5B draft's whole forward: bfloat16 (packed), int4 with torch's kernel, int4 with ours operator by operator
    and in one call, paired by round."""
    data = read_source(root, QUANT_FORWARD, "python -m pipeline.benchmarks.quant_linear --model ...")
    results = data["results"]
    pairs = [k for k in ("int4_over_bfloat16", "int4_linear_over_bfloat16", "int4_linear_over_int4",
                         "int4_layers_over_bfloat16", "int4_layers_over_int4_linear") if k in results[0]]
    ways = [w for w in ("bfloat16", "int4", "int4_linear", "int4_layers") if f"{w}_ms" in results[0]]
    body = [[str(r["new_tokens"]), *(f"{r[f'{w}_ms']:.2f}" for w in ways),
             *(interval(r[k], *r[f"{k}_ci"]) for k in pairs)] for r in results]
    header = ["new tokens", *(f"{w} ms" for w in ways), *(k.replace("_over_", " over ") for k in pairs)]
    s, load = data["settings"], data["load_average"]
    low, high = sorted((load["before"][0], load["after"][0]))
    note = (f"{data['model']}, one forward after {s['context']} cached tokens, {s['threads']} threads, median of "
            f"{s['rounds']} rounds of {s['calls']} calls; a over b: b's time over a's per round, the median over "
            f"rounds with its {percent(results[0]['ci_coverage'])} interval; load average {low:.1f}-{high:.1f}, "
            f"{data['provenance']['date'][:10]}.")
    return table(header, body) + "\n\n" + prose(note)


def bench_quant_linear_prefill(root: Path) -> str:
    """The same at a prefill's rows (the int8-by-int8 product's regime, ``--draft-quant int4+a8``)."""
    return bench_quant_linear(root, QUANT_LINEAR_PREFILL)


def bench_omp_wait(root: Path) -> str:
    """One int4 draft forward under each OpenMP wait policy, alone and beside CPU-burning processes."""
    data = read_source(root, OMP_WAIT, "python -m pipeline.benchmarks.omp_wait")
    rows = data["results"]
    body = [[str(r["burners"]) if i == 0 or r["burners"] != rows[i - 1]["burners"] else "", f"`{r['policy']}`",
             f"{r['median_ms']:.1f}", f"{r['p90_ms']:.1f}", f"{r['cpu_ms_per_forward']:.1f}", ci(r["speedup"])]
            for i, r in enumerate(rows)]
    s, load = data["settings"], data["load_average"]
    low, high = sorted((load["before"][0], load["after"][0]))
    header = ["CPU burners beside it", "policy", "ms per forward", "p90 ms", "CPU ms per forward",
              f"speedup over `{rows[0]['speedup_over']}`"]
    note = (f"{s['model']} ({s['quant']} weights, {s['dtype']}: the Qwen pair's `--draft-quant int4` draft with random "
            f"weights), {s['new_tokens']} new token after {s['context']} cached, {s['threads']} threads on "
            f"{s['usable_cores']} cores; each policy in its own "
            f"process, {s['rounds']} rounds of {s['calls']} forwards, the policies' order rotating; the median over "
            f"rounds, and the speedup as the median of per-round ratios with its "
            f"{percent(rows[0]['speedup']['ci_coverage'])} interval; CPU ms: the process's CPU time (all threads) "
            f"per forward. Load average {low:.1f}-{high:.1f} (the burners included), "
            f"{data['provenance']['date'][:10]}.")
    return table(header, body) + "\n\n" + prose(note)


def bench_processes(root: Path) -> str:
    """Data-parallel runs: examples/s per processes x threads setting, against one process of one thread."""
    data = read_source(root, PROCESSES, "python -m pipeline.benchmarks.processes --target T --draft D --data F")
    base = next(k for k in data["rows"][0] if k.startswith("speedup_vs_"))
    body = []
    for r in data["rows"]:
        speed = r[base]
        first = r["repeats"][0]
        command = [x["command_s"] for x in r["repeats"]]
        vs = "1.00" if speed["ci_low"] == speed["ci_high"] == 1.0 else ci(speed)
        body.append([r["setting"], ci(r["examples_per_s"], 1), f"{r['tokens_per_s']['median']:.0f}", vs,
                     "-" if r["scaling_efficiency"] is None else num(r["scaling_efficiency"]),
                     ", ".join(num(s) for s in first["rank_wall_s"]), f"{min(command):.1f}-{max(command):.1f}"])
    header = ["setting (processes x threads)", "examples/s [interval]", "tokens/s", f"vs {base[len('speedup_vs_'):]} "
              "[interval]", "scaling efficiency", "pass wall per rank (s), repeat 1", "command (s)"]
    return table(header, body)


def _rate(value: float) -> str:
    """Requests or tokens per second as the serving tables write them: "1022", "22.8", "6.6", "0.25"."""
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 1 else f"{value:.2f}"


def _serve_table(data: dict) -> str:
    """`bench serve`: per client count, the dynamic-batching server and the one-at-a-time server, and their ratio
    (the goal's client count in bold)."""
    ratios = {r["concurrency"]: r for r in data["dynamic_over_one_at_a_time"]}
    goal = data["goals"]["concurrency"]
    body = []
    for r in data["results"]:
        label = f"dynamic (max batch {r['max_batch']})" if r["server"] == "dynamic" else "one at a time"
        ratio = ""
        if r["server"] == "dynamic":
            x = ratios[r["concurrency"]]
            median = f"**{num(x['median'])}x**" if r["concurrency"] == goal else f"{num(x['median'])}x"
            ratio = f"{median} (repeats {', '.join(num(v) for v in x['per_repeat'])})"
        body.append([label, str(r["concurrency"]), f"{r['ok']}/{r['sent']}", str(r["failed"]), str(r["lost"]),
                     f"{r['latency_p50_s'] * 1e3:.0f}", f"{r['latency_p99_s'] * 1e3:.0f}",
                     _rate(r["requests_per_second"]), _rate(r["tokens_per_second"]), num(r["mean_batch_size"], 1),
                     ratio])
    header = ["server", "clients", "ok/sent", "failed", "lost", "p50 ms", "p99 ms", "req/s", "tok/s", "mean batch",
              "dynamic / one at a time"]
    return table(header, body)


def serve_toy(root: Path) -> str:
    """docs/serve.md: `bench serve` on the toy text pair."""
    return _serve_table(read_source(root, SERVE_TOY, f"specsweep bench serve --out {SERVE_TOY}"))


def serve_smollm2(root: Path) -> str:
    """docs/serve.md: `bench serve` with SmolLM2-135M-Instruct and prompt lookup, through the chat endpoint."""
    return _serve_table(read_source(root, SERVE_SMOLLM2, "specsweep bench serve --target smollm2-135m-instruct "
                                                         f"--drafter prompt-lookup --chat --out {SERVE_SMOLLM2}"))


FORWARD_DTYPES = (("Qwen2.5-Coder-1.5B-Instruct", "results/bench/forward-qwen2.5-coder-1.5b-instruct-cpu.json"),
                  ("Qwen2.5-Coder-0.5B-Instruct", "results/bench/forward-qwen2.5-coder-0.5b-instruct-cpu.json"),
                  ("SmolLM2-135M-Instruct", "results/bench/forward-smollm2-135m-instruct-cpu.json"),
                  ("Whisper base (decoder)", "results/bench/forward-whisper-base-cpu.json"),
                  ("toy-sized GPT-2 (16 x 128, random)", "results/bench/forward-toy-gpt2-16x128-cpu.json"))
FORWARD_DTYPES_WRITER = ("python -m pipeline.benchmarks.forward --model PATH --dtypes float32,bfloat16 --threads 2 "
                         "(docs/benchmarks.md)")


def bench_forward_dtypes(root: Path) -> str:
    """docs/benchmarks.md: our static forward of each real model in float32 and bfloat16, timed in the same rounds:
    ms per forward at each number of new tokens, the verify cost r = ms(q) / ms(1) and bfloat16 over float32."""
    rows = []
    for label, path in FORWARD_DTYPES:
        data = read_source(root, path, FORWARD_DTYPES_WRITER)
        by = {(r["dtype"], r["new_tokens"]): r for r in data["results"]}
        ratio = {r["new_tokens"]: r["speedup"] for r in data["dtypes"] if r["over"] == "float32"}
        settings = data["settings"]
        for q in settings["new_tokens"]:
            f32, bf16 = by[("float32", q)], by[("bfloat16", q)]
            rows.append([label if q == settings["new_tokens"][0] else "", str(q), num(f32["static_ms"], 1),
                         num(bf16["static_ms"], 1), ci(ratio[q]), ci(f32["verify_cost"]), ci(bf16["verify_cost"]),
                         f"{settings['threads']}, {settings['context']}, {data['provenance']['date'][:10]}"])
    return table(["model", "new tokens", "float32 ms", "bfloat16 ms", "bfloat16 over float32", "r float32",
                  "r bfloat16", "threads, context, date"], rows)


FORWARD_PACKED = FORWARD_DTYPES[:3]
"""The models of FORWARD_DTYPES whose static forward packs its weights (the Llama family's)."""


def bench_forward_packed(root: Path) -> str:
    """docs/benchmarks.md: our static forward of each Llama-family model over its own weights ("plain") and over
    packed copies (the engine's default on a CPU), timed in the same rounds: ms, packed over plain with its interval,
    the verify cost r = ms(q) / ms(1) of each, and the largest logit difference between the two."""
    rows = []
    for label, path in FORWARD_PACKED:
        data = read_source(root, path, FORWARD_DTYPES_WRITER)
        settings = data["settings"]
        for r in data["results"]:
            if "plain_ms" not in r:
                raise ValueError(f"{path} has no plain-weights timings: rerun {FORWARD_DTYPES_WRITER}")
            first = r["new_tokens"] == settings["new_tokens"][0]
            rows.append([label if first and r["dtype"] == settings["dtypes"][0] else "",
                         r["dtype"] if first else "", str(r["new_tokens"]), num(r["plain_ms"], 1),
                         num(r["static_ms"], 1), ci(r["packed_speedup"]), ci(r["plain_verify_cost"]),
                         ci(r["verify_cost"]), f"{r['plain_max_abs_logit_diff']:.1g}",
                         f"{settings['threads']}, {settings['context']}, {data['provenance']['date'][:10]}"])
    return table(["model", "dtype", "new tokens", "plain ms", "packed ms", "packed over plain", "r plain",
                  "r packed", "max logit diff", "threads, context, date"], rows)


HOST_BEFORE, HOST_AFTER = "results/bench/host-cpu-before.json", "results/bench/host-cpu.json"
HOST_WRITER = "specsweep bench host --device cpu [--out results/bench/host-cpu-before.json] (docs/benchmarks.md)"
DTYPE_SHORT = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}


def bench_host(root: Path) -> str:
    """docs/benchmarks.md: the host side of one eager verify call of each kernel sampler on the CPU (launches
    recorded and skipped), before and after issue 43's plans: µs with its interval, dispatches and Python peak bytes."""
    before, after = (read_source(root, path, HOST_WRITER) for path in (HOST_BEFORE, HOST_AFTER))

    def key(r: dict) -> tuple:
        return r["B"], r["gamma"], r["V"], r["dtype"], r["sampler"]

    old = {key(r): r for r in before["results"]}
    rows = []
    for r in after["results"]:
        b = old[key(r)]
        rows.append([f"{r['B']}, {r['gamma']}, {r['V']}, {DTYPE_SHORT.get(r['dtype'], r['dtype'])}", r["sampler"],
                     ci(b["host_us"], 1), ci(r["host_us"], 1), f"{b['dispatches']} → {r['dispatches']}",
                     f"{b['python_bytes']['peak']} → {r['python_bytes']['peak']}"])
    return table(["B, γ, V, dtype", "sampler", "host µs before [95 %]", "host µs after [95 %]",
                  "dispatches per call", "Python peak bytes"], rows)


def bench_engine_qwen(root: Path) -> str:
    """benchmarks.md's `bench engine` on the Qwen2.5-Coder pair: one row per committed file (our loop's setting),
    the paired ratios at T = 0 with their intervals; "not equal γ" where ours drafts otherwise than HF's assisted
    loop (another drafter or an adaptive length), so that ratio compares settings, not loops."""
    from pipeline.benchmarks.engine import describe_ours  # kept local: imports torch, which the other blocks do not

    body, dates = [], set()
    for path in ENGINE_QWEN:
        data = read_source(root, path, "specsweep bench engine (docs/benchmarks.md, the Qwen2.5-Coder pair)")
        s, goal = data["settings"], data["goals"]["T=0.0"]
        dates.add(data["provenance"]["date"][:10])
        cells = []
        for name, _ in ENGINE_QWEN_RATIOS:
            r = goal["intervals"][name]
            cell = ci(r, suffix="x")
            cells.append(cell + (" (not equal γ)" if name == "speculative_over_hf_assisted" and not s["equal_gamma"]
                                 else ""))
        ours = describe_ours(s["ours"])
        device = data["provenance"]["device"]
        body.append([ours if s["ours"].get("drafter", "model") != "model" else f"draft model, {ours}",
                     short_cpu(device["cpu_model"]) if device.get("cpu_model") else UNRECORDED_CPU,
                     f"{s['prompts']['limit']} x {s['max_new_tokens']}",
                     SHORT_DTYPE[s["dtype"]], *cells])
    header = ["our loop", "CPU", "articles x tokens", "dtype",
              *(label for _, label in ENGINE_QWEN_RATIOS)]
    default = data["settings"]["hf_assisted_default"]
    after = (f"T = 0, EOS masked (every loop emits the tokens asked for), {data['settings']['repeats']} interleaved "
             "repeats, 75 % intervals; HF's assisted loops draft with the whole 0.5B model, out of the box with "
             f"{default['num_assistant_tokens']} tokens, a {default['num_assistant_tokens_schedule']} schedule and "
             f"confidence {default['assistant_confidence_threshold']:g}. Measured on {', '.join(sorted(dates))}.")
    return "\n".join([table(header, body), "", prose(after)])


def bench_distortion_qwen(root: Path) -> str:
    """docs/results.md's distortion map of the sigmoid on the Qwen2.5-Coder pair (`specsweep bench distortion`, run
    by the sigmoid profile): exact (the zero check), exact against the draft's argmax (llama.cpp's rule, where the file
    has it), typical and the sigmoid at the registry's parameters, then the
    other sigmoid settings no setting beats on both distortion and acceptance (the front), by acceptance; the chosen
    one marked."""
    data = read_source(root, DISTORTION_QWEN, "the sigmoid profile (specsweep bench distortion)")
    s, rows, choice = data["settings"], data["results"], data["choice"]
    sigmoid = [r for r in rows if r["rule"] == "sigmoid"]
    on = pareto_mask([r["acceptance"] for r in sigmoid], [-r["distortion"] for r in sigmoid])
    front = [r for r, keep in zip(sigmoid, on) if keep]
    # the reference rows, before the sigmoid grid: exact, exact against the draft's argmax (a file may lack it),
    # typical, and the first sigmoid row (the registry's α and β)
    references = [r for r in rows if r["rule"] != "sigmoid"] + sigmoid[:1]
    names = {("exact", "sampled"): "exact (lossless: the check)",
             ("exact", "argmax"): "exact, the draft's argmax (llama.cpp's rule; lossless)",
             ("typical", "sampled"): "typical, the registry's ε and δ",
             ("sigmoid", "sampled"): "sigmoid, the registry's α and β"}
    named = {r["label"]: names.get((r["rule"], r.get("draft", "sampled")), r["label"]) for r in references}
    body = []
    on_front = {r["label"] for r in front}
    for r in [*references, *sorted((r for r in front if r["label"] not in named), key=lambda r: r["acceptance"])]:
        what = named.get(r["label"], "sigmoid, on the front")
        if r["label"] in named and r["label"] in on_front:
            what += ", on the front"
        if choice is not None and r["label"] == choice["label"]:
            what += f" (chosen: the most accepting within {num(s['max_distortion'], 2)})"
        low, high = r["distortion_ci95"]
        body.append([what, rule_params(r), f"{num(r['distortion'], 3)} [{num(low, 3)}, {num(high, 3)}]",
                     num(r["acceptance"], 2), num(r["tokens_per_step"], 2)])
    at = at_commit(data["provenance"])
    chosen = ("no sigmoid setting is within the bound, so there is no tuned row" if choice is None else
              f"the tuned row above runs {rule_params(choice)}")
    after = (f"{s['steps']} verify steps of one exact run ({s['limit']} articles, up to {s['max_new_tokens']} new "
             f"tokens, T = {s['temperature']:g}, γ {s['gamma']}, {s['dtype']}, the draft in {s['draft_quant']}), "
             f"{len(sigmoid)} sigmoid settings; 95 % bootstrap intervals over verify steps; tokens/step at the "
             f"acceptance as if i.i.d. Bound {num(s['max_distortion'], 2)}: {chosen}. Measured on "
             f"{data['provenance']['date'][:10]}{at}.")
    return "\n".join([table(["rule", "parameters", "distortion per token [95 %]", "acceptance", "tokens/step"], body),
                      "", prose(after)])


def bench_rules_t1(root: Path) -> str:
    """docs/results.md's llama.cpp verify rule at T = 1 beside exact rejection sampling (the llama-cpp profile's
    `specsweep bench distortion`): the acceptance of the draft's sampled token and of its argmax on the same
    positions, with intervals and the tokens per step they give."""
    data = read_source(root, RULES_T1, "the llama-cpp profile (specsweep bench distortion)")
    s = data["settings"]
    rows = {r.get("draft", "sampled"): r for r in data["results"] if r["rule"] == "exact"}
    what = {"sampled": "exact rejection sampling, the draft samples at T (specsweep's exact)",
            "argmax": "exact, the draft proposes its argmax (llama.cpp's rule)"}
    body = [[what[k], interval(r["acceptance"], *r["acceptance_ci95"], 3), num(r["tokens_per_step"], 2),
             num(r["distortion"], 4)] for k, r in ((k, rows[k]) for k in ("sampled", "argmax") if k in rows)]
    after = (f"Closed form on the same {s['steps']} verify steps of one exact run of specsweep's engine ({s['limit']} "
             f"articles, up to {s['max_new_tokens']} new tokens, T = {s['temperature']:g}, γ {s['gamma']}, "
             f"{s['dtype']}, the converted folders of the Q4_K_M files): acceptance Σ min(p, q) for a sampled draft, "
             f"p(argmax q) for the argmax; 95 % bootstrap intervals over verify steps; tokens/step at that "
             f"acceptance as if i.i.d.; distortion is total variation per token (0: lossless). Measured on "
             f"{measured_on(data['provenance'])}.")
    return "\n".join([table(["verify rule at T = 1", "acceptance [95 %]", "tokens/step", "distortion"], body), "",
                      prose(after)])


def _best_tree(rows: list[dict], what) -> str:
    """A sentence on the best token tree against the best chain (empty where no tree was replayed)."""
    trees = [r for r in rows if r.get("draft_tree")]
    if not trees:
        return ""
    tree = max(trees, key=lambda r: r["predicted_decode_speedup"])
    chain = max((r for r in rows if not r.get("draft_tree")), key=lambda r: r["predicted_decode_speedup"])
    return (f" Of {len(trees)} token trees (a tree's γ is its node count, each costed as a chain of as many tokens), "
            f"the best, {what(tree)}, takes {num(tree['tokens_per_step'], 2)} tokens/step for a predicted "
            f"{num(tree['predicted_decode_speedup'], 2)}x, against the best chain's {num(chain['tokens_per_step'], 2)} "
            f"and {num(chain['predicted_decode_speedup'], 2)}x: the nodes a tree spends on width, a chain of the same "
            "cost spends on depth.")


def bench_replay_qwen(root: Path) -> str:
    """docs/results.md: prompt lookup and suffix decoding replayed on the 24-article lookup run's texts
    (``python -m pipeline.benchmarks.replay``, run by the pair profile): the run's own setting with what it measured,
    then the settings with the highest predicted decoding speedup."""
    data = read_source(root, REPLAY_QWEN, "the pair profile (python -m pipeline.benchmarks.replay)")
    rows, measured, src = data["results"], data["run_measured"], data["source"]
    own = next(r for r in rows if r["own"])
    ranked = sorted(rows, key=lambda r: -r["predicted_decode_speedup"])

    def what(r: dict) -> str:
        shape = f", tree {r['draft_tree']} ({r['gamma']} nodes)" if r.get("draft_tree") else f", γ {r['gamma']}"
        if r["drafter"] == "prompt-lookup":
            return f"prompt lookup, n-grams {r['lookup_min']}-{r['lookup_max']}{shape}"
        return f"suffix decoding, factor {r['suffix_factor']:g}, min prob {r['suffix_min_prob']:g}{shape}"

    body = [[what(r) + (" (the run's own)" if r["own"] else ""), num(r["tokens_per_step"], 2),
             num(r["acceptance_rate"], 2), percent(r["proposing_share"]), num(r["predicted_decode_speedup"], 2) + "x"]
            for r in ranked[:REPLAY_ROWS]]
    rank = ranked.index(own) + 1
    at = at_commit(data["provenance"])
    after = (f"{len(rows)} settings replayed on the {data['samples']} texts of the run's own setting ({what(own)}; "
             f"{src['limit']} articles, up to {src['max_new_tokens']} new tokens, {src['dtype']}), the cost of a "
             f"step from the target's forward over 1 to {max(map(int, data['cost_curve']))} tokens in the same "
             f"dtype. The run measured {num(measured['mean_accepted_tokens'], 2)} tokens/step (replayed: "
             f"{num(own['tokens_per_step'], 2)}) and {num(measured['decode_speedup'], 2)}x decoding alone (predicted: "
             f"{num(own['predicted_decode_speedup'], 2)}x); it ranks {rank} of {len(rows)}.{_best_tree(rows, what)} "
             "Predictions, not "
             f"measurements: a setting is measured by `specsweep run`. Replayed on {data['provenance']['date'][:10]}"
             f"{at}.")
    return "\n".join([table(["setting", "tokens/step", "acceptance", "steps proposing",
                              "predicted decoding speedup"], body), "", prose(after)])


def bench_replay_draft(root: Path) -> str:
    """docs/results.md: the int4 draft replayed on a 24-article run's texts (``python -m pipeline.benchmarks.replay
    --drafters prompt-lookup,model,lookup-model --draft ...``, run by the pair profile on an AMX CPU): per drafter, its
    settings with the highest predicted decoding speedup, and the draft's fixed γ against its in-step stop."""
    data = read_source(root, REPLAY_DRAFT, "the pair profile (python -m pipeline.benchmarks.replay --draft ...)")
    rows, src = data["results"], data["source"]

    def what(r: dict) -> str:
        stop = f", stops below {r['draft_confidence']:g}" if r.get("draft_confidence") else ", fixed"
        if r["drafter"] == "model":
            return f"the int4 draft, γ {r['gamma']}{stop}"
        if r["drafter"] == "lookup-model":
            return (f"prompt lookup's match (n-grams {r['lookup_min']}-{r['lookup_max']}), then the int4 draft, "
                    f"γ {r['gamma']}{stop}")
        return f"prompt lookup, n-grams {r['lookup_min']}-{r['lookup_max']}, γ {r['gamma']}"

    def best(keep) -> list[dict]:
        return sorted((r for r in rows if keep(r)), key=lambda r: -r["predicted_decode_speedup"])[:3]

    picked = (best(lambda r: r["drafter"] == "prompt-lookup")
              + best(lambda r: r["drafter"] == "model" and not r["draft_confidence"])
              + best(lambda r: r["drafter"] == "model" and r["draft_confidence"])
              + best(lambda r: r["drafter"] == "lookup-model"))
    body = [[what(r) + (" (the run's own)" if r["own"] else ""), num(r["tokens_per_step"], 2),
             num(r["acceptance_rate"], 2), "" if r["drafter"] == "prompt-lookup" else num(
                 r["draft_forwards_per_step"], 2), num(r["predicted_decode_speedup"], 2) + "x"] for r in picked]
    curve, draft = data["draft_cost_curve"], data["draft"]
    at = at_commit(data["provenance"])
    machine = machine_of(data["provenance"])
    after = (f"{len(rows)} settings replayed on the {data['samples']} texts of {src['limit']} articles (up to "
             f"{src['max_new_tokens']} new tokens, {src['dtype']}), the draft ({draft['model']}, "
             f"--draft-quant {draft['quant']}) traced once per text; a step's cost from the target's forward over 1 "
             f"to {max(map(int, data['cost_curve']))} tokens and the draft's over 1 to {max(map(int, curve))} "
             f"(c(1) = {num(curve['1'], 3)}, c({max(map(int, curve))}) = {num(curve[str(max(map(int, curve)))], 3)} "
             f"one-token target forwards), both measured on {machine}; past a miss the forwards are counted to the "
             f"step's length (--after-miss {draft['after_miss']}). Predictions, not measurements: a setting is "
             f"measured by `specsweep run`. Replayed on {data['provenance']['date'][:10]}{at}.")
    return "\n".join([table(["setting", "tokens/step", "acceptance", "draft forwards/step",
                              "predicted decoding speedup"], body), "", prose(after)])


QUANT_TARGET = "results/published/llama-cpp/results/bench/quant-target/qwen-1.5b-cpu.json"   # the llama-cpp profile's
QUANT_TARGET_PROJECTIONS = "results/published/llama-cpp/results/bench/quant-target/projections-cpu.json"   # the same
WEIGHTS_NAMED = {"float32": "float32", "bfloat16": "bfloat16", "int8": "int8 weights", "int4": "int4 weights",
                 "int8+a8": "int8 weights, int8 prefill", "int4+a8": "int4 weights, int8 prefill"}


def bench_quant_target(root: Path) -> str:
    """docs/results.md: the 1.5B target's forward in torch, dense and quantised in place (``--target-quant``), one and
    γ + 1 tokens, each dtype's time over the first's paired by round, and the bytes each holds (the llama-cpp
    profile's ``python -m pipeline.benchmarks.forward --dtypes ...``)."""
    data = read_source(root, QUANT_TARGET, "the llama-cpp profile (python -m pipeline.benchmarks.forward)")
    s = data["settings"]
    rows = {(r["dtype"], r["new_tokens"]): r for r in data["results"]}
    over = {(r["dtype"], r["new_tokens"]): r["speedup"] for r in data["dtypes"]}
    base, q = s["dtypes"][0], max(s["new_tokens"])

    def named(dtype: str) -> str:
        activations, _, mode = dtype.partition("+")
        return f"{WEIGHTS_NAMED[mode]}, {activations} activations" if mode else f"{activations}, dense"

    body = []
    for d in s["dtypes"]:
        one, many = rows[d, 1], rows[d, q]
        faster = [ci(over[d, n]) + "x" if (d, n) in over else "1 (itself)" for n in (1, q)]
        body.append([named(d), num(data["weight_bytes"][d] / 1e9, 2), num(one["static_ms"], 0),
                     num(many["static_ms"], 0),
                     ci(many["verify_cost"]), *faster])
    after = (f"Qwen2.5-Coder-1.5B-Instruct (the converted folder: the Q4_K_M weights, dequantised) in specsweep's "
             f"static forward, one forward of 1 and of {q} new tokens after {s['context']} cached ones, batch 1, "
             f"{s['threads']} threads; every variant in the same {s['rounds']} interleaved rounds of {s['calls']} "
             f"calls, medians; the last two columns are {base}'s time over the row's, paired by round, with their "
             f"{percent(over[next(iter(over))]['ci_coverage'])} intervals (above 1: the row is faster). GB: the "
             f"model's own tensors as loaded. Measured on {measured_on(data['provenance'])}.")
    return "\n".join([table(["the 1.5B target in torch", "GB", "1 token, ms", f"{q} tokens, ms",
                             f"r = ms({q}) / ms(1)", f"1 token: {base} over it", f"{q} tokens: {base} over it"], body),
                      "", prose(after)])


def bench_quant_target_projections(root: Path) -> str:
    """docs/results.md: the 1.5B's largest projections over 1 to 384 rows, torch's weight-only kernels and F.linear
    over the int8 weight dequantised for the call, against bfloat16's F.linear (the llama-cpp profile's ``python -m
    pipeline.benchmarks.quant_linear``): why a quantised target's projections run their kernel at every row count."""
    data = read_source(root, QUANT_TARGET_PROJECTIONS,
                       "the llama-cpp profile (python -m pipeline.benchmarks.quant_linear)")
    s = data["settings"]
    ways = [w for w in ("int8", "int4", "dequantised") if w in s["ways"]]
    named = {"int8": "int8 kernel", "int4": "int4 kernel", "dequantised": "dequantised int8, F.linear"}

    def cell(r: dict, w: str) -> str:
        low, high = r[f"{w}_speedup_ci"]
        return f"{num(r[f'{w}_us'] / 1e3, 1)} ({interval(r[f'{w}_speedup'], low, high, suffix='x')})"

    body = [[r["shape"], str(r["rows"]), num(r["bfloat16_us"] / 1e3, 1), *(cell(r, w) for w in ways)]
            for r in data["results"]]
    after = (f"One projection y = x @ W.T, W N x K of the 1.5B's shapes (gate and up stacked; down), x bfloat16 of "
             f"M rows, random values; ms per call, median of {s['rounds']} rounds of {s['calls']} calls, "
             f"{s['threads']} threads; in brackets bfloat16's time over the way's, paired by round (above 1: "
             f"faster). Measured on {measured_on(data['provenance'])}.")
    return "\n".join([table(["N x K", "rows M", "bfloat16 F.linear, ms", *(f"{named[w]}, ms" for w in ways)], body),
                      "", prose(after)])
