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

With --model: a real model from a local PATH (a save_pretrained folder, a Whisper's included: its decoder, over a
random encoder output of its shape; a .gguf file, dequantised to float32, which
needs the ``gguf`` package; or a folder holding only a config.json: random weights of that shape, as timings do
not depend on the values). For each number of new tokens per forward (1: a draft step or autoregressive decoding;
γ + 1: a target's verify forward), transformers' forward and ours, both through CachedModel as the engine calls
them, append that many tokens after ``context`` cached ones, with every position's logits, and roll them back.
The two alternate in paired rounds; each round's ratio (transformers' median time over ours) gives the speedup as
the median over rounds with its order-statistic interval (pipeline/measure.py). The first forward's logits of
the two are compared as well. Writes results/bench/forward-<model>-<device>.json.

Batch 1, fp32, torch's threads as set (1 by default here, as `specsweep run` uses on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from pipeline.benchmarks.timing import format_table, time_calls
from pipeline.decoding.cache import CachedModel, model_kind
from pipeline.env_info import provenance
from pipeline.io import write_json_atomic
from pipeline.measure import median_ci


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


def load_model(path: str, device: str = "cpu"):
    """A causal LM (or a Whisper: its decoder is what is timed) from a local ``path`` in float32 with sdpa attention,
    in eval mode (see the module docstring)."""
    from transformers import AutoConfig, AutoModelForCausalLM, WhisperForConditionalGeneration

    p = Path(path)
    kwargs = {"dtype": torch.float32, "attn_implementation": "sdpa"}
    if p.is_dir() and getattr(AutoConfig.from_pretrained(p), "is_encoder_decoder", False):
        return WhisperForConditionalGeneration.from_pretrained(p, **kwargs).to(device).eval()
    if p.suffix == ".gguf":
        try:
            import gguf  # noqa: F401
        except ImportError:
            raise SystemExit("reading a .gguf file needs the gguf package: .venv/bin/pip install gguf") from None
        model = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, **kwargs)
    elif not any(p.glob("*.safetensors")) and not any(p.glob("*.bin")):
        with torch.device(device):                     # initialised where it runs: faster for a large model
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(p), **kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(p, **kwargs)
    return model.to(device).eval()


