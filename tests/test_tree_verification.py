"""Exact verification of token trees (pipeline/samplers/tree.py) and their shape (pipeline/tree_shape.py).

  shape        widths per depth -> parents, children, depths, the ancestor mask; bad widths in one line
  chain        a chain tree accepts exactly what ``exact`` accepts from the same uniforms, and emits the same tokens
  greedy       at T = 0 the emitted tokens are the target's argmax path, and the accepted path is the longest
               prefix of it the tree holds (checked against a walk written out in plain Python)
  exactness    chi-square on a Markov toy model, decoded step after step with a tree per step: the joint law of the
               first two emitted tokens and the law of the third are the target's, for children drawn with
               replacement (T = 1 and 0.7), without replacement, and deterministic (the draft's top-k)
  power        the same tests reject: children drawn without replacement verified as if drawn with it, and the
               reverse; the target's row in place of the residual after a rejection; a deterministic child kept in
               the residual
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from stat_utils import THRESHOLD, assert_fits, chisquare_pvalue, counts
from sync_detector import assert_no_host_sync

from pipeline.errors import SamplerInputError, SpecsweepError
from pipeline.samplers import get_sampler
from pipeline.samplers.contract import uniforms
from pipeline.samplers.torch_ref import softmax_fp32
from pipeline.samplers.tree import TreeVerifier, tree_rejection_verify
from pipeline.tree_shape import TokenTree, parse_widths
from pipeline.tree_tensors import ancestor_mask, children_table

torch.set_num_threads(1)
N_ROWS = 20_000
V = 6


# ---- the shape ----------------------------------------------------------------------------------------------------

def test_widths_give_parents_children_depths_and_the_ancestor_mask():
    tree = TokenTree.from_widths("3,2,1")
    assert tree.parents == (-1, -1, -1, 0, 0, 1, 1, 2, 2, 3, 4, 5, 6, 7, 8)
    assert tree.n_nodes == 15 and tree.depth == 3 and tree.max_width == 3
    assert tree.children[0] == (0, 1, 2) and tree.children[1] == (3, 4) and tree.children[4] == (9,)
    assert tree.children[15] == ()
    assert tree.depths == (1, 1, 1, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3)
    mask = ancestor_mask(tree, "cpu")
    assert mask[9].nonzero().flatten().tolist() == [0, 3, 9]        # node 9 sees its parent 3 and grandparent 0
    assert mask[4].nonzero().flatten().tolist() == [0, 4]
    assert mask.sum().item() == 3 * 1 + 6 * 2 + 6 * 3
    table = children_table(tree, "cpu")
    assert table.shape == (16, 3) and table[1].tolist() == [3, 4, -1] and table[15].tolist() == [-1, -1, -1]
    assert TokenTree.chain(3).parents == (-1, 0, 1) and TokenTree.from_widths([1, 1, 1]) == TokenTree.chain(3)


@pytest.mark.parametrize("text", ["", "3,,1", "a", "3,0", "-1", "2;2"])
def test_bad_widths_are_refused_in_one_line(text):
    with pytest.raises(SpecsweepError) as e:
        parse_widths(text)
    assert "--draft-tree" in str(e.value) and "\n" not in str(e.value)


def test_a_tree_must_list_parents_first_and_siblings_together():
    with pytest.raises(SpecsweepError, match="parents before children"):
        TokenTree((-1, 1))
    with pytest.raises(SpecsweepError, match="siblings together"):
        TokenTree((-1, -1, 0, 1, 0))
    with pytest.raises(SpecsweepError, match="more than"):
        TokenTree.from_widths([16, 16])


def test_a_call_with_the_wrong_node_count_is_refused():
    tree = TokenTree.from_widths([2, 2])
    with pytest.raises(SamplerInputError, match="the tree has 6"):
        TreeVerifier()(tree, torch.zeros(1, 5, dtype=torch.int64), None, torch.zeros(1, 6, V))


# ---- a Markov toy model decoded with a tree per step -------------------------------------------------------------

def markov(seed: int = 3, scale: float = 1.5) -> dict:
    """Target and draft next-token logits given the last token, float32 [V, V] each."""
    g = torch.Generator().manual_seed(seed)
    return {"P": torch.randn(V, V, generator=g) * scale, "Q": torch.randn(V, V, generator=g) * scale}


def draw_children(probs: torch.Tensor, k: int, mode: str, g: torch.Generator) -> torch.Tensor:
    """k children per row from probs [B, V]: "with" (independent draws), "without" (without replacement), or
    "top" (the k most probable, deterministic). int64 [B, k]."""
    if mode == "top":
        return probs.topk(k, dim=1).indices
    return torch.multinomial(probs, k, replacement=mode == "with", generator=g)


def tree_inputs(tree: TokenTree, m: dict, context: torch.Tensor, mode: str, temperature: float, g):
    """One step's draft and target for rows whose last token is context int64 [B]: (draft_tokens [B, N],
    draft_logits [B, N, V] or None for deterministic children, target_logits [B, N+1, V])."""
    B = context.shape[0]
    tokens = torch.zeros(B, tree.n_nodes, dtype=torch.int64)
    for position, kids in enumerate(tree.children):
        if kids:
            parent_token = context if position == 0 else tokens[:, position - 1]
            probs = torch.softmax(m["Q"][parent_token] / temperature, -1)
            tokens[:, list(kids)] = draw_children(probs, len(kids), mode, g)
    parent_tokens = torch.where(torch.tensor(tree.parents) < 0, context[:, None],
                                tokens[:, torch.tensor(tree.parents).clamp_min(0)])
    draft_logits = None if mode == "top" else m["Q"][parent_tokens]
    target_logits = m["P"][torch.cat([context[:, None], tokens], 1)]
    return tokens, draft_logits, target_logits


def decode(verifier, tree: TokenTree, m: dict, mode: str, n_tokens: int = 3, temperature: float = 1.0,
           seed: int = 0, rows: int = N_ROWS) -> np.ndarray:
    """The first ``n_tokens`` tokens each row emits from start token 0, a tree step at a time. int [rows, n]."""
    g = torch.Generator().manual_seed(seed)
    out = torch.full((rows, n_tokens + 1), -1, dtype=torch.int64)            # the last column: a dummy
    length = torch.zeros(rows, dtype=torch.int64)
    context = torch.zeros(rows, dtype=torch.int64)
    j = torch.arange(tree.depth + 1)
    for _ in range(n_tokens):                                # each step emits at least one token
        res = verifier(tree, *tree_inputs(tree, m, context, mode, temperature, g), generator=g)
        emitted = res.accepted + 1
        write = (j < emitted[:, None]) & (length[:, None] + j < n_tokens)
        cols = torch.where(write, length[:, None] + j, n_tokens)
        out.scatter_(1, cols, torch.where(write, res.tokens, -1))
        context = res.tokens.gather(1, res.accepted[:, None]).squeeze(1)
        length += emitted
    return out[:, :n_tokens].numpy()


def target_laws(m: dict, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """(joint of the first two tokens float64 [V*V], law of the third [V]) from start token 0."""
    P = torch.softmax(m["P"].double() / temperature, -1)
    joint = P[0][:, None] * P
    return joint.flatten().numpy(), (joint.sum(0) @ P).numpy()


def pvalues(verifier, mode: str, widths=(3, 2, 1), temperature: float = 1.0, seed: int = 0, m=None) -> list[float]:
    m = m or markov()
    tokens = decode(verifier, TokenTree.from_widths(widths), m, mode, temperature=temperature, seed=seed)
    joint, third = target_laws(m, temperature)
    return [chisquare_pvalue(counts(tokens[:, 0] * V + tokens[:, 1], V * V), joint),
            chisquare_pvalue(counts(tokens[:, 2], V), third)]


@pytest.mark.parametrize("mode,replacement,temperature", [
    ("with", True, 1.0), ("with", True, 0.7), ("without", False, 1.0), ("top", True, 1.0), ("top", False, 1.0)])
def test_tree_steps_keep_the_target_distribution(mode, replacement, temperature):
    m = markov()
    tokens = decode(TreeVerifier(temperature, replacement), TokenTree.from_widths((3, 2, 1)), m, mode,
                    temperature=temperature, seed=1)
    joint, third = target_laws(m, temperature)
    what = f"{mode} replacement={replacement} T={temperature}"
    assert_fits(counts(tokens[:, 0] * V + tokens[:, 1], V * V), joint, f"first two tokens, {what}")
    assert_fits(counts(tokens[:, 2], V), third, f"third token, {what}")


def test_a_wide_shallow_tree_without_replacement_keeps_the_target():
    """Four children of six tokens drawn without replacement: the draft's q loses most of its mass before the last
    sibling (and rows where it has none left reject outright)."""
    m = markov(seed=7, scale=2.5)
    tokens = decode(TreeVerifier(1.0, replacement=False), TokenTree.from_widths((4, 2)), m, "without", seed=2)
    joint, third = target_laws(m, 1.0)
    assert_fits(counts(tokens[:, 0] * V + tokens[:, 1], V * V), joint, "first two tokens, 4,2 without replacement")
    assert_fits(counts(tokens[:, 2], V), third, "third token, 4,2 without replacement")


def keep_p(p, q, x):
    """WRONG residual: after a rejection, the target's row as it was (for a deterministic child: x kept in it)."""
    return p


