"""Token trees from drafters without a draft model (pipeline/decoding/drafters/lookup.py): several prompt-lookup
matches or suffix-tree branches per step, merged into a trie that fits ``--draft-tree``'s widths.

  shape      the trie shares prefixes, keeps the first match first and never exceeds the widths; the proposers
             rank their matches (prompt lookup: the chain's match, then more recent ones; suffix decoding: counts)
  padding    a row with a smaller tree than the step's is verified exactly as its own tree (same uniforms, same
             result), and the emitted token after its own leaf is a bonus
  lossless   at T = 0 the output is the target alone (GPT-2 and Llama, batched with padding); at T = 1 the first two
             tokens follow the target (chi-square), and keeping a rejected child in p fails the same test
  gain       on a repetitive fixture a tree accepts at least as many tokens per step as the chain of its depth on
             every prompt (paired), and a 1,1,1 tree is that chain exactly
  syncs      a tree step adds no host sync to the chain's
  cli        `specsweep run --drafter prompt-lookup --draft-tree 3,2,1` and `--drafter suffix`; the grid and the
             search space take trees with these drafters
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from stat_utils import THRESHOLD, chisquare_pvalue, counts, target_laws
from sync_detector import NoHostSync
from tiny_models import load_saved_pair

from pipeline.config import RunConfig
from pipeline.decoding.drafters.lookup import prompt_lookup, suffix_decoding
from pipeline.decoding.drafters.ngram import NgramIndex
from pipeline.decoding.drafters.suffix_tree import SuffixDecoder
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.errors import SpecsweepError
from pipeline.origins import ACCEPTED, BONUS
from pipeline.samplers import get_sampler
from pipeline.samplers.tree import TreeSampler, TreeVerifier, tree_greedy_verify, tree_rejection_verify
from pipeline.tree_shape import TokenTree, place_paths

torch.set_num_threads(1)
EOF_ID = 1
REPEATING = ["the storm hit the city and the storm hit the",
             "police said the plane was late police said the plane",
             "a new report a new report a new",
             "water"]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    loaded = {}

    def load(kind: str):
        if kind not in loaded:
            loaded[kind] = load_saved_pair(tmp_path_factory.mktemp(kind), kind=kind)
        return loaded[kind]
    return load


def drafter(name: str, widths):
    widths = None if widths is None else tuple(widths)
    if name == "prompt-lookup":
        return prompt_lookup(1, 3, [EOF_ID], widths)
    return suffix_decoding(24, 2.0, 0.1, False, widths)


def engine(target, name: str, widths, temperature: float, eos=(EOF_ID,), sampler=None):
    n = TokenTree.from_widths(widths).n_nodes
    sampler = sampler or TreeSampler(get_sampler("exact", temperature=temperature))
    return SpeculativeEngine(target, drafter(name, widths), sampler, gamma=n, device="cpu", eos_token_ids=list(eos),
                             pad_token_id=0)


# ---- the shape ------------------------------------------------------------------------------------------------------

def test_matches_merge_into_a_trie_that_fits_the_widths():
    shape = TokenTree.from_widths((3, 2, 1))
    placed = place_paths([[5, 6, 7], [5, 8, 9], [5, 6, 1], [2, 3], [4], [9, 9]], (3, 2, 1), 3)
    # 5 is the root's first child and 6 its first child (the first match first); [5, 6, 1] finds 6's one slot
    # taken, [9, 9] finds the root's three taken
    assert placed == {0: 5, 3: 6, 9: 7, 4: 8, 10: 9, 1: 2, 5: 3, 2: 4}
    tree = shape.subtree(placed)
    assert tree.parents == (-1, -1, -1, 0, 0, 1, 3, 4) and tree.depth == 3
    assert place_paths([[5, 6, 7], [5, 8, 9]], (3, 2, 1), 1) == {0: 5}       # a row's room caps its depth
    assert place_paths([], (3, 2, 1), 3) == {}
    with pytest.raises(SpecsweepError, match="leave out a parent"):
        shape.subtree([0, 9])


def test_prompt_lookup_ranks_the_chains_match_first_then_more_recent_ones():
    index = NgramIndex(1, 3, "first", [EOF_ID], every=True)
    index.start([4, 5, 6, 7, 4, 5, 8, 9, 4, 5, 6, 2, 4, 5])
    chain = NgramIndex(1, 3, "first", [EOF_ID])
    chain.start(index.tokens)
    many = index.propose_many(3, (3, 2, 1))
    assert many[0] == chain.propose(3) == [6, 7, 4]
    assert many[1:] == [[6, 2, 4], [8, 9, 4]]             # the other occurrences of (4, 5), the latest first
    index.extend([1, 3])
    assert all(EOF_ID not in m for m in index.propose_many(3, (2,)))
    with pytest.raises(ValueError, match="every=True"):
        chain.propose_many(3, (2,))


def test_suffix_decoding_branches_follow_the_trees_counts():
    decoder = SuffixDecoder(24, 4.0, 0.0)
    # after "1 2": 3 three times, 4 twice, 5 once; after "1 2 3": 6 twice, 7 once
    decoder.start([1, 2, 3, 6, 1, 2, 4, 1, 2, 3, 7, 1, 2, 3, 6, 1, 2, 4, 1, 2, 5, 1, 2])
    branches = decoder.propose_many(2, (2, 2))
    assert branches[0] == decoder.propose(2)                # the chain's draft is the first branch
    assert [b[0] for b in branches] == [3, 3, 4, 4][: len(branches)] and branches[:2] == [[3, 6], [3, 7]]
    assert len({b[0] for b in branches}) <= 2                # two children of the root at most
    assert SuffixDecoder(24, 1.0, 0.9).propose_many(3, (2,)) == []


# ---- padding nodes --------------------------------------------------------------------------------------------------

def test_a_row_with_a_smaller_tree_is_verified_as_its_own_tree():
    """Rows whose trees are parts of the step's tree, at T = 1 and T = 0: the same accepted count, path (mapped to
    the step's nodes) and emitted token as the row's own tree verified alone with the same uniforms."""
    g = torch.Generator().manual_seed(0)
    step = TokenTree.from_widths((3, 2))                                      # 9 nodes
    owns = [[0, 1, 3, 4], [0, 3], list(range(9)), [0, 1, 2, 5, 7]]
    B, V = 64, 7
    real = torch.zeros(B, step.n_nodes, dtype=torch.bool)
    for b in range(B):
        real[b, owns[b % 4]] = True
    tokens = torch.randint(0, V, (B, step.n_nodes), generator=g)
    logits = torch.randn(B, step.n_nodes + 1, V, generator=g) * 2
    p = torch.softmax(logits, -1)
    u = torch.rand(B, step.n_nodes + 1, generator=g)
    acc, path, nxt = tree_rejection_verify(step, tokens, p, None, u, real=real)
    gacc, gpath, gnxt = tree_greedy_verify(step, tokens, logits, real)
    for b in range(B):
        nodes = owns[b % 4]
        own = step.subtree(nodes)
        positions = [0, *[n + 1 for n in nodes]]
        cols = [*nodes, step.n_nodes]
        a, pa, x = tree_rejection_verify(own, tokens[b:b + 1, nodes], p[b:b + 1, positions], None, u[b:b + 1, cols])
        mapped = [nodes[i] if i >= 0 else -1 for i in pa[0].tolist()]
        assert (int(acc[b]), path[b, : own.depth].tolist(), int(nxt[b])) == (int(a[0]), mapped, int(x[0]))
        a, pa, x = tree_greedy_verify(own, tokens[b:b + 1, nodes], logits[b:b + 1, positions])
        mapped = [nodes[i] if i >= 0 else -1 for i in pa[0].tolist()]
        assert (int(gacc[b]), gpath[b, : own.depth].tolist(), int(gnxt[b])) == (int(a[0]), mapped, int(x[0]))
    assert 0 < int(acc.sum()) and 0 < int(gacc.sum())
    with pytest.raises(Exception, match="real must be bool"):
        TreeVerifier(1.0)(step, tokens, None, logits, real=real[:, :3])


def test_the_token_after_a_rows_own_leaf_is_a_bonus(pairs):
    """A row that accepted down to a node without children of its own emitted a bonus token (not a corrected one),
    though the step's tree goes deeper (Proposal.bonus, which the loop's origins read); in the loop the accepted
    counts are the accepted origins."""
    from pipeline.decoding.drafters.base import Proposal

    step = TokenTree.from_widths((2, 2))                                   # nodes 0, 1; 2, 3 below 0; 4, 5 below 1
    real = torch.tensor([[True, True, True, False, False, False],          # node 1 has no children of its own
                         [True, True, True, True, True, True],
                         [True, False, False, False, False, False]])
    proposal = Proposal(torch.zeros(3, 6, dtype=torch.int64), None, tree=step, real=real)
    path = torch.tensor([[1, -1], [1, -1], [-1, -1]])
    accepted = (path >= 0).sum(1)
    assert proposal.bonus(accepted, path).tolist() == [True, False, False]
    assert proposal.bonus(torch.tensor([2, 2, 1]), torch.tensor([[0, 2], [1, 5], [0, -1]])).tolist() == [True] * 3
    target, _, tok = pairs("gpt2")
    enc = tok(REPEATING, return_tensors="pt", padding=True)
    res = engine(target, "prompt-lookup", (3, 2, 1), 0.0).generate(enc.input_ids, enc.attention_mask, 24)
    for stats, origins in zip(res.row_stats, res.origins):
        assert stats["accepted"] == sum(o == ACCEPTED for o in origins)
    assert any(o == BONUS for row in res.origins for o in row)


# ---- lossless --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("name", ["prompt-lookup", "suffix"])
def test_greedy_tree_decoding_is_the_target_alone(pairs, kind, name):
    target, _, tok = pairs(kind)
    enc = tok(REPEATING, return_tensors="pt", padding=True)
    reference = SpeculativeEngine(target, None, get_sampler("greedy"), gamma=0, device="cpu", eos_token_ids=[EOF_ID],
                                  pad_token_id=0).generate(
        enc.input_ids, enc.attention_mask, 24).tokens
    for widths in ((3, 2, 1), (2, 2)):
        result = engine(target, name, widths, 0.0).generate(enc.input_ids, enc.attention_mask, 24)
        assert result.tokens == reference, widths
        assert sum(s["accepted"] for s in result.row_stats) > 0 and result.extra["draft_forwards"] == 0
    one = tok(REPEATING[1], return_tensors="pt")
    assert engine(target, name, (3, 2, 1), 0.0).generate(one.input_ids, one.attention_mask, 24).tokens \
        == [reference[1]]


@pytest.fixture(scope="module")
def echo(pairs) -> str:
    """A prompt where lookup matches are taken at T = 1: a phrase, the target's greedy continuation, the phrase
    again, another continuation, the phrase (so the phrase's n-grams have two continuations)."""
    target, _, tok = pairs("gpt2")
    phrase = "a new report"
    enc = tok(phrase, return_tensors="pt")
    greedy = SpeculativeEngine(target, None, get_sampler("greedy"), gamma=0, device="cpu", eos_token_ids=[],
                               pad_token_id=0).generate(
        enc.input_ids, enc.attention_mask, 8).tokens[0]
    return f"{phrase} police said {phrase} {tok.decode(greedy)} {phrase}"


def _first_two(eng, tok, prompt: str, n: int = 4000) -> tuple[np.ndarray, int]:
    """The first two tokens of n rows [n, 2] and the accepted draft tokens; the first step proposed a tree of more
    nodes than its depth (siblings were on offer)."""
    enc = tok([prompt] * n, return_tensors="pt")
    drafted = []
    result = eng.generate(enc.input_ids, enc.attention_mask, 3, torch.Generator().manual_seed(3),
                          on_step=lambda rows, tokens, accepted, finished, own: drafted.append(max(own)))
    assert drafted[0] > 3, drafted
    return np.array([row[:2] for row in result.tokens]), sum(s["accepted"] for s in result.row_stats)


def _fit(target, tok, echo, out) -> tuple[float, float]:
    V = target.config.vocab_size
    (first, _), joint = target_laws(target, tok(echo, return_tensors="pt").input_ids, 1.0, 2)
    return (chisquare_pvalue(counts(out[:, 0], V), first),
            chisquare_pvalue(counts(out[:, 0] * V + out[:, 1], V * V), joint.flatten()))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["prompt-lookup", "suffix"])
