"""How AdaSum's weight deltas travel between the ranks of a process group.

Two exchanges compute the same AdaSum of every rank's flat delta (:mod:`.maths`):

- :func:`allgather_exchange`: every rank receives every rank's whole delta and combines them
  locally (traffic and memory grow with ranks x parameters). Through a
  :class:`~lit_amp.boost.adasum.shm.ShmAllGather` (shared memory, ranks on one host) when one
  is given, else the process group's ``all_gather``. Used for 2 ranks (the same bytes as
  halving, in one collective), for ``transport="shm"``, and as the reference halving is tested
  against.
- :class:`VectorHalving`: Horovod's recursive vector halving through point-to-point sends;
  each rank sends about 2N floats for N parameters whatever the number of ranks.

:func:`exchange` picks one; :func:`adasum_allreduce_` is the public in-place form.
:data:`TRAFFIC` counts the bytes this process sent (``bench/adasum_bytes.py`` reads it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from lit_amp._runtime import dist_ready
from lit_amp.boost.adasum.maths import EPS, SegmentLayout, combine_rows
from lit_amp.boost.adasum.shm import ShmAllGather

__all__ = [
    "TRAFFIC",
    "VectorHalving",
    "adasum_allreduce_",
    "allgather_exchange",
    "count_sent",
    "exchange",
]

#: bytes this process has sent in AdaSum exchanges (point-to-point sends counted exactly;
#: collectives by their ring algorithm's share per rank) — read by ``bench/adasum_bytes.py``
TRAFFIC = {"bytes_sent": 0}


def count_sent(numel: int, itemsize: int = 4) -> None:
    """Add ``numel`` items of ``itemsize`` bytes to :data:`TRAFFIC`."""
    TRAFFIC["bytes_sent"] += int(numel) * itemsize


def allgather_exchange(
    delta: Tensor,
    layout: SegmentLayout,
    group: Any,
    local_size: int,
    buffers: Sequence[Tensor] = (),
    eps: float = EPS,
    channel: ShmAllGather | None = None,
) -> tuple[Tensor, Tensor | None]:
    """AdaSum of every rank's ``delta`` by an all-gather, and the mean of ``buffers``.

    Every rank receives every rank's whole delta (and buffers): through ``channel`` (shared
    memory, one host) when given and large enough, else the process group. With
    ``local_size > 1`` one row per block enters the combination.

    Returns:
        ``(combined, buffer mean)``; the mean is None without buffers.
    """
    n = delta.numel()
    flat = delta
    if buffers:
        flat = torch.cat([delta, *[b.detach().reshape(-1).float() for b in buffers]])
    world = dist.get_world_size(group)
    if channel is not None and flat.numel() <= channel.numel:
        gathered = channel.all_gather(flat)  # valid until the next exchange: used right here
    else:
        gathered = torch.empty(world, flat.numel(), dtype=flat.dtype, device=flat.device)
        dist.all_gather(list(gathered.unbind(0)), flat, group=group)
    count_sent((world - 1) * flat.numel(), flat.element_size())
    rows = list(gathered[:, :n].unbind(0)) if buffers else list(gathered.unbind(0))
    rows = rows[::local_size] if local_size > 1 and world % local_size == 0 else rows
    combined = combine_rows(rows, layout, eps)
    mean = gathered[:, n:].mean(0) if buffers else None
    return combined, mean


Slice = tuple[int, int]


class VectorHalving:
    """Horovod's recursive vector-halving AdaSum of one flat vector, for one rank.

    The ranks taking part (block leaders, "virtual ranks" ``0..B-1``) form the combine tree of
    :func:`~lit_amp.boost.adasum.maths.combine_rows`: at level ``k`` the node of ranks
    ``[g, g + 2^(k-1))`` (always complete) combines with the node ``[g + 2^(k-1), g + 2^k)``
    (possibly cut short by ``B``, or empty: then carried up). Every rank holds one contiguous
    slice of its node's vector (``held``, known to all ranks). Two complete nodes halve: paired
    ranks hold the same slice, the left one keeps the first half and the right one the second,
    and they swap the other halves. A cut-short right node instead sends its pieces to the left
    node's holders (and holds nothing afterwards). Per-tensor dot products and norms are partial
    sums over the slices, summed over the node's holders (an aligned power-of-two group) by
    recursive doubling; at the end every rank all-gathers the slices. Sent per rank: ~N/2 + N/4
    + ... + ~N in the final gather, about 2N floats whatever the number of ranks (plus 3 scalars
    per tensor and level). Single-element tensors are summed along the tree and divided by B at
    the end. With blocks (``local_size > 1``) only the block leaders halve; the closing
    all-gather includes every rank (non-leaders send padding), ~``local_size`` x N floats per
    rank.
    """

    def __init__(self, layout: SegmentLayout, group: Any, local_size: int, eps: float) -> None:
        self.layout, self.group, self.eps = layout, group, eps
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        self.world = world
        self.ls = local_size if local_size > 1 and world % local_size == 0 else 1
        self.blocks = world // self.ls
        self.me = rank // self.ls if rank % self.ls == 0 else None

    def _peer(self, v: int) -> int:
        r = v * self.ls
        return r if self.group is None else dist.get_global_rank(self.group, r)

    def _p2p(self, sends: list[tuple[int, Tensor]], recvs: list[tuple[int, Tensor]]) -> None:
        ops = [dist.P2POp(dist.isend, t.contiguous(), self._peer(v), self.group) for v, t in sends]
        ops += [dist.P2POp(dist.irecv, t, self._peer(v), self.group) for v, t in recvs]
        for _, t in sends:
            count_sent(t.numel(), t.element_size())
        if ops:  # batched: NCCL needs the sends and receives of a swap in one group call
            for w in dist.batch_isend_irecv(ops):
                w.wait()

    def _allreduce(self, x: Tensor, g0: int, size: int) -> Tensor:
        """Sum of ``x`` over virtual ranks ``[g0, g0 + size)`` (size a power of two), by
        recursive doubling; x + y == y + x, so every rank gets the same bits."""
        step = 1
        while step < size:
            buf = torch.empty_like(x)
            self._p2p([(g0 + ((self.me - g0) ^ step), x)], [(g0 + ((self.me - g0) ^ step), buf)])
            x = x + buf
            step *= 2
        return x

    def _redistribute(
        self, data: Tensor, held: dict[int, Slice], tgt: dict[int, Slice], nodes: tuple
    ) -> tuple[Tensor, Tensor]:
        """Send my pieces to their new holders; return (left's, right's) vector on my slice."""
        me, mine, want = self.me, held[self.me], tgt[self.me]
        sends, recvs, got = [], [], {}
        for q in (*nodes[0], *nodes[1]):
            out, inn = _intersect(mine, tgt[q]), _intersect(held[q], want)
            if q != me and out:
                sends.append((q, data[out[0] - mine[0] : out[1] - mine[0]]))
            if q != me and inn:
                got[q] = data.new_empty(inn[1] - inn[0])
                recvs.append((q, got[q]))
        self._p2p(sends, recvs)
        sides = []
        for side in nodes:
            pieces = []
            for q in sorted(side, key=lambda q: held[q][0]):
                inn = _intersect(held[q], want)
                if inn:
                    pieces.append(got[q] if q != me else data[inn[0] - mine[0] : inn[1] - mine[0]])
            sides.append(torch.cat(pieces) if pieces else data.new_empty(0))
        return sides[0], sides[1]

    def _combine(self, a: Tensor, b: Tensor, sl: Slice, g0: int, size: int) -> Tensor:
        """AdaSum of a and b on my slice, with per-tensor sums over the holders."""
        lay = self.layout
        s, e = sl
        lengths = lay.ends.clamp(s, e) - lay.starts.clamp(s, e)
        part = torch.stack(
            [torch.segment_reduce(x, "sum", lengths=lengths) for x in (a * b, a * a, b * b)]
        ) if e > s else a.new_zeros(3, len(lay.sizes))
        dot, na, nb = self._allreduce(part, g0, size).add_(self.eps).unbind(0)
        idx = lay.index[s:e]
        ca = (1 - dot / (2 * na)).index_select(0, idx)
        cb = (1 - dot / (2 * nb)).index_select(0, idx)
        return torch.where(lay.scalar_mask[s:e], a + b, torch.addcmul(ca.mul_(a), cb, b))

    def _level(self, data: Tensor, held: dict[int, Slice], size: int) -> Tensor:
        """One level of the tree (nodes of ``size`` ranks combine in pairs)."""
        for g0 in range(0, self.blocks, 2 * size):
            left = range(g0, g0 + size)
            right = range(g0 + size, min(g0 + 2 * size, self.blocks))
            if not right:
                continue
            full = len(right) == size
            tgt: dict[int, Slice] = {}
            for i, v in enumerate(left):
                s, e = held[v]
                tgt[v] = (s, (s + e) // 2) if full else (s, e)
                if full:
                    tgt[right[i]] = ((s + e) // 2, e)
            if not full:
                tgt.update({v: (0, 0) for v in right})
            if self.me is not None and g0 <= self.me < g0 + 2 * size:
                a, b = self._redistribute(data, held, tgt, (left, right))
                holders = 2 * size if full else size
                if self.me < g0 + holders:
                    data = self._combine(a, b, tgt[self.me], g0, holders)
                else:
                    data = data.new_empty(0)
            held.update(tgt)
        return data

    def run(self, delta: Tensor) -> Tensor:
        """The AdaSum over the ranks of this rank's flat ``delta`` (every rank calls it)."""
        n = delta.numel()
        held: dict[int, Slice] = {v: (0, n) for v in range(self.blocks)}
        data, size = delta, 1
        while size < self.blocks:
            data = self._level(data, held, size)
            size *= 2
        lmax = max(e - s for s, e in held.values())
        mine = delta.new_zeros(lmax)
        if self.me is not None:
            mine[: data.numel()] = data
        gathered = delta.new_empty(self.world, lmax)
        dist.all_gather(list(gathered.unbind(0)), mine, group=self.group)
        count_sent((self.world - 1) * lmax, delta.element_size())
        out = delta.new_empty(n)
        for v, (s, e) in held.items():
            out[s:e] = gathered[v * self.ls, : e - s]
        if self.layout.scalar_idx.numel():
            out[self.layout.scalar_idx] /= self.blocks
        return out


