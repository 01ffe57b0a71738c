"""AdaSum's arithmetic, without communication: the pairwise combination and the combine tree.

Per parameter tensor, two ranks' weight deltas ``a`` and ``b`` combine into

    ``(1 - (a·b + ε) / (2 (‖a‖² + ε))) a + (1 - (a·b + ε) / (2 (‖b‖² + ε))) b``, ``ε = 1e-12``

(MS ``boost/adasum.py``; Maleki et al., MLSys 2021): identical deltas are averaged, orthogonal
ones added. Ranks combine in recursive-doubling order: ``(0,1), (2,3), ...`` first, then those
results, ...; an odd one is carried up the tree. Single-element tensors are averaged
(MindSpore cannot split them across partners). The exchanges of
:mod:`~lit_amp.boost.adasum.transport` work on flat vectors whose segments are the tensors
(:class:`SegmentLayout`).

Example:
    >>> a = torch.tensor([1.0, 0.0]); b = torch.tensor([0.0, 1.0])
    >>> adasum_combine(a, b)            # orthogonal: summed
    tensor([1., 1.])
    >>> adasum_combine(a, a)            # parallel: averaged
    tensor([1., 0.])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["EPS", "SegmentLayout", "adasum_combine", "adasum_reduce", "combine_rows"]

#: the ε of the combination (MindSpore's)
EPS = 1e-12


def adasum_combine(a: Tensor, b: Tensor, eps: float = EPS) -> Tensor:
    """AdaSum of two same-shaped tensors (one parameter's deltas from two ranks).

    Raises:
        ValueError: the shapes differ.

    Example:
        >>> adasum_combine(torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0]))
        tensor([2.0000, 0.5000])
    """
    if a.shape != b.shape:
        raise ValueError(
            f"adasum_combine: 'a' and 'b' must have the same shape, but got {tuple(a.shape)} "
            f"and {tuple(b.shape)}."
        )
    dot = (a * b).sum() + eps
    na = (a * a).sum() + eps
    nb = (b * b).sum() + eps
    return (1 - dot / (2 * na)) * a + (1 - dot / (2 * nb)) * b


class SegmentLayout:
    """Where each tensor's segment lies in a flat vector, for the per-tensor AdaSum.

    Attributes:
        sizes: the tensors' element counts.
        lengths, starts, ends: the segments, as tensors on ``device``.
        index: the segment id of every flat element (a gather index for per-segment values).
        scalar_idx: the flat offsets of the single-element tensors.
        scalar_mask: per flat element, whether it belongs to a single-element tensor.

    Example:
        >>> lay = SegmentLayout([torch.Size([2, 2]), torch.Size([1])], torch.device("cpu"))
        >>> lay.sizes, lay.index.tolist(), lay.scalar_idx.tolist()
        ([4, 1], [0, 0, 0, 0, 1], [4])
    """

    __slots__ = ("sizes", "lengths", "index", "scalar_idx", "starts", "ends", "scalar_mask")

    def __init__(self, shapes: Sequence[torch.Size], device: torch.device) -> None:
        self.sizes = [int(torch.Size(sh).numel()) for sh in shapes]
        self.lengths = torch.tensor(self.sizes, device=device)
        self.ends = torch.cumsum(self.lengths, 0)
        self.starts = self.ends - self.lengths
        self.index = torch.repeat_interleave(
            torch.arange(len(self.sizes), device=device), self.lengths
        )
        offsets = [sum(self.sizes[:i]) for i, n in enumerate(self.sizes) if n == 1]
        self.scalar_idx = torch.tensor(offsets, dtype=torch.long, device=device)
        self.scalar_mask = (self.lengths == 1).index_select(0, self.index)


def _combine_flat(a: Tensor, b: Tensor, layout: SegmentLayout, eps: float) -> Tensor:
    """Per-segment AdaSum of two flat vectors (segments = tensors)."""
    dot = torch.segment_reduce(a * b, "sum", lengths=layout.lengths).add_(eps)
    na = torch.segment_reduce(a * a, "sum", lengths=layout.lengths).add_(eps)
    nb = torch.segment_reduce(b * b, "sum", lengths=layout.lengths).add_(eps)
    ca = (1 - dot / (2 * na)).index_select(0, layout.index)
    cb = (1 - dot / (2 * nb)).index_select(0, layout.index)
    return torch.addcmul(ca.mul_(a), cb, b)


def combine_rows(rows: list[Tensor], layout: SegmentLayout, eps: float = EPS) -> Tensor:
    """AdaSum of flat vectors (one per rank) in recursive-doubling order, segment by segment;
    single-element segments are averaged over the rows.

    Example:
        >>> lay = SegmentLayout([torch.Size([2]), torch.Size([1])], torch.device("cpu"))
        >>> combine_rows([torch.tensor([1.0, 0, 2]), torch.tensor([0, 1.0, 4])], lay)
        tensor([1., 1., 3.])
    """
    level = rows
    while len(level) > 1:
        nxt = [_combine_flat(level[i], level[i + 1], layout, eps)
               for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    out = level[0]
    if layout.scalar_idx.numel():
        out[layout.scalar_idx] = torch.stack([r[layout.scalar_idx] for r in rows]).mean(0)
    return out


def adasum_reduce(deltas: Sequence[Sequence[Tensor]] | Sequence[Tensor], eps: float = EPS) -> Any:
    """AdaSum over ranks, in recursive-doubling order, without communication.

    Args:
        deltas: one entry per rank: a tensor, or a list of tensors (one per parameter, combined
            tensor by tensor).
        eps: the combination's ε.

    Returns:
        The combined tensor, or list of tensors. Single-element tensors are averaged.

    Raises:
        ValueError: ``deltas`` is empty.

    Example:
        >>> r = adasum_reduce([torch.tensor([1.0, 0]), torch.tensor([0, 1.0]),
        ...                    torch.tensor([1.0, 0]), torch.tensor([0, 1.0])])
        >>> r        # (a+b) with (a+b): parallel, averaged
        tensor([1., 1.])
    """
    if not deltas:
        raise ValueError("adasum_reduce: 'deltas' must hold at least one rank's deltas.")
    single = isinstance(deltas[0], Tensor)
    per_rank = [[d] if single else list(d) for d in deltas]
    shapes = [t.shape for t in per_rank[0]]
    rows = [torch.cat([t.reshape(-1) for t in r]) for r in per_rank]
    layout = SegmentLayout(shapes, rows[0].device)
    out = combine_rows(rows, layout, eps)
    parts = list(torch.split(out, layout.sizes))
    res = [p.reshape(s) for p, s in zip(parts, shapes)]
    return res[0] if single else res
