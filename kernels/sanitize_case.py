"""A small verify step for compute-sanitizer (kernels/sanitize.sh): every sampler and dtype, odd V, γ = 0..4, with
and without per-row draft lengths.

Runs the cupy kernels on B = 3, V_t = 5003 (odd: rows start off 16-byte boundaries, so every pass reads a peeled
head one entry at a time before its aligned vectors), V_d = 4999 (padded, another alignment), and on a
16-byte-aligned V = 4096 (vectors only). Each sampler runs three times: without lengths (a null pointer), with
per-row draft lengths [0, 2, γ + 3] (a row that drafted nothing, a short row, one clamped to γ: the bonus row g and
the uniform u_g are read), and with [-1, 1, γ + 2] handed to the kernels unclamped (they clamp them); the samplers
that take a deterministic draft (draft logits None: a null draft pointer) run it too, with and without lengths. Then
it synchronises. Exit code 0 means the kernels ran; the sanitizer reports memory errors and races itself.
"""

from __future__ import annotations

import sys

import torch

from pipeline.samplers import cupy_backend


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
                    # the step functions hand the unclamped lengths to the kernels, which clamp them themselves
                    sampler._verify(dt, dl, tl, g, lengths - 1)
                    if sampler.takes_deterministic_drafts:       # exact, greedy: a null draft pointer
                        sampler(dt, None, tl, generator=g)
                        sampler(dt, None, tl, generator=g, lengths=lengths)
    torch.cuda.synchronize()
    print("sanitize_case: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
