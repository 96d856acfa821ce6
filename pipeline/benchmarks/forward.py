"""One forward of a causal LM, our static-cache forward against transformers', in one process: why the engine has
its own forward.

    python -m pipeline.benchmarks.forward [--layers 2 --width 32 --context 256 --rounds 6 --no-compile]
    python -m pipeline.benchmarks.forward --model PATH [--context 600 --new-tokens 1,5,11 --rounds 10]

Without --model: one decode forward of a small random GPT-2, three ways:
  transformers  the model's own forward over a DynamicCache (what the engine runs with --no-static-cache)
  static        the engine's static-cache forward (pipeline/decoding/static/, through CachedModel)
  compiled      torch.compile(model.forward, dynamic=False) over transformers' StaticCache, the route of
                transformers' static-cache generation; its first call's compile time is reported apart
Each call appends one token after ``context`` cached tokens and rolls it back, so the context stays fixed. The
three run in interleaved rounds (a change of machine load lands on all of them); each round's figure is the
median of ``calls`` calls, and the table gives the median over rounds with the rounds' range. Writes
results/bench/forward-<device>.json.

With --model: a real model from a registry name (docs/models.md) or a local PATH (a save_pretrained folder, a
Whisper's included: its decoder, over a random encoder output of its shape; a .gguf file, dequantised, which
needs the ``gguf`` package; or a folder holding only a config.json: random weights of that shape, as timings do
not depend on the values). For each number of new tokens per forward (1: a draft step or autoregressive decoding;
γ + 1: a target's verify forward), transformers' forward and ours, both through CachedModel as the engine calls
them, append that many tokens after ``context`` cached ones, with every position's logits, and roll them back.
Where our forward multiplies packed weights (pipeline/decoding/static/packed.py), ours over the model's own
weights ("plain") is timed in the same rounds too, and each row gives the packed weights' gain over it; where its
few-row products are ours (bf16_linear or amx_linear, kernels/cpu.py), ours packed with oneDNN's product for every
number of rows ("onednn", built under cpu.turned_off()) too, and each row gives our few-row kernel's gain over it;
where they are amx_linear's (a CPU with AMX), ours with bf16_linear's ("bf16_linear", built under
cpu.turned_off(amx_only=True)) too, and each row gives amx_linear's gain over it. ``--ways`` times fewer of them
(ours as the engine runs it is always timed; without transformers' the rows give no speedup over it).
The two alternate in paired rounds; each round's ratio (transformers' median time over ours) gives the speedup as
the median over rounds with its order-statistic interval (pipeline/measure.py). The first forward's logits of
the two are compared as well. Writes results/bench/forward-<model>-<device>.json.

With --dtypes float32,bfloat16 the model is loaded in each dtype and every forward of every dtype and number of new
tokens is timed in the same rounds: each dtype's row gives ours against transformers' and the verify cost
r = ms(q) / ms(1) of ours (what a target's verify forward over q = γ + 1 tokens costs in one-token forwards), and
a row per number of new tokens gives our forward in the first dtype over ours in the second (paired by round).
A dtype may name a weight-only quantisation after a +: ``bfloat16+int4`` is the model loaded in bfloat16 with its
projections and head quantised in place (pipeline/decoding/static/quant.py ``quantize_model``, what
``--target-quant int4`` runs). Each dtype's weight bytes as loaded are recorded (``weight_bytes``).

Batch 1, torch's threads as set (1 by default here, as `specsweep run` uses on 2 cores).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from pipeline.benchmarks.timing import format_table, time_calls
from pipeline.decoding.cache import CachedModel, model_kind
from pipeline.decoding.static import LlamaStaticForward
from pipeline.decoding.static.packed import few_rows_kernel
from pipeline.decoding.static.quant import MODES, check_supported, quantize_model, weight_bytes
from pipeline.dtypes import DTYPES, torch_dtype
from pipeline.env_info import provenance
from pipeline.errors import OneLineParser, SpecsweepError
from pipeline.io import write_json_atomic
from pipeline.kernels import cpu
from pipeline.measure import median_ci
from pipeline.models import is_shape, random_weights


def run(layers: int = 2, width: int = 32, heads: int = 2, vocab: int = 269, context: int = 256, rounds: int = 6,
        calls: int = 200, compile: bool = True, threads: int = 1, out: Path | None = None) -> dict:
    """Time the three forwards (see the module docstring); torch's thread count is put back afterwards."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            return _run(layers, width, heads, vocab, context, rounds, calls, compile, threads, out)
    finally:
        torch.set_num_threads(previous)


