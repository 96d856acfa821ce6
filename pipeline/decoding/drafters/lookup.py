"""Drafters without a draft model: each row's proposals come from a search of its own text on the host.

    prompt lookup    n-gram matches in the prompt and the text so far (pipeline/decoding/drafters/ngram.py)
    suffix decoding  suffix trees over the prompt, the text so far and, optionally, earlier outputs
                     (pipeline/decoding/drafters/suffix_tree.py)

Both propose deterministic drafts: the :class:`Proposal` has no logits, and the verify rule treats the draft as
one-hot (exact sampling accepts a proposed x with the target's probability p(x), and on rejection samples from p
with x removed: lossless at any temperature; pipeline/samplers/contract.py). A row without a match proposes nothing;
rows with fewer proposals than the step's widest are verified with their own lengths (the sampler contract's
per-row lengths), so a row's tokens never depend on its batch.

Host work. The search runs on the host between steps and reads each step's emitted tokens, which come in the
step's one sync (``reads_emitted``); the proposals go to the device in one copy. Both are timed as the "lookup"
phase. The uniforms the loop draws for the drafter are not used.

Token trees (``widths``, ``--draft-tree 3,2,1``): each row proposes several matches at once, a tree of deterministic
children. Its proposer returns candidate continuations, best first (prompt lookup: the distinct continuations of the
longest and then shorter n-gram matches, the chain's own first; suffix decoding: the suffix tree's top-scoring
branches), merged into a trie that fits the widths per depth (:func:`~pipeline.tree_shape.place_paths`: shared
prefixes share nodes, a node keeps its first widths[d] children, so the first match is every node's first child).
A row never proposes more than the shape allows and a row with fewer matches a smaller tree. The step's tree is the
union of the rows' trees (a subtree of the shape, :meth:`~pipeline.tree_shape.TokenTree.subtree`): the target scores
only nodes some row proposed, and a row's nodes that others proposed but it did not are padding the verify step never
tests (``Proposal.real``), so each row is verified exactly as its own tree would be. A step where no row matched
proposes nothing, as for a chain. The tokens and the real flags go to the device in one copy. With per-example
seeds a row's uniforms follow the step's tree, so its tokens may depend on its batch (their distribution does not).

Earlier outputs (suffix decoding with ``outputs``): a finished row's output joins a tree shared by later rows (a
run's later examples, a server's later requests). A row whose prompt was decoded before does not read that tree,
so that re-decoding a prompt (a run's timed repeats) never proposes its own earlier output back to it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pipeline.decoding.draft_policy import row_limits
from pipeline.decoding.drafters.base import DraftAsk, Drafter, DraftPrompt, DraftSetup, Proposal, StepOutcome
from pipeline.decoding.drafters.ngram import NgramIndex, Proposer
from pipeline.decoding.drafters.suffix_tree import OutputCache, SuffixDecoder
from pipeline.errors import SpecsweepError
from pipeline.tree_shape import TokenTree, place_paths
from pipeline.tree_tensors import whole_span


class LookupDrafter(Drafter):
    """A model-free drafter: one :class:`~pipeline.decoding.drafters.ngram.Proposer` per active row.

    make      () -> a fresh proposer for a row; a drafter that shares earlier outputs takes ``make(shared)``
    settings  what the results record about the drafter (its name and parameters)
    widths    a token tree's children per node at each depth (module docstring), or None: a chain
    """

    reads_emitted = True

    def __init__(self, make: Callable[..., Proposer], settings: dict, outputs: OutputCache | None = None,
                 widths: tuple[int, ...] | None = None) -> None:
        super().__init__()
        self.make = make
        self.settings = dict(settings)
        self.outputs = outputs
        self.widths = None if widths is None else tuple(widths)
        self.shape = None if widths is None else TokenTree.from_widths(self.widths)
        if widths is not None:
            self.settings.update(draft_tree=list(self.widths), tree_children="top-k")
        self.rows: list[Proposer] = []
        self._seen: set[tuple[int, ...]] = set()      # prompts whose output is in ``outputs``
        self._keys: list[tuple[int, ...]] = []        # each active row's prompt
        self._timer = None
        self.proposed = 0                             # tokens proposed in this generate call

    def bind(self, setup: DraftSetup) -> None:
        if setup.adaptive:
            raise SpecsweepError(f"the {self.settings['drafter']} drafter proposes as far as its match reaches: "
                                 "use a constant γ (no --draft-schedule heuristic or --draft-confidence)")
        super().bind(setup)

    def start(self, prompt: DraftPrompt) -> None:
        """A proposer per row, over its real prompt tokens (one host copy of the prompts per generate call)."""
        self._finish(range(len(self.rows)))
        ids, real = prompt.input_ids.tolist(), prompt.attention_mask.tolist()
        self._keys = [tuple(t for t, m in zip(row, keep) if m) for row, keep in zip(ids, real)]
        self._timer = prompt.timer
        self.proposed = 0
        with prompt.timer.phase("lookup"):
            self.rows = []
            for key in self._keys:
                row = self.make(None if key in self._seen else self.outputs)
                row.start(key)
                self.rows.append(row)

    def propose(self, ask: DraftAsk) -> Proposal:
        """Each row's proposals, at most ask.gamma (its own limit where it has one): int64 [b, K], K the most any
        row proposed (0 when none matched), no logits. With a tree: :meth:`propose_tree`."""
        if self.shape is not None:
            return self.propose_tree(ask)
        with self._timer.phase("lookup"):
            limits = ask.wants or [ask.gamma] * len(self.rows)
            found = [row.propose(k) for row, k in zip(self.rows, limits)]
            own = [len(p) for p in found]
            K = max(own, default=0)
            host = torch.zeros((len(found), K), dtype=torch.int64, pin_memory=ask.u.is_cuda)
            for b, p in enumerate(found):
                host[b, : len(p)] = torch.tensor(p, dtype=torch.int64)
            tokens = host.to(ask.u.device, non_blocking=True)
            lengths = row_limits(own, K, ask.u.device) if K else None
        self.proposed += sum(own)
        return Proposal(tokens, None, lengths, own if lengths is not None else None)

    def propose_tree(self, ask: DraftAsk) -> Proposal:
        """Each row's matches as a tree (module docstring), no deeper than its limit (ask.gamma, or its own): tokens
        int64 [b, N] and real bool [b, N] over the step's tree of N nodes (N = 0 when no row matched: no tree)."""
        with self._timer.phase("lookup"):
            limits = ask.wants or [ask.gamma] * len(self.rows)
            depth = self.shape.depth
            placed = [place_paths(row.propose_many(min(k, depth), self.widths), self.widths, min(k, depth))
                      for row, k in zip(self.rows, limits)]
            nodes = sorted(set().union(*placed))
            host = torch.full((len(placed), len(nodes)), -1, dtype=torch.int64, pin_memory=ask.u.is_cuda)
            column = {n: i for i, n in enumerate(nodes)}
            for b, row in enumerate(placed):
                if row:
                    host[b, [column[n] for n in row]] = torch.tensor(list(row.values()), dtype=torch.int64)
            tokens = host.to(ask.u.device, non_blocking=True)
            own = [len(row) for row in placed]
        self.proposed += sum(own)
        if not nodes:
            return Proposal(tokens, None)
        tree = self.shape.subtree(nodes)
        return Proposal(tokens.clamp_min(0), None, tree=tree, span=whole_span(tree, ask.u.device), real=tokens >= 0,
                        drafted_host=own)

    def commit(self, outcome: StepOutcome) -> None:
        with self._timer.phase("lookup"):
            for row, new in zip(self.rows, outcome.emitted):
                row.extend(new)

    def select(self, rows: torch.Tensor, keep: list[int]) -> None:
        kept = set(keep)
        self._finish(i for i in range(len(self.rows)) if i not in kept)
        self.rows = [self.rows[i] for i in keep]
        self._keys = [self._keys[i] for i in keep]

    def _finish(self, indices) -> None:
        """Rows that are done: their outputs join the shared tree (once per prompt)."""
        if self.outputs is None:
            return
        for i in indices:
            if self._keys[i] not in self._seen:
                self.rows[i].finish()
                self._seen.add(self._keys[i])

    def statistics(self) -> dict:
        return {"draft_forwards": 0}


