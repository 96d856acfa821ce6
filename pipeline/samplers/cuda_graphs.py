"""A kernel sampler's verify step captured in CUDA graphs and replayed: one launch of the graph per step.

    verify = GraphedVerify(get_sampler("exact", backend="cupy", temperature=1.0))
    result = verify(draft_tokens, draft_logits, target_logits, generator=gen)    # the sampler contract
    result = verify(draft_tokens, draft_logits, target_logits, generator=gen, lengths=lengths)   # per-row lengths

Same contract, samplers and tokens as the wrapped sampler: the uniforms are drawn eagerly from the caller's
generator, by the same one ``torch.rand((B, γ+1))`` an eager step makes, and copied into the graph, so a replayed
step emits exactly what an eager step with the same generator state would (greedy steps draw none, as eager).
With per-example randomness (a pipeline.rng.RowGenerators) the same helper draws each row from its own generator.

A deterministic draft (``draft_logits=None``) is its own signature: its graph holds no draft-logits buffer and
replays the kernels' deterministic mode (refused in one line before any capture where the rule does not take one).

One graph per input signature (B, γ, V_t, V_d, dtypes, device, and whether per-row lengths are given), captured
at its first call: the kernels are loaded first (``prepare``), the step runs twice on a private stream to size that
stream's workspace, then it is captured on that stream. Every graph has its own stream and so its own workspace, so
graphs never share scratch memory and may replay on any streams; workspaces never free a buffer a graph has seen
(cupy_backend._Workspace). Each call copies the inputs into the graph's static buffers (the logits' strides may
change from call to call); per-row draft lengths are checked and clamped into [0, γ] as Sampler.__call__ does (on
the device: no host sync) and copied into the graph's static int64 [B] lengths buffer. The result's tensors
are the graph's static outputs: valid until the next call with the same signature.

With ``fall_back`` (``--verify-graphs auto``, the default on CUDA): where capturing a signature fails (a CUDA error,
an operation capture forbids), that signature's steps run eagerly through the wrapped sampler, the same tokens, and
one line on stderr says so, once per signature. Without it the capture's error propagates. Bad input is refused in
one line either way (SamplerInputError, before any capture).

Needs a CUDA GPU and a kernel sampler (``backend="cupy"``); the engine uses it through ``--verify-graphs``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from pipeline.errors import SamplerInputError
from pipeline.samplers import cupy_backend as kernels
from pipeline.samplers.contract import SamplerResult, clamp_lengths, uniforms, validate_inputs, validate_lengths
from pipeline.samplers.torch_ref import check_deterministic


@dataclass
class _Captured:
    graph: object                 # torch.cuda.CUDAGraph
    draft_tokens: torch.Tensor    # static inputs, int64 [B, γ]
    draft_logits: torch.Tensor | None   # [B, γ, V_d]; None: a deterministic draft
    target_logits: torch.Tensor   # [B, γ+1, V_t]
    u: torch.Tensor               # float32 [B, γ+1]
    lengths: torch.Tensor | None  # int64 [B] per-row draft lengths, in a graph captured with lengths; else None
    result: SamplerResult         # static outputs


class GraphedVerify:
    """Wraps a kernel sampler (``backend="cupy"``): same call, same tokens, verify steps replayed from CUDA graphs."""

    def __init__(self, sampler, fall_back: bool = False) -> None:
        if getattr(sampler, "launcher", None) is None:
            raise SamplerInputError(
                f"CUDA-graph verify needs a kernel sampler (backend='cupy'); got {sampler!r}: use --backend cupy")
        self.sampler = sampler
        self.name, self.backend = sampler.name, sampler.backend
        self.temperature = sampler.temperature
        self.draft_temperature = sampler.draft_temperature
        self.fall_back = fall_back
        self._graphs: dict[tuple, _Captured] = {}
        self.eager: dict[tuple, str] = {}      # signatures verified eagerly -> why their capture failed

    @property
    def params(self) -> dict:
        return self.sampler.params

    @property
    def graphs(self) -> int:
        """How many signatures have been captured."""
        return len(self._graphs)

    @property
    def verifies_by_argmax(self) -> bool:
        """The wrapped sampler's (the engine and the draft-tokenizer mode ask every sampler)."""
        return self.sampler.verifies_by_argmax

    @property
    def takes_deterministic_drafts(self) -> bool:
        """The wrapped sampler's: whether a call with draft_logits=None is verified (pipeline/rules.py)."""
        return self.sampler.takes_deterministic_drafts

    def _greedy(self) -> bool:
        return self.verifies_by_argmax

    def _step(self, draft_tokens, draft_logits, target_logits, u, lengths) -> SamplerResult:

        s, launcher = self.sampler, self.sampler.launcher
        if self._greedy():
            return kernels.greedy_step(launcher, draft_tokens, draft_logits, target_logits, lengths)
        if self.name == "exact":
            return kernels.exact_step(launcher, draft_tokens, draft_logits, target_logits, s.temperature, u=u,
                                      lengths=lengths)
        return kernels.sigmoid_step(launcher, draft_tokens, draft_logits, target_logits, s.alpha / s.temperature,
                                    s.beta, u=u, lengths=lengths)

    def _capture(self, draft_tokens, draft_logits, target_logits, with_lengths: bool) -> _Captured:
        device = draft_tokens.device
        if device.type != "cuda":
            raise SamplerInputError(f"CUDA-graph verify needs CUDA tensors; got {device}")
        self.sampler.prepare(device)
        B, gamma = draft_tokens.shape
        static = (draft_tokens.clone(), None if draft_logits is None else draft_logits.contiguous().clone(),
                  target_logits.contiguous().clone(),
                  torch.zeros((B, gamma + 1), dtype=torch.float32, device=device),
                  torch.full((B,), gamma, dtype=torch.int64, device=device) if with_lengths else None)
        stream = torch.cuda.Stream(device)
        caller = torch.cuda.current_stream(device)
        stream.wait_stream(caller)
        with torch.cuda.stream(stream):
            for _ in range(2):                                  # this stream's workspace, at this size
                self._step(*static)
        caller.wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=stream):
                result = self._step(*static)
        finally:
            torch.cuda.set_stream(caller)    # a failed capture leaves the capture stream current
        return _Captured(graph, *static, result=result)

    def __call__(self, draft_tokens: torch.Tensor, draft_logits: torch.Tensor | None, target_logits: torch.Tensor,
                 generator: torch.Generator | None = None, lengths: torch.Tensor | None = None) -> SamplerResult:
        validate_inputs(draft_tokens, draft_logits, target_logits)
        validate_lengths(lengths, draft_tokens)
        if draft_logits is None:
            check_deterministic(self.sampler)
        draft_sig = None if draft_logits is None else (tuple(draft_logits.shape), draft_logits.dtype)
        key = (tuple(draft_tokens.shape), draft_sig, tuple(target_logits.shape), target_logits.dtype,
               draft_tokens.device, lengths is None)
        captured = self._graphs.get(key)
        if captured is None and key not in self.eager:
            captured = self._capture_or_note(key, draft_tokens, draft_logits, target_logits, lengths is not None)
        if captured is None:
            return self.sampler(draft_tokens, draft_logits, target_logits, generator=generator, lengths=lengths)
        B, gamma = draft_tokens.shape
        captured.draft_tokens.copy_(draft_tokens)
        if draft_logits is not None:
            captured.draft_logits.copy_(draft_logits)
        captured.target_logits.copy_(target_logits)
        if lengths is not None:
            captured.lengths.copy_(clamp_lengths(lengths, gamma))
        if not self._greedy():
            captured.u.copy_(uniforms(B, gamma, draft_tokens.device, generator))
        captured.graph.replay()
        return captured.result

    def _capture_or_note(self, key: tuple, draft_tokens, draft_logits, target_logits,
                         with_lengths: bool) -> _Captured | None:
        """The signature's graph, captured now; with ``fall_back``, None where capture fails (its steps then run
        eagerly, and one line on stderr says why)."""
        try:
            captured = self._graphs[key] = self._capture(draft_tokens, draft_logits, target_logits, with_lengths)
            return captured
        except RuntimeError as e:                # CUDA and CuPy driver errors, operations capture forbids
            if not self.fall_back:
                raise
            if draft_tokens.is_cuda:
                torch.cuda.synchronize(draft_tokens.device)     # a sticky error would surface here, and end the run
            self.eager[key] = " ".join(f"{type(e).__name__}: {e}".split())[:300]
            B, gamma = draft_tokens.shape
            print(f"note: --verify-graphs auto: capturing the verify step at B = {B}, γ = {gamma} failed "
                  f"({self.eager[key]}); these steps are verified eagerly (same tokens)", file=sys.stderr)
            return None

    def __repr__(self) -> str:
        return f"GraphedVerify({self.sampler!r}, graphs={self.graphs})"
