"""A small verify step for compute-sanitizer (kernels/sanitize.sh): every sampler and dtype, odd V, γ = 0..4, with
and without per-row draft lengths.

Runs the cupy kernels on B = 3, V_t = 5003 (odd: rows start off 16-byte boundaries, so every pass reads a peeled
head one entry at a time before its aligned vectors), V_d = 4999 (padded, another alignment), and on a
16-byte-aligned V = 4096 (vectors only). Each sampler runs three times: without lengths (a null pointer), with
per-row draft lengths [0, 2, γ + 3] (a row that drafted nothing, a short row, one clamped to γ: the bonus row g and
the uniform u_g are read), and with [-1, 1, γ + 2] handed to the kernels unclamped (they clamp them); the samplers
that take a deterministic draft (draft logits None: a null draft pointer) run it too, with and without lengths. Then
tree_verify, the token-tree kernel (tree_steps). Then it synchronises. Exit code 0 means the kernels ran; the
sanitizer reports memory errors and races itself.
"""

from __future__ import annotations

import sys

import torch

from pipeline.samplers import cupy_backend
from pipeline.tree_shape import TokenTree


def main() -> int:

    if not cupy_backend.available():
        print(f"sanitize_case: skipped: {cupy_backend.unavailable_reason()}")
        return 0
    g = torch.Generator(device="cuda").manual_seed(0)
    for vt, vd in ((5003, 4999), (4096, 4096)):
        for gamma in (0, 4):
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                tl = (torch.randn(3, gamma + 1, vt, device="cuda", generator=g) * 3).to(dtype)
                dl = (torch.randn(3, gamma, vd, device="cuda", generator=g) * 3).to(dtype)
                dt = torch.randint(0, vd, (3, gamma), device="cuda", generator=g)
                lengths = torch.tensor([0, 2, gamma + 3], dtype=torch.int64, device="cuda")
                for name, cls in cupy_backend.SAMPLERS.items():
                    sampler = cls(temperature=0.0 if name == "greedy" else 0.8)
                    sampler(dt, dl, tl, generator=g)
                    sampler(dt, dl, tl, generator=g, lengths=lengths)
                    # the samplers hand lengths to the kernels unclamped (-1, γ + 2 here): the kernels clamp them
                    sampler(dt, dl, tl, generator=g, lengths=lengths - 1)
                    if sampler.takes_deterministic_drafts:       # exact, greedy: a null draft pointer
                        sampler(dt, None, tl, generator=g)
                        sampler(dt, None, tl, generator=g, lengths=lengths)
    tree_steps(g)
    torch.cuda.synchronize()
    print("sanitize_case: ok")
    return 0


def tree_steps(g: torch.Generator) -> None:
    """tree_verify on the tree 3,2,1 (N = 15): with and without replacement, deterministic children and T = 0, each
    dtype, at V_t = 5003 / V_d = 4999 (odd, padded), random tokens (most rows reject every child of the root: the
    residual passes run), one token out of range; the deterministic children also with rows of smaller trees (``real``:
    row 0 proposed nothing, row 1 the first child of the root only)."""
    shape = TokenTree.from_widths("3,2,1")
    n = shape.n_nodes
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        tl = (torch.randn(3, n + 1, 5003, device="cuda", generator=g) * 3).to(dtype)
        dl = (torch.randn(3, n, 4999, device="cuda", generator=g) * 3).to(dtype)
        dt = torch.randint(0, 4999, (3, n), device="cuda", generator=g)
        dt[2, 1] = 5003
        sampler = cupy_backend.ExactSampler(temperature=0.8)
        for temperature, replacement, draft in ((0.8, True, dl), (0.8, False, dl), (0.8, True, None), (0.0, True, dl)):
            sampler.tree_verifier(temperature, replacement)(shape, dt, draft, tl, generator=g)
        real = torch.ones(3, n, dtype=torch.bool, device="cuda")
        real[0] = False
        real[1, 1:] = False
        for temperature in (0.8, 0.0):
            sampler.tree_verifier(temperature, True)(shape, dt, None, tl, generator=g, real=real)


if __name__ == "__main__":
    sys.exit(main())
