"""``--engine llama.cpp``: llama.cpp's own speculative decoding, through its server, as an engine of a run.

:class:`LlamaCppEngine` has the engines' ``generate`` (pipeline/decoding/engine.py ``GenerationResult``): each row's
prompt goes to a ``llama-server`` (pipeline/decoding/llama_cpp/server.py) as token ids of the target's tokenizer, one
``/completion`` request per row (batch 1), and comes back as token ids with the server's per-request ``timings``. The
server is started on the first call (the run's untimed warm-up) and stopped by :meth:`close` or
``server.stop_all`` when the run ends. A run has two: the speculative one (target and draft model, or the target and
an n-gram drafter) and its γ = 0 loop, the same target file alone in a second server; the paired timing alternates
between them as between our loops.

How the run's settings become the server's flags (:func:`server_args`):

=====================  ==========================================================================================
γ (``--gamma``)        ``--spec-draft-n-max`` (draft model); ``--spec-ngram-simple-size-m`` (n-gram drafter)
``--drafter model``    ``--spec-type draft-simple --spec-draft-model DRAFT.gguf`` (the draft drafts greedily)
``--drafter            ``--spec-type ngram-simple --spec-ngram-simple-size-n <--lookup-max>``: the continuation of the
prompt-lookup``        last occurrence of the last n tokens, n = --lookup-max exactly (no shorter fallback)
``--draft-min``        ``--spec-draft-n-min`` (a draft shorter than this is dropped; llama.cpp's default 0)
``--draft-p-min``      ``--spec-draft-p-min`` (the draft stops below this top probability; default 0.0)
``--threads``          ``--threads``, ``--threads-batch`` and the draft's ``--spec-draft-threads(-batch)``
``--temperature``      per request: 0 = greedy (``top_k`` 1); T > 0 samples at T with every other sampler off
                       (``top_k`` 0, ``top_p`` 1, ``min_p`` 0, no penalties), seeded from the run's generator
=====================  ==========================================================================================

Always: ``--parallel 1``, ``--cache-ram 0`` and ``cache_prompt: false`` per request (every request reads its whole
prompt: repeats of a prompt cost what the first did), ``--ctx-size`` the prompt limit plus the new tokens where
``--max-prompt-tokens`` is given (else the model's own context), no web UI. llama.cpp verifies by sampling the target
at every drafted position and keeping the draft while the two agree (greedy match at T = 0). Its draft proposes its
argmax, so this is Leviathan's rule against a point-mass draft: lossless, accepting p(argmax q) where ``--sampler
exact`` with a sampled draft accepts Σ min(p, q) (docs/engine.md, "llama.cpp's verify rule").

What a row reports: ``new_tokens`` (the returned ids, EOS included), ``accepted`` and ``drafted`` from the server's
``timings.draft_n_accepted`` and ``timings.draft_n``, ``verify_steps`` = new tokens − accepted (each target forward
emits its accepted tokens and one more; the prompt's forward counts as the first, as in our engine), ``wall_time_s``
around the HTTP request. Phases: ``prefill`` the server's ``prompt_ms``; the rest of its ``predicted_ms`` is
``target`` for the γ = 0 server (one forward per token after the first) and ``speculative`` for the other (llama.cpp
does not split draft from target time, so the run has no c and r). Peak memory is the servers' peak resident set.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.decoding.engine import GenerationResult
from pipeline.decoding.llama_cpp import build
from pipeline.decoding.llama_cpp.quantize import requantized
from pipeline.decoding.llama_cpp.server import LlamaServer
from pipeline.errors import SpecsweepError

DRAFT_MIN_DEFAULT = 0
"""llama.cpp's ``--spec-draft-n-min`` default at the pinned version (common/common.h)."""
DRAFT_P_MIN_DEFAULT = 0.0
"""llama.cpp's ``--spec-draft-p-min`` default at the pinned version (common/common.h)."""
VERIFY_RULE = ("llama.cpp's: the draft proposes its argmax, the target samples every drafted position and the draft "
               "is kept while they agree (greedy match at T = 0; exact rejection sampling against a point-mass draft)")
RESPONSE_FIELDS = ["tokens", "timings", "stop_type", "tokens_predicted", "tokens_evaluated"]


@dataclass
class Settings:
    """What a llama.cpp loop runs: the files and the flags of :func:`server_args`."""

    target: Path
    draft: Path | None = None                 # the draft model (spec type draft-simple)
    spec_type: str | None = None              # None (γ = 0), "draft-simple" or "ngram-simple"
    gamma: int = 0
    draft_min: int | None = None
    draft_p_min: float | None = None
    ngram_size: int = 3
    threads: int = 1
    ctx_size: int = 0
    temperature: float = 0.0
    ignore_eos: bool = False


