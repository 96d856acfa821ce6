"""tree_verify (kernels/verify.cu) against the torch reference of token-tree verification (pipeline/samplers/tree.py):
one set of cases, run wherever the kernels execute (tests/test_tree_verify_cpu.py on the CPU runtime for CUDA kernels
in every CI run, tests/test_kernels_gpu.py on a GPU). Subclasses of ``TreeKernelCases`` provide the fixture ``kb``
(a kernel_cases.KernelBackend).

Inputs (``tree_inputs``) are drawn the way a tree drafter makes them: at each position with children, the draft's
distribution there (the target's logits plus noise) is the draft row of every child, and the children are drawn from
it with replacement, without replacement, or are its top-k (deterministic: no draft logits); the target is close
enough to the draft that steps accept at every depth, reject, and reach leaves.

Agreement rule: given the same inputs and uniforms, the kernel's accepted count, path and tokens equal the
reference's in every row, except rows that fp32 rounding can decide: the kernel sums softmax normalisers, residual
masses and CDFs in another order than torch, so a decision u * q < p or an inverse-CDF draw that lies within
rounding of its boundary may go the other way (the chain kernels' rule, tests/kernel_cases.py). Such a row must be
reproduced by the reference with every uniform of the row scaled by 1 - BOUNDARY or 1 + BOUNDARY (a relative move
of 1e-5, as the chain rule's boundary), and at most 1 % of rows (at least one) may differ at all. (A residual whose
mass lies within rounding of the zero tolerance, which the chain rule also allows, is not looked for: these cases do
not come near it.) At T = 0 no row may differ. The flags must be equal in every row.

Rows with smaller trees (``real_masks``): the nodes each row proposed, as a drafter without a model leaves them (a
node's real children are its first few, or none; a row with no real node, a row with every node), and masks with
holes among siblings (a node real only if its parent is); the padding nodes keep the tokens and draft rows drawn for
them, so a kernel that tested them would decide otherwise. The same agreement rule, with ``real`` given to both.
"""

from __future__ import annotations

import pytest
import torch
from kernel_cases import BOUNDARY, KernelBackend, assert_rounding_rare

from pipeline.dtypes import torch_dtype
from pipeline.errors import SamplerInputError
from pipeline.samplers import contract, cupy_backend
from pipeline.samplers.contract import SamplerResult
from pipeline.samplers.torch_ref import softmax_fp32
from pipeline.samplers.tree import TreeSampler, TreeVerifier, tree_rejection_verify
from pipeline.tree_shape import TokenTree

SHAPES = ("1,1,1", "2,2,1", "3,2,1", "4,2")
MODES = ("with", "without", "top")            # how the children are drawn (top: the draft's top-k, deterministic)
# (mode, temperature) of the cases with rows of smaller trees: deterministic children (what lookup trees propose) at
# T = 1, 0.7 and 0, stochastic children with and without replacement, and T = 0 with draft logits
REAL_CASES = (("top", 1.0), ("top", 0.7), ("top", 0.0), ("with", 1.0), ("without", 1.0), ("with", 0.0))
V_T, V_D = 5_003, 4_999                       # odd (rows off 16-byte alignment), 5 chunks, a padded draft vocabulary


def tree_inputs(device, tree: TokenTree, B: int, vt: int, vd: int, dtype: str, mode: str, seed: int = 0,
                scale: float = 3.0, noise: float = 0.6):
    """(draft_tokens int64 [B, N], draft_logits [B, N, V_d] or None (mode "top"), target_logits [B, N+1, V_t]).

    The draft's logits at position j are the target's there plus normal noise (std ``noise``); node n's draft row is
    its parent position's (the distribution it was drawn from); the children of a position are drawn from it with
    replacement ("with"), without replacement ("without"), or are its top-k ("top", V_d = V_t).
    """
    vd = vt if mode == "top" else vd
    g = torch.Generator().manual_seed(seed)     # drawn on the CPU: one case whatever device runs it
    tl = torch.randn(B, tree.n_nodes + 1, vt, generator=g) * scale
    dpos = tl[:, :, :vd] + noise * torch.randn(B, tree.n_nodes + 1, vd, generator=g)
    tokens = torch.zeros(B, tree.n_nodes, dtype=torch.int64)
    for position, kids in enumerate(tree.children):
        if not kids:
            continue
        if mode == "top":
            picked = dpos[:, position].topk(len(kids), dim=1).indices
        else:
            probs = torch.softmax(dpos[:, position], dim=1)
            picked = torch.multinomial(probs, len(kids), replacement=mode == "with", generator=g)
        tokens[:, kids[0]: kids[0] + len(kids)] = picked
    parents = torch.tensor(tree.parents) + 1
    draft = None if mode == "top" else dpos[:, parents].to(device, torch_dtype(dtype))
    return tokens.to(device), draft, tl.to(device, torch_dtype(dtype))


