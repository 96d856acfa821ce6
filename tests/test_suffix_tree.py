"""Suffix decoding (pipeline/decoding/drafters/suffix_tree.py): counts against counting by hand and by brute force,
hand-checked speculations (frequencies, the probability threshold, the max_spec_factor and max_depth bounds),
speculation against a brute-force reference of the module docstring's rule, incremental against built at once,
the output cache and its bound."""

from __future__ import annotations

import random

import pytest

from pipeline.decoding.drafters.ngram import Rows
from pipeline.decoding.drafters.suffix_tree import Draft, OutputCache, SuffixDecoder, SuffixTree


def decoder(context, **kwargs) -> SuffixDecoder:
    d = SuffixDecoder(**kwargs)
    d.start(context)
    return d


# ------------------------------------------------------------------------ a brute-force reference of the rule

def occurrences(seqs, s):
    """(sequence, end) of every occurrence of s: its time, in the order the tree counts them."""
    return [(j, i + len(s)) for j, q in enumerate(seqs) for i in range(len(q) - len(s) + 1) if q[i:i + len(s)] == s]


def reference_draft(seqs, max_depth, s, budget, min_prob):
    tokens, probs, p = [], [], 1.0
    s = list(s)
    while len(tokens) < budget and len(s) < max_depth:
        found = occurrences(seqs, s)
        kids: dict[int, list] = {}
        for j, end in found:
            if end < len(seqs[j]):
                kids.setdefault(seqs[j][end], []).append((j, end + 1))
        if not kids:
            break
        # the largest count; ties: the child whose last (count-th) occurrence came first
        t = min(kids, key=lambda t: (-len(kids[t]), max(kids[t])))
        p *= len(kids[t]) / len(found)
        if p < min_prob:
            break
        tokens.append(t)
        probs.append(p)
        s.append(t)
    return tokens, probs


def reference_best(seqs, max_depth, context, budget, factor, min_prob):
    """(tokens, probs, match length) of the best-scoring draft, the longer match on ties."""
    best = ([], [], 0)
    for length in range(1, min(max_depth, len(context)) + 1):
        s = context[len(context) - length:]
        if not occurrences(seqs, s):
            break
        tokens, probs = reference_draft(seqs, max_depth, s, min(budget, int(length * factor + 1e-6)), min_prob)
        if tokens and sum(probs) >= sum(best[1]):
            best = (tokens, probs, length)
    return best


# ---------------------------------------------------------------------------------------------------- counts

def test_counts_by_hand():
    tree = SuffixTree(max_depth=3)
    tree.add([1, 2, 3, 1, 2, 4])
    assert tree.count([1, 2]) == 2
    assert tree.count([2]) == 2
    assert tree.count([1, 2, 3]) == 1
    assert tree.count([2, 4]) == 1
    assert tree.count([4, 1]) == 0
    assert tree.count([3, 1, 2, 4]) == 0       # longer than max_depth
    assert tree.count([]) == 6
    deep = SuffixTree(max_depth=4)
    deep.add([1, 2, 3, 1, 2, 4])
    assert deep.count([3, 1, 2, 4]) == 1


def test_counts_equal_brute_force_over_several_sequences_grown_in_chunks():
    rng = random.Random(0)
    for _ in range(60):
        vocab, max_depth = rng.choice([2, 3, 5]), rng.randint(1, 7)
        seqs = [[rng.randrange(vocab) for _ in range(rng.randint(0, 30))] for _ in range(rng.randint(1, 3))]
        tree = SuffixTree(max_depth)
        for seq in seqs:
            tree.add([])
            i = 0
            while i < len(seq):
                step = rng.randint(1, 5)
                tree.extend(seq[i:i + step])
                i += step
        for length in range(1, max_depth + 2):
            for s in {tuple(q[i:i + length]) for q in seqs for i in range(len(q) - length + 1)}:
                expected = len(occurrences(seqs, list(s))) if length <= max_depth else 0
                assert tree.count(s) == expected, (seqs, max_depth, s)


def test_leaf_compression_keeps_one_node_per_token_for_text_that_never_repeats():
    tree = SuffixTree(max_depth=24)
    tree.add(range(1000))
    assert len(tree) == 1 + 1000     # an uncompressed trie of the suffixes cut at 24 tokens: 1 + 23_724 nodes


# ------------------------------------------------------------------------------------------------ speculation

def test_speculation_by_hand():
    # (1, 2) occurred before the context's own: count 2, followed once by 3: probability 1/2, then the rest of that
    # one occurrence at 1/2; max_spec_factor 1 allows 2 tokens after a 2-token match
    assert decoder([1, 2, 3, 4, 5, 6, 1, 2]).speculate(10) == Draft(
        [3, 4], [-1, 0], [0.5, 0.5], 1.0, match_len=2, source="request")
    assert decoder([1, 2, 3, 4, 5, 6, 1, 2], max_spec_factor=2).propose(10) == [3, 4, 5, 6]
    assert decoder([1, 2, 3, 4, 5, 6, 1, 2], max_spec_factor=3).propose(10) == [3, 4, 5, 6, 1, 2]  # the end
    assert decoder([1, 2, 3, 4, 5, 6, 1, 2], max_spec_factor=3).propose(3) == [3, 4, 5]
    assert decoder([1, 2, 3, 4, 5, 6, 1, 2], min_token_prob=0.6).propose(10) == []
    # max_depth 4: a 2-token match leaves room for 2 tokens (score 1); the 1-token match gets 3 (score 1.5) and wins
    assert decoder([1, 2, 3, 4, 5, 6, 1, 2], max_depth=4, max_spec_factor=3).speculate(10) == Draft(
        [3, 4, 5], [-1, 0, 1], [0.5, 0.5, 0.5], 1.5, match_len=1, source="request")