def server_args(s: Settings) -> list[str]:
    """The ``llama-server`` flags of one loop (host and port are the server's own)."""
    args = ["--model", str(s.target), "--threads", str(s.threads), "--threads-batch", str(s.threads),
            "--parallel", "1", "--ctx-size", str(s.ctx_size), "--cache-ram", "0", "--no-webui"]
    if s.spec_type == "draft-simple":
        args += ["--spec-type", "draft-simple", "--spec-draft-model", str(s.draft), "--spec-draft-n-max", str(s.gamma),
                 "--spec-draft-threads", str(s.threads), "--spec-draft-threads-batch", str(s.threads)]
        if s.draft_min is not None:
            args += ["--spec-draft-n-min", str(s.draft_min)]
        if s.draft_p_min is not None:
            args += ["--spec-draft-p-min", str(s.draft_p_min)]
    elif s.spec_type == "ngram-simple":
        args += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(s.ngram_size),
                 "--spec-ngram-simple-size-m", str(s.gamma), "--spec-ngram-simple-min-hits", "1"]
    return args


def request_body(ids: list[int], max_new_tokens: int, temperature: float, seed: int, ignore_eos: bool) -> dict:
    """One ``/completion`` request: the prompt as token ids, plain sampling at ``temperature`` (greedy at 0)."""
    return {"prompt": ids, "n_predict": max_new_tokens, "cache_prompt": False, "return_tokens": True,
            "stream": False, "ignore_eos": ignore_eos, "seed": seed, "temperature": temperature,
            "top_k": 1 if temperature == 0 else 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0,
            "top_n_sigma": -1.0, "dynatemp_range": 0.0, "repeat_penalty": 1.0, "repeat_last_n": 0,
            "presence_penalty": 0.0, "frequency_penalty": 0.0, "dry_multiplier": 0.0, "xtc_probability": 0.0,
            "mirostat": 0, "n_probs": 0, "response_fields": RESPONSE_FIELDS}


class LlamaCppEngine:
    """One llama.cpp loop (see the module's doc): ``generate`` as our engines have it, batch 1 row by row."""

    bridge = None              # no draft with another tokenizer (pipeline/paired.py asks)

    def __init__(self, settings: Settings, seed: int = 0) -> None:
        self.settings, self.seed = settings, seed
        self.gamma = settings.gamma if settings.spec_type else 0
        self.root = build.require()
        self.server: LlamaServer | None = None
        self.props: dict = {}

    def start(self) -> LlamaServer:
        if self.server is None:
            name = f"llama-server-{self.settings.spec_type or 'target-alone'}"
            self.server = LlamaServer(build.binary("llama-server", self.root), server_args(self.settings), name)
            self.server.start()
            self.props = self.server.get("/props")
        return self.server

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def _seed(self, generator) -> int:
        """A request's seed: drawn from the run's generator (so the paired repeats, seeded alike, send the same
        seeds), else the run's seed."""
        if generator is None:
            return self.seed
        import torch  # kept local: the engine module stays importable without torch for --help

        return int(torch.randint(0, 2**31 - 1, (1,), generator=generator).item())

    def generate(self, input_ids, attention_mask, max_new_tokens: int, generator=None, encoder_inputs=None,
                 **_) -> GenerationResult:
        """input_ids, attention_mask int64 [B, L] (left-padded); each row is one request."""
        if encoder_inputs is not None:
            raise SpecsweepError("--engine llama.cpp decodes text prompts: a speech task's encoder inputs it cannot "
                                 "take")
        server = self.start()
        s = self.settings
        tokens, rows, timings = [], [], []
        phase_time = {"prefill": 0.0}
        phase_calls = {"prefill": 0}
        decode = "speculative" if self.gamma else "target"
        t_start = time.perf_counter()
        for row in range(input_ids.shape[0]):
            ids = input_ids[row][attention_mask[row].bool()].tolist()
            body = request_body(ids, max_new_tokens, s.temperature, self._seed(generator), s.ignore_eos)
            t_row = time.perf_counter()
            reply = server.complete(body)
            wall = time.perf_counter() - t_row
            new = [int(t) for t in reply.get("tokens") or []]
            t = reply.get("timings") or {}
            accepted, drafted = int(t.get("draft_n_accepted", 0)), int(t.get("draft_n", 0))
            steps = max(1, len(new) - accepted)
            tokens.append(new)
            timings.append({k: t.get(k) for k in ("cache_n", "prompt_n", "prompt_ms", "predicted_n",
                                                  "predicted_ms", "draft_n", "draft_n_accepted")})
            rows.append({"new_tokens": len(new), "verify_steps": steps, "accepted": accepted, "drafted": drafted,
                         "wall_time_s": wall, "acceptance_counted": True})
            phase_time["prefill"] += float(t.get("prompt_ms") or 0.0) / 1e3
            phase_calls["prefill"] += 1
            phase_time[decode] = phase_time.get(decode, 0.0) + float(t.get("predicted_ms") or 0.0) / 1e3
            phase_calls[decode] = phase_calls.get(decode, 0) + steps - 1
        return GenerationResult(tokens=tokens, row_stats=rows, wall_time_s=time.perf_counter() - t_start,
                                verify_steps=sum(r["verify_steps"] for r in rows), phase_time_s=phase_time,
                                phase_calls=phase_calls, peak_memory_mb=self.peak_memory_mb(),
                                extra={"draft_forwards": 0, "accepted_histogram": None, "server_timings": timings})

    def peak_memory_mb(self) -> float:
        """The server's peak resident set (``VmHWM``, Linux), in MB; 0 where unknown."""
        process = self.server.process if self.server is not None else None
        try:
            for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        except (OSError, AttributeError, ValueError):
            pass
        return 0.0

    def record(self) -> dict:
        """What the results record of this loop (``resolved.llama_cpp``)."""
        from pipeline.decoding.llama_cpp.gguf_files import describe  # kept local: reads GGUF metadata

        s = self.settings
        info = {}
        with_build = build.build_dir() / "build.json"
        if with_build.is_file():
            info = json.loads(with_build.read_text())
        out = {"source": info.get("llama_cpp_source", f"{build.SDIST}=={build.VERSION}"),
               "build_info": self.props.get("build_info"), "server_args": server_args(s),
               "target": describe(s.target), "threads": s.threads, "ctx_size": s.ctx_size,
               "spec_type": s.spec_type, "verify": VERIFY_RULE if s.spec_type else None}
        if s.spec_type == "draft-simple":
            out.update(draft=describe(s.draft), draft_max=s.gamma,
                       draft_min=DRAFT_MIN_DEFAULT if s.draft_min is None else s.draft_min,
                       draft_p_min=DRAFT_P_MIN_DEFAULT if s.draft_p_min is None else s.draft_p_min)
        elif s.spec_type == "ngram-simple":
            out.update(ngram_size=s.ngram_size, draft_max=s.gamma, ngram_min_hits=1)
        return out


