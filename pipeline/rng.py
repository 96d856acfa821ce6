"""Per-example randomness: one random stream per example, so its tokens do not depend on its batch or process.

The default randomness of a run is one ``torch.Generator`` for the whole run: the uniforms a row gets depend on
how many rows were drawn before it (its batch, its position in the batch, the batches before it). With
:class:`RowGenerators` each example has its own generator, seeded from (run seed, example id) by a stable hash,
so an example decodes to the same tokens at batch size 1 or inside any batch, and in any process of a
data-parallel run (pipeline/distributed.py).

    rows = RowGenerators(seed, ["p0", "p3", "p7"], device)    # one generator per row of one generate call
    u = rows.rand((3, γ))                                     # float32 [b, γ]: row i from row i's own stream
    rows.follow([0, 2])                                       # the engine dropped row 1 (it finished)
    u = rows.rand((2, γ + 1))                                 # rows 0 and 2 draw on; row 1 never draws again
    rows.set_step(4, [4, 2])                                  # rows draft their own lengths: row 1 only 2
    u = rows.rand((2, 4 + 1))                                 # row 0 draws 5, row 1 draws 3 (then zeros)

The engine (pipeline/decoding/engine.py ``_draft``) and the samplers' uniform helper (pipeline/samplers/contract.py
``uniforms``) take either a plain generator or this object. A step draws from each active row's generator in turn:
one small ``torch.rand`` per active row instead of one for the batch (no host sync either way). Where the rows of a
step draft different lengths (an adaptive draft length, each row's room near the end, another tokenizer's text:
pipeline/decoding/engine.py), :meth:`RowGenerators.set_step`
makes each row draw only what it would draw alone, so its stream, and so its tokens, do not depend on the lengths
the other rows drafted.
"""

from __future__ import annotations

import hashlib

import torch


def example_seed(seed: int, example_id) -> int:
    """A 63-bit seed for (run seed, example id): BLAKE2b of both, the same in every process and Python version
    (Python's ``hash`` of a string is salted per process)."""
    digest = hashlib.blake2b(f"{int(seed)}\x00{example_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


class RowGenerators:
    """One ``torch.Generator`` per example of a batch; draws stack one row per active example.

    seed         the run's seed
    example_ids  the batch's example ids, in row order (ids are strings or ints; the same id gives the same stream)
    device       where the generators and their draws live
    active       host list: the original row index of each active row, in order (all rows until :meth:`follow`)
    """

    def __init__(self, seed: int, example_ids, device, *, row_seeds=None) -> None:
        self.device = torch.device(device)
        self.example_ids = list(example_ids)
        if row_seeds is None:
            row_seeds = [example_seed(seed, i) for i in self.example_ids]
        self.generators = [torch.Generator(device=self.device).manual_seed(int(s)) for s in row_seeds]
        self.active = list(range(len(self.generators)))
        self._step: tuple[int, list[int]] | None = None

    @classmethod
    def from_seeds(cls, seeds, device) -> RowGenerators:
        """One generator per row seeded with ``seeds[i]`` itself (no hashing): row i then draws what a plain
        ``torch.Generator().manual_seed(seeds[i])`` would draw alone (a server's per-request seeds)."""
        seeds = [int(s) for s in seeds]
        return cls(0, [f"seed {s}" for s in seeds], device, row_seeds=seeds)

    def __len__(self) -> int:
        return len(self.active)

    def follow(self, rows) -> None:
        """The active rows are now these original row indices (host ints, in the engine's row order)."""
        rows = list(rows)
        self._step = None
        if rows != self.active:
            if any(not 0 <= r < len(self.generators) for r in rows):
                raise IndexError(f"rows {rows} out of range for {len(self.generators)} example generators")
            self.active = rows

    def set_step(self, gamma: int, lengths: list[int] | None) -> None:
        """This step drafts ``gamma`` positions, and active row i only its first ``lengths[i]`` (host ints; None:
        every row all γ). Until the next :meth:`follow`, a draw of shape (b, γ + k) then takes ``min(lengths[i], γ)
        + k`` uniforms from row i's stream, in its first columns, and zeros after: what the row would draw alone
        with γ = lengths[i] (the draft's k = 0 and the verify step's k = 1, pipeline/samplers/contract.py)."""
        if lengths is not None and len(lengths) != len(self.active):
            raise ValueError(f"{len(lengths)} draft lengths for {len(self.active)} active rows")
        self._step = None if lengths is None else (int(gamma), [min(int(n), int(gamma)) for n in lengths])

    def rand(self, shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``dtype`` [b, ...] uniforms in [0, 1): row i drawn from the generator of active row i. ``shape[0]`` must
        be the number of active rows. After :meth:`set_step`, a 2-d draw of γ + k columns takes only each row's own
        count (see there)."""
        shape = tuple(shape)
        if shape[0] != len(self.active):
            raise ValueError(f"a draw of shape {list(shape)} for {len(self.active)} active rows: the first dimension "
                             "must be the active rows")
        rest = shape[1:]
        if not self.active:
            return torch.empty(shape, dtype=dtype, device=self.device)
        if self._step is not None and len(shape) == 2:
            gamma, lengths = self._step
            extra = shape[1] - gamma
            if extra < 0:
                raise ValueError(f"a draw of {shape[1]} columns in a step of γ = {gamma}: expected γ + k, k >= 0")
            out = torch.zeros(shape, dtype=dtype, device=self.device)
            for i, (r, n) in enumerate(zip(self.active, lengths)):
                out[i, : n + extra] = torch.rand(n + extra, generator=self.generators[r], device=self.device,
                                                 dtype=dtype)
            return out
        return torch.stack([torch.rand(rest, generator=self.generators[r], device=self.device, dtype=dtype)
                            for r in self.active])

    def row_generator(self, i: int) -> torch.Generator:
        """The plain generator of active row i (for a step that runs one row, e.g. HF's batch-1 verify step)."""
        return self.generators[self.active[i]]

    def __repr__(self) -> str:
        return f"RowGenerators({len(self.active)}/{len(self.generators)} active rows on {self.device})"


def rand(generator, shape, device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Uniforms of ``shape`` from a plain generator (or None: the global one) or a :class:`RowGenerators`."""
    if isinstance(generator, RowGenerators):
        return generator.rand(shape, dtype)
    return torch.rand(shape, generator=generator, device=device, dtype=dtype)