def real_masks(tree: TokenTree, B: int, device, seed: int) -> torch.Tensor:
    """bool [B, N] on ``device``: the nodes each row proposed, a node real only where its parent is (or it is a child
    of the root). Row 0 has no real node, row 1 every node; of the others, even rows keep the first m children of each
    real position (m uniform in 0..width: the subtrees pipeline.tree_shape.place_paths leaves), odd rows each child
    of a real position with probability 0.6 (holes among siblings)."""
    g = torch.Generator().manual_seed(seed)
    real = torch.zeros(B, tree.n_nodes, dtype=torch.bool)
    real[1] = True
    for b in range(2, B):
        for position, kids in enumerate(tree.children):
            if not kids or (position > 0 and not real[b, position - 1]):
                continue
            if b % 2 == 0:
                m = int(torch.randint(0, len(kids) + 1, (1,), generator=g))
                real[b, kids[0]: kids[0] + m] = True
            else:
                real[b, list(kids)] = torch.rand(len(kids), generator=g) < 0.6
    return real.to(device)


def reference(tree: TokenTree, inputs, temperature: float, replacement: bool, u: torch.Tensor,
              real: torch.Tensor | None = None) -> SamplerResult:
    """The torch reference at T > 0 on ``inputs`` with the uniforms u float32 [B, N+1] given and ``real`` bool [B, N]
    or None (accepted count, path and tokens; the flags are not computed: all True)."""
    dt, dl, tl = inputs
    q = None if dl is None else softmax_fp32(dl, 1.0 / temperature)
    accepted, path, nxt = tree_rejection_verify(tree, dt, softmax_fp32(tl, 1.0 / temperature), q, u, replacement,
                                                real=real)
    ok = torch.ones_like(accepted, dtype=torch.bool)
    tokens = contract.assemble_tokens(dt.gather(1, path.clamp_min(0)), accepted, nxt)
    return SamplerResult(accepted=accepted, tokens=tokens, draft_ok=ok, target_ok=ok, path=path)


def _cpu(*tensors: torch.Tensor | None) -> tuple:
    return tuple(None if t is None else t.cpu() for t in tensors)


def _to(r: SamplerResult, device) -> SamplerResult:
    return SamplerResult(accepted=r.accepted.to(device), tokens=r.tokens.to(device), draft_ok=r.draft_ok.to(device),
                         target_ok=r.target_ok.to(device), path=r.path.to(device))


def _same(a: SamplerResult, b: SamplerResult) -> torch.Tensor:
    """bool [B]: rows with the same accepted count, path and tokens."""
    return (a.accepted == b.accepted) & (a.path == b.path).all(1) & (a.tokens == b.tokens).all(1)


def assert_tree_agrees(kb: KernelBackend, tree: TokenTree, inputs, temperature: float, replacement: bool, seed: int,
                       kernel_replacement: bool | None = None, real: torch.Tensor | None = None) -> SamplerResult:
    """The kernel (run with ``kernel_replacement``, default ``replacement``) and the reference, same inputs,
    uniforms and ``real`` (bool [B, N] or None): identical but for rounding (module docstring). Returns the kernel's
    result."""
    dt, dl, tl = inputs
    B = dt.shape[0]
    # the uniforms and the reference on the CPU, whatever device runs the kernel: one case everywhere, and a
    # reference whose own sums are the same on every machine
    u = contract.uniforms(B, tree.n_nodes, "cpu", torch.Generator().manual_seed(seed)).to(kb.device)
    mode = replacement if kernel_replacement is None else kernel_replacement
    got = cupy_backend.tree_verify(kb.samplers["exact"].launcher, tree, dt, dl, tl, temperature, mode, u=u, real=real)
    ref = _to(TreeVerifier(temperature, replacement)(tree, *_cpu(dt, dl, tl), generator=torch.Generator().manual_seed(
        seed), real=_cpu(real)[0]), kb.device)
    assert got.tokens.shape == (B, tree.depth + 1) and got.path.shape == (B, tree.depth)
    assert torch.equal(got.draft_ok, ref.draft_ok) and torch.equal(got.target_ok, ref.target_ok)
    pos = torch.arange(tree.depth + 1, device=kb.device)
    assert torch.equal(got.tokens >= 0, pos <= got.accepted[:, None]), "padding does not follow the accepted count"
    differ = ~_same(got, ref)
    explained = torch.zeros_like(differ)
    if temperature > 0 and bool(differ.any()):
        for factor in (1 - BOUNDARY, 1 + BOUNDARY):
            moved = reference(tree, _cpu(*inputs), temperature, replacement, (u * factor).cpu(), _cpu(real)[0])
            explained |= _same(got, _to(moved, kb.device))
    unexplained = differ & ~explained
    assert_rounding_rare(differ, unexplained, got, ref)
    return got


