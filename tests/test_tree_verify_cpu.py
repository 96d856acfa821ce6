"""tree_verify (kernels/verify.cu), executed on the CPU and held to the torch reference of token-tree verification:
in every CI run, no GPU needed.

The cases and agreement rule are tests/tree_kernel_cases.py's (the GPU runs them in tests/test_kernels_gpu.py); the
kernels run on the CPU runtime for CUDA kernels (tests/cuda_on_cpu: each block on an OS thread, each CUDA thread a
fibre, strict barriers) through the cupy backend's own launch code (grid sizing for a 132-SM GPU, workspace, argument
packing). Here also: mutants of the tree kernel that the cases must catch.
"""

from __future__ import annotations

import pytest
import torch
from cuda_on_cpu import KernelLibrary, build, compiler
from test_kernels_cpu import cpu_backend
from tree_kernel_cases import V_D, V_T, TreeKernelCases, assert_tree_agrees, real_masks, tree_inputs

from pipeline.kernels import loader
from pipeline.tree_shape import TokenTree

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C++ compiler (g++ >= 11 or clang++): apt install g++")

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tree_library() -> KernelLibrary:
    return KernelLibrary(build(loader.SOURCE_PATH, loader.NAME_EXPRESSIONS))


class TestTreeVerifyOnCpu(TreeKernelCases):
    @pytest.fixture
    def kb(self, tree_library):
        return cpu_backend(tree_library)


# name -> (anchor in verify.cu, its broken replacement, the (shape, mode, temperature, rows with smaller trees) case
# that must then fail)
MUTANTS = {
    # without replacement, q not renormalised after a rejected sibling (the rejected token removed only)
    "without: q not renormalised": ("(v == w.x[j] ? 0.0f : qw / w.qmass[j])", "(v == w.x[j] ? 0.0f : qw)",
                                    ("4,2", "without", 1.0, False)),
    # the residual not renormalised after a rejection
    "residual not renormalised": ("fmaxf(__fsub_rn(p, qj), 0.0f)) / mj;", "fmaxf(__fsub_rn(p, qj), 0.0f));",
                                  ("3,2,1", "with", 1.0, False)),
    # a deterministic child kept in p after its rejection
    "deterministic: x kept": ("(det ? (v == w.x[j] ? 0.0f : p) :", "(det ? p :", ("3,2,1", "top", 1.0, False)),
    # the emitted token drawn with the uniform of the last node tested instead of column N
    "emit uniform": ("nc, u[r.n], sh, offset);", "nc, u[r.n - 1], sh, offset);", ("2,2,1", "with", 1.0, False)),
    # `real` ignored: padding nodes tested as if the row had proposed them (deterministic children, as lookup trees)
    "real ignored": ("return real == nullptr || real[n];", "return true;", ("3,2,1", "top", 1.0, True)),
    # T = 0: the walk follows a padding child equal to the argmax
    "greedy: padding followed": (" && is_real(rrow, first + k)) chosen", ") chosen", ("3,2,1", "top", 0.0, True)),
}


@pytest.mark.parametrize("mutant", MUTANTS, ids=list(MUTANTS))
def test_the_cases_catch_a_broken_tree_kernel(mutant):
    original, broken, (shape, mode, temperature, masked) = MUTANTS[mutant]
    source = loader.source()
    assert source.count(original) == 1, f"the mutant's anchor is gone from verify.cu: update MUTANTS[{mutant!r}]"
    library = KernelLibrary(build(loader.SOURCE_PATH, loader.NAME_EXPRESSIONS, text=source.replace(original, broken)))
    tree = TokenTree.from_widths(shape)
    cpu = torch.device("cpu")
    inputs = tree_inputs(cpu, tree, 32, V_T, V_D, "float32", mode, seed=7, noise=0.3 if temperature == 0 else 1.0)
    real = real_masks(tree, 32, cpu, seed=7) if masked else None
    with pytest.raises(AssertionError, match="rows differ"):
        assert_tree_agrees(cpu_backend(library), tree, inputs, temperature, mode != "without", seed=8, real=real)