def test_tree_sampling_keeps_the_target_law(pairs, echo, name):
    target, _, tok = pairs("gpt2")
    out, accepted = _first_two(engine(target, name, (3, 2, 1), 1.0, eos=()), tok, echo)
    assert accepted > 0.2 * len(out)                     # matches were on offer and taken
    p = _fit(target, tok, echo, out)
    assert min(p) > THRESHOLD, f"{name} tree at T = 1: p = {p}"


class _KeepRejected(TreeSampler):
    """WRONG: a rejected deterministic child stays in p (the residual is p itself)."""

    def __call__(self, draft_tokens, draft_logits, target_logits, generator=None, lengths=None, tree=None,
                 replacement=True, real=None):
        if tree is None:
            return super().__call__(draft_tokens, draft_logits, target_logits, generator, lengths)
        keep = TreeVerifier(1.0, replacement, residual_fn=lambda p, q, x: p)
        return keep(tree, draft_tokens, draft_logits, target_logits, generator, real)


@pytest.mark.slow
def test_negative_control_keeping_a_rejected_match_in_p_fails(pairs, echo):
    target, _, tok = pairs("gpt2")
    wrong = _KeepRejected(get_sampler("exact", temperature=1.0))
    out, _ = _first_two(engine(target, "prompt-lookup", (3, 2, 1), 1.0, eos=(), sampler=wrong), tok, echo)
    assert min(_fit(target, tok, echo, out)) <= THRESHOLD, "the test has no power"


