"""How long torch's idle OpenMP workers spin before they sleep, and what a forward costs for it: alone and beside
processes that burn every core. Why ``specsweep`` sets GOMP_SPINCOUNT (pipeline/env_info.py: bounded_omp_wait).

    python -m pipeline.benchmarks.omp_wait [--model kernels/shapes/qwen2.5-coder-0.5b-shape --quant int4]
        [--policies passive,spin:1000,spin:10000,spin:100000,default] [--burners 0,2] [--rounds 5] [--calls 20]
        [--context 400] [--new-tokens 1] [--threads 2] [--out results/bench/omp-wait-cpu.json]

torch's CPU build runs its intra-op pool on GNU OpenMP (libgomp). Between two parallel regions (one per matrix
product, norm or attention call: hundreds per forward) a worker waits for the next one: it spins GOMP_SPINCOUNT
times (about 100,000 spins per millisecond, libgomp's own estimate), then sleeps on a futex, and waking it costs
tens of microseconds. A policy is what the workers do while they wait:

  passive   OMP_WAIT_POLICY=PASSIVE: sleep at once (what ``specsweep`` set before; docs/measurement.md says why)
  spin:N    GOMP_SPINCOUNT=N: spin N times, then sleep
  default   neither variable: libgomp's own default (300,000 spins; 1,000 when there are more threads than cores)

libgomp reads the variables once, when it loads, so each policy runs in its own child process, which loads the
model once and stays up; the parent has every child time a batch in turn, round after round (the order rotates),
with 0 and then N CPU-burning processes started beside them (``--burners``; one per usable core is the contended
case of issue 14). A batch is ``calls`` static-cache forwards (pipeline/decoding/static/) of ``new-tokens`` tokens
after ``context`` cached ones, each rolled back; its figure is the median forward, and the child's CPU seconds
(user + system, all threads) per forward say how much of the cores the waiting burnt. Per policy and number of
burners the table gives the median over rounds, and its speedup over the first policy: the median over rounds of
the per-round ratio, with its order-statistic interval (pipeline/measure.py). Rounds pair the policies as closely
as processes allow (one process cannot switch policies).

The model is any local folder forward.py loads (default: the config-only Qwen2.5-Coder-0.5B shape in
kernels/shapes/, random weights: timings do not depend on the values), in ``--dtype``, with ``--quant`` weights
(int4: the ``--draft-quant int4`` draft of the Qwen pair, whose forward is about 170 short kernel calls).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tqdm.auto import tqdm

from pipeline.benchmarks.timing import format_table
from pipeline.config import DRAFT_QUANTS
from pipeline.env_info import cpu_burners, provenance, usable_cores
from pipeline.errors import OneLineParser, SpecsweepError
from pipeline.io import write_json_atomic
from pipeline.measure import median_ci

POLICIES = ("passive", "spin:1000", "spin:10000", "spin:100000", "default")
WAIT_ENV = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
MARK = "omp_wait: "
"""The prefix of the child's result lines on stdout (anything else it prints is passed over)."""


def policy_env(policy: str) -> dict[str, str]:
    """The OpenMP wait variables of a policy name (see the module docstring); one-line SpecsweepError otherwise."""
    if policy == "passive":
        return {"OMP_WAIT_POLICY": "PASSIVE"}
    if policy == "default":
        return {}
    name, _, count = policy.partition(":")
    if name == "spin" and count.isdigit():
        return {"GOMP_SPINCOUNT": count}
    raise SpecsweepError(f"--policies {policy!r}: expected passive, default or spin:N (N spins, e.g. spin:10000)")


def run(model: str, quant: str = "int4", dtype: str = "bfloat16", policies=POLICIES, burners=(0, 2), *,
        rounds: int = 5, calls: int = 20, context: int = 400, new_tokens: int = 1, threads: int = 2,
        out: Path | None = None) -> dict:
    """Time the forward under every policy, alone and beside each number of burners (see the module docstring).
    Returns the results dict (also written to ``out``)."""
    for p in policies:
        policy_env(p)
    child = {"model": model, "quant": quant, "dtype": dtype, "calls": calls, "context": context,
             "new_tokens": new_tokens, "threads": threads}
    procs = {p: _start(p, child) for p in policies}
    try:
        child_env = {p: _read(proc, p)["env"] for p, proc in procs.items()}   # loaded and warmed up
        load = os.getloadavg()
        batches = {(p, b): [] for p in policies for b in burners}
        for r in tqdm(range(rounds), desc="rounds"):
            for b in burners:
                with cpu_burners(b, seconds=3600):
                    time.sleep(0.5 if b else 0)                  # let the scheduler spread them
                    order = list(policies[r % len(policies):]) + list(policies[: r % len(policies)])
                    for p in order:
                        procs[p].stdin.write("run\n")
                        procs[p].stdin.flush()
                        batches[p, b].append(_read(procs[p], p))
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait(timeout=10)
    base = policies[0]
    rows = []
    for b in burners:
        for p in policies:
            ms = [x["median_ms"] for x in batches[p, b]]
            ratios = [x["median_ms"] / y["median_ms"] for x, y in zip(batches[base, b], batches[p, b])]
            rows.append({"policy": p, "env": policy_env(p), "burners": b, "median_ms": statistics.median(ms),
                         "rounds_ms": ms, "p90_ms": statistics.median(x["p90_ms"] for x in batches[p, b]),
                         "cpu_ms_per_forward": statistics.median(x["cpu_ms"] for x in batches[p, b]),
                         "speedup_over": base, "speedup": median_ci(ratios).to_dict(), "ratios": ratios})
    result = {"benchmark": "omp_wait", "provenance": provenance("cpu"),
              "settings": {**child, "policies": list(policies), "burners": list(burners), "rounds": rounds,
                           "usable_cores": usable_cores()},
              "child_env": child_env,
              "load_average": {"before": list(load), "after": list(os.getloadavg())}, "results": rows}
    if out is not None:
        write_json_atomic(out, result)
    return result


