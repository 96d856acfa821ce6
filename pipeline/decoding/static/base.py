"""What every static forward shares: the call CachedModel makes and the preallocated KV cache it appends to (the
package docstring says how the cache is used)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.decoding.static.compiled import CompiledSteps, mark_static
from pipeline.errors import SpecsweepError

KEY_BLOCK = 512
"""On a CPU a forward's attention reads the cached keys in whole blocks of this many, those past each query's own
position masked. torch's CPU attention (sdpa, 2.13) splits the keys into blocks of 512 (its kvSplitSize) and sums
each block's values with a product whose length is the block's width, so a query's output depended on how many
masked keys followed it in its block, that is on how many tokens its forward held: a verify forward's logits at a
position could differ in the last bit from the one-token forward's (docs/results.md, "Lossless in bfloat16"). A block
that is masked whole adds exact zeros, so any multiple of 512 keys gives the same output (random data of the 1.5B's
shape: 0 of 200 differ, where 16 keys more than the query needs differ in 2-7 of 150; tests/test_packed.py). With
whole blocks, projections whose rows do not depend on one another (the Llama family's packed ones: bf16_linear up to
kernels/cpu.py's BF16_ROWS rows, amx_linear up to AMX_ROWS on a CPU with AMX: packed.row_limit), and at least 4
query heads per key/value head (with fewer, sdpa's output rows depend on how many there are: 13-38 of 360 rows on
random data with 1-3; the 1.5B and 0.5B have 6 and 7, SmolLM2-135M 3), a forward over that many tokens gives each
position the one-token forward's logits bit for bit. Forwards in bfloat16 and float16 read whole blocks
(StaticForward.whole_key_blocks); in float32 and on a GPU the keys end at the last new token."""


def key_width(end: int, device: torch.device, whole_blocks: bool = True) -> int:
    """How many cache positions a forward that ends at ``end`` attends over: ``end`` rounded up to KEY_BLOCK on a CPU
    with ``whole_blocks``, ``end`` otherwise."""
    return -(-end // KEY_BLOCK) * KEY_BLOCK if whole_blocks and device.type == "cpu" else end


class StaticForward:
    """The call and the KV cache of a static forward: keys and values of every layer in two buffers,
    dtype [n_layer, B, H_kv, capacity, D].

    A family's forward subclasses it, sets ``n_layer``, ``kv_heads``, ``head_dim`` and ``dtype`` in its
    constructor and implements :meth:`forward`; CachedModel calls it, :meth:`allocate`, :meth:`grow` and
    :meth:`select`.
    """

    n_layer: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    keys: torch.Tensor | None = None       # [n_layer, B, H_kv, capacity, D]
    values: torch.Tensor | None = None
    row_forward = None
    """input_ids [1, 1], length -> logits [1, 1, V]: the family's forward of one token in one batch row with no mask
    and no position ids, in one kernel call, where it has one (llama.py with int4 projections: int4_row.py)."""
    row_kernel: str | None = None
    """The kernel row_forward runs ("int4_layers"), recorded by a run as ``resolved.row_kernel``; None without one."""
    compiled = None
    """The compiled steps (compiled.py's CompiledSteps) where :meth:`compile` turned them on; None: every step eager."""
    forward_at = None
    """input_ids int64 [B, q], at int64 [q] (consecutive cache positions), last -> logits [B, q or last, V]: the
    family's forward at fixed shapes, over the whole cache (compiled.py), where it has one (llama.py)."""

    def compile(self, mode: str) -> None:
        """Run the steps compiled.py compiles through ``torch.compile(mode=mode)``; one-line SpecsweepError for a
        family without a fixed-shape forward, or a forward whose products are our kernels (packed or int4 rows)."""
        name = type(self).__name__.removesuffix("StaticForward")
        if self.forward_at is None:
            raise SpecsweepError(f"--compile compiles the static forward of a Llama, Mistral or Qwen2 model; this "
                                 f"model's family ({name}) has no compiled form: drop --compile")
        if getattr(self, "packed", False) or self.row_forward is not None or getattr(self, "quant", "none") != "none":
            raise SpecsweepError("--compile compiles torch's own products, not our kernels' packed or quantised "
                                 "weights: drop --draft-quant, or drop --compile")
        self.compiled = CompiledSteps(self, mode)

    def __call__(self, input_ids: torch.Tensor, length: int, attend: torch.Tensor | None,
                 positions: torch.Tensor | None, last: int) -> torch.Tensor:
        """Append input_ids int64 [B, q] at cache positions [length, length + q) and return logits [B, q, V] (or
        the last ``last`` positions' [B, last, V]).

        attend     bool [B, 1, q, length + q] (True = attend), or None: plain causal over every position
        positions  int64 [B, q] position ids, or None: length, length + 1, ...

        The family's forward attends over :func:`key_width` positions: ``attend`` gets False columns up to it.
        """
        q = input_ids.shape[1]
        end = length + q
        width = key_width(end, input_ids.device, self.whole_key_blocks)
        self.grow(width)
        if self.row_forward is not None and q == 1 and attend is None and positions is None \
                and input_ids.shape[0] == 1:
            return self.row_forward(input_ids, length)
        if self.compiled is not None and self.compiled.takes(length, q, attend, positions):
            return self.compiled(input_ids, length, last)
        if attend is None and (q > 1 or width > end):   # causal among the new tokens, everything cached before them
            key = torch.arange(width, device=input_ids.device)
            attend = key <= torch.arange(length, end, device=input_ids.device)[:, None]
        elif attend is not None and width > end:
            attend = F.pad(attend, (0, width - end), value=False)
        return self.forward(input_ids, length, attend, positions, last)

    @property
    def whole_key_blocks(self) -> bool:
        """Whether attention on a CPU reads whole blocks of KEY_BLOCK keys: in bfloat16 and float16, where a last-bit
        difference flips a near tie (GPT-2's `bench lossless --synthetic` greedy agreement in bfloat16: 3/8 with the
        keys ending at the last new token, 6/8 over whole blocks). Not in float32, where it would only cost time (a toy
        GPT-2's one-token forward: 145 µs against 166 µs over 512 keys) and ties that close are rare."""
        return self.dtype in (torch.bfloat16, torch.float16)

    def forward(self, input_ids: torch.Tensor, length: int, attend: torch.Tensor | None,
                positions: torch.Tensor | None, last: int) -> torch.Tensor:
        """The family's forward, as :meth:`__call__` but with room for the new tokens, and ``attend`` bool
        [B, 1, q, S] or [q, S] over the first S = :func:`key_width` cache positions, or None where the one query
        attends every position up to its own (q = 1, S = length + 1)."""
        raise NotImplementedError

    @property
    def capacity(self) -> int:
        return 0 if self.keys is None else self.keys.shape[3]

    def allocate(self, batch: int, capacity: int, device: torch.device) -> None:
        """Fresh buffers for ``batch`` rows and ``capacity`` positions, rounded up to KEY_BLOCK with whole blocks of
        keys (previous contents are dropped). Zeros: a masked position's key and value must be finite (a NaN there would
        leak through the mask)."""
        capacity = key_width(capacity, torch.device(device), self.whole_key_blocks)
        if self.compiled is not None:
            # compiled steps (compiled.py): whole blocks, so a few capacities serve every prompt, and the buffers of
            # the last generation where they are large enough, so their graphs stay valid
            capacity = -(-capacity // KEY_BLOCK) * KEY_BLOCK
            if self.keys is not None and self.keys.shape[:3] == (self.n_layer, batch, self.kv_heads) \
                    and self.capacity >= capacity and self.keys.device == torch.device(device):
                self.keys.zero_()
                self.values.zero_()
                return
        shape = (self.n_layer, batch, self.kv_heads, capacity, self.head_dim)
        self.keys = torch.zeros(shape, dtype=self.dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        if self.compiled is not None:
            mark_static(self.keys, self.values)

    def grow(self, capacity: int) -> None:
        """At least ``capacity`` positions, keeping what is cached (doubling, so appends stay amortised O(1))."""
        if capacity <= self.capacity:
            return
        new = max(capacity, 2 * self.capacity)
        for name in ("keys", "values"):
            old = getattr(self, name)
            buf = old.new_zeros((*old.shape[:3], new, old.shape[4]))
            buf[:, :, :, : old.shape[3]] = old
            setattr(self, name, buf)
        if self.compiled is not None:
            mark_static(self.keys, self.values)

    def keep_path(self, first: int, path: torch.Tensor) -> None:
        """Compact a token tree's accepted path in place: the entries of node path[b, d] (cache position first +
        path[b, d]) move to position first + d, for path int64 [B, P] (-1 entries: any node's entries land there,
        past what the row keeps). Nodes sit at or after their depth's slot, so no entry is read after it is
        overwritten (the gather reads before the write)."""
        B, P = path.shape
        index = (first + path.clamp_min(0))[None, :, None, :, None].expand(
            self.n_layer, B, self.kv_heads, P, self.head_dim)
        for buf in (self.keys, self.values):
            buf[:, :, :, first: first + P] = buf.gather(3, index)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these batch rows (int64 indices on the cache's device)."""
        self.keys, self.values = self.keys[:, rows], self.values[:, rows]
        if self.compiled is not None:
            mark_static(self.keys, self.values)