@pytest.mark.parametrize("mode,verifier", [
    ("without", TreeVerifier(1.0, replacement=True)),        # drawn without replacement, verified as with
    ("with", TreeVerifier(1.0, replacement=False)),          # drawn with replacement, verified as without
    ("with", TreeVerifier(1.0, residual_fn=keep_p)),
    ("top", TreeVerifier(1.0, residual_fn=keep_p)),
])
def test_negative_controls_fail_the_same_test(mode, verifier):
    m = markov(seed=7, scale=2.5)
    got = pvalues(verifier, mode, widths=(4, 2), m=m, seed=2)
    assert min(got) <= THRESHOLD, f"a wrong verifier ({mode}) passed (p = {got}): the test has no power"
    right = pvalues(TreeVerifier(1.0, replacement=mode != "without"), mode, widths=(4, 2), m=m, seed=2)
    assert min(right) > THRESHOLD, f"the right verifier fails on this model (p = {right})"


# ---- agreement with the chain sampler, greedy paths, no host sync ------------------------------------------------

@pytest.mark.parametrize("deterministic", [False, True])
def test_a_chain_tree_accepts_what_exact_accepts_from_the_same_uniforms(deterministic):
    g = torch.Generator().manual_seed(4)
    B, gamma, Vb = 4000, 4, 40
    tl, dl = torch.randn(B, gamma + 1, Vb, generator=g) * 2, torch.randn(B, gamma, Vb, generator=g) * 2
    dt = torch.multinomial(torch.softmax(dl.reshape(-1, Vb), -1), 1, generator=g).reshape(B, gamma)
    dl = None if deterministic else dl
    chain = get_sampler("exact", temperature=1.0)(dt, dl, tl, generator=torch.Generator().manual_seed(9))
    tree = TreeVerifier(1.0)(TokenTree.chain(gamma), dt, dl, tl, generator=torch.Generator().manual_seed(9))
    assert torch.equal(tree.accepted, chain.accepted)
    assert 0 < chain.accepted.float().mean() < gamma
    # the emitted token is drawn from the same residual, normalised before the draw: rounding may move a rare draw
    assert (tree.tokens == chain.tokens).all(dim=1).float().mean() > 0.999