def _run(layers, width, heads, vocab, context, rounds, calls, compile, threads, out) -> dict:
    from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel, StaticCache


    torch.manual_seed(0)
    config = GPT2Config(vocab_size=vocab, n_positions=context + 64, n_embd=width, n_layer=layers, n_head=heads,
                        bos_token_id=1, eos_token_id=1)
    model = GPT2LMHeadModel(config).eval()
    prompt = torch.randint(0, vocab, (1, context))
    token = torch.randint(0, vocab, (1, 1))

    dynamic = DynamicCache(config=config)
    model(prompt, past_key_values=dynamic, use_cache=True)

    def transformers_forward(_):
        model(token, past_key_values=dynamic, use_cache=True)
        dynamic.crop(-1)

    cached = CachedModel(model, static=True)
    cached.reset(1, torch.device("cpu"), capacity=context + 8)
    cached.forward(prompt, last=1)
    keep_none = torch.zeros(1, dtype=torch.int64)

    def static_forward(_):
        cached.forward(token, last=1)
        cached.retain(1, keep_none, 0, 0)

    ways = {"transformers": transformers_forward, "static": static_forward}
    compile_seconds = None
    if compile:
        static_cache = StaticCache(config=config, max_cache_len=context + 8)
        model(prompt, past_key_values=static_cache, use_cache=True, cache_position=torch.arange(context))
        compiled = torch.compile(model.forward, dynamic=False)
        position = torch.arange(context, context + 1)

        def compiled_forward(_):
            compiled(input_ids=token, past_key_values=static_cache, use_cache=True, cache_position=position)
            for layer in static_cache.layers:
                layer.cumulative_length.sub_(1)

        t0 = time.perf_counter()
        compiled_forward(0)
        compile_seconds = time.perf_counter() - t0
        ways["compiled"] = compiled_forward

    per_round: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, fn in ways.items():
            per_round[name].append(statistics.median(time_calls(fn, "cpu", calls, warmup=20)))
    rows = [{"forward": name, "median_ms": statistics.median(r) * 1e3, "min_round_ms": min(r) * 1e3,
             "max_round_ms": max(r) * 1e3, "rounds_ms": [x * 1e3 for x in r]} for name, r in per_round.items()]
    result = {"benchmark": "forward", "provenance": provenance("cpu"),
              "settings": {"layers": layers, "width": width, "heads": heads, "vocab": vocab, "context": context,
                           "rounds": rounds, "calls": calls, "threads": threads, "batch": 1, "dtype": "float32"},
              "compile_seconds": compile_seconds, "results": rows}
    if out is not None:
        write_json_atomic(out, result)
    return result


