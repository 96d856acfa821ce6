"""Suffix decoding: propose the continuation that suffix trees of earlier text say is the most frequent.

After Oliaro et al. 2024 ("SuffixDecoding: Extreme Speculative Decoding for Emerging AI Applications") and its
implementation in Snowflake's ArcticInference (the one vLLM's ``suffix`` method runs), whose semantics this
follows where the paper leaves a choice.

Trees. A :class:`SuffixTree` holds count(s) for every string s of 1 to ``max_depth`` tokens of its sequences: the
number of places s occurs (starts i with seq[i:i+len(s)] == s). It is a trie of every suffix of every sequence,
cut at max_depth tokens: the node of s has count(s), its child for token t has count(s + t). A request
(:class:`SuffixDecoder`, one per batch row) reads two trees: its own, over its prompt and the tokens emitted so far
(grown every step), and optionally one shared over earlier requests' outputs (:class:`OutputCache`, bounded).

Speculation, for a context x (the request's prompt and emitted tokens) and a budget of max_tokens:
  - for each match length L = 1 .. max_depth whose string s = x[-L:] is in the tree, a draft: from s's node,
    repeatedly the child with the largest count (ties: the child that reached that count first), each token's
    probability being the product along the path of child count / parent count; it stops before a token whose
    probability is below ``min_token_prob``, after min(max_tokens, floor(max_spec_factor * L)) tokens, or where
    the tree ends (a path holds at most max_depth tokens: L + the draft's length <= max_depth);
  - a draft's score is the sum of its tokens' probabilities (the expected number accepted, were the counts the
    truth); the highest score wins, the longer match on ties; across the two trees the request's own draft wins
    unless the output tree's scores strictly higher.
A parent's count includes the occurrences that end there, the context's own last L tokens among them: a string
seen once before proposes what followed it with probability 1/2. All of this is ArcticInference's rule (its
suffix_tree.cc), with three differences: its ties go to whichever child its hash map lists first; it never matches
the whole context (L < len(x), which differs only for a context shorter than max_depth found whole in the output
tree); and it adds a request's output to the shared tree while the request runs, where
:meth:`SuffixDecoder.finish` adds it at the end.

A token tree (:meth:`SuffixDecoder.propose_many`, docs/trees.md): from the state of the draft speculation picks (the
same tree and match length), the top-scoring branches: at each node its children by count, the most frequent (the
chain's choice) first, at most ``widths[d]`` of them at depth d, each kept while its probability (the product of
child count / parent count along its path) is at least ``min_token_prob``, down to the speculation's token budget;
its root-to-leaf paths in depth-first order (so siblings keep the tree's own frequency order and the first path is
the chain's draft). O(nodes * children scanned).

Leaf compression keeps memory linear in practice: a node with count 1 has no children, since the rest of its one
occurrence is read from its sequence (the node's tail); when a second occurrence reaches it, it gets the child its
first occurrence continues with. Nodes: at most the number of tokens plus the number of distinct strings of <=
max_depth tokens that occur at least twice. Appending a token costs O(k + 1) dict operations, k <= max_depth being
the number of the sequence's suffixes that occurred before (for prose, a handful); a speculation costs at most
O(max_depth * max_tokens) and usually far less (match lengths that cannot beat the best score so far are skipped).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

ROOT = 0


@dataclass(frozen=True)
class Draft:
    """A speculation: ``tokens`` with, per token, its parent's index in ``tokens`` (-1: the context; a chain today,
    the shape a token tree will take) and its probability; ``score`` = sum(probs); ``match_len``, the length of
    the context suffix it continues; ``source``: "request" or "outputs", the tree it came from ("" when empty)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0
    source: str = ""
    state: tuple[int, int] | None = field(default=None, compare=False)   # the matched (node, extra)