def greedy_walk(tree: TokenTree, tokens: list[int], best: list[int]) -> tuple[list[int], int]:
    """Plain Python: (the accepted node path, the emitted token) for one row, best[position] the argmax."""
    path, position = [], 0
    while True:
        match = [n for n in tree.children[position] if tokens[n] == best[position]]
        if not match:
            return path, best[position]
        path.append(match[0])
        position = match[0] + 1


def test_greedy_follows_the_targets_argmax_path():
    m = markov(seed=8)
    tree = TokenTree.from_widths((3, 2, 2))
    g = torch.Generator().manual_seed(0)
    context = torch.randint(0, V, (500,), generator=g)
    dt, dl, tl = tree_inputs(tree, m, context, "with", 1.0, g)
    res = TreeVerifier(0.0)(tree, dt, dl, tl)
    best = tl.argmax(-1)
    for b in range(len(context)):
        path, nxt = greedy_walk(tree, dt[b].tolist(), best[b].tolist())
        assert res.path[b, : len(path)].tolist() == path and res.accepted[b] == len(path)
        assert res.tokens[b, len(path)] == nxt
        # the emitted tokens are the target's own greedy continuation of the context
        want, last = [], int(context[b])
        for _ in range(len(path) + 1):
            last = int(m["P"][last].argmax())
            want.append(last)
        assert res.tokens[b, : len(path) + 1].tolist() == want
    assert 0 < res.accepted.float().mean() < tree.depth


def test_tree_verification_makes_no_host_sync():
    m = markov()
    tree = TokenTree.from_widths((2, 2))
    g = torch.Generator().manual_seed(0)
    dt, dl, tl = tree_inputs(tree, m, torch.zeros(8, dtype=torch.int64), "with", 1.0, g)
    for temperature in (1.0, 0.0):
        assert_no_host_sync(TreeVerifier(temperature), tree, dt, dl, tl, generator=torch.Generator())
    assert_no_host_sync(TreeVerifier(1.0, replacement=False), tree, dt, None, tl, generator=torch.Generator())


def test_the_reference_reads_the_uniform_of_each_node_tested():
    """u for the root's first child at 0 accepts it whatever p/q; at 1 - eps rejects it where p < q."""
    tree = TokenTree.from_widths((2,))
    p = softmax_fp32(torch.tensor([[[2.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]]), 1.0)
    q = softmax_fp32(torch.tensor([[[0.0, 3.0, 0.0], [0.0, 3.0, 0.0]]]), 1.0)
    dt = torch.tensor([[1, 0]])
    zero = torch.zeros(1, 3)
    accepted, path, _ = tree_rejection_verify(tree, dt, p, q, zero)
    assert accepted.tolist() == [1] and path.tolist() == [[0]]
    high = torch.tensor([[0.999, 0.0, 0.5]])
    accepted, path, _ = tree_rejection_verify(tree, dt, p, q, high)
    assert accepted.tolist() == [1] and path.tolist() == [[1]]         # first rejected, second accepted
    assert uniforms(2, tree.n_nodes, "cpu", torch.Generator()).shape == (2, 3)