def assert_steps_vary(got: SamplerResult, tree: TokenTree) -> None:
    """The case has teeth: some rows accept nothing, some accept deeper than one node, and some second-or-later child
    is accepted (the residual after a rejected sibling decided)."""
    assert bool((got.accepted == 0).any()) and bool((got.accepted >= min(2, tree.depth)).any()), got.accepted
    if tree.max_width > 1:
        first_children = torch.tensor([kids[0] for kids in tree.children if kids], device=got.path.device)
        later = (got.path >= 0) & ~torch.isin(got.path, first_children)
        assert bool(later.any()), "no row accepted a later sibling: the residual never decided"


class TreeKernelCases:
    """tree_verify = the reference. Subclasses provide the fixture ``kb`` (a KernelBackend)."""

    B = 32

    @pytest.mark.parametrize("mode", MODES)
    @pytest.mark.parametrize("shape", SHAPES)
    def test_matches_reference(self, kb, shape, mode):
        tree = TokenTree.from_widths(shape)
        inputs = tree_inputs(kb.device, tree, self.B, V_T, V_D, "float32", mode, seed=len(shape) + len(mode))
        got = assert_tree_agrees(kb, tree, inputs, 1.0, mode != "without", seed=3)
        assert_steps_vary(got, tree)

    @pytest.mark.parametrize("mode", MODES)
    def test_tempered_matches_reference(self, kb, mode):
        tree = TokenTree.from_widths("3,2,1")
        inputs = tree_inputs(kb.device, tree, self.B, V_T, V_D, "float32", mode, seed=11)
        got = assert_tree_agrees(kb, tree, inputs, 0.7, mode != "without", seed=12)
        assert_steps_vary(got, tree)

    @pytest.mark.parametrize("shape", SHAPES)
    def test_greedy_matches_reference(self, kb, shape):
        """T = 0: the first child equal to the target's argmax at each node, the argmax emitted where none is. The
        children are the draft's top-k (a near copy of the target), so most steps follow several nodes."""
        tree = TokenTree.from_widths(shape)
        for mode in ("top", "with"):
            inputs = tree_inputs(kb.device, tree, self.B, V_T, V_D, "float32", mode, seed=21, noise=0.3)
            got = assert_tree_agrees(kb, tree, inputs, 0.0, True, seed=0)
            assert bool((got.accepted > 0).any()), "greedy never accepted: no test of the walk"

    @pytest.mark.parametrize("mode,temperature", REAL_CASES)
    @pytest.mark.parametrize("shape", SHAPES)
    def test_rows_with_smaller_trees_match_reference(self, kb, shape, mode, temperature):
        """``real`` (rows that proposed fewer nodes than the step's tree, as in lookup and suffix trees): the kernel
        never tests a padding node, as the reference, row for row; the row without real nodes accepts nothing and
        emits from the root's p. The case has teeth: the padding changes some rows' outcome."""
        tree = TokenTree.from_widths(shape)
        seed = len(shape) + len(mode) + int(10 * temperature)
        inputs = tree_inputs(kb.device, tree, self.B, V_T, V_D, "float32", mode, seed=seed,
                             noise=0.3 if temperature == 0 else 0.6)
        real = real_masks(tree, self.B, kb.device, seed=seed)
        got = assert_tree_agrees(kb, tree, inputs, temperature, mode != "without", seed=seed + 1, real=real)
        assert int(got.accepted[0]) == 0
        assert bool(real.gather(1, got.path.clamp_min(0))[got.path >= 0].all()), "a padding node was accepted"
        full = TreeVerifier(temperature, mode != "without")(tree, *inputs, generator=kb.generator(seed + 1))
        assert bool((~_same(got, full)).any()), "the padding decided nothing: no test of real"
        assert bool((got.accepted > 0).any())

    @pytest.mark.parametrize("dtype,shape", [("bfloat16", "2,2,1"), ("float16", "4,2")])
    def test_half_precision_logits(self, kb, dtype, shape):
        tree = TokenTree.from_widths(shape)
        for mode in ("with", "without"):
            inputs = tree_inputs(kb.device, tree, self.B, V_T, V_D, dtype, mode, seed=31)
            assert_tree_agrees(kb, tree, inputs, 1.0, mode == "with", seed=32)

    def test_more_nodes_than_a_chain_may_have(self, kb):
        """4,4,1: 36 nodes, more than the chain kernels' γ <= 16 (73 rows reduced per batch row)."""
        tree = TokenTree.from_widths("4,4,1")
        for mode in MODES:
            inputs = tree_inputs(kb.device, tree, 16, 3_001, 3_001, "float32", mode, seed=35)
            got = assert_tree_agrees(kb, tree, inputs, 1.0, mode != "without", seed=36)
            assert bool((got.accepted > 0).any())

    def test_a_large_vocabulary_in_several_slices_and_chunks(self, kb):
        """V = 128256 (bf16): the partial pass splits each row over several blocks and the draw picks among 126
        chunks."""
        tree = TokenTree.from_widths("2,2,1")
        inputs = tree_inputs(kb.device, tree, 3, 128_256, 128_256, "bfloat16", "without", seed=41)
        assert_tree_agrees(kb, tree, inputs, 1.0, False, seed=42)
        launches = [grid for kernel, grid in getattr(kb.samplers["exact"].launcher, "launches", [])
                    if kernel.startswith("tree_verify_partials")]
        assert not launches or launches[-1][0] > 1, launches

    @pytest.mark.parametrize("deterministic", [False, True])
    def test_a_chain_tree_is_the_chain_kernel(self, kb, deterministic):
        """The tree 1,1,1 reads the uniforms the chain kernels read: it accepts exactly what the exact kernel accepts
        (the same normalisers, the same decisions) and emits the same tokens but where rounding decides (the tree
        draws from the residual normalised, the chain kernel from it unnormalised)."""
        tree = TokenTree.chain(3)
        inputs = tree_inputs(kb.device, tree, 64, V_T, V_D, "float32", "top" if deterministic else "with", seed=51)
        u = contract.uniforms(64, 3, kb.device, kb.generator(52))
        launcher = kb.samplers["exact"].launcher
        got = cupy_backend.tree_verify(launcher, tree, *inputs, 1.0, u=u)
        chain = cupy_backend.exact_step(launcher, *inputs, 1.0, u=u)
        assert torch.equal(got.accepted, chain.accepted) and 0 < float(chain.accepted.float().mean()) < 3
        pos = torch.arange(3, device=kb.device)
        assert torch.equal(got.path, torch.where(pos < got.accepted[:, None], pos, -1))
        assert int((got.tokens != chain.tokens).any(1).sum()) <= 1
        assert torch.equal(got.draft_ok, chain.draft_ok) and torch.equal(got.target_ok, chain.target_ok)

    def test_the_wrong_replacement_rule_disagrees(self, kb):
        """Negative control: children drawn without replacement, the kernel run with the with-replacement rule (and
        the reverse), held to the reference with the right rule: the comparison fails (it can tell the rules apart)."""
        tree = TokenTree.from_widths("4,2")
        for drawn in ("without", "with"):
            inputs = tree_inputs(kb.device, tree, 64, V_T, V_D, "float32", drawn, seed=61, noise=1.0)
            right = drawn == "with"
            assert_tree_agrees(kb, tree, inputs, 1.0, right, seed=62)
            with pytest.raises(AssertionError, match="rows differ"):
                assert_tree_agrees(kb, tree, inputs, 1.0, right, seed=62, kernel_replacement=not right)

    @pytest.mark.parametrize("temperature", [1.0, 0.0])
    def test_nan_and_inf_are_flagged_like_the_reference(self, kb, temperature):
        tree = TokenTree.from_widths("2,2")
        dt, dl, tl = tree_inputs(kb.device, tree, 6, 3_001, 3_001, "float32", "with", seed=71)
        tl[1, :, 100] = float("nan")              # NaN in every target row of batch row 1
        tl[2, 3, 7] = float("inf")                # +inf in one target row of batch row 2
        dl[3, :, dt[3, 0]] = float("nan")         # NaN in every draft row of batch row 3, at a drafted token
        tl[4, 2] = float("-inf")                  # batch row 4: a target row of only -inf
        dl[5, 1, dt[5, 1]] = float("inf")         # +inf in a draft row of batch row 5, at its drafted token
        ref = TreeVerifier(temperature)(tree, dt, dl, tl, generator=kb.generator(0))
        got = kb.samplers["exact"](temperature=1.0).tree_verifier(temperature, True)(tree, dt, dl, tl,
                                                                                        generator=kb.generator(0))
        assert torch.equal(got.target_ok, ref.target_ok) and torch.equal(got.draft_ok, ref.draft_ok)
        assert got.target_ok.tolist() == [True, False, False, True, False, True]
        assert got.draft_ok.tolist() == [True, True, True, False, True, False]
        assert bool(((got.tokens >= -1) & (got.tokens < 3_001)).all()), "a flagged row emitted an out-of-range token"

    @pytest.mark.parametrize("temperature", [1.0, 0.0])
    def test_out_of_range_draft_token_is_rejected_and_flagged(self, kb, temperature):
        """As the chain kernels do (the reference has no such token): rejected, and draft_ok False."""
        tree = TokenTree.from_widths("2,2")
        dt, dl, tl = tree_inputs(kb.device, tree, 4, 2_000, 2_000, "float32", "with", seed=81)
        dt[1, 0], dt[1, 1] = 2_000, -3           # both children of the root out of range
        got = kb.samplers["exact"](temperature=1.0).tree_verifier(temperature, True)(tree, dt, dl, tl,
                                                                                        generator=kb.generator(82))
        assert got.draft_ok.tolist() == [True, False, True, True] and int(got.accepted[1]) == 0
        assert bool(((got.tokens >= -1) & (got.tokens < 2_000)).all())

    def test_tree_sampler_dispatches_to_the_kernel(self, kb):
        """The engine's TreeSampler around a kernel sampler verifies trees with tree_verify (exact at T > 0, greedy
        and exact at T = 0), and chains with the chain kernels."""
        tree = TokenTree.from_widths("2,2,1")
        inputs = tree_inputs(kb.device, tree, 8, 3_001, 3_001, "float32", "without", seed=91)
        real = real_masks(tree, 8, kb.device, seed=93)
        for name, params, temperature in (("exact", {"temperature": 1.0}, 1.0), ("greedy", {}, 0.0),
                                          ("exact", {"temperature": 0.0}, 0.0)):
            sampler = TreeSampler(kb.samplers[name](**params))
            for mask in (None, real):
                got = sampler(*inputs, generator=kb.generator(92), tree=tree, replacement=False, real=mask)
                want = TreeVerifier(temperature, False)(tree, *inputs, generator=kb.generator(92), real=mask)
                assert torch.equal(got.tokens, want.tokens) and torch.equal(got.path, want.path), (name, mask)
            assert isinstance(sampler.tree_verifier(temperature, False), cupy_backend.TreeVerifier)

    def test_bad_input_is_one_line_error(self, kb):
        tree = TokenTree.from_widths("2,2")
        dt, dl, tl = tree_inputs(kb.device, tree, 2, 1_000, 1_000, "float32", "with")
        verifier = kb.samplers["exact"](temperature=1.0).tree_verifier(1.0, True)
        with pytest.raises(SamplerInputError, match="the tree has 6"):
            verifier(tree, dt[:, :5], dl[:, :5], tl[:, :6])
        with pytest.raises(SamplerInputError, match="draft vocabulary"):
            verifier(tree, dt, torch.cat([dl, dl], 2), tl)
        other = torch.device("cpu" if kb.device.type != "cpu" else "meta")
        with pytest.raises(SamplerInputError, match="tensors; got"):
            verifier(tree, dt.to(other), dl.to(other), tl.to(other))
        with pytest.raises(SamplerInputError, match="temperature must be >= 0"):
            kb.samplers["exact"](temperature=1.0).tree_verifier(-1.0, True)
        real = torch.ones_like(dt, dtype=torch.bool)
        for bad in (real[:, :5], real.to(torch.uint8), real.to(other)):
            with pytest.raises(SamplerInputError, match="real must be bool") as e:
                verifier(tree, dt, dl, tl, real=bad)
            assert "\n" not in str(e.value)

