"""Detect host syncs on any device, CPU included.

A host sync is an op whose result the host must read: ``.item()``/``bool(t)``/``int(t)`` dispatch to
``aten::_local_scalar_dense``; ``nonzero``, ``masked_select``, boolean-mask indexing ``x[mask]`` and friends
need the data to size their output.
``NoHostSync`` records every such op dispatched inside it, so the tests can prove a hot path has none, on a
CPU-only machine where ``torch.cuda.set_sync_debug_mode`` cannot help.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNCING_OPS = {
    "aten::_local_scalar_dense",  # .item(), bool(), int(), float() on a tensor
    "aten::item",  # .item() as seen under inference_mode (not decomposed into _local_scalar_dense there)
    "aten::is_nonzero",
    "aten::nonzero",
    "aten::nonzero_static",
    "aten::masked_select",
    "aten::unique_consecutive",
    "aten::_unique2",
    "aten::repeat_interleave",
    "aten::equal",
}


BOOL_INDEXING_OPS = {"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"}


def _has_bool_index(args) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in indices or ())


class NoHostSync(TorchDispatchMode):
    """Context manager: ``with NoHostSync() as m: ...`` then ``m.syncs`` lists offending op names."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name in SYNCING_OPS:
            self.syncs.append(name)
        elif name in BOOL_INDEXING_OPS and _has_bool_index(args):
            # x[mask]: the output size depends on the mask's values (a nonzero inside the kernel on CPU,
            # a host sync on a GPU)
            self.syncs.append(f"{name} with a boolean mask")
        return func(*args, **(kwargs or {}))


def assert_no_host_sync(fn, *args, **kwargs):
    with NoHostSync() as mode:
        out = fn(*args, **kwargs)
    assert not mode.syncs, f"host syncs inside the step: {sorted(set(mode.syncs))}"
    return out

