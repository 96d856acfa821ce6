"""The decoding loop's one device-to-host transfer per step (pipeline/decoding/engine.py)."""

from __future__ import annotations

import torch


def to_host(parts: dict[str, torch.Tensor]) -> dict[str, list]:
    """One device-to-host transfer of several int64 tensors of the same batch b, each [b] or [k, b]: a dict of the
    same names, [b] as a list of b ints and [k, b] as k lists of b ints."""
    rows, spans = [], {}
    for name, t in parts.items():
        block = t[None] if t.dim() == 1 else t
        spans[name] = (sum(r.shape[0] for r in rows), block.shape[0], t.dim() == 1)
        rows.append(block.long())
    host = torch.cat(rows).tolist()
    return {name: host[start] if flat else host[start: start + n] for name, (start, n, flat) in spans.items()}
