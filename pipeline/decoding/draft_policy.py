"""Adaptive draft length: how many tokens the draft proposes in each verify step, row by row.

Two rules, as transformers' assisted generation has them, alone or together (:class:`DraftPolicy`):

  heuristic    ``num_assistant_tokens_schedule="heuristic"``: a row's draft length grows by 2 after a step in which
               the target accepted every token the row drafted, and shrinks by 1 (never below 1) after a step that
               rejected one; it starts at γ in every generate call (transformers' "heuristic_transient") and never
               passes γ_max
  confidence   ``assistant_confidence_threshold`` (the "dynamic speculation lookahead"): a row stops proposing once
               the draft's confidence at a position, the largest probability of its distribution there, falls below
               the threshold; the position that fell is still proposed (as transformers does). On a CPU a row's
               proposal ends there and the step stops drafting where every row's has, as transformers' does
               (``in_step``: reading that is a read of values on the host, no sync), and each row starts every step
               wanting its most, γ_max; elsewhere rows pad, and guess their next length (below)

Exactness. Each rule decides from the draft's own distributions (the confidence at positions already drafted) and from
what earlier steps emitted and accepted, never from the target's logits of the step being drafted; the verify step
is exact for any draft distribution that is a function of what precedes it, so the output still follows the target.
tests/test_adaptive_draft.py tests it with chi-square tests (and a negative control the same test rejects).

How a batch drafts without extra host syncs. A step drafts γ_step = the longest draft length any active row wants,
capped by γ_max and by the room left (the roomiest row's; with per-example randomness each row's own room cuts its
own length instead, pipeline/decoding/engine.py). A row that wants fewer hands the
verify rule its own length (the sampler contract's ``lengths``, pipeline/samplers/contract.py), which verifies the
row as it would verify it alone with γ = that length: the positions past it are never accepted, and a row that
accepts its whole draft gets its bonus token from the target right after it. With per-example randomness each row
also draws only its own length's uniforms (pipeline.rng.RowGenerators.set_step), so a row's tokens are the same in
any batch as at batch size 1. Inside its own length, a row whose confidence fell pads the positions after the fall
with the draft's argmax and a one-hot draft distribution: a valid, deterministic draft that the exact rule accepts
with the target's probability of that token (and on rejection samples p without it, renormalised), as at batch 1.
What a row wants next is decided on the host from what the step's one sync brings: the accepted counts, and each
row's confident length (how many positions it proposed before stopping), copied to pinned host memory without
blocking before that sync (:meth:`DraftLengths.record`). With the confidence rule alone, a row wants its last
confident length next, one more after a step in which its confidence never fell. Saving draft forwards inside a
step would need a host read per draft position (transformers does one); on a GPU, where that read is a sync, this
engine does not; on a CPU, where it is free, it does (``in_step``, set by the engine; docs/tuning.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SCHEDULES = ("constant", "heuristic")


@dataclass(frozen=True)
class DraftPolicy:
    """How long the draft drafts. schedule: "constant" (γ every step) or "heuristic" (see the module docstring);
    confidence: stop a row's proposals after the first position whose draft confidence is below it (0: never);
    gamma_max: the most tokens a step may draft (None: γ); in_step: the confidence rule stops the step's draft
    forwards where every row has stopped, and the rule alone has each row want γ_max every step (the engine sets it
    on a CPU: :meth:`on`)."""

    schedule: str = "constant"
    confidence: float = 0.0
    gamma_max: int | None = None
    in_step: bool = False

    @property
    def adaptive(self) -> bool:
        return self.schedule == "heuristic" or self.confidence > 0

    def ceiling(self, gamma: int) -> int:
        """The most draft tokens a step may propose with starting draft length ``gamma``."""
        return max(gamma, self.gamma_max or gamma)

    def on(self, device: torch.device) -> DraftPolicy:
        """The policy as the engine runs it on ``device``: the confidence rule stops in the step on a CPU, where
        reading whether every row has stopped costs no sync."""
        from dataclasses import replace

        return replace(self, in_step=self.confidence > 0 and device.type == "cpu")

    @classmethod
    def of(cls, config) -> DraftPolicy | None:
        """The policy of a RunConfig (or anything with draft_schedule, draft_confidence, gamma_max, gamma); None
        for a fixed γ."""
        policy = cls(getattr(config, "draft_schedule", "constant") or "constant",
                     float(getattr(config, "draft_confidence", 0.0) or 0.0), getattr(config, "gamma_max", None))
        return policy if policy.adaptive and config.gamma > 0 else None


def row_limits(lengths: list[int], gamma: int, device: torch.device) -> torch.Tensor | None:
    """int64 [b] on ``device``: each active row's own draft length (host ints), where some row drafts fewer than the
    step's ``gamma``; None when none does (every row drafts all γ positions). A pinned host tensor copied without
    blocking."""
    import torch

    if min(lengths) >= gamma:
        return None
    host = torch.tensor(lengths, dtype=torch.int64, pin_memory=device.type == "cuda")
    return host.to(device, non_blocking=True)


class DraftLengths:
    """The draft length each row wants, for one generate call (host side; the engine keeps one per call).

    want[r]     int: the draft length original row r wants in the next step, in [1, ceiling]
    The device tensor ``confident`` int64 [b] (per active row of the last step, how many positions it proposed before
    its confidence fell, or all of its positions) reaches the host through :meth:`record`.
    """

    def __init__(self, policy: DraftPolicy, gamma: int, ceiling: int) -> None:
        # the confidence rule alone, stopping in the step, wants γ_max from the first step on
        in_step_only = policy.in_step and policy.schedule == "constant"
        self.policy, self.start, self.ceiling = policy, ceiling if in_step_only else gamma, ceiling
        self.want: dict[int, int] = {}
        self._rows: list[int] = []
        self._gamma = 0
        self._accepted: dict[int, int] = {}
        self._confident: torch.Tensor | None = None
        self._ready = None   # a CUDA event recorded after the device-to-host copy of ``confident``

    def step_gamma(self, rows: list[int], accepted: list[int], room: int | None) -> int:
        """γ for the next step of the active original ``rows``, after taking in the last step's outcome.
        ``accepted``: per original row, its accepted draft tokens so far (the engine's host statistics, kept by the
        step's sync); ``room``: tokens the roomiest row may still emit (None: no cut here; with per-example
        randomness the engine cuts each row to its own room, so a row's last steps do not depend on the others)."""
        self._learn(accepted)
        for r in rows:
            self.want.setdefault(r, self.start)
        gamma = min(max(self.want[r] for r in rows), self.ceiling, room - 1 if room is not None else self.ceiling)
        self._rows, self._gamma = list(rows), max(gamma, 0)
        for r in rows:
            self._accepted[r] = accepted[r]
        return self._gamma

    def wanted(self) -> list[int]:
        """Host ints: the draft length each active row wants this step (at most the step's γ), in row order."""
        return [min(self.want[r], self._gamma) for r in self._rows]

    def record(self, confident: torch.Tensor | None) -> None:
        """Keep the step's per-row confident lengths (int64 [b], on the device) for the host: a copy to pinned memory
        queued before the step's sync, so reading it after that sync waits for nothing."""
        if confident is None:
            self._confident = None
            return
        import torch

        if confident.device.type != "cuda":
            self._confident = confident
            return
        host = torch.empty(confident.shape, dtype=confident.dtype, pin_memory=True)
        host.copy_(confident, non_blocking=True)
        self._ready = torch.cuda.Event()
        self._ready.record()
        self._confident = host

    def _learn(self, accepted: list[int]) -> None:
        """Update want[r] of the last step's rows from their accepted counts and confident lengths."""
        if not self._rows or self._gamma == 0:
            return
        confident = None
        if self._confident is not None:
            if self._ready is not None:
                self._ready.synchronize()   # already complete: the step's sync came after it on the same stream
            confident = self._confident.tolist()
        for i, r in enumerate(self._rows):
            own = min(self.want[r], self._gamma)           # the positions row r drafted for itself
            fell = False
            if confident is not None:
                fell = confident[i] < own
                own = confident[i]
            if self.policy.schedule == "heuristic":
                hit = accepted[r] - self._accepted[r] >= own   # every token it drafted for itself was accepted
                self.want[r] = min(self.want[r] + 2, self.ceiling) if hit else max(1, self.want[r] - 1)
            elif self.policy.in_step:                          # the confidence rule alone, stopping in the step
                self.want[r] = self.ceiling
            else:                                              # the confidence rule alone
                self.want[r] = max(1, own) if fell else min(own + 1, self.ceiling)
        self._confident = self._ready = None