def _intersect(x: Slice, y: Slice) -> Slice | None:
    s, e = max(x[0], y[0]), min(x[1], y[1])
    return (s, e) if s < e else None


def exchange(
    delta: Tensor,
    layout: SegmentLayout,
    group: Any,
    local_size: int,
    buffers: Sequence[Tensor] = (),
    eps: float = EPS,
    channel: ShmAllGather | None = None,
) -> tuple[Tensor, Tensor | None]:
    """AdaSum over ranks of a flat fp32 vector (segments = tensors), and the mean of
    ``buffers`` over ranks; returns new tensors (mean None without buffers). Through
    ``channel`` (shared memory): the all-gather exchange; else vector halving through the
    process group's point-to-point sends, and an all-reduce for the buffers. Two ranks use the
    all-gather: the same N floats sent per rank as halving, in one collective instead of
    three."""
    if channel is not None or dist.get_world_size(group) == 2:
        return allgather_exchange(delta, layout, group, local_size, buffers, eps, channel)
    combined = VectorHalving(layout, group, local_size, eps).run(delta)
    if not buffers:
        return combined, None
    flat = torch.cat([b.detach().reshape(-1).float() for b in buffers])
    dist.all_reduce(flat, group=group)
    world = dist.get_world_size(group)
    count_sent(2 * (world - 1) * flat.numel() // world, flat.element_size())
    return combined, flat.div_(world)


def adasum_allreduce_(
    tensors: Sequence[Tensor],
    group: Any = None,
    local_size: int = 1,
    eps: float = EPS,
) -> None:
    """Replace each rank's ``tensors`` (deltas) by their AdaSum over ranks, in place.

    All ranks must call it with tensors of the same shapes. ``local_size > 1``: the tensors
    of the ``local_size`` ranks of a block are assumed equal already (block-averaged
    gradients) and one per block enters the combination. No-op without ``torch.distributed``
    or with one rank.

    Example:
        >>> t = [torch.ones(2)]
        >>> adasum_allreduce_(t)   # without torch.distributed: unchanged
        >>> t
        [tensor([1., 1.])]
    """
    if not tensors or not dist_ready():
        return
    if dist.get_world_size(group) == 1:
        return
    flat = torch.cat([t.detach().reshape(-1).float() for t in tensors])
    layout = SegmentLayout([t.shape for t in tensors], flat.device)
    out, _ = exchange(flat, layout, group, local_size, eps=eps)
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(out[offset : offset + n].view_as(t))
            offset += n