# ---- the gain over a chain ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def repetitive(pairs):
    """12 prompts (token ids [12, L], left-padded, and their mask), each four short random starts followed by the
    target's own greedy continuation: the target's later text repeats n-grams seen with several continuations."""
    target, _, _ = pairs("gpt2")
    V = target.config.vocab_size
    g = torch.Generator().manual_seed(0)
    alone = SpeculativeEngine(target, None, get_sampler("greedy"), gamma=0, device="cpu", eos_token_ids=[],
                              pad_token_id=0)
    prompts = []
    for _ in range(12):
        parts: list[int] = []
        for _ in range(4):
            start = torch.randint(3, V, (1, 3), generator=g)
            parts += start[0].tolist() + alone.generate(start, torch.ones_like(start), 10).tokens[0]
        prompts.append(parts)
    L = max(map(len, prompts))
    ids = torch.tensor([[0] * (L - len(p)) + p for p in prompts])
    return ids, torch.arange(L) >= L - torch.tensor([len(p) for p in prompts])[:, None]


def _tokens_per_step(result) -> list[float]:
    return [s["new_tokens"] / s["verify_steps"] for s in result.row_stats]


@pytest.mark.parametrize("name", ["prompt-lookup", "suffix"])
def test_a_tree_accepts_at_least_the_chain_of_its_depth(pairs, repetitive, name):
    """Paired on the same prompts at T = 0 (the same tokens: the target's), the 3,2,1 tree's tokens per step are
    at least the depth-3 chain's on every prompt and more on most; a 1,1,1 tree is the chain step for step."""
    target, _, _ = pairs("gpt2")
    ids, mask = repetitive
    chain = SpeculativeEngine(target, drafter(name, None), get_sampler("exact", temperature=0.0), gamma=3, device="cpu",
                              eos_token_ids=[], pad_token_id=0)
    chain_res = chain.generate(ids, mask, 40)
    tree_res = engine(target, name, (3, 2, 1), 0.0, eos=()).generate(ids, mask, 40)
    line = engine(target, name, (1, 1, 1), 0.0, eos=()).generate(ids, mask, 40)
    assert tree_res.tokens == chain_res.tokens == line.tokens
    assert [s["verify_steps"] for s in line.row_stats] == [s["verify_steps"] for s in chain_res.row_stats]
    diff = np.array(_tokens_per_step(tree_res)) - np.array(_tokens_per_step(chain_res))
    assert (diff >= 0).all() and (diff > 0).mean() > 0.5, diff