def load_model(path: str, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """A causal LM (or a Whisper: its decoder is what is timed) from a local ``path`` in ``dtype`` with sdpa
    attention, in eval mode (see the module docstring)."""
    from transformers import AutoConfig, AutoModelForCausalLM, WhisperForConditionalGeneration

    from pipeline.weights.resolver import resolve  # kept local: a registry name is converted on first use

    p = Path(resolve(str(path)))
    kwargs = {"dtype": dtype, "attn_implementation": "sdpa"}
    whisper = p.is_dir() and getattr(AutoConfig.from_pretrained(p), "is_encoder_decoder", False)
    if is_shape(str(p)):                               # random weights, initialised where they run
        return random_weights(str(p), dtype, device, WhisperForConditionalGeneration if whisper
                              else AutoModelForCausalLM)
    if whisper:
        return WhisperForConditionalGeneration.from_pretrained(p, **kwargs).to(device).eval()
    if p.suffix == ".gguf":
        try:
            import gguf  # noqa: F401
        except ImportError:
            raise SystemExit("reading a .gguf file needs the gguf package: .venv/bin/pip install gguf") from None
        model = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, **kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(p, **kwargs)
    return model.to(device).eval()


def load_quantized(path: str, device: str, name: str):
    """:func:`load_model` in the dtype ``name`` names, its weights quantised in place where it names a mode after a +
    (``bfloat16+int4``; see the module docstring)."""
    dtype, _, mode = name.partition("+")
    model = load_model(path, device, torch_dtype(dtype))
    if mode:
        quantize_model(model, mode)
    return model


def parse_dtypes(text: str, device: str) -> tuple[str, ...]:
    """--dtypes: "float32,bfloat16+int4" -> its names; SpecsweepError naming a bad one, or a quantisation that
    cannot run on ``device`` in its dtype (before any model loads)."""
    names = tuple(text.split(","))
    for name in names:
        dtype, plus, mode = name.partition("+")
        if dtype not in DTYPES or (plus and mode not in MODES[1:]):
            raise SpecsweepError(f"--dtypes: {name!r} is not a dtype ({', '.join(DTYPES)}) with an optional +mode "
                                 f"({', '.join(MODES[1:])}), e.g. bfloat16+int4")
        if mode:
            check_supported(mode, device, torch_dtype(dtype), role="target")
    return names


FORWARDS = ("transformers", "static", "plain", "onednn", "bf16_linear", "compiled")
"""transformers' forward; ours as the engine runs it (packed weights where the family, device and dtype allow:
pipeline/decoding/static/packed.py); ours over the model's own weights ("plain": left out where nothing is packed);
ours packed with oneDNN's product over every number of rows ("onednn": left out where packed.py's few-row products
are oneDNN's anyway); ours packed with bf16_linear's few rows ("bf16_linear": only where packed.py's are
amx_linear's, kernels/cpu.py); ours through torch.compile ("compiled": pipeline/decoding/static/compiled.py, under CUDA
graphs on a GPU; the Llama family only, left out for the others)."""
COMPARED = {"plain": "packed_speedup", "onednn": "few_rows_speedup", "bf16_linear": "amx_speedup",
            "compiled": "compiled_over_eager"}
"""The forwards timed against "static", and the name of that row's paired ratio (theirs over static's; for "compiled",
whose ratio is compiled's time over the eager static forward's, below 1 where compiling pays)."""
DEFAULT_WAYS = tuple(f for f in FORWARDS if f != "compiled")
"""--ways when not given: compiling a real model's forward takes minutes on a CPU, so "compiled" is asked by name."""
COMPILE_MODE = {"cuda": "reduce-overhead", "cpu": "default"}
"""The torch.compile mode of the "compiled" forward on each device type: CUDA graphs on a GPU."""


def run_model(path: str, context: int = 600, new_tokens: tuple[int, ...] = (1, 5, 11), rounds: int = 10,
              calls: int = 10, threads: int = 1, device: str = "cpu", dtypes: tuple[str, ...] = ("float32",),
              out: Path | None = None, ways: tuple[str, ...] = DEFAULT_WAYS) -> dict:
    """Time transformers' forward and ours on the model at ``path``, in each of ``dtypes``, all in the same
    interleaved rounds (see the module docstring); ``ways``: which of FORWARDS (ours as the engine runs it always);
    torch's thread count is put back afterwards."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            models = {name: load_quantized(path, device, name) for name in dtypes}
            load = os.getloadavg()
            rows, dtype_rows, compiled = _measure(models, context, new_tokens, rounds, calls, device, ways)
    finally:
        torch.set_num_threads(previous)
    config = next(iter(models.values())).config
    result = {"benchmark": "forward", "provenance": provenance(device), "model": str(path),
              "config": {k: getattr(config, k, None) for k in ("model_type", "num_hidden_layers", "hidden_size",
                                                                "num_attention_heads", "num_key_value_heads",
                                                                "vocab_size")},
              "settings": {"context": context, "new_tokens": list(new_tokens), "rounds": rounds, "calls": calls,
                           "threads": threads, "batch": 1, "dtypes": list(dtypes), "ways": list(ways)},
              "load_average": {"before": list(load), "after": list(os.getloadavg())}, "results": rows,
              "dtypes": dtype_rows, "compiled": compiled,
              "weight_bytes": {name: weight_bytes(model) for name, model in models.items()}}
    if out is not None:
        write_json_atomic(out, result)
    return result


def _measure(models: dict, context: int, new_tokens: tuple[int, ...], rounds: int, calls: int,
             device: str, ways: tuple[str, ...] = DEFAULT_WAYS) -> tuple[list[dict], list[dict], dict]:
    """Every (forward, dtype, new tokens) timed in the same rounds, in an order that rotates from round to round.
    Returns the rows per (dtype, new tokens): ms of each forward, ours against transformers' (paired by round),
    the verify cost r = ms(q) / ms(1) of ours (paired by round; 1 must be among ``new_tokens``) and the first
    forward's logit difference; and the rows per new tokens comparing the dtypes: ours in the first dtype over ours
    in each other (> 1: the other is faster); and the compiled forward's record per dtype (its mode, the seconds spent
    compiling, outside the timed rounds)."""
    dev = torch.device(device)
    first = next(iter(models.values()))
    vocab = first.get_output_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, context), generator=g).to(dev)
    tokens = {q: torch.randint(0, vocab, (1, q), generator=g).to(dev) for q in new_tokens}
    keep_none = torch.zeros(1, dtype=torch.int64, device=dev)
    # a Whisper's decoder (or a Whisper draft decoder) attends to an encoder output: random values of its shape
    kind = model_kind(first, target_is_seq2seq=type(first).__name__ == "WhisperForCausalLM")
    hidden = None
    if kind != "causal":
        hidden = torch.randn(1, first.config.max_source_positions, first.config.d_model, generator=g).to(dev)
    cached, logits = {}, {}
    for dtype, model in models.items():
        for forward in FORWARDS:
            if forward not in ways and forward != "static":
                continue
            static = cached.get(("static", dtype))                 # built before "plain" and "onednn" are
            packed = static is not None and getattr(static.static, "packed", False)
            if forward == "plain" and not packed:
                continue                                    # nothing packed: the plain forward is the static one
            if forward == "onednn" and not (packed and few_rows_kernel(model.dtype) != "onednn"):
                continue                                    # the static forward's few-row products are oneDNN's
            if forward == "bf16_linear" and not (packed and few_rows_kernel(model.dtype) == "amx_linear"):
                continue                                    # they are bf16_linear's, or oneDNN's
            off = {"onednn": cpu.turned_off(), "bf16_linear": cpu.turned_off(amx_only=True)}
            if forward == "compiled" and not (kind == "causal" and LlamaStaticForward.supports(model)):
                continue                                    # only the Llama family's forward compiles
            with off.get(forward, contextlib.nullcontext()):
                c = CachedModel(model, kind, static=forward != "transformers",
                                packed=forward in ("static", "onednn", "bf16_linear"),
                                compile=COMPILE_MODE[dev.type] if forward == "compiled" else "off")
            if forward != "transformers" and c.static is None:
                raise SystemExit(f"{type(model).__name__} has no static forward here (pipeline/decoding/static/)")
            c.reset(1, dev, None if hidden is None else hidden.to(model.dtype), capacity=context + max(new_tokens) + 8)
            c.forward(prompt, last=1)
            for q in new_tokens:
                logits[forward, dtype, q] = c.forward(tokens[q], last=q).float()
                c.retain(q, keep_none, 0, 0)
            cached[forward, dtype] = c

    def step(c, q):
        def call(_):
            c.forward(tokens[q], last=q)
            c.retain(q, keep_none, 0, 0)
        return call

    ways = [(f, d, q) for d in models for f in FORWARDS if (f, d) in cached for q in new_tokens]
    times: dict[tuple, list[float]] = {w: [] for w in ways}
    for r in tqdm(range(rounds), desc="rounds", leave=False):
        shift = r % len(ways)
        for f, d, q in ways[shift:] + ways[:shift]:                # rotate which goes first
            times[f, d, q].append(statistics.median(time_calls(step(cached[f, d], q), device, calls, warmup=1)))
    compiled = {d: c.static.compiled.record() for (f, d), c in cached.items() if f == "compiled"}
    return (*_rows(models, new_tokens, times, logits, cached), compiled)


def _rows(models: dict, new_tokens: tuple[int, ...], times: dict, logits: dict,
          cached: dict) -> tuple[list[dict], list[dict]]:
    """_measure's rows from each (forward, dtype, new tokens)'s round times and first logits."""
    rows = []
    for d in models:
        for q in new_tokens:
            s = times["static", d, q]
            row = {"dtype": d, "new_tokens": q, "static_ms": statistics.median(s) * 1e3,
                   "rounds_ms": {"static": [x * 1e3 for x in s]}}
            if ("transformers", d) in cached:
                t = times["transformers", d, q]
                ratios = [a / b for a, b in zip(t, s)]
                row.update({"transformers_ms": statistics.median(t) * 1e3, "speedup": median_ci(ratios).to_dict(),
                            "ratios": ratios, "max_abs_logit_diff": float(
                                (logits["static", d, q] - logits["transformers", d, q]).abs().max())})
                row["rounds_ms"]["transformers"] = [x * 1e3 for x in t]
            if 1 in new_tokens:
                row["verify_cost"] = median_ci([a / b for a, b in zip(s, times["static", d, 1])]).to_dict()
            for other, ratio in COMPARED.items():
                if (other, d) not in cached:
                    continue
                p = times[other, d, q]                  # the packed weights' (or bf16_linear's) gain, paired by round
                row.update({f"{other}_ms": statistics.median(p) * 1e3,
                            ratio: median_ci([a / b for a, b in zip(p, s)]).to_dict(),
                            f"{other}_max_abs_logit_diff":
                                float((logits["static", d, q] - logits[other, d, q]).abs().max())})
                row["rounds_ms"][other] = [x * 1e3 for x in p]
                if 1 in new_tokens:
                    row[f"{other}_verify_cost"] = median_ci([a / b for a, b in zip(p, times[other, d, 1])]).to_dict()
            rows.append(row)
    base, *others = list(models)
    dtype_rows = [{"new_tokens": q, "over": base, "dtype": d,
                   "speedup": median_ci([a / b for a, b in zip(times["static", base, q], times["static", d, q])])
                   .to_dict()} for d in others for q in new_tokens]
    return rows, dtype_rows


def print_model_table(result: dict) -> None:
    def ci(x):
        return f"{x['median']:.3f} [{x['ci_low']:.3f}, {x['ci_high']:.3f}] ({x['ci_coverage']:.0%})"

    table = [{"dtype": r["dtype"], "new tokens": r["new_tokens"],
              **({"transformers ms": f"{r['transformers_ms']:.2f}", "static over transformers": ci(r["speedup"]),
                  "max |logit diff|": f"{r['max_abs_logit_diff']:.1e}"} if "transformers_ms" in r else {}),
              "static ms": f"{r['static_ms']:.2f}",
              "r = ms(q) / ms(1)": ci(r["verify_cost"]) if "verify_cost" in r else "",
              **({"plain-weights ms": f"{r['plain_ms']:.2f}", "packed over plain": ci(r["packed_speedup"]),
                  "plain r": ci(r["plain_verify_cost"]) if "plain_verify_cost" in r else ""}
                 if "plain_ms" in r else {}),
              **({"oneDNN ms": f"{r['onednn_ms']:.2f}", "ours over oneDNN": ci(r["few_rows_speedup"]),
                  "oneDNN r": ci(r["onednn_verify_cost"]) if "onednn_verify_cost" in r else ""}
                 if "onednn_ms" in r else {}),
              **({"bf16_linear ms": f"{r['bf16_linear_ms']:.2f}", "amx_linear over bf16_linear": ci(r["amx_speedup"]),
                  "bf16_linear r": ci(r["bf16_linear_verify_cost"]) if "bf16_linear_verify_cost" in r else ""}
                 if "bf16_linear_ms" in r else {}),
              **({"compiled ms": f"{r['compiled_ms']:.2f}", "compiled over eager": ci(r["compiled_over_eager"]),
                  "compiled r": ci(r["compiled_verify_cost"]) if "compiled_verify_cost" in r else ""}
                 if "compiled_ms" in r else {})} for r in result["results"]]
    print(format_table(table, list(table[0])))
    if result["dtypes"]:
        table = [{"new tokens": r["new_tokens"], "static": f"{r['dtype']} over {r['over']}",
                  "speedup [interval]": ci(r["speedup"])} for r in result["dtypes"]]
        print(format_table(table, list(table[0])))
    for dtype, record in (result.get("compiled") or {}).items():
        print(f"compiled ({dtype}, mode {record['mode']}): {record['compile_s']:.1f} s compiling {record['shapes']} "
              "shapes, before the timed rounds")
    print("load average (1, 5, 15 min) before: {:.2f} {:.2f} {:.2f}, after: {:.2f} {:.2f} {:.2f}".format(
        *result["load_average"]["before"], *result["load_average"]["after"]))


def print_table(result: dict) -> None:
    table = [{"forward": r["forward"], "median ms": f"{r['median_ms']:.3f}",
              "rounds ms": f"{r['min_round_ms']:.3f}-{r['max_round_ms']:.3f}"} for r in result["results"]]
    print(format_table(table, list(table[0])))
    if result["compile_seconds"] is not None:
        print(f"torch.compile, first call: {result['compile_seconds']:.1f} s")


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m pipeline.benchmarks.forward", description=__doc__.splitlines()[0])
    p.add_argument("--model", help="a registry name (specsweep fetch --help) or a local model: a save_pretrained "
                                   "folder, a .gguf file, or a folder with only a config.json (random weights); "
                                   "without it, a small random GPT-2")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--context", type=int, help="cached tokens (default: 256, with --model 600)")
    p.add_argument("--new-tokens", default="1,5,11", help="with --model: new tokens per forward, comma-separated")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default: 6, with --model 10)")
    p.add_argument("--calls", type=int, help="calls per round (default: 200, with --model 10)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="with --model: cpu or cuda")
    p.add_argument("--dtypes", default="float32", help="with --model: dtypes, comma-separated, timed in the same "
                                                       "rounds (e.g. float32,bfloat16: the second against the first)")
    p.add_argument("--ways", default=",".join(DEFAULT_WAYS),
                   help="with --model: the forwards timed, comma-separated, of " + ", ".join(FORWARDS)
                        + " (static, ours as the engine runs it, always; where a way does not apply it is left out; "
                        "default: all but compiled)")
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.model:
        try:
            dtypes = parse_dtypes(args.dtypes, args.device)
        except SpecsweepError as e:
            p.error(str(e))
        ways = tuple(args.ways.split(","))
        if bad := [w for w in ways if w not in FORWARDS]:
            p.error(f"--ways: unknown forward {bad[0]!r}: choose from {', '.join(FORWARDS)}")
        name = Path(args.model).stem if args.model.endswith(".gguf") else Path(args.model.rstrip("/")).name
        out = args.out or Path(f"results/bench/forward-{name.lower()}-{args.device}.json")
        result = run_model(args.model, context=args.context or 600,
                           new_tokens=tuple(int(x) for x in args.new_tokens.split(",")), rounds=args.rounds or 10,
                           calls=args.calls or 10, threads=args.threads, device=args.device, dtypes=dtypes, out=out,
                           ways=ways)
        print_model_table(result)
    else:
        out = args.out or Path("results/bench/forward-cpu.json")
        result = run(layers=args.layers, width=args.width, heads=args.heads, context=args.context or 256,
                     rounds=args.rounds or 6, calls=args.calls or 200, compile=args.compile, threads=args.threads,
                     out=out)
        print_table(result)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