class SuffixTree:
    """Occurrence counts of the strings of <= ``max_depth`` tokens of a list of sequences (module docstring).

    ``add(tokens)`` opens a new sequence; ``extend(tokens)`` appends to the last one. ``walkers`` are the nodes of
    the last sequence's suffixes that occurred before (count >= 2), walkers[i] being the suffix of i + 1 tokens.
    A position in the tree is a state (node, extra): the node's string, or for a leaf, ``extra`` more tokens of
    its tail.
    """

    def __init__(self, max_depth: int = 24) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1; got {max_depth}")
        self.max_depth = max_depth
        self.seqs: list[list[int]] = []
        # one entry per node, node 0 the root (the empty string, counted once per token)
        self.counts = [0]
        self.depths = [0]
        self.tokens = [-1]                                      # the last token of the node's string
        self.children: list[dict[int, int] | None] = [{}]       # token -> node; None for a leaf (count 1)
        self.best = [-1]                                        # the child with the largest count, -1 for none
        self.owner_seq = [-1]                                   # an occurrence of the node's string: for a leaf,
        self.owner_start = [-1]                                 # its only one, whose tail continues it
        self.walkers: list[int] = []

    def __len__(self) -> int:
        """The number of nodes, the root included."""
        return len(self.counts)

    def add(self, tokens: Iterable[int]) -> None:
        """A new sequence of ``tokens``: O(len * (k + 1)), see the module docstring."""
        self.seqs.append([])
        self.walkers = []
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append ``tokens`` to the last sequence: every suffix ending at a new token is counted once more."""
        counts, children, best, depths = self.counts, self.children, self.best, self.depths
        seq, q, max_depth = self.seqs[-1], len(self.seqs) - 1, self.max_depth
        for token in tokens:
            token = int(token)
            seq.append(token)
            end = len(seq)
            counts[ROOT] += 1
            walkers = []
            for node in (ROOT, *self.walkers):   # the suffixes ending before the token, the empty one first
                depth = depths[node]
                if depth == max_depth:
                    break
                child = children[node].get(token)
                if child is None:   # a new string: a leaf (and so for every longer suffix after this one)
                    self._node(node, token, q, end - depth - 1)
                    continue
                counts[child] += 1
                if counts[child] > counts[best[node]]:
                    best[node] = child
                if counts[child] == 2:
                    self._split(child)
                walkers.append(child)
            self.walkers = walkers

    def _node(self, parent: int, token: int, seq: int, start: int) -> int:
        """A new leaf under ``parent`` for the occurrence of its string at seqs[seq][start:]."""
        node = len(self.counts)
        self.counts.append(1)
        self.depths.append(self.depths[parent] + 1)
        self.tokens.append(token)
        self.children.append(None)
        self.best.append(-1)
        self.owner_seq.append(seq)
        self.owner_start.append(start)
        self.children[parent][token] = node
        if self.best[parent] < 0:
            self.best[parent] = node
        return node

    def _split(self, leaf: int) -> None:
        """A leaf reached by a second occurrence gets children: the one its first occurrence continues with."""
        self.children[leaf] = {}
        seq, start, depth = self.seqs[self.owner_seq[leaf]], self.owner_start[leaf], self.depths[leaf]
        if depth < self.max_depth and start + depth < len(seq):
            self._node(leaf, seq[start + depth], self.owner_seq[leaf], start)

    def step(self, node: int, extra: int, token: int) -> tuple[int, int] | None:
        """The state after one more token from (node, extra), or None where the string leaves the tree."""
        length = self.depths[node] + extra
        if length == self.max_depth:
            return None
        kids = self.children[node]
        if kids is not None:
            child = kids.get(token)
            return None if child is None else (child, 0)
        seq = self.seqs[self.owner_seq[node]]
        i = self.owner_start[node] + length
        return (node, extra + 1) if i < len(seq) and seq[i] == token else None

    def advance(self, states: list[tuple[int, int]], token: int) -> list[tuple[int, int]]:
        """Match states of a context that is not in the tree, after one more context token: ``states[i]`` is the
        state of the context's last i + 1 tokens, for every suffix in the tree (O(len(states) + 1))."""
        out = []
        for node, extra in ((ROOT, 0), *states):
            state = self.step(node, extra, token)
            if state is None:   # a longer suffix is in the tree only if this one is
                break
            out.append(state)
        return out

    def count(self, path: Sequence[int]) -> int:
        """count(path): its occurrences, 0 where it is longer than max_depth (the total tokens for ())."""
        state = (ROOT, 0)
        for token in path:
            state = self.step(*state, token)
            if state is None:
                return 0
        return self.counts[state[0]]

    def branches(self, node: int, extra: int, widths: Sequence[int], max_tokens: int, min_prob: float
                 ) -> list[list[int]]:
        """The top-scoring branches below state (node, extra) (module docstring): root-to-leaf token paths of at most
        ``max_tokens`` tokens, depth first, the most frequent child first, at most widths[d] children at depth d."""
        out: list[list[int]] = []
        limit = min(max_tokens, len(widths))

        def walk(node: int, extra: int, prefix: list[int], p: float) -> None:
            kids = self.children[node] if extra == 0 else None
            if len(prefix) == limit or kids is None:
                tail = [] if len(prefix) == limit else self.draft(node, extra, limit - len(prefix), min_prob)[0]
                if prefix or tail:
                    out.append(prefix + tail)
                return
            best = self.best[node]
            ranked = heapq.nsmallest(widths[len(prefix)], kids.values(),
                                     key=lambda c: (c != best, -self.counts[c], c))
            taken = [c for c in ranked if p * self.counts[c] / self.counts[node] >= min_prob]
            if not taken and prefix:
                out.append(prefix)
            for child in taken:
                walk(child, 0, [*prefix, self.tokens[child]], p * self.counts[child] / self.counts[node])

        walk(node, extra, [], 1.0)
        return out

    def draft(self, node: int, extra: int, max_tokens: int, min_prob: float) -> tuple[list[int], list[float]]:
        """The greedy continuation of state (node, extra) and its tokens' probabilities (module docstring):
        O(max_tokens)."""
        tokens: list[int] = []
        probs: list[float] = []
        p = 1.0
        while len(tokens) < max_tokens:
            if self.children[node] is None:   # a leaf: the rest of its one occurrence, each token certain
                seq, start = self.seqs[self.owner_seq[node]], self.owner_start[node]
                i = start + self.depths[node] + extra
                tail = seq[i:min(len(seq), start + self.max_depth, i + max_tokens - len(tokens))]
                tokens += tail
                probs += [p] * len(tail)
                break
            child = self.best[node]
            if child < 0:
                break
            p *= self.counts[child] / self.counts[node]
            if p < min_prob:
                break
            tokens.append(self.tokens[child])
            probs.append(p)
            node, extra = child, 0
        return tokens, probs