# ---- syncs -----------------------------------------------------------------------------------------------------------

def test_a_tree_step_adds_no_host_sync(pairs):
    target, _, tok = pairs("gpt2")
    enc = tok(REPEATING[:3], return_tensors="pt", padding=True)
    found = {}
    for widths in (None, (3, 2, 1)):
        if widths is None:
            eng = SpeculativeEngine(target, drafter("prompt-lookup", None), get_sampler("exact", temperature=1.0),
                                    gamma=3, device="cpu", eos_token_ids=[], pad_token_id=0)
        else:
            eng = engine(target, "prompt-lookup", widths, 1.0, eos=())
        with NoHostSync() as mode:
            res = eng.generate(enc.input_ids, enc.attention_mask, 16, torch.Generator().manual_seed(0))
        found[widths] = (len(mode.syncs) / res.verify_steps, sorted(set(mode.syncs)))
        assert res.verify_steps >= 4
    assert found[(3, 2, 1)][0] <= found[None][0], found


# ---- settings, the CLI, grids and studies ----------------------------------------------------------------------------

def test_tree_settings_with_a_drafter_without_a_model(tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"id": "a", "prompt": "x"}) + "\n")
    base = {"target": "t", "data": str(data), "drafter": "suffix", "draft_tree": "3,2,1"}
    config = RunConfig.from_dict(base).validate_decoding()
    assert config.gamma == 15 and config.tree_children == "top-k"
    with pytest.raises(SpecsweepError, match="deterministic children") as e:
        RunConfig.from_dict({**base, "tree_children": "with-replacement"}).validate_decoding()
    assert "\n" not in str(e.value)
    with pytest.raises(SpecsweepError, match="--sampler exact or greedy"):
        RunConfig.from_dict({**base, "sampler": "sigmoid"}).validate_decoding()
    # the tree kernel skips a row's padding nodes as the reference does (tests/test_tree_verify_cpu.py)
    assert RunConfig.from_dict({**base, "backend": "cupy"}).validate_decoding().gamma == 15
    with pytest.raises(SpecsweepError, match="no --verify-graphs") as e:
        RunConfig.from_dict({**base, "backend": "cupy", "verify_graphs": True, "device": "cuda"}).validate_decoding()
    assert "\n" not in str(e.value)


