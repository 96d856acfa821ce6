"""Per-example randomness (pipeline/rng.py): stable seeds, per-row draws that follow dropped rows, and an example's
tokens independent of its batch, its position in it and its companions."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from tiny_models import PROMPTS, load_saved_pair

from pipeline.decoding.draft_policy import DraftPolicy
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.rng import RowGenerators, example_seed, rand
from pipeline.samplers import get_sampler
from pipeline.samplers.contract import uniforms

EOS = 1


def test_example_seeds_are_the_same_in_every_process_and_differ_by_seed_and_id():
    code = "from pipeline.rng import example_seed; print(example_seed(7, 'p3'), example_seed(7, 3))"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}   # Python's own str hash would change with this
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == [str(example_seed(7, "p3")), str(example_seed(7, 3))]
    seeds = {example_seed(s, i) for s in (0, 1) for i in ("p0", "p1", "p10")}
    assert len(seeds) == 6 and all(0 <= s < 2**63 for s in seeds)


def test_each_row_draws_from_its_own_stream_and_follows_dropped_rows():
    ids = ["a", "b", "c"]
    rows = RowGenerators(0, ids, "cpu")
    alone = {i: RowGenerators(0, [i], "cpu") for i in ids}
    first = rows.rand((3, 4))
    assert first.shape == (3, 4) and first.dtype == torch.float32
    for k, i in enumerate(ids):
        assert torch.equal(first[k], alone[i].rand((1, 4))[0])
    rows.follow([0, 2])                                   # row "b" finished and was dropped
    second = rows.rand((2, 5))
    assert torch.equal(second[0], alone["a"].rand((1, 5))[0]) and torch.equal(second[1], alone["c"].rand((1, 5))[0])
    assert rows.row_generator(1) is rows.generators[2]
    with pytest.raises(ValueError, match="active rows"):
        rows.rand((3, 5))
    with pytest.raises(IndexError):
        rows.follow([3])


def test_the_uniform_helper_keeps_the_plain_generator_path_and_takes_row_generators():
    plain = uniforms(3, 2, torch.device("cpu"), torch.Generator().manual_seed(4))
    assert torch.equal(plain, torch.rand((3, 3), generator=torch.Generator().manual_seed(4)))
    assert torch.equal(rand(torch.Generator().manual_seed(4), (3, 3), "cpu"), plain)
    per_row = uniforms(2, 2, torch.device("cpu"), RowGenerators(4, ["x", "y"], "cpu"))
    assert torch.equal(per_row, RowGenerators(4, ["x", "y"], "cpu").rand((2, 3)))
    assert not torch.equal(per_row, plain[:2])


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return load_saved_pair(tmp_path_factory.mktemp("rng"))


def _decode(pair, sampler: str, idx: list[int], seed: int = 0, gamma: int = 3, policy: DraftPolicy | None = None,
            temperature: float = 1.0, stats: list | None = None) -> dict[int, list[int]]:
    target, draft, tok = pair
    enc = tok([PROMPTS[i] for i in idx], return_tensors="pt", padding=True)
    engine = SpeculativeEngine(target, draft, get_sampler(sampler, temperature=temperature), gamma=gamma, device="cpu",
                               eos_token_ids=[EOS], pad_token_id=0, draft_policy=policy)
    rows = RowGenerators(seed, [f"p{i}" for i in idx], "cpu")
    result = engine.generate(enc.input_ids, enc.attention_mask, 16, rows)
    if stats is not None:
        stats.append(result)
    return dict(zip(idx, result.tokens))


@pytest.mark.parametrize("sampler", ["exact", "sigmoid"])
def test_an_examples_tokens_do_not_depend_on_its_batch(pair, sampler):
    alone = {i: _decode(pair, sampler, [i])[i] for i in range(len(PROMPTS))}
    assert len({tuple(t) for t in alone.values()}) > 1
    for batch in ([0, 1, 2, 3], [3, 2, 1, 0], [4, 0, 2, 1], [1, 3, 4, 2]):   # every position, other companions
        assert _decode(pair, sampler, batch) == {i: alone[i] for i in batch}
    assert _decode(pair, sampler, [0, 1, 2, 3], seed=1) != {i: alone[i] for i in range(4)}   # the seed matters


def test_gamma_zero_draws_per_row_too(pair):
    alone = {i: _decode(pair, "exact", [i], gamma=0)[i] for i in range(4)}
    assert _decode(pair, "exact", [2, 0, 3, 1], gamma=0) == alone


ADAPTIVE = {"heuristic": DraftPolicy("heuristic", 0.0, 6), "confidence": DraftPolicy("constant", 0.6, 6),
            "both": DraftPolicy("heuristic", 0.5, 6)}


@pytest.mark.parametrize("sampler,temperature", [("exact", 1.0), ("sigmoid", 1.0), ("block", 1.0), ("exact", 0.7)])
@pytest.mark.parametrize("policy", list(ADAPTIVE))
def test_with_an_adaptive_draft_length_an_examples_tokens_do_not_depend_on_its_batch(pair, policy, sampler,
                                                                                   temperature):
    """Rows of one batch draft different lengths (the step drafts the longest): each row is verified with its own
    length and draws only its own uniforms, so it decodes as it does at batch size 1. The batches did mix lengths."""
    run = {"policy": ADAPTIVE[policy], "sampler": sampler, "temperature": temperature, "gamma": 2}
    alone = {i: _decode(pair, idx=[i], **run)[i] for i in range(len(PROMPTS))}
    assert len({tuple(t) for t in alone.values()}) > 1
    results = []
    for batch in ([0, 1, 2, 3], [3, 2, 1, 0], [4, 0, 2, 1]):
        assert _decode(pair, idx=batch, stats=results, **run) == {i: alone[i] for i in batch}
    # some step padded a row: a row drafted fewer positions than the step (the drafted counts are per row)
    steps = [s["verify_steps"] for r in results for s in r.row_stats]
    drafted = [s["drafted"] for r in results for s in r.row_stats]
    assert any(d < 6 * n for d, n in zip(drafted, steps))
    assert any(len({s["drafted"] / s["verify_steps"] for s in r.row_stats}) > 1 for r in results)


@pytest.mark.parametrize("policy", [None, "both"])
def test_seeded_rows_decode_as_a_plain_generator_alone_and_the_same_in_any_batch(pair, policy):
    """RowGenerators.from_seeds (a server's per-request seeds): a row seeded S decodes alone to what one plain
    generator seeded S gives at batch size 1 (the last steps cut to the row's own room, as that generator's are),
    and to the same tokens inside a batch of rows with other seeds and other lengths left."""
    target, draft, tok = pair
    engine = SpeculativeEngine(target, draft, get_sampler("exact", temperature=1.0), gamma=3, device="cpu",
                               eos_token_ids=[EOS], pad_token_id=0, draft_policy=ADAPTIVE[policy] if policy else None)

    def decode(idx, generator, new_tokens=11):
        enc = tok([PROMPTS[i] for i in idx], return_tensors="pt", padding=True)
        return engine.generate(enc.input_ids, enc.attention_mask, new_tokens, generator).tokens

    seeds = [11, 12, 13, 14]
    plain = {i: decode([i], torch.Generator().manual_seed(seeds[i]))[0] for i in range(4)}
    assert {i: decode([i], RowGenerators.from_seeds([seeds[i]], "cpu"))[0] for i in range(4)} == plain
    batch = [2, 0, 3, 1]
    together = decode(batch, RowGenerators.from_seeds([seeds[i] for i in batch], "cpu"))
    assert dict(zip(batch, together)) == plain
    assert len({len(t) for t in plain.values()}) > 1 or len({tuple(t) for t in plain.values()}) > 1
