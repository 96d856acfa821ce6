"""A roofline per run: analytic FLOPs and bytes of the draft forwards, the target forwards and the verify step,
against the time each phase took and the machine's peak.

**What is counted** (:func:`forward_cost`), for one forward of a decoder over ``new`` tokens per row, after
``context`` cached positions, keeping the logits of ``logits`` positions, for ``rows`` rows at once:

  FLOPs   2 x the matrix parameters per new token (attention projections q, k, v, o; the MLP's two matrices, or
          three with a gate; cross-attention's q and o for an encoder-decoder), plus 2 x d_model x V for each
          position whose logits are kept (the output projection); and 4 x L x d_attn per (query, key) pair for the
          attention scores and the weighted values, over the cached keys and the causal part of the new ones
          (plus the encoder's positions for cross-attention)
  bytes   every matrix weight read once per forward, whatever the rows (a batch shares them); each row's K and V
          cache read once (2 x L x d_kv x positions, self-attention and cross-attention); the kept logits written

and for one verify step per row (:func:`verify_cost`) over γ draft positions and γ + 1 target positions:

  FLOPs   4 per logit of each softmax (max, exp of the shifted value, sum, divide) over the γ + 1 target rows and
          the γ draft rows, and 3 per logit of each draft position for the comparison and the residual
          (p - q, its positive part, its sum)
  bytes   each logit read once (γ + 1 target rows and γ draft rows of V)

**Not counted**: embedding lookups, layer norms, biases, activation functions, rotary embeddings, residual
adds, the softmax inside attention, K/V writes of the new positions, activations passed between layers
(small against the weights at decode sizes), the random numbers and the inverse-CDF pass of the verify step,
the encoder of an encoder-decoder, the prefill (the first step, which reads the prompt), and fixed per-call
costs (Python, kernel launches), which dominate tiny models on a CPU. Weights and the KV cache are in the
run's dtype; logits in the model's dtype.

**Per run** (:func:`run_roofline`): each phase's calls (forwards, verify steps) come from the quality pass's
counters, its rows per call from the row-steps over the verify calls, and its context from the mean over
row-steps of the prompt plus the tokens emitted before the step (a sample's ``origin_steps`` give it exactly;
without them, prompt + half the new tokens). Per phase: the FLOPs and bytes in all and per generated token,
the achieved FLOP/s and bytes/s over the phase's measured time, the arithmetic intensity, the attainable
FLOP/s there (min(peak FLOP/s, intensity x peak bytes/s)) and the fraction of it achieved. The phase that
takes the largest share of the decode time (draft + target + verify) **bounds the speedup**: it is where a
faster implementation pays most.

**The machine's peak** (:func:`machine_peak`): on a GPU, from its properties (SM count x clock x FMA per cycle,
bus width x memory clock: torch's GPULimits), else a short probe; on a CPU, a short probe (< 2 s) of the
best copy bandwidth and matmul throughput at the run's threads and dtype, in a child process (so its buffers
never count toward the run's peak memory), cached per machine under
``$SPECSWEEP_CACHE_DIR`` (default ``~/.cache/specsweep``, or ``$XDG_CACHE_HOME/specsweep``) in ``peak.json``;
delete that file to probe again.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.io import file_lock, write_json_atomic

PHASES = ("draft", "target", "verify")
# model types whose MLP is gated (three matrices: gate, up, down) rather than two
GATED_MLP = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
                       "gemma3_text", "phi3", "olmo", "olmo2", "granite", "cohere", "starcoder2_gated", "smollm3"})
SOFTMAX_FLOPS_PER_LOGIT = 4
RESIDUAL_FLOPS_PER_LOGIT = 3


# ---------------------------------------------------------------------------------------------- model shapes

@dataclass(frozen=True)
class ModelShape:
    """What the counts read from a model's config (the decoder's, for an encoder-decoder).

    layers       L, decoder layers
    d_model      the residual width
    d_attn       query heads x head dim: the width of attention scores and values
    d_kv         key/value heads x head dim: the width of each of K and V in the cache (d_attn without GQA)
    d_ff         the MLP's inner width
    vocab        V, rows of the output projection
    gated        the MLP has a gate matrix (3 matrices) instead of 2
    cross_positions  encoder positions each layer cross-attends to (0: a decoder-only model)
    """

    layers: int
    d_model: int
    d_attn: int
    d_kv: int
    d_ff: int
    vocab: int
    gated: bool = False
    cross_positions: int = 0

    @classmethod
    def from_config(cls, config) -> ModelShape:
        """From a transformers config: GPT-2 (n_layer, n_embd, n_head, n_inner), Llama-style (num_hidden_layers,
        hidden_size, num_attention_heads, num_key_value_heads, head_dim, intermediate_size) or an encoder-decoder's
        decoder (decoder_layers, d_model, decoder_attention_heads, decoder_ffn_dim, max_source_positions)."""
        enc_dec = bool(getattr(config, "is_encoder_decoder", False)) or hasattr(config, "decoder_layers")
        text = config if enc_dec or not hasattr(config, "get_text_config") else config.get_text_config(decoder=True)
        if enc_dec:
            layers, d, heads = text.decoder_layers, text.d_model, text.decoder_attention_heads
            kv_heads, d_ff = heads, getattr(text, "decoder_ffn_dim", None)
        else:
            layers = _first(text, "num_hidden_layers", "n_layer")
            d = _first(text, "hidden_size", "n_embd")
            heads = _first(text, "num_attention_heads", "n_head")
            kv_heads = getattr(text, "num_key_value_heads", None) or heads
            d_ff = _first(text, "intermediate_size", "n_inner", required=False)
        head_dim = getattr(text, "head_dim", None) or d // heads
        return cls(layers=int(layers), d_model=int(d), d_attn=int(heads * head_dim), d_kv=int(kv_heads * head_dim),
                   d_ff=int(d_ff or 4 * d), vocab=int(text.vocab_size),
                   gated=getattr(text, "model_type", "") in GATED_MLP,
                   cross_positions=int(getattr(text, "max_source_positions", 0) or 0) if enc_dec else 0)

    @property
    def layer_params(self) -> int:
        """Matrix parameters of one layer: q and o (d_model x d_attn each), k and v (d_model x d_kv each), the MLP,
        and cross-attention's q and o for an encoder-decoder (its k and v of the encoder states are cached)."""
        attn = 2 * self.d_model * self.d_attn + 2 * self.d_model * self.d_kv
        cross = 2 * self.d_model * self.d_attn if self.cross_positions else 0
        return attn + cross + (3 if self.gated else 2) * self.d_model * self.d_ff

    @property
    def head_params(self) -> int:
        return self.d_model * self.vocab

    @property
    def matrix_params(self) -> int:
        """Every matrix a forward reads: the layers and the output projection."""
        return self.layers * self.layer_params + self.head_params


