"""Prompt lookup (pipeline/decoding/drafters/ngram.py): hand-checked proposals, edge cases, a brute-force scan, the
incremental index against one built at once, and transformers' PromptLookupCandidateGenerator token for token."""

from __future__ import annotations

import random

import pytest
import torch

from pipeline.decoding.drafters.ngram import NgramIndex, Rows


def index(tokens, *args, **kwargs) -> NgramIndex:
    idx = NgramIndex(*args, **kwargs)
    idx.start(tokens)
    return idx


def scan(tokens, max_tokens, min_n, max_n, occurrence, stop_ids=()):
    """The module docstring's rule, by scanning every earlier window."""
    m = len(tokens)
    if max_tokens <= 0:
        return []
    for n in range(max_n, min_n - 1, -1):
        starts = [p for p in range(m - n) if tokens[p:p + n] == tokens[m - n:]]
        if starts:
            p = starts[0] if occurrence == "first" else starts[-1]
            proposal = tokens[p + n:min(p + n + max_tokens, m)]
            cut = [i for i, t in enumerate(proposal) if t in stop_ids]
            return proposal[:cut[0]] if cut else proposal
    return []


def test_hand_checked_proposals():
    # vLLM's docstring example: [4, 2, 3] has no earlier occurrence, [2, 3] has one; three tokens follow it
    assert index([1, 2, 3, 4, 2, 3], 2, 3).propose(4) == [4, 2, 3]
    # the longest n decides: (1, 2) follows at 2, while 2 alone first occurs at 0
    tokens = [2, 5, 1, 2, 6, 8, 2, 7, 1, 2]
    assert index(tokens, 1, 2).propose(3) == [6, 8, 2]
    assert index(tokens, 1, 1).propose(3) == [5, 1, 2]
    # first against last occurrence
    tokens = [1, 2, 3, 1, 2, 4, 1, 2]
    assert index(tokens, 2, 2, "first").propose(3) == [3, 1, 2]
    assert index(tokens, 2, 2, "last").propose(3) == [4, 1, 2]
    # overlapping occurrences: the last one's continuation stops at the context's end
    assert index([7, 7, 7, 7], 2, 2, "first").propose(5) == [7, 7]
    assert index([7, 7, 7, 7], 2, 2, "last").propose(5) == [7]


def test_edge_cases():
    assert index([], 1, 3).propose(4) == []
    assert index([5], 1, 3).propose(4) == []
    assert index([1, 2, 3], 1, 3).propose(4) == []                  # no token repeats
    assert index([1, 2, 1], 1, 5).propose(10) == [2, 1]             # n > context: shorter n; never past the end
    assert index([1, 2, 3, 9, 2, 3], 3, 4).propose(4) == []         # only a 2-gram repeats, min_n is 3
    assert index([1, 2, 1], 1, 3).propose(0) == []
    assert index([1, 2, 1], 1, 3).propose(-1) == []
    for bad in ({"min_n": 0}, {"min_n": 3, "max_n": 2}, {"occurrence": "best"}):
        with pytest.raises(ValueError):
            NgramIndex(**bad)


def test_a_proposal_ends_before_its_first_stop_token_and_does_not_fall_back():
    tokens = [1, 2, 3, 0, 4, 9, 2, 0, 1, 2]
    assert index(tokens, 1, 2, stop_ids=[0]).propose(5) == [3]
    # the 2-gram (1, 2) decides even when its continuation is cut to nothing, where (2,) alone proposes
    tokens = [2, 3, 1, 2, 0, 1, 2]
    assert index(tokens, 1, 2, stop_ids=[0]).propose(5) == []
    assert index(tokens, 1, 1, stop_ids=[0]).propose(5) == [3, 1, 2]


@pytest.mark.parametrize("occurrence", ["first", "last"])
def test_incremental_equals_built_at_once_equals_the_scan(occurrence):
    rng = random.Random(0)
    for _ in range(150):
        vocab, length = rng.choice([2, 3, 5, 30]), rng.randint(0, 80)
        min_n = rng.randint(1, 3)
        max_n = rng.randint(min_n, 5)
        stop_ids = {rng.randrange(vocab)} if rng.random() < 0.3 else set()
        tokens = [rng.randrange(vocab) for _ in range(length)]
        grown = index(tokens[:rng.randint(0, length)], min_n, max_n, occurrence, stop_ids)
        while len(grown.tokens) < length:
            grown.extend(tokens[len(grown.tokens):len(grown.tokens) + rng.randint(1, 4)])
            m = len(grown.tokens)
            at_once = index(tokens[:m], min_n, max_n, occurrence, stop_ids)
            for k in (1, 3, 10):
                expected = scan(tokens[:m], k, min_n, max_n, occurrence, stop_ids)
                assert grown.propose(k) == at_once.propose(k) == expected, (tokens[:m], min_n, max_n, k)


def test_first_occurrence_is_transformers_prompt_lookup_token_for_token():
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    rng = random.Random(1)
    compared = proposing = 0
    for _ in range(60):
        vocab, length = rng.choice([2, 3, 6, 40]), rng.randint(2, 70)
        max_n, k, eos = rng.randint(1, 4), rng.randint(1, 10), rng.randrange(vocab)
        tokens = [rng.randrange(vocab) for _ in range(length)]
        theirs = PromptLookupCandidateGenerator(eos_token_id=torch.tensor([eos]), num_output_tokens=k,
                                                max_matching_ngram_size=max_n, max_length=10 ** 6)
        ours = index(tokens[:1], 1, max_n, "first", [eos])
        for m in range(2, length + 1):
            ours.extend(tokens[m - 1:m])
            candidates, _ = theirs.get_candidates(torch.tensor([tokens[:m]]))
            expected = candidates[0, m:].tolist()
            assert ours.propose(k) == expected, (tokens[:m], max_n, k, eos)
            compared += 1
            proposing += bool(expected)
    assert proposing > compared // 3   # the comparison covers matches, not only empty proposals


def test_rows_start_extend_propose_select_and_add():
    rows = Rows(lambda: NgramIndex(1, 2))
    rows.start([[1, 2, 3, 1], [4, 5, 4]])
    assert len(rows) == 2
    assert rows.propose(2) == [[2, 3], [5, 4]]
    rows.extend([[2], []])
    assert rows.propose([1, 0]) == [[3], []]
    rows.add([[6, 6]])
    rows.select([2, 0])
    assert [r.tokens for r in rows.rows] == [[6, 6], [1, 2, 3, 1, 2]]
    assert rows[1].propose(5) == [3, 1, 2]
    with pytest.raises(ValueError):
        rows.extend([[1]])
    with pytest.raises(ValueError):
        rows.propose([1, 2, 3])