@pytest.mark.parametrize("kind,children", [("gpt2", "without-replacement"), ("llama", "with-replacement"),
                                           ("gpt2", "top-k")])
def test_the_engine_decodes_the_same_tokens_with_the_kernel(tmp_path, tree_library, kind, children):
    """A tree run through the engine (draft model's tree proposals, tree forward, compaction of the accepted path) with
    the kernel samplers verifying emits the tokens it emits with the torch reference, from the same generator, at
    T = 1 (the llama draft's vocabulary is smaller than its target's), and the target's own greedy tokens at T = 0."""
    from tiny_models import PROMPTS, save_pair

    from pipeline.decoding.drafters.tree import TreeDrafter
    from pipeline.decoding.engine import SpeculativeEngine
    from pipeline.models import load_causal_lm, load_tokenizer
    from pipeline.samplers import get_sampler
    from pipeline.samplers.tree import TreeSampler

    tp, dp = save_pair(tmp_path, kind=kind, draft_vocab_pad=-2 if kind == "llama" else 0)
    target, draft = (load_causal_lm(str(path), torch.float32, "cpu") for path in (tp, dp))
    tok = load_tokenizer(str(tp))
    tree = TokenTree.from_widths("2,2,1")
    kernels = cpu_backend(tree_library).samplers
    enc = tok(PROMPTS[:3], return_tensors="pt", padding=True)

    def run(sampler, temperature):
        engine = SpeculativeEngine(target, TreeDrafter(draft, tree, children), TreeSampler(sampler), gamma=tree.n_nodes,
                                   device="cpu", eos_token_ids=[1], pad_token_id=0)
        return engine.generate(enc.input_ids, enc.attention_mask, 16, torch.Generator().manual_seed(5))

    for temperature in (1.0, 0.0):
        got = run(kernels["exact"](temperature=temperature), temperature)
        want = run(get_sampler("exact", temperature=temperature), temperature)
        assert got.tokens == want.tokens, temperature
        assert 0 < sum(s["accepted"] for s in got.row_stats) == sum(s["accepted"] for s in want.row_stats)
    assert any(kernel.startswith("tree_verify<") for kernel, _ in kernels["exact"].launcher.launches)


def test_a_lookup_tree_with_padding_rows_decodes_the_same_tokens_with_the_kernel(tmp_path, tree_library):
    """`--drafter prompt-lookup --draft-tree 3,2,1` through the engine (rows that found fewer matches than the step's
    tree has nodes: padding the verify step never tests) emits with the kernel samplers the tokens it emits with the
    torch reference, from the same generator, at T = 1 and at T = 0."""
    from test_lookup_trees import REPEATING, engine
    from tiny_models import load_saved_pair

    from pipeline.samplers import get_sampler
    from pipeline.samplers.tree import TreeSampler

    target, _, tok = load_saved_pair(tmp_path, kind="gpt2")
    kernels = cpu_backend(tree_library).samplers
    enc = tok(REPEATING, return_tensors="pt", padding=True)

    def run(sampler, temperature):
        owns = []
        result = engine(target, "prompt-lookup", (3, 2, 1), temperature, sampler=TreeSampler(sampler)).generate(
            enc.input_ids, enc.attention_mask, 16, torch.Generator().manual_seed(5),
            on_step=lambda rows, tokens, accepted, finished, own: owns.append(list(own)))
        return result, owns

    for temperature in (1.0, 0.0):
        got, owns = run(kernels["exact"](temperature=temperature), temperature)
        want, _ = run(get_sampler("exact", temperature=temperature), temperature)
        assert got.tokens == want.tokens, temperature
        assert 0 < sum(s["accepted"] for s in got.row_stats) == sum(s["accepted"] for s in want.row_stats)
        assert any(max(own) > 0 and len(set(own)) > 1 for own in owns), f"no step had padding rows: {owns}"
    assert any(kernel.startswith("tree_verify<") for kernel, _ in kernels["exact"].launcher.launches)