def run_model(path: str, context: int = 600, new_tokens: tuple[int, ...] = (1, 5, 11), rounds: int = 10,
              calls: int = 10, threads: int = 1, device: str = "cpu", out: Path | None = None) -> dict:
    """Time transformers' forward and ours on the model at ``path`` (see the module docstring); torch's thread
    count is put back afterwards."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            model = load_model(path, device)
            load = os.getloadavg()
            rows = [_pair(model, context, q, rounds, calls, device) for q in new_tokens]
    finally:
        torch.set_num_threads(previous)
    config = model.config
    result = {"benchmark": "forward", "provenance": provenance(device), "model": str(path),
              "config": {k: getattr(config, k, None) for k in ("model_type", "num_hidden_layers", "hidden_size",
                                                                "num_attention_heads", "num_key_value_heads",
                                                                "vocab_size")},
              "settings": {"context": context, "new_tokens": list(new_tokens), "rounds": rounds, "calls": calls,
                           "threads": threads, "batch": 1, "dtype": "float32"},
              "load_average": {"before": list(load), "after": list(os.getloadavg())}, "results": rows}
    if out is not None:
        write_json_atomic(out, result)
    return result


def _pair(model, context: int, q: int, rounds: int, calls: int, device: str) -> dict:
    """One paired comparison at ``q`` new tokens per forward: ms per forward of each, and the speedup."""

    dev = torch.device(device)
    vocab = model.get_output_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(q)
    prompt = torch.randint(0, vocab, (1, context), generator=g).to(dev)
    tokens = torch.randint(0, vocab, (1, q), generator=g).to(dev)
    keep_none = torch.zeros(1, dtype=torch.int64, device=dev)
    # a Whisper's decoder (or a Whisper draft decoder) attends to an encoder output: random values of its shape
    kind = model_kind(model, target_is_seq2seq=type(model).__name__ == "WhisperForCausalLM")
    hidden = None
    if kind != "causal":
        frames, width = model.config.max_source_positions, model.config.d_model
        hidden = torch.randn(1, frames, width, generator=g).to(dev)
    ways = {"transformers": CachedModel(model, kind, static=False), "static": CachedModel(model, kind, static=True)}
    if ways["static"].static is None:
        raise SystemExit(f"{type(model).__name__} has no static forward here (pipeline/decoding/static/)")
    logits = {}
    for name, cached in ways.items():
        cached.reset(1, dev, hidden, capacity=context + q + 8)
        cached.forward(prompt, last=1)
        logits[name] = cached.forward(tokens, last=q)
        cached.retain(q, keep_none, 0, 0)

    def step(cached):
        def call(_):
            cached.forward(tokens, last=q)
            cached.retain(q, keep_none, 0, 0)
        return call

    per_round: dict[str, list[float]] = {name: [] for name in ways}
    for r in range(rounds):
        for name in (list(ways) if r % 2 == 0 else list(reversed(ways))):       # alternate which goes first
            per_round[name].append(statistics.median(time_calls(step(ways[name]), device, calls, warmup=2)))
    ratios = [t / s for t, s in zip(per_round["transformers"], per_round["static"])]
    return {"new_tokens": q,
            **{f"{name}_ms": statistics.median(r) * 1e3 for name, r in per_round.items()},
            "speedup": median_ci(ratios).to_dict(), "ratios": ratios,
            "rounds_ms": {name: [x * 1e3 for x in r] for name, r in per_round.items()},
            "max_abs_logit_diff": float((logits["static"] - logits["transformers"]).abs().max())}


def print_model_table(result: dict) -> None:
    table = [{"new tokens": r["new_tokens"], "transformers ms": f"{r['transformers_ms']:.2f}",
              "static ms": f"{r['static_ms']:.2f}",
              "speedup [interval]": f"{r['speedup']['median']:.3f} [{r['speedup']['ci_low']:.3f}, "
                                    f"{r['speedup']['ci_high']:.3f}] ({r['speedup']['ci_coverage']:.0%})",
              "max |logit diff|": f"{r['max_abs_logit_diff']:.1e}"} for r in result["results"]]
    print(format_table(table, list(table[0])))
    print("load average (1, 5, 15 min) before: {:.2f} {:.2f} {:.2f}, after: {:.2f} {:.2f} {:.2f}".format(
        *result["load_average"]["before"], *result["load_average"]["after"]))


def print_table(result: dict) -> None:
    table = [{"forward": r["forward"], "median ms": f"{r['median_ms']:.3f}",
              "rounds ms": f"{r['min_round_ms']:.3f}-{r['max_round_ms']:.3f}"} for r in result["results"]]
    print(format_table(table, list(table[0])))
    if result["compile_seconds"] is not None:
        print(f"torch.compile, first call: {result['compile_seconds']:.1f} s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="a local model: a save_pretrained folder, a .gguf file, or a folder with only "
                                   "a config.json (random weights); without it, a small random GPT-2")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--context", type=int, help="cached tokens (default: 256, with --model 600)")
    p.add_argument("--new-tokens", default="1,5,11", help="with --model: new tokens per forward, comma-separated")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default: 6, with --model 10)")
    p.add_argument("--calls", type=int, help="calls per round (default: 200, with --model 10)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="with --model: cpu or cuda")
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.model:
        out = args.out or Path(f"results/bench/forward-{Path(args.model).stem.lower()}-{args.device}.json")
        result = run_model(args.model, context=args.context or 600,
                           new_tokens=tuple(int(x) for x in args.new_tokens.split(",")), rounds=args.rounds or 10,
                           calls=args.calls or 10, threads=args.threads, device=args.device, out=out)
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