def check_inputs(config) -> None:
    """Before anything is downloaded or loaded: the local GGUF files a run names exist and are GGUF, and llama.cpp is
    built (one-line :class:`SpecsweepError` for each, the files first)."""
    from pipeline.decoding.llama_cpp.gguf_files import gguf_path  # kept local: reads files only for a run
    from pipeline.weights.resolver import kind  # kept local: the registry, only for a run

    named = [("--target", config.target)]
    if config.gamma > 0 and config.drafter == "model":
        named.append(("--draft", config.draft))
    for flag, name in named:
        if kind(name) not in ("registry", "pypi"):
            gguf_path(name, flag)
    build.require()


def load_target(config, progress: bool = True):
    """(the GGUF target's stand-in model, its tokenizer): pipeline/decoding/llama_cpp/gguf_files.py."""
    from pipeline.decoding.llama_cpp.gguf_files import load_target as load  # kept local: GGUF and transformers

    check_inputs(config)
    return load(config.target, progress, lambda path: requantized(path, config.dtype))


def build_engine(config, target) -> LlamaCppEngine:
    """The run's llama.cpp loop for ``config`` (γ = 0: the target alone) around the GGUF ``target``
    (:class:`~pipeline.decoding.llama_cpp.gguf_files.GGUFModel`)."""
    from pipeline.decoding.llama_cpp.gguf_files import gguf_path  # kept local: reads files only for a run
    from pipeline.env_info import default_threads  # kept local: imports torch

    spec, draft = None, None
    if config.gamma > 0:
        spec = "draft-simple" if config.drafter == "model" else "ngram-simple"
        draft = requantized(gguf_path(config.draft, "--draft"), config.dtype, "--draft") \
            if spec == "draft-simple" else None
    train = target.config.max_position_embeddings
    ctx = 0
    if config.max_prompt_tokens is not None:
        ctx = config.max_prompt_tokens + config.max_new_tokens + config.gamma + 8
        ctx = min(ctx, train) if train else ctx
    settings = Settings(target.path, draft, spec, config.gamma, config.draft_min, config.draft_p_min,
                        config.lookup_max, config.threads or default_threads(), ctx, config.temperature,
                        config.ignore_eos)
    return LlamaCppEngine(settings, config.seed)