def _lookup_run_args(tmp_path, name: str, device: str = "cpu") -> list[str]:
    """`specsweep run` arguments for a lookup drafter on the tiny GPT-2 target and the repeating prompts, at T = 0
    (no --out, --draft-tree or --gamma)."""
    root = tmp_path / "pair"
    load_saved_pair(root, kind="gpt2")
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i}", "prompt": p}) + "\n" for i, p in enumerate(REPEATING)))
    return ["run", "--target", str(root / "target"), "--drafter", name, "--data", str(data), "--device", device,
            "--temperature", "0", "--max-new-tokens", "12", "--repeats", "3", "--samples-per-repeat", "2",
            "--threads", "1", "--no-progress"]


@pytest.mark.parametrize("name", ["prompt-lookup", "suffix"])
def test_specsweep_run_with_a_lookup_tree(tmp_path, name):
    from pipeline.cli import main

    common = _lookup_run_args(tmp_path, name)
    assert main([*common, "--draft-tree", "3,2,1", "--out", str(tmp_path / "tree.json")]) == 0
    assert main([*common, "--gamma", "0", "--out", str(tmp_path / "alone.json")]) == 0
    tree = json.loads((tmp_path / "tree.json").read_text())
    alone = json.loads((tmp_path / "alone.json").read_text())
    assert [s["token_ids"] for s in tree["samples"]] == [s["token_ids"] for s in alone["samples"]]
    assert tree["config"]["draft_tree"] == "3,2,1" and tree["config"]["gamma"] == 15
    assert tree["resolved"]["drafter"]["draft_tree"] == [3, 2, 1]
    assert tree["metrics"]["accepted_tokens"] > 0 and tree["metrics"]["draft_forwards"] == 0
    assert len(tree["metrics"]["accepted_histogram"]) == 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_specsweep_run_with_a_lookup_tree_on_the_kernel(tmp_path):
    """`specsweep run --drafter prompt-lookup --draft-tree 3,2,1 --backend cupy` (the tree kernel skipping each row's
    padding nodes) emits the tokens of `--backend torch` (on the CPU runtime: tests/test_tree_verify_cpu.py)."""
    from pipeline.cli import main

    common = [*_lookup_run_args(tmp_path, "prompt-lookup", "cuda"), "--draft-tree", "3,2,1"]
    for backend in ("cupy", "torch"):
        assert main([*common, "--backend", backend, "--out", str(tmp_path / f"{backend}.json")]) == 0
    runs = [json.loads((tmp_path / f"{backend}.json").read_text()) for backend in ("cupy", "torch")]
    assert [s["token_ids"] for s in runs[0]["samples"]] == [s["token_ids"] for s in runs[1]["samples"]]
    assert runs[0]["config"]["backend"] == "cupy" and runs[0]["metrics"]["accepted_tokens"] > 0


def test_the_grid_and_the_search_space_take_trees_with_these_drafters():
    import optuna

    from pipeline.commands.run import expand_grid
    from pipeline.tuning.space import SearchSpace

    points = expand_grid({"sampler": "exact", "backend": "torch", "gamma": "3", "dtype": "float32",
                          "drafter": "prompt-lookup,suffix", "draft_tree": "chain/3,2,1",
                          "out": "r-{drafter}-{draft_tree}.json"})
    assert sorted((p["drafter"], str(p["draft_tree"])) for p in points) == [
        ("prompt-lookup", "3,2,1"), ("prompt-lookup", "None"), ("suffix", "3,2,1"), ("suffix", "None")]
    space = SearchSpace(samplers=("exact",), drafters=("prompt-lookup", "suffix"), trees=("chain", "3,2,1")).check()
    params = space.suggest(optuna.trial.FixedTrial({"gamma": 4, "sampler": "exact", "dtype": "float32",
                                                    "drafter": "suffix", "suffix_factor": 1.0,
                                                    "draft_tree": "3,2,1"}))
    assert params["drafter"] == "suffix" and params["draft_tree"] == "3,2,1"
