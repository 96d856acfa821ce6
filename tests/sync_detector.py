"""Detect host syncs on any device, CPU included.

A host sync is an op whose result the host must read: ``.item()``/``bool(t)``/``int(t)`` dispatch to
``aten::_local_scalar_dense``; ``nonzero``, ``masked_select`` and friends need the data to size their output.
``NoHostSync`` records every such op dispatched inside it, so the tests can prove a hot path has none, on a
CPU-only machine where ``torch.cuda.set_sync_debug_mode`` cannot help.
"""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode

SYNCING_OPS = {
    "aten::_local_scalar_dense",  # .item(), bool(), int(), float() on a tensor
    "aten::is_nonzero",
    "aten::nonzero",
    "aten::nonzero_static",
    "aten::masked_select",
    "aten::unique_consecutive",
    "aten::_unique2",
    "aten::repeat_interleave",
    "aten::equal",
}


class NoHostSync(TorchDispatchMode):
    """Context manager: ``with NoHostSync() as m: ...`` then ``m.syncs`` lists offending op names."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name in SYNCING_OPS:
            self.syncs.append(name)
        return func(*args, **(kwargs or {}))


def assert_no_host_sync(fn, *args, **kwargs):
    with NoHostSync() as mode:
        out = fn(*args, **kwargs)
    assert not mode.syncs, f"host syncs inside the step: {sorted(set(mode.syncs))}"
    return out