class OutputCache:
    """Earlier requests' outputs in one :class:`SuffixTree`, shared by the requests' decoders.

    It holds at most ``max_outputs`` outputs: one more drops the oldest down to the newest ceil(max_outputs / 2)
    and rebuilds the tree from them (FIFO in batches, so that rebuilding costs O(1) insertions per output
    amortised). ``version`` changes with every change, so that decoders know to match their context again.
    """

    def __init__(self, max_depth: int = 24, max_outputs: int = 10_000) -> None:
        if max_outputs < 1:
            raise ValueError(f"max_outputs must be >= 1; got {max_outputs} (no output cache: pass none)")
        self.max_outputs = max_outputs
        self.tree = SuffixTree(max_depth)
        self.version = 0

    def add(self, tokens: Sequence[int]) -> None:
        if not tokens:
            return
        self.version += 1
        if len(self.tree.seqs) < self.max_outputs:
            self.tree.add(tokens)
            return
        kept = [*self.tree.seqs[len(self.tree.seqs) + 1 - (self.max_outputs + 1) // 2:], list(tokens)]
        self.tree = SuffixTree(self.tree.max_depth)
        for seq in kept:
            self.tree.add(seq)


class SuffixDecoder:
    """One request's suffix decoding (module docstring): its own tree over prompt and output, and optionally the
    shared :class:`OutputCache`. The settings' defaults are vLLM's (``suffix_decoding_max_tree_depth`` 24,
    ``..._max_spec_factor`` 1, ``..._min_token_prob`` 0.1).

        start(prompt_ids)       a new request: its tree over the prompt, O(len * (k + 1))
        extend(new_ids)         the tokens emitted in a verify step, O(len(new_ids) * (k + 1))
        speculate(max_tokens)   a Draft (the chain and its probabilities, score, match length, source)
        propose(max_tokens)     speculate's tokens
        finish()                the request is done: its output goes to the output cache, if any
    """

    def __init__(self, max_depth: int = 24, max_spec_factor: float = 1.0, min_token_prob: float = 0.1,
                 outputs: OutputCache | None = None) -> None:
        if max_spec_factor <= 0 or not 0 <= min_token_prob <= 1:
            raise ValueError(f"need max_spec_factor > 0 and 0 <= min_token_prob <= 1; got {max_spec_factor}, "
                             f"{min_token_prob}")
        self.max_spec_factor, self.min_token_prob = max_spec_factor, min_token_prob
        self.outputs = outputs
        self.tree = SuffixTree(max_depth)
        self.tree.add([])                           # before start: an empty context
        self.prompt_len = 0
        self._states: list[tuple[int, int]] = []   # the context's match states in the output tree
        self._version = -1                          # the output cache's version they were matched at

    @property
    def context(self) -> list[int]:
        """The prompt and the tokens emitted so far."""
        return self.tree.seqs[-1]

    def start(self, prompt_ids: Sequence[int]) -> None:
        self.tree = SuffixTree(self.tree.max_depth)
        self.tree.add(prompt_ids)
        self.prompt_len = len(prompt_ids)
        self._version = -1

    def extend(self, new_ids: Sequence[int]) -> None:
        self.tree.extend(new_ids)
        if self.outputs is not None and self._version == self.outputs.version:
            for token in new_ids:
                self._states = self.outputs.tree.advance(self._states, token)

    def speculate(self, max_tokens: int) -> Draft:
        best = self._best(self.tree, [(node, 0) for node in self.tree.walkers], max_tokens, "request")
        if self.outputs is not None:
            tree = self.outputs.tree
            if self._version != self.outputs.version:   # new outputs: match the context's tail again
                self._states = []
                for token in self.context[-tree.max_depth:]:
                    self._states = tree.advance(self._states, token)
                self._version = self.outputs.version
            other = self._best(tree, self._states, max_tokens, "outputs")
            if other.score > best.score:
                best = other
        return best

    def propose(self, max_tokens: int) -> list[int]:
        return self.speculate(max_tokens).tokens

    def propose_many(self, max_tokens: int, widths: Sequence[int]) -> list[list[int]]:
        """The top-scoring branches (module docstring) from the state and tree :meth:`speculate` picks, within its
        token budget for that match length; [] where it proposes nothing."""
        best = self.speculate(max_tokens)
        if not best.tokens:
            return []
        tree = self.tree if best.source == "request" else self.outputs.tree
        budget = min(max_tokens, int(best.match_len * self.max_spec_factor + 1e-6))
        return tree.branches(*best.state, widths, budget, self.min_token_prob)

    def finish(self) -> None:
        if self.outputs is not None:
            self.outputs.add(self.context[self.prompt_len:])

    def _best(self, tree: SuffixTree, states: list[tuple[int, int]], max_tokens: int, source: str) -> Draft:
        """The best-scoring draft over the match lengths of ``states`` (states[L - 1]: the context's last L
        tokens), the longer match on ties; a shorter match whose token budget cannot beat the best score is not
        tried, since the budget shrinks with L and a score never exceeds its draft's length."""
        best = Draft()
        for length in range(len(states), 0, -1):
            budget = min(max_tokens, int(length * self.max_spec_factor + 1e-6))
            if budget <= best.score:
                break
            tokens, probs = tree.draft(*states[length - 1], budget, self.min_token_prob)
            score = sum(probs)
            if score > best.score:
                best = Draft(tokens, list(range(-1, len(tokens) - 1)), probs, score, length, source,
                             states[length - 1])
        return best