def prompt_lookup(min_n: int, max_n: int, stop_ids=(), widths: tuple[int, ...] | None = None) -> LookupDrafter:
    """Prompt lookup with n-grams of min_n..max_n tokens (the longest match decides, its earliest occurrence, as
    transformers and vLLM do); proposals end before a stop id (the target's EOS). ``widths``: a token tree of
    several matches per step (module docstring)."""
    if not 1 <= min_n <= max_n:
        raise SpecsweepError(f"prompt lookup needs 1 <= --lookup-min <= --lookup-max; got {min_n}, {max_n}")
    stops = tuple(stop_ids)
    return LookupDrafter(lambda shared: NgramIndex(min_n, max_n, "first", stops, every=widths is not None),
                         {"drafter": "prompt-lookup", "lookup_min": min_n, "lookup_max": max_n}, widths=widths)


def suffix_decoding(max_depth: int, max_spec_factor: float, min_token_prob: float,
                    keep_outputs: bool, widths: tuple[int, ...] | None = None) -> LookupDrafter:
    """Suffix decoding (ArcticInference's rule, vLLM's defaults 24, 1.0, 0.1), with a tree of earlier outputs
    kept across generate calls when ``keep_outputs``; ``widths``: a token tree of its top-scoring branches per step
    (module docstring)."""
    if max_depth < 1 or max_spec_factor <= 0 or not 0 <= min_token_prob <= 1:
        raise SpecsweepError(f"suffix decoding needs --suffix-depth >= 1, --suffix-factor > 0 and --suffix-min-prob "
                             f"in [0, 1]; got {max_depth}, {max_spec_factor}, {min_token_prob}")
    outputs = OutputCache(max_depth) if keep_outputs else None
    return LookupDrafter(lambda shared: SuffixDecoder(max_depth, max_spec_factor, min_token_prob, shared),
                         {"drafter": "suffix", "suffix_depth": max_depth, "suffix_factor": max_spec_factor,
                          "suffix_min_prob": min_token_prob, "suffix_outputs": keep_outputs}, outputs, widths)