def _first(config, *names: str, required: bool = True):
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    if required:
        raise ValueError(f"{type(config).__name__} has none of {names}: cannot count its FLOPs")
    return None


# ---------------------------------------------------------------------------------------------- costs

@dataclass(frozen=True)
class Cost:
    """FLOPs and bytes moved to or from memory."""

    flops: float = 0.0
    bytes: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.flops + other.flops, self.bytes + other.bytes)

    def __mul__(self, k: float) -> Cost:
        return Cost(self.flops * k, self.bytes * k)

    __rmul__ = __mul__


def forward_cost(shape: ModelShape, rows: float, new: int, context: float, logits: int, weight_bytes: int,
                 logit_bytes: int | None = None) -> Cost:
    """One forward over ``new`` tokens per row after ``context`` cached positions, ``logits`` positions kept, for
    ``rows`` rows (see the module docstring). Weights and cache in ``weight_bytes`` per value; logits in
    ``logit_bytes`` (default: the same)."""
    logit_bytes = weight_bytes if logit_bytes is None else logit_bytes
    L = shape.layers
    pairs = new * context + new * (new + 1) / 2 + new * shape.cross_positions   # (query, key) pairs per row
    flops = 2 * L * shape.layer_params * new + 2 * shape.head_params * logits + 4 * L * shape.d_attn * pairs
    kv_read = 2 * L * shape.d_kv * (context + new) + 2 * L * shape.d_attn * shape.cross_positions
    data = shape.matrix_params * weight_bytes + rows * (kv_read * weight_bytes + logits * shape.vocab * logit_bytes)
    return Cost(rows * flops, data)


def verify_cost(vocab: int, gamma: int, rows: float, logit_bytes: int) -> Cost:
    """One verify step of ``rows`` rows over γ draft and γ + 1 target positions of ``vocab`` logits."""
    softmax_rows = 2 * gamma + 1
    flops = vocab * (SOFTMAX_FLOPS_PER_LOGIT * softmax_rows + RESIDUAL_FLOPS_PER_LOGIT * gamma)
    return Cost(rows * flops, rows * softmax_rows * vocab * logit_bytes)