def _start(policy: str, child: dict) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in WAIT_ENV} | policy_env(policy)
    return subprocess.Popen([sys.executable, "-m", "pipeline.benchmarks.omp_wait", "--child", json.dumps(child)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)


def _read(proc: subprocess.Popen, policy: str) -> dict:
    """The child's next result line (the model loaded: the wait variables it runs with; a batch: its figures)."""
    for line in proc.stdout:
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise SpecsweepError(f"the {policy} child process stopped (exit {proc.wait()}): see its error above")


def _child(spec: dict) -> None:
    """Load the model, warm up, say so, then time a batch for every ``run`` line on stdin."""
    import torch

    # model code only the children need (the parent only starts them and reads their lines)
    from pipeline.benchmarks.forward import load_model  # children only, as above
    from pipeline.decoding.static import static_forward_for  # children only, as above
    from pipeline.dtypes import torch_dtype  # children only, as above

    torch.set_num_threads(spec["threads"])
    with torch.inference_mode():
        model = load_model(spec["model"], "cpu", torch_dtype(spec["dtype"]))
        forward = static_forward_for(model, spec["quant"])
        if forward is None:
            raise SystemExit(f"{type(model).__name__} has no static forward (pipeline/decoding/static/)")
        vocab = model.get_output_embeddings().weight.shape[0]
        g = torch.Generator().manual_seed(0)
        context, q = spec["context"], spec["new_tokens"]
        forward.allocate(1, context + q + 8, torch.device("cpu"))
        forward(torch.randint(0, vocab, (1, context), generator=g), 0, None, None, 1)
        tokens = torch.randint(0, vocab, (1, q), generator=g)

        def one() -> None:                                   # appended at `context` each time: rolled back
            forward(tokens, context, None, None, 1)

        for _ in range(3):
            one()
        print(MARK + json.dumps({"env": {k: os.environ[k] for k in WAIT_ENV if k in os.environ}}), flush=True)
        for line in sys.stdin:
            if line.strip() != "run":
                continue
            times, cpu0 = [], time.process_time()
            for _ in range(spec["calls"]):
                t = time.perf_counter()
                one()
                times.append(time.perf_counter() - t)
            cpu = time.process_time() - cpu0
            times.sort()
            print(MARK + json.dumps({"median_ms": statistics.median(times) * 1e3,
                                     "p90_ms": times[int(0.9 * (len(times) - 1))] * 1e3,
                                     "cpu_ms": cpu / spec["calls"] * 1e3}), flush=True)


def _print(result: dict) -> None:
    rows = []
    for r in result["results"]:
        s = r["speedup"]
        rows.append({"burners": r["burners"], "policy": r["policy"], "ms/forward": f"{r['median_ms']:.1f}",
                     "p90 ms": f"{r['p90_ms']:.1f}", "CPU ms/forward": f"{r['cpu_ms_per_forward']:.1f}",
                     f"x over {r['speedup_over']}": f"{s['median']:.2f} [{s['ci_low']:.2f}, {s['ci_high']:.2f}]"})
    print(format_table(rows, list(rows[0])))
    s = result["settings"]
    print(f"\n{s['model']} ({s['quant']}, {s['dtype']}), {s['new_tokens']} new token(s) after {s['context']}, "
          f"{s['threads']} threads on {s['usable_cores']} cores; median of {s['rounds']} rounds of {s['calls']} "
          f"forwards; x: the first policy's time over this one's, paired by round, with its interval; load average "
          f"{result['load_average']['before'][0]:.2f} -> {result['load_average']['after'][0]:.2f}")


def main(argv: list[str] | None = None) -> None:
    p = OneLineParser(prog="python -m pipeline.benchmarks.omp_wait", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="kernels/shapes/qwen2.5-coder-0.5b-shape")
    p.add_argument("--quant", default="int4", choices=DRAFT_QUANTS)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--burners", default=f"0,{usable_cores()}", help="CPU-burning processes beside the forwards")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--context", type=int, default=400)
    p.add_argument("--new-tokens", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("results/bench/omp-wait-cpu.json"))
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        _child(json.loads(args.child))
        return
    try:
        policies = tuple(s.strip() for s in args.policies.split(","))
        burners = tuple(int(s) for s in args.burners.split(","))
        result = run(args.model, args.quant, args.dtype, policies, burners, rounds=args.rounds, calls=args.calls,
                     context=args.context, new_tokens=args.new_tokens, threads=args.threads, out=args.out)
    except (SpecsweepError, ValueError) as e:
        print(f"omp_wait: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    _print(result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