def test_frequencies_pick_the_child_and_the_threshold_stops_the_chain():
    # (5, 1) occurs 4 times (the context's own last one included): followed by 7 twice, by 8 once; then along
    # 5 1 7 5 1 every count is 2, and there 7 and 8 follow once each: a tie, which 7 wins (it came first)
    context = [5, 1, 7, 5, 1, 7, 5, 1, 8, 5, 1]
    assert decoder(context, max_spec_factor=3, min_token_prob=0.2).speculate(10) == Draft(
        [7, 5, 1, 7, 5, 1], list(range(-1, 5)), [0.5, 0.5, 0.5, 0.25, 0.25, 0.25], 2.25, 2, "request")
    # at 0.3 the chain stops before the first token at 1/4; the 1-token match scores as much, the longer one wins
    assert decoder(context, max_spec_factor=3, min_token_prob=0.3).speculate(10) == Draft(
        [7, 5, 1], [-1, 0, 1], [0.5, 0.5, 0.5], 1.5, 2, "request")


def test_edge_cases():
    assert decoder([]).speculate(5) == Draft()
    assert decoder([3]).propose(5) == []
    assert decoder([1, 2, 3]).propose(5) == []                  # nothing repeats
    assert decoder([1, 2, 1, 2]).propose(0) == []
    for bad in ({"max_spec_factor": 0}, {"min_token_prob": 1.5}, {"max_depth": 0}):
        with pytest.raises(ValueError):
            SuffixDecoder(**bad)
    with pytest.raises(ValueError):
        OutputCache(max_outputs=0)


@pytest.mark.parametrize("with_outputs", [False, True])
def test_speculation_equals_the_brute_force_rule(with_outputs):
    rng = random.Random(1 + with_outputs)
    for _ in range(200):
        vocab, max_depth = rng.choice([2, 3, 4, 8]), rng.randint(1, 8)
        factor, min_prob = rng.choice([0.5, 1.0, 2.0]), rng.choice([0.0, 0.1, 0.4])
        outputs = [[rng.randrange(vocab) for _ in range(rng.randint(0, 25))] for _ in range(rng.randint(0, 3))]
        context = [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
        cache = OutputCache(max_depth) if with_outputs else None
        d = SuffixDecoder(max_depth, factor, min_prob, cache)
        cut = rng.randint(1, len(context))
        d.start(context[:cut])
        added = rng.randint(0, len(outputs))
        for out in outputs[:added] if cache else ():
            cache.add(out)
        d.speculate(3)                                # matched against the cache as it was
        for out in outputs[added:] if cache else ():
            cache.add(out)                            # ... which then changes under the request
        i = cut
        while i < len(context):
            step = rng.randint(1, 4)
            d.extend(context[i:i + step])
            i += step
            if rng.random() < 0.3:
                d.speculate(2)
        budget = rng.randint(0, 8)
        got = d.speculate(budget)
        own = reference_best([context], max_depth, context, budget, factor, min_prob)
        other = reference_best([o for o in outputs if o], max_depth, context, budget, factor, min_prob) \
            if cache else ([], [], 0)
        expected, source = (other, "outputs") if sum(other[1]) > sum(own[1]) else (own, "request")
        assert (got.tokens, got.probs) == expected[:2], (context, outputs, max_depth, budget, got)
        if got.tokens:
            assert (got.match_len, got.source, got.score) == (expected[2], source, sum(expected[1]))


def test_incremental_equals_started_at_once():
    rng = random.Random(3)
    for _ in range(50):
        context = [rng.randrange(4) for _ in range(rng.randint(1, 60))]
        grown = decoder(context[:1], max_spec_factor=2)
        for i in range(1, len(context)):
            grown.extend(context[i:i + 1])
            assert grown.speculate(6) == decoder(context[:i + 1], max_spec_factor=2).speculate(6)


# ------------------------------------------------------------------------------------------- the output cache

def test_finished_outputs_serve_later_requests():
    cache = OutputCache()
    first = SuffixDecoder(outputs=cache)
    first.start([9, 9])
    first.extend([1, 2, 3, 4])
    later = SuffixDecoder(outputs=cache)
    later.start([5, 1, 2])
    assert later.propose(4) == []            # nothing cached yet
    first.finish()                           # its output, without its prompt
    assert cache.tree.seqs == [[1, 2, 3, 4]]
    assert later.speculate(4) == Draft([3, 4], [-1, 0], [1.0, 1.0], 2.0, 2, "outputs")
    SuffixDecoder(outputs=cache).finish()    # no tokens: nothing added
    assert len(cache.tree.seqs) == 1


def test_the_output_cache_drops_its_oldest_half_past_its_bound():
    cache = OutputCache(max_depth=4, max_outputs=4)
    outputs = [[i, i + 100] for i in range(5)]
    for out in outputs[:4]:
        cache.add(out)
    assert cache.tree.seqs == outputs[:4]
    cache.add(outputs[4])
    assert cache.tree.seqs == outputs[3:]    # the newest ceil(4 / 2)
    assert cache.tree.count([0]) == 0 and cache.tree.count([3, 103]) == 1
    assert cache.version == 5


def test_rows_hold_suffix_decoders_too():
    cache = OutputCache()
    rows = Rows(lambda: SuffixDecoder(outputs=cache))
    rows.start([[1, 2, 3, 1, 2], [7, 8]])
    assert rows.propose(4) == [[3, 1], []]
    rows.extend([[3, 1, 2], [3]])
    rows[0].finish()                          # row 0's output, 3 1 2, is cached
    rows.select([1])
    assert rows.propose(4) == [[1]]           # row 1 ends with 3, which the output continued with 1
