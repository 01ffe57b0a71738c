"""Sparse gradients: :func:`coalesced`, torch's ``coalesce`` without a sort of sorted indices.

An embedding looked up once per distinct row (``WideDeep``: ``torch.unique`` first) gets a
sparse gradient whose indices are strictly increasing, but torch never marks it coalesced
(autograd's accumulation drops the flag), so every ``coalesce()`` sorted it again.

Example:
    >>> g = torch.sparse_coo_tensor(torch.tensor([[1, 4, 7]]), torch.ones(3, 2), (9, 2))
    >>> g.is_coalesced(), coalesced(g).is_coalesced()
    (False, True)
"""

from __future__ import annotations

import torch

__all__ = ["coalesced"]


def coalesced(t: torch.Tensor) -> torch.Tensor:
    """``t.coalesce()``; a 1-d-indexed tensor whose indices strictly increase (and that does
    not require grad) is only marked coalesced (it is: sorted, no duplicates), in place,
    without a copy."""
    if t.is_coalesced():
        return t
    if t.sparse_dim() == 1 and not t.requires_grad:
        idx = t._indices()[0]
        if idx.numel() < 2 or bool((idx[1:] > idx[:-1]).all()):
            return t._coalesced_(True)
    return t.coalesce()
