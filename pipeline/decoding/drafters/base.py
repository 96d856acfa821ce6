"""The drafter protocol: what the loop asks of anything that proposes tokens, and the records it hands over.

The loop (pipeline/decoding/engine.py) never asks which drafter it has. Each verify step it asks the drafter for
proposals, lets the target score them, verifies them, and tells the drafter what was accepted; the drafter keeps
its own state (a KV cache, an n-gram index, the text so far). A new drafter is one module with a subclass of
:class:`Drafter` and its tests.

    bind(setup)          once, when the engine is built: the engine's settings (:class:`DraftSetup`)
    start(prompt)        at the start of each generate call: read the prompts (:class:`DraftPrompt`); the
                         statistics count from here
    propose(ask)         this step's proposals (:class:`Proposal`) for the active rows, as asked (:class:`DraftAsk`)
    observe_target(l, p) the target's logits at the scored positions (a drafter that measures them; else nothing)
    host_rows()          int64 [k, b] on the device to bring to the host in the step's one sync, or None
    commit(outcome)      after verification: what was accepted and emitted (:class:`StepOutcome`)
    select(rows, keep)   keep only these rows (finished rows leave)
    statistics()         what the run records about the drafter (host values; read once, at the end)

Token kinds (as vLLM's rejection sampler names them): a *draft* token is proposed; it is *accepted* when the verify
step keeps it; the step then emits one more token, *corrected* (sampled from the residual after a rejection) or
*bonus* (from the target's distribution after a wholly accepted draft). Proposals are always in target ids.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pipeline.decoding.cache import CachedModel
from pipeline.decoding.timing import PhaseTimer
from pipeline.tree_shape import TokenTree
from pipeline.tree_tensors import TreeSpan, children_table


@dataclass(frozen=True)
class DraftSetup:
    """The engine's settings a drafter may need, told once (:meth:`Drafter.bind`).

    device             where the loop runs
    gamma              the most tokens a step proposes
    draft_temperature  the temperature the verify rule assumes the draft sampled at (0: propose the argmax)
    temperature        the decoding temperature (the target's)
    target_kind        how the target is driven: "causal", or "seq2seq" (an encoder-decoder such as Whisper)
    mask_logits        (logits [..., V], first_position) -> logits with suppressed ids at -inf (in place), or None
    pad                the target's pad id
    adaptive           an adaptive draft length is on (pipeline/decoding/draft_policy.py)
    static             use a static-cache forward where the model's family has one
    target_vocab       V_t, the target's output rows
    quant              the draft model's weights in its static forward: none, int8 or int4
                       (pipeline/decoding/static/quant.py)
    packed             its weights packed where they can be (pipeline/decoding/static/packed.py; quantised: the
                       dequantised weights its prefill multiplies)
    compile            its static forward's decoding steps through torch.compile in this mode, or "off"
                       (pipeline/decoding/static/compiled.py)
    """

    device: torch.device
    gamma: int
    draft_temperature: float
    temperature: float
    target_kind: str
    mask_logits: Callable | None
    pad: int
    adaptive: bool
    static: bool
    target_vocab: int
    quant: str = "none"
    packed: bool = False
    compile: str = "off"


@dataclass
class DraftPrompt:
    """One generate call's prompts, as a drafter reads them (:meth:`Drafter.start`).

    input_ids       int64 [B, L], left-padded, on the device (target ids)
    attention_mask  bool [B, L], True at real tokens
    padded          whether any row has padding (known on the host, no sync)
    texts           each row's prompt as text (a drafter that reads text tokenises it its own way), or None
    encoder_inputs  the encoder's inputs on the device in the target's dtype (a seq2seq target), else {}
    encoder_hidden  the target's encoder output [B, S, D] (a seq2seq target), else None
    capacity        positions a static cache allocates up front
    max_new_tokens  the most tokens a row emits
    timer           the call's phase timer (a drafter times its own host work in a phase of its own)
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    padded: bool
    texts: list[str] | None
    encoder_inputs: dict
    encoder_hidden: torch.Tensor | None
    capacity: int
    max_new_tokens: int
    timer: PhaseTimer


@dataclass
class DraftAsk:
    """What the loop asks for in one step (:meth:`Drafter.propose`).

    gamma       the most tokens a row may propose this step
    u           float32 [b, γ]: uniforms for sampled proposals (a row's own stream with per-row generators)
    first_step  the first step of the call (Whisper's begin-suppressed ids apply to its first position)
    limits      int64 [b] on the device: row b proposes at most limits[b] (each row's room near the end, or its
                adaptive length); None: every row may propose γ
    wants       the same as host ints, or None
    confidence  an adaptive draft length's threshold: stop a row's draft after the first position whose largest
                draft probability is below it (0: never); None: no adaptive length
    in_step     with ``confidence``: each row's proposal ends where it stopped (its length: the positions it
                proposed for itself, no padding after), and the draft runs no forward after the position where every
                row has stopped, so the proposal may be narrower than γ; reading those is a read of values the step
                computed, which costs no sync on a CPU, where the engine asks for it (pipeline/decoding/draft_policy.py)
    """

    gamma: int
    u: torch.Tensor
    first_step: bool
    limits: torch.Tensor | None = None
    wants: list[int] | None = None
    confidence: float | None = None
    in_step: bool = False


@dataclass
class Proposal:
    """A step's proposals for the b active rows.

    tokens        int64 [b, K] target ids, K ≤ γ; a row's positions past its own length are padding that the
                  verify step never reads
    logits        [b, K, V] the draft's logits at each position (the distribution each token was drawn from);
                  None: a deterministic draft (one-hot at ``tokens``)
    lengths       int64 [b] on the device: each row's own count where some row proposed fewer than K; else None
    lengths_host  the same as host ints (None likewise)
    confident     int64 [b]: positions each row proposed for itself (an adaptive draft length), else None
    tree          a token tree (pipeline/tree_shape.py): tokens [b, N] and logits [b, N, V] are its nodes (each
                  node's logits those of its parent, the distribution it was drawn from); None: a chain
    replacement   how a tree's stochastic siblings were drawn: independently (True) or without replacement
    span          how the target attends over the tree (:class:`~pipeline.tree_tensors.TreeSpan` of the root and
                  its N nodes, on the device), None for a chain
    real          bool [b, N] on the device: the nodes each row proposed where some row's tree is smaller than the
                  step's (a drafter without a model: each row's matches, the others padding the verify step never
                  tests); None: every node
    drafted_host  host ints [b]: tokens each row proposed, where ``real`` is given (else None)
    """

    tokens: torch.Tensor
    logits: torch.Tensor | None
    lengths: torch.Tensor | None = None
    lengths_host: list[int] | None = None
    confident: torch.Tensor | None = None
    tree: TokenTree | None = None
    replacement: bool = True
    span: TreeSpan | None = None
    real: torch.Tensor | None = None
    drafted_host: list[int] | None = None

    @property
    def width(self) -> int:
        """Tokens proposed per row: the target scores each (a tree's nodes)."""
        return self.tokens.shape[1]

    def verify_args(self) -> dict:
        """The verify step's keyword arguments besides the tensors: per-row lengths, a tree and its sibling rule."""
        args = {} if self.lengths is None else {"lengths": self.lengths}
        if self.tree is not None:
            args.update(tree=self.tree, replacement=self.replacement)
        if self.real is not None:
            args["real"] = self.real
        return args

    def proposed(self) -> torch.Tensor | None:
        """bool [b, K]: the positions each row proposed, or None where every row proposed all K."""
        if self.real is not None:
            return self.real
        if self.lengths is None:
            return None
        return torch.arange(self.width, device=self.lengths.device) < self.lengths[:, None]

    def bonus(self, accepted: torch.Tensor, path: torch.Tensor | None) -> torch.Tensor | None:
        """bool [b]: rows whose emitted token is a bonus (they accepted all their own draft: a chain row its own
        length, a tree row a node without children of its own), given accepted int64 [b] and a tree's path int64
        [b, D]; None where that is the verify step's width alone (every row proposed all of it). No host sync."""
        if self.real is not None:
            rows = torch.arange(accepted.shape[0], device=accepted.device)
            last = path.gather(1, (accepted - 1).clamp_min(0)[:, None]).squeeze(1)
            at = torch.where(accepted > 0, last + 1, 0)                              # 0: the root
            kids = children_table(self.tree, accepted.device)[at]                    # [b, K]
            return ~((kids >= 0) & self.real[rows[:, None], kids.clamp_min(0)]).any(dim=1)
        return None if self.lengths is None else accepted == self.lengths


@dataclass
class StepOutcome:
    """What a verify step decided, for :meth:`Drafter.commit`.

    proposal       the step's :class:`Proposal`
    accepted       int64 [b]: accepted proposals per row (device)
    accepted_host  the same as host ints
    next_token     int64 [b]: the emitted corrected or bonus token (device)
    emitted        per row, the target ids the step emitted (host), when the drafter reads them
                   (``reads_emitted``); else None
    host_rows      :meth:`Drafter.host_rows` on the host, one list per row (None when it gave none)
    path           int64 [b, D]: a tree's accepted path, node indices (-1 after ``accepted``); None for a chain
    """

    proposal: Proposal
    accepted: torch.Tensor
    accepted_host: list[int]
    next_token: torch.Tensor
    emitted: list[list[int]] | None = None
    host_rows: list[list[int]] | None = None
    path: torch.Tensor | None = None


class Drafter:
    """Base class of every drafter (see the module docstring for the protocol).

    reads_emitted  the drafter reads each step's emitted tokens on the host (they then come in the step's one sync)
    vocab_size     V of its proposal logits (known after :meth:`bind`)
    forwards       draft-model forwards in this generate call (0 for a drafter without a model)
    model          the draft model's :class:`~pipeline.decoding.cache.CachedModel`, for a drafter with one
    settings       what a results file records about the drafter: its name ("drafter") and parameters
    """

    reads_emitted = False

    def __init__(self) -> None:
        self.vocab_size = 0
        self.forwards = 0
        self.model: CachedModel | None = None
        self.settings: dict = {"drafter": "model"}
        self.setup: DraftSetup | None = None

    def bind(self, setup: DraftSetup) -> None:
        self.setup = setup
        self.vocab_size = setup.target_vocab

    def start(self, prompt: DraftPrompt) -> None:
        raise NotImplementedError

    def propose(self, ask: DraftAsk) -> Proposal:
        raise NotImplementedError

    def observe_target(self, target_logits: torch.Tensor, proposal: Proposal) -> None:
        """target_logits [b, K+1, V_t] at the positions the target scored for ``proposal`` this step."""

    def host_rows(self) -> torch.Tensor | None:
        return None

    def commit(self, outcome: StepOutcome) -> None:
        raise NotImplementedError

    def select(self, rows: torch.Tensor, keep: list[int]) -> None:
        """Keep only these active rows: int64 indices on the device, and the same as a host list."""
        raise NotImplementedError

    def statistics(self) -> dict:
        """Host values: ``draft_forwards``, and where the drafter counts more (its proposals by source, ...)
        ``drafter_counts``, a dict of ints and lists of ints that :func:`add_counts` sums over calls and runs."""
        return {"draft_forwards": self.forwards}


def add_counts(into: dict | None, other: dict | None) -> dict | None:
    """Two ``drafter_counts`` (:meth:`Drafter.statistics`) summed: ints added, lists of ints added element by element
    (the longer one's tail kept); None where both are None."""
    if other is None:
        return into
    out = dict(into or {})
    for key, value in other.items():
        if isinstance(value, list):
            mine = out.get(key, [])
            out[key] = [a + b for a, b in zip(mine, value)] + (mine[len(value):] or value[len(mine):])
        else:
            out[key] = out.get(key, 0) + value
    return out
