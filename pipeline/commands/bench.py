"""`specsweep bench {samplers,engine,kernels,block,lossless,serve}`: benchmarks that print a table and write JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.errors import SpecsweepError

HELP = "benchmarks: print a table and write JSON (speed goals are judged here)"


def _device(name: str) -> str:
    """cpu, cuda, cuda:N or auto (CUDA when there is one): the run's own rules, minus the dtype check (the
    benchmarks choose their dtypes)."""
    from pipeline.models import resolve_device

    return resolve_device(name)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", required=True, metavar="{samplers,engine,kernels,block,lossless,serve}")
    p = sub.add_parser("samplers", help="every (sampler, backend) against HF's _speculative_sampling",
                       description="Median time per verify call of every available (sampler, backend) and of HF's "
                                   "_speculative_sampling (B = 1), over B x γ x V x dtype; and a deterministic draft "
                                   "(draft_logits=None) against one-hot draft logits, paired.")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    p.add_argument("--repeats", type=int, default=20, help="timed calls per configuration (default: 20)")
    p.add_argument("--quick", action="store_true", help="one small configuration (a smoke run)")
    p.add_argument("--deterministic-only", action="store_true",
                   help="only the deterministic-draft comparison (draft_logits=None against one-hot logits, as string "
                        "mode builds them), over B 1, 16 x γ 4, 8 x V 32000, 128256 x fp32, bf16")
    p.add_argument("--out", type=Path, default=None,
                   help="results JSON (default: results/bench/samplers-<device>.json, "
                        "samplers-deterministic-<device>.json with --deterministic-only)")
    e = sub.add_parser("engine", help="our decoding loop against HF's generate, side by side",
                       description="Tokens/s of our speculative loop against HF generate(assistant_model=...) and of "
                                   "our γ = 0 loop against HF's plain generate, same models, prompts and γ, batch 1. "
                                   "Without --target/--draft a synthetic random-init pair is built.")
    e.add_argument("--target", help="target model (default: a synthetic pair built locally)")
    e.add_argument("--draft", help="draft model (with --target)")
    e.add_argument("--data", help="JSONL of {prompt} lines (default: built-in prompts for the synthetic pair)")
    e.add_argument("--gamma", type=int, default=4, help="draft tokens per step (default: 4)")
    e.add_argument("--max-new-tokens", type=int, default=64, help="tokens per prompt (default: 64)")
    e.add_argument("--repeats", type=int, default=3, help="interleaved repetitions; the median counts (default: 3)")
    e.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    e.add_argument("--out", type=Path, default=None, help="results JSON (default: results/bench/engine-<device>.json)")
    k = sub.add_parser("kernels", help="the cupy CUDA verify kernels vs HF, torch, FlashInfer and the floor (GPU)",
                       description="Time per verify call of the cupy kernels (exact, sigmoid, greedy), the torch "
                                   "reference, HF's _speculative_sampling (B = 1), FlashInfer's softmax + "
                                   "chain_speculative_sampling (if installed) and the memory/launch floor, over "
                                   "B x γ x V x dtype (B 1, 8, 32, 128; γ 1, 3, 5, 8; V 32000, 128256; bf16, fp32, "
                                   "fp16). Each is timed eagerly (CUDA events around each call) and under CUDA "
                                   "graph replay (device time); goals are judged on graph replay where both "
                                   "sides have it. Needs a CUDA GPU.")
    k.add_argument("--repeats", type=int, default=50,
                   help="eager timed calls per configuration; torch and HF get a fifth (default: 50)")
    k.add_argument("--graph-calls", type=int, default=16,
                   help="calls captured in one CUDA graph, rotating over the input sets (default: 16)")
    k.add_argument("--graph-replays", type=int, default=10, help="timed replays of that graph (default: 10)")
    k.add_argument("--max-seconds", type=float, default=240,
                   help="start no configuration after this many seconds, so the run ends in time with a table "
                        "and its JSON saying which configurations were not run; 0: no limit (default: 240, "
                        "inside the 300 s that kernels/gpu_validate.sh gives this step)")
    k.add_argument("--quick", action="store_true", help="B in {1, 16}, γ = 5, V = 128256, bf16 (a smoke run)")
    k.add_argument("--out", type=Path, default=None,
                   help="results JSON (default: kernels/results/kernels-<gpu>.json)")
    b = sub.add_parser("block", help="accepted tokens per step: block verification against exact, per γ",
                       description="Accepted draft tokens per verify step of the block rule and of exact in our "
                                   "speculative loop (batch 1), each prompt decoded with both from the same seed, "
                                   "for each γ; the difference paired over prompts with a 95 % interval. Writes "
                                   "JSON and a figure (.png beside it).")
    b.add_argument("--target", default="models/toy/text/target", help="target model (default: the toy text pair)")
    b.add_argument("--draft", default="models/toy/text/draft", help="draft model (default: the toy text pair)")
    b.add_argument("--data", default="data/toy/text/test.jsonl",
                   help="JSONL of {prompt} or {article} lines (default: data/toy/text/test.jsonl)")
    b.add_argument("--gammas", default="2,3,4,5,6,8", help="comma-separated γ values (default: 2,3,4,5,6,8)")
    b.add_argument("--steps", type=int, default=64, help="most new tokens per prompt (default: 64)")
    b.add_argument("--limit", type=int, default=None, help="the first N prompts only (default: all)")
    b.add_argument("--temperature", type=float, default=1.0, help="decoding temperature, > 0 (default: 1)")
    b.add_argument("--seed", type=int, default=0, help="prompt i decodes from seed + i with both rules (default: 0)")
    b.add_argument("--ignore-eos", action="store_true", help="decode --steps tokens per prompt, past EOS")
    b.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    b.add_argument("--out", type=Path, default=None,
                   help="results JSON (default: results/bench/block-gain-<device>.json)")
    _add_lossless_arguments(sub)
    _add_serve_arguments(sub)


def main(args: argparse.Namespace) -> int:
    if args.bench == "samplers":
        from pipeline.benchmarks import samplers

        if args.repeats < 1:
            raise SpecsweepError(f"--repeats must be >= 1; got {args.repeats}")
        device = _device(args.device)
        kind = "samplers-deterministic" if args.deterministic_only else "samplers"
        out = args.out or Path("results/bench") / f"{kind}-{device.split(':')[0]}.json"
        sizes = samplers.QUICK if args.quick else samplers.DETERMINISTIC if args.deterministic_only else samplers.FULL
        result = samplers.run(device=device, repeats=args.repeats, out=out, deterministic_only=args.deterministic_only,
                              **sizes)
        samplers.print_table(result)
        print(f"wrote {out}")
        return 0
    if args.bench == "engine":
        from pipeline.benchmarks import engine

        if args.repeats < 1 or args.gamma < 1 or args.max_new_tokens < 1:
            raise SpecsweepError("--repeats, --gamma and --max-new-tokens must be >= 1")
        if (args.target is None) != (args.draft is None):
            raise SpecsweepError("give both --target and --draft, or neither (a synthetic pair)")
        device = _device(args.device)
        out = args.out or Path("results/bench") / f"engine-{device.split(':')[0]}.json"
        result = engine.run(args.target, args.draft, args.data, gamma=args.gamma, max_new_tokens=args.max_new_tokens,
                            repeats=args.repeats, device=device, out=out)
        engine.print_table(result)
        print(f"wrote {out}")
        return 0
    if args.bench == "kernels":
        from pipeline.kernels import bench as kernel_bench

        if min(args.repeats, args.graph_calls, args.graph_replays) < 1 or args.max_seconds < 0:
            raise SpecsweepError("--repeats, --graph-calls and --graph-replays must be >= 1 and --max-seconds "
                                 f">= 0; got {args.repeats}, {args.graph_calls}, {args.graph_replays}, "
                                 f"{args.max_seconds:g}")
        kernel_bench._require_gpu()
        out = args.out or Path("kernels/results") / f"kernels-{_gpu_slug()}.json"
        sizes = kernel_bench.QUICK if args.quick else kernel_bench.FULL
        result = kernel_bench.run(repeats=args.repeats, graph_calls=args.graph_calls,
                                  graph_replays=args.graph_replays, max_seconds=args.max_seconds or None, out=out,
                                  **sizes)
        kernel_bench.print_table(result)
        print(f"wrote {out}")
        return 0
    if args.bench == "block":
        from pipeline.benchmarks import block_gain

        try:
            gammas = [int(g) for g in args.gammas.split(",")]
        except ValueError:
            raise SpecsweepError(f"--gammas must be comma-separated integers; got {args.gammas!r}") from None
        if min(gammas) < 1 or args.steps < 1 or not args.temperature > 0 or (args.limit is not None and args.limit < 1):
            raise SpecsweepError("--gammas and --steps must be >= 1, --limit >= 1 and --temperature > 0 (at T = 0 "
                                 "block verification is greedy verification, as exact's)")
        device = _device(args.device)
        out = args.out or Path("results/bench") / f"block-gain-{device.split(':')[0]}.json"
        result = block_gain.run(args.target, args.draft, args.data, gammas=gammas, steps=args.steps, seed=args.seed,
                                out=out, temperature=args.temperature, limit=args.limit, device=device,
                                ignore_eos=args.ignore_eos)
        block_gain.print_table(result)
        print(f"wrote {out} and {out.with_suffix('.png')}")
        return 0
    if args.bench == "lossless":
        return _lossless(args)
    if args.bench == "serve":
        return _serve(args)
    raise SpecsweepError(f"unknown benchmark {args.bench!r}")


def _gpu_slug() -> str:
    import re

    import torch

    return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name().lower()).strip("-")


# ---- bench lossless ---------------------------------------------------------------------------------------------

def _add_lossless_arguments(sub) -> None:
    lo = sub.add_parser("lossless", help="per dtype: do the lossless rules keep the target's output?",
                        description="For each lossless rule of the registry (pipeline/rules.py) and each dtype: at "
                                    "T = 0, the rule's output against the target's own greedy output (γ = 0, same "
                                    "engine and dtype) on every prompt, token for token, with the first diverging "
                                    "position of each mismatch; at T = 1, a chi-square test of homogeneity of N "
                                    "short continuations drawn with the rule against N drawn with γ = 0 (first "
                                    "token, first two tokens). Default pair: the toy text pair when it exists, "
                                    "else a synthetic one.")
    lo.add_argument("--rules", default=None,
                    help="comma-separated rule[:preset] to check, e.g. exact,sigmoid:paper (default: every rule "
                         "the registry calls lossless at any temperature)")
    lo.add_argument("--dtypes", default=None,
                    help="comma-separated dtypes (default: float32,bfloat16; float16 too on CUDA)")
    lo.add_argument("--target", help="target model (default: models/toy/text/target if it exists, else a synthetic "
                                     "pair built locally)")
    lo.add_argument("--draft", help="draft model (with --target)")
    lo.add_argument("--synthetic", action="store_true",
                    help="the synthetic random-init pair of `bench engine` and its prompts, even where the toy pair "
                         "exists")
    lo.add_argument("--data", help="JSONL of {prompt} or {article} lines (default: data/toy/text/test.jsonl with the "
                                   "toy pair, built-in prompts with the synthetic one)")
    lo.add_argument("--gamma", type=int, default=4, help="draft tokens per step (default: 4)")
    lo.add_argument("--greedy-tokens", type=int, default=32, help="greedy part: most new tokens per prompt "
                                                                  "(default: 32)")
    lo.add_argument("--limit", type=int, default=None, help="greedy part: the first N prompts only (default: all)")
    lo.add_argument("--samples", type=int, default=400,
                    help="sampled part: continuations per rule and per reference, per prompt (default: 400)")
    lo.add_argument("--max-new-tokens", type=int, default=3,
                    help="sampled part: tokens per continuation, >= 2 (default: 3)")
    lo.add_argument("--sample-prompts", type=int, default=1,
                    help="sampled part: the first N prompts (default: 1)")
    lo.add_argument("--sample-prompt-tokens", type=int, default=None,
                    help="sampled part: each prompt cut to its first N tokens (default: the prefix whose next token "
                         "the target is least sure of, the strongest test)")
    lo.add_argument("--alpha", type=float, default=0.01,
                    help="sampled part: test level, Bonferroni-corrected over a row's tests (default: 0.01)")
    lo.add_argument("--seed", type=int, default=0, help="sampled part: seed (default: 0)")
    lo.add_argument("--ignore-eos", action="store_true", help="decode past EOS")
    lo.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    lo.add_argument("--out", type=Path, default=None,
                    help="results JSON (default: results/bench/lossless-<device>.json)")


def _lossless(args: argparse.Namespace) -> int:
    from pipeline.benchmarks import lossless
    from pipeline.dtypes import DTYPES

    if min(args.gamma, args.greedy_tokens, args.sample_prompts, args.sample_prompt_tokens or 1) < 1 \
            or args.samples < 10 or args.max_new_tokens < 2 or (args.limit is not None and args.limit < 1):
        raise SpecsweepError("--gamma, --greedy-tokens, --limit, --sample-prompts and --sample-prompt-tokens must be "
                             ">= 1, --samples >= 10 and --max-new-tokens >= 2 (the joint test needs two tokens)")
    if not 0 < args.alpha < 1:
        raise SpecsweepError(f"--alpha must be in (0, 1); got {args.alpha:g}")
    if (args.target is None) != (args.draft is None):
        raise SpecsweepError("give both --target and --draft, or neither (the toy text pair, else a synthetic pair)")
    if args.synthetic and (args.target is not None or args.data is not None):
        raise SpecsweepError("--synthetic builds its own pair and prompts: leave out --target, --draft and --data")
    if args.data is not None and not Path(args.data).is_file():
        raise SpecsweepError(f"--data {args.data} does not exist: give a JSONL of {{prompt}} or {{article}} lines")
    rules = lossless.parse_rules(args.rules) if args.rules is not None else None
    device = _device(args.device)
    dtypes = [d.strip() for d in args.dtypes.split(",")] if args.dtypes else lossless.default_dtypes(device)
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown or not dtypes or len(set(dtypes)) != len(dtypes):
        raise SpecsweepError(f"--dtypes must name each of {', '.join(DTYPES)} at most once; got {args.dtypes!r}")
    target, draft, data = args.target, args.draft, args.data
    if target is None and not args.synthetic and (toy := lossless.default_pair()) is not None:
        target, draft = toy[:2]
        data = data or toy[2]
    out = args.out or Path("results/bench") / f"lossless-{device.split(':')[0]}.json"
    result = lossless.run(target, draft, data, rules=rules, dtypes=dtypes, gamma=args.gamma,
                          greedy_tokens=args.greedy_tokens, limit=args.limit, samples=args.samples,
                          max_new_tokens=args.max_new_tokens, sample_prompts=args.sample_prompts,
                          sample_prompt_tokens=args.sample_prompt_tokens, seed=args.seed, alpha=args.alpha,
                          ignore_eos=args.ignore_eos, device=device, out=out)
    lossless.print_table(result)
    print(f"wrote {out}")
    return 0


# ---- bench serve ------------------------------------------------------------------------------------------------

def _add_serve_arguments(sub) -> None:
    sv = sub.add_parser("serve", help="`specsweep serve` under load: dynamic batching against one request at a time",
                        description="Starts `specsweep serve` twice on loopback (dynamic batching with --max-batch, "
                                    "and --max-batch 1) and sends --requests completions per concurrency level "
                                    "(1, 4, 16 clients), --repeats times, the servers interleaved: requests lost or "
                                    "failed, p50/p99 latency, requests/s and tokens/s, and the tokens/s of dynamic "
                                    "batching over one request at a time at the highest concurrency (goal: >= 2x).")
    sv.add_argument("--target", default=_toy_pair("target"), help="target model (default: the toy text pair)")
    sv.add_argument("--draft", default=_toy_pair("draft"), help="draft model (default: the toy text pair)")
    sv.add_argument("--drafter", default="model", choices=("model", "prompt-lookup", "suffix"),
                    help="the servers' --drafter; prompt-lookup and suffix need no --draft (default: model)")
    sv.add_argument("--chat", action="store_true",
                    help="send chat completions (the prompt as the user's message) instead of completions")
    sv.add_argument("--data", default="data/toy/text/test.jsonl",
                    help="JSONL of {prompt} or {article} lines, cycled (default: data/toy/text/test.jsonl)")
    sv.add_argument("--sampler", default="exact", help="acceptance rule (default: exact)")
    sv.add_argument("--gamma", type=int, default=4, help="draft tokens per step (default: 4)")
    sv.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: 1)")
    sv.add_argument("--max-tokens", type=int, default=32, help="max_tokens of every request (default: 32)")
    sv.add_argument("--requests", type=int, default=64,
                    help="requests of one run (a server, a concurrency level, a repeat) (default: 64)")
    sv.add_argument("--concurrency", default="1,4,16", help="comma-separated client counts (default: 1,4,16)")
    sv.add_argument("--repeats", type=int, default=3,
                    help="runs per server and concurrency, the servers interleaved (default: 3)")
    sv.add_argument("--max-batch", type=int, default=16, help="the batching server's --max-batch (default: 16)")
    sv.add_argument("--max-wait-ms", type=float, default=10.0, help="both servers' --max-wait-ms (default: 10)")
    sv.add_argument("--threads", type=int, default=None, help="the servers' torch threads (default: theirs)")
    sv.add_argument("--seed", type=int, default=0, help="request i carries seed + i (default: 0)")
    sv.add_argument("--device", default="cpu", help="the servers' device: cpu, cuda, cuda:N or auto (default: cpu)")
    sv.add_argument("--out", type=Path, default=None, help="results JSON (default: results/bench/serve-<device>.json)")


def _toy_pair(name: str) -> str:
    return f"models/toy/text/{name}"


def _serve(args: argparse.Namespace) -> int:
    from pipeline.benchmarks import serve

    try:
        levels = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        raise SpecsweepError(f"--concurrency must be comma-separated integers; got {args.concurrency!r}") from None
    if min(levels) < 1 or min(args.requests, args.max_tokens, args.max_batch, args.repeats, args.gamma + 1) < 1:
        raise SpecsweepError("--concurrency, --requests, --max-tokens, --max-batch and --repeats must be >= 1 and "
                             "--gamma >= 0")
    if not Path(args.data).is_file():
        raise SpecsweepError(f"--data {args.data} does not exist: run `make` for the toy data, or give --data")
    for name in ("target", "draft") if args.drafter == "model" else ("target",):  # toy folders by default
        value = getattr(args, name)
        if value == _toy_pair(name) and not Path(value).is_dir():
            raise SpecsweepError(f"--{name} {value} does not exist: run `make` for the toy pair, or give --{name}")
    device = _device(args.device)
    out = args.out or Path("results/bench") / f"serve-{device.split(':')[0]}.json"
    result = serve.run(args.target, args.draft, args.data, sampler=args.sampler, gamma=args.gamma,
                       temperature=args.temperature, max_tokens=args.max_tokens, requests=args.requests,
                       concurrency=levels, repeats=args.repeats, max_batch=args.max_batch,
                       max_wait_ms=args.max_wait_ms, device=device, threads=args.threads, seed=args.seed,
                       drafter=args.drafter, chat=args.chat, out=out)
    serve.print_table(result)
    print(f"wrote {out}")
    return 0