def call_costs(target: ModelShape, draft: ModelShape | None, gamma: int, rows: float, context: float,
               weight_bytes: int, logit_bytes: int | None = None) -> dict[str, Cost]:
    """The cost of one call of each phase: a draft forward (one new token per row, its logits kept), a target
    forward (γ + 1 new tokens, all their logits kept) and a verify step."""
    logit_bytes = weight_bytes if logit_bytes is None else logit_bytes
    out = {"target": forward_cost(target, rows, gamma + 1, context, gamma + 1, weight_bytes, logit_bytes),
           "verify": verify_cost(target.vocab, gamma, rows, logit_bytes)}
    if draft is not None and gamma > 0:
        out["draft"] = forward_cost(draft, rows, 1, context, 1, weight_bytes, logit_bytes)
    return out


def mean_context(samples: list[dict]) -> float | None:
    """The mean over row-steps of the positions before the step: the prompt plus the tokens emitted before it.
    From a sample's ``origin_steps`` (tokens per step) when it has them, else prompt + half its new tokens per
    step."""
    total = steps = 0.0
    for s in samples:
        prompt = s.get("prompt_tokens") or 0
        lengths = s.get("origin_steps")
        if lengths:
            before = 0
            for n in lengths:
                total += prompt + before
                before += n
            steps += len(lengths)
        elif s.get("verify_steps"):
            total += (prompt + s.get("new_tokens", 0) / 2) * s["verify_steps"]
            steps += s["verify_steps"]
    return total / steps if steps else None


def run_roofline(target: ModelShape, draft: ModelShape | None, gamma: int, weight_bytes: int, samples: list[dict],
                 phase_time: dict, phase_calls: dict, draft_forwards: int, peak: dict,
                 logit_bytes: int | None = None) -> dict | None:
    """The roofline of one run's quality pass (see the module docstring). ``phase_time``/``phase_calls``: seconds
    and calls per phase (the engine's), ``draft_forwards``: the draft's forwards outside its prefill, ``peak``:
    {"flops_per_s", "bytes_per_s", ...} (:func:`machine_peak`). None when nothing was decoded."""
    row_steps = sum(s.get("verify_steps") or 0 for s in samples)
    new_tokens = sum(s.get("new_tokens") or 0 for s in samples)
    context = mean_context(samples)
    verify_calls = phase_calls.get("verify", 0)
    if not (row_steps and new_tokens and verify_calls and context is not None):
        return None
    rows = row_steps / verify_calls
    per_call = call_costs(target, draft, gamma, rows, context, weight_bytes, logit_bytes)
    calls = {"draft": draft_forwards, "target": phase_calls.get("target", 0), "verify": verify_calls}
    decode_time = sum(phase_time.get(p, 0.0) for p in PHASES)
    phases = {}
    for name in PHASES:
        if name not in per_call or not calls[name]:
            continue
        total = per_call[name] * calls[name]
        phases[name] = _phase(total, calls[name], phase_time.get(name, 0.0), decode_time, new_tokens, peak)
    bounding = max(phases, key=lambda p: phases[p]["time_s"]) if phases else None
    return {"peak": peak, "rows_per_call": rows, "mean_context": context, "gamma": gamma,
            "weight_bytes": weight_bytes, "phases": phases, "bounding_phase": bounding}


def _phase(total: Cost, calls: int, seconds: float, decode_time: float, new_tokens: int, peak: dict) -> dict:
    out = {"calls": calls, "flops": total.flops, "bytes": total.bytes, "flops_per_token": total.flops / new_tokens,
           "bytes_per_token": total.bytes / new_tokens, "intensity": total.flops / total.bytes if total.bytes else None,
           "time_s": seconds, "time_share": seconds / decode_time if decode_time > 0 else None,
           "flops_per_s": None, "bytes_per_s": None}
    if seconds > 0:
        out["flops_per_s"], out["bytes_per_s"] = total.flops / seconds, total.bytes / seconds
    out.update(attainment(out["flops_per_s"], out["bytes_per_s"], out["intensity"], peak))
    return out


def attainment(flops_per_s: float | None, bytes_per_s: float | None, intensity: float | None, peak: dict) -> dict:
    """Against the machine's peak: the attainable FLOP/s at this intensity (min(peak FLOP/s, intensity x peak
    bytes/s)), the fraction of it achieved (``roofline_fraction``), the fractions of peak FLOP/s and of peak
    bandwidth, and which roof bounds the phase (``memory`` left of the ridge point, ``compute`` right of it)."""
    pf, pb = peak.get("flops_per_s"), peak.get("bytes_per_s")
    if not (pf and pb and intensity):
        return {"attainable_flops_per_s": None, "roofline_fraction": None, "flops_fraction": None,
                "bandwidth_fraction": None, "bound": None}
    attainable = min(pf, intensity * pb)
    return {"attainable_flops_per_s": attainable,
            "roofline_fraction": flops_per_s / attainable if flops_per_s is not None else None,
            "flops_fraction": flops_per_s / pf if flops_per_s is not None else None,
            "bandwidth_fraction": bytes_per_s / pb if bytes_per_s is not None else None,
            "bound": "memory" if intensity < pf / pb else "compute"}


# ---------------------------------------------------------------------------------------------- the machine's peak

def cache_dir() -> Path:
    """$SPECSWEEP_CACHE_DIR, else $XDG_CACHE_HOME/specsweep, else ~/.cache/specsweep."""
    if os.environ.get("SPECSWEEP_CACHE_DIR"):
        return Path(os.environ["SPECSWEEP_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specsweep"


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo where there is one), else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine_peak(device: str, dtype, cache: Path | None = None) -> dict:
    """{"flops_per_s", "bytes_per_s", "source", "device", "dtype", ...}: a GPU's from its properties (a probe
    where torch has no figures for it), a CPU's from :func:`probe` at torch's current threads in a child process
    (:func:`probe_in_child`), cached per machine (CPU model, threads, dtype, torch version) in ``cache`` (default
    :func:`cache_dir`). Where the probe fails: a warning, and no peak (the roofline then has no fractions)."""
    import torch

    dtype_name = str(dtype).replace("torch.", "")
    if str(device).startswith("cuda"):
        dev = torch.device(device)
        try:
            return gpu_peak(dev, dtype)
        except (RuntimeError, AttributeError, ImportError):   # torch has no figures for this GPU: measure it
            return {**probe(dtype, dev), "source": "probe (no properties for this GPU)",
                    "device": torch.cuda.get_device_name(dev), "dtype": dtype_name}
    threads = torch.get_num_threads()
    key = f"{cpu_name()} | {threads} threads | {dtype_name} | torch {torch.__version__}"
    path = (cache or cache_dir()) / "peak.json"

    with file_lock(path.with_suffix(".lock")):
        known = _read_cache(path)
        if key not in known:
            try:
                measured = probe_in_child(dtype_name, threads)
            except (OSError, ValueError, RuntimeError, subprocess.SubprocessError) as e:
                print(f"warning: the CPU's peak could not be probed ({' '.join(str(e).split())[:160]}); the roofline "
                      "has no peak this time", file=sys.stderr)
                return {"source": "unavailable", "device": cpu_name(), "threads": threads, "dtype": dtype_name}
            known[key] = {**measured, "source": "probe", "device": cpu_name(), "threads": threads,
                          "dtype": dtype_name, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            write_json_atomic(path, known)
    return {**known[key], "cache": str(path)}


def probe_in_child(dtype_name: str, threads: int, timeout_s: float = 120) -> dict:
    """:func:`probe` on the CPU in a child Python process at ``threads`` intra-op threads: its buffers never count
    toward this process's peak resident memory (a run's ``peak_memory_mb`` on a CPU), and this process's state
    (threads, allocator) stays as it was. Starting the child (importing torch) adds a second or two, once per
    machine."""
    code = ("import json, sys, torch\n"
            "from pipeline.roofline import probe\n"
            "torch.set_num_threads(int(sys.argv[1]))\n"
            "print(json.dumps(probe(getattr(torch, sys.argv[2]), torch.device('cpu'))))\n")
    package_root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-c", code, str(threads), dtype_name], capture_output=True, text=True,
                          timeout=timeout_s, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the probe process failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def gpu_peak(device, dtype) -> dict:
    """A GPU's theoretical peak from its properties: tensor-core FLOP/s for half precision (and fp32 when TF32
    matmuls are allowed), CUDA-core FLOP/s otherwise; DRAM bandwidth from bus width and memory clock."""
    import torch
    from torch.cuda._device_limits import GPULimits

    limits = GPULimits(device)
    tensor = dtype in (torch.float16, torch.bfloat16) or (dtype == torch.float32
                                                          and torch.backends.cuda.matmul.allow_tf32)
    return {"flops_per_s": limits.get_tflops_per_second(dtype, use_tensor_cores=tensor) * 1e12,
            "bytes_per_s": float(limits.get_memory_bandwidth_Bps()),
            "source": f"GPU properties ({'tensor' if tensor else 'CUDA'} cores)",
            "device": torch.cuda.get_device_name(device), "dtype": str(dtype).replace("torch.", "")}


def probe(dtype, device, budget_s: float = 1.5) -> dict:
    """The best of a few timed runs of a large copy (bytes read + written per second) and of a square matmul
    in ``dtype`` (2n^3 FLOPs per second), within about ``budget_s`` seconds in all. On a CPU the copy's 2 x 128 MiB
    are larger than the caches on most machines (a huge L3 would overstate the bandwidth) and n = 1024 (512 for a
    dtype this CPU multiplies slowly); on a GPU, 2 x 1 GiB and n = 8192, so launch latency does not dominate."""
    import torch

    def timed(fn, budget: float) -> float:
        fn()                                       # warm-up
        _sync(device)
        best, end, runs = float("inf"), time.perf_counter() + budget, 0
        while runs < 2 or (time.perf_counter() < end and runs < 20):
            t0 = time.perf_counter()
            fn()
            _sync(device)
            best = min(best, time.perf_counter() - t0)
            runs += 1
        return best

    with torch.inference_mode():
        gpu = getattr(device, "type", str(device)) == "cuda"
        n_bytes = 2**30 if gpu else 128 * 2**20
        buffers = [torch.ones(n_bytes // 4, dtype=torch.float32, device=device)]
        buffers.append(torch.empty_like(buffers[0]))
        copy_s = timed(lambda: buffers[1].copy_(buffers[0]), budget_s / 3)
        buffers.clear()
        n = 8192 if gpu else 1024
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        t0 = time.perf_counter()
        torch.mm(a, b)
        _sync(device)
        if not gpu and time.perf_counter() - t0 > budget_s / 4:   # a slow dtype on this CPU: a smaller matmul
            n = 512
            a, b = a[:n, :n].contiguous(), b[:n, :n].contiguous()
        mm_s = timed(lambda: torch.mm(a, b), budget_s / 2)
    return {"flops_per_s": 2 * n**3 / mm_s, "bytes_per_s": 2 * n_bytes / copy_s, "matmul_n": n}


def _sync(device) -> None:
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        torch.cuda.synchronize(device)


def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def describe(roofline: dict | None) -> list[str]:
    """The roofline of a run as text lines, one per phase, and which phase bounds the speedup; [] without one."""
    if not roofline or not roofline.get("phases"):
        return []
    peak = roofline.get("peak") or {}
    lines = [f"roofline (peak {_si(peak.get('flops_per_s'))}FLOP/s, {_si(peak.get('bytes_per_s'))}B/s: "
             f"{peak.get('source', '?')}, {peak.get('device', '?')}; {roofline['rows_per_call']:.2f} rows per call, "
             f"mean context {roofline['mean_context']:.0f}):"]
    for name, p in roofline["phases"].items():
        share = "-" if p.get("time_share") is None else f"{100 * p['time_share']:.0f} %"
        frac = "-" if p.get("roofline_fraction") is None else f"{100 * p['roofline_fraction']:.2g} %"
        lines.append(f"  {name:<7} {share:>5} of decode time; per token {_si(p['flops_per_token'])}FLOP, "
                     f"{_si(p['bytes_per_token'])}B; achieved {_si(p.get('flops_per_s'))}FLOP/s, "
                     f"{_si(p.get('bytes_per_s'))}B/s; intensity {p['intensity']:.3g} FLOP/B; {frac} of its roofline "
                     f"({p.get('bound') or '?'}-bound)")
    if roofline.get("bounding_phase"):
        lines.append(f"  the {roofline['bounding_phase']} phase bounds the speedup (the largest share of the decode "
                     "time)")
    return lines


def _si(value: float | None) -> str:
    """1.23e9 -> '1.23 G' (value and prefix, for a unit to follow)."""
    if value is None:
        return "- "
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}"
    return f"{value:.4g} "
