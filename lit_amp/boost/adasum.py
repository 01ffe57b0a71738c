"""AdaSum: combine the data-parallel ranks' weight updates adaptively (semantics.md §3.3).

Each rank takes its optimizer step on its **own** gradients; the weight deltas
``Δ_r = w_old - w_new`` are then combined pairwise (recursive halving/doubling order: ranks
``(0,1), (2,3), ...`` first, then those results, ...) with, per parameter tensor,

    ``res = (1 - (a·b + ε) / (2 (‖a‖² + ε))) a + (1 - (a·b + ε) / (2 (‖b‖² + ε))) b``,
    ``ε = 1e-12``

(MS ``boost/adasum.py``; Maleki et al., MLSys 2021): identical updates are averaged,
orthogonal ones added. Every rank then sets ``w = w_old - res``, so weights stay identical
across ranks while optimizer states (momentum) stay local, as in MindSpore and Horovod.
Single-element parameters are averaged (MindSpore cannot split them across partners).

``local_size`` mirrors MindSpore's nodes: gradients are averaged inside each block of
``local_size`` consecutive ranks (MindSpore: the 8 devices of a node), and AdaSum combines the
blocks. MindSpore switches AdaSum on only for ≥ 2 nodes of 8 devices (≥ 16 devices), so on one
machine its O2 equals O1; lit_amp combines across all data-parallel ranks when ``local_size``
does not divide the world into ≥ 2 blocks (``local_size=1``: every rank is a block), which
makes it usable — and testable — with 2 CPU processes. Any world size works (an odd block is
carried up the tree); MindSpore needs a power of two.

Implementation: optimizer step pre-/post-hooks (snapshot, then combine after the local step).
The flattened delta travels by Horovod's recursive vector halving through the process group's
point-to-point sends (:class:`_Halving`): each level swaps half of the current slice with a
partner, sums the per-tensor partial dot products and norms over the ranks of the subtree, and
recurses on the half; one all-gather of the slices ends it. Each rank sends about 2N floats for
N parameters whatever the number of ranks (the former all-gather sent (world - 1) x N and held
world x N; ``bench/adasum_bytes.py``). Two ranks exchange by one all-gather (the same N floats,
one collective); on one host with gloo they use shared memory (:mod:`lit_amp.boost._shm`,
``transport="auto"``), measured faster there. With ``local_size=1`` DDP's gradient
synchronisation is switched off altogether (each rank keeps its own gradients; the floating
buffers DDP would broadcast, BatchNorm's running statistics, are averaged over the ranks in the
same ``all_gather`` instead); with blocks, a DDP communication hook replaces DDP's gradient
averaging by a block-local mean (:func:`noop_comm_hook` is the per-rank variant for plain DDP
without Lightning). Usable without
Lightning: :func:`adasum_combine`, :func:`adasum_reduce`, :func:`adasum_allreduce_`,
:func:`noop_comm_hook`, :class:`AdaSumHooks`.

Example:
    >>> a = torch.tensor([1.0, 0.0]); b = torch.tensor([0.0, 1.0])
    >>> adasum_combine(a, b)            # orthogonal: summed
    tensor([1., 1.])
    >>> adasum_combine(a, a)            # parallel: averaged
    tensor([1., 0.])

Size: over 500 lines — the combine tree, both exchanges (vector halving, and the all-gather
it is tested against) and the DDP hooks share the layout and tree code; the shared-memory
transport already lives apart (:mod:`lit_amp.boost._shm`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lit_amp._runtime import dist_ready
from lit_amp.boost._shm import ShmAllGather
from lit_amp.boost.base import BoostAlgorithm

__all__ = [
    "AdaSum",
    "AdaSumHooks",
    "adasum_combine",
    "adasum_reduce",
    "adasum_allreduce_",
    "noop_comm_hook",
    "local_mean_comm_hook",
    "EPS",
]

log = logging.getLogger(__name__)

EPS = 1e-12


def adasum_combine(a: Tensor, b: Tensor, eps: float = EPS) -> Tensor:
    """AdaSum of two same-shaped tensors (one parameter's deltas from two ranks).

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


class _Layout:
    """Where each tensor's segment lies in a flat vector, for the per-tensor AdaSum."""

    __slots__ = ("sizes", "lengths", "index", "scalar_idx", "starts", "ends", "scalar_mask")

    def __init__(self, shapes: Sequence[torch.Size], device: torch.device) -> None:
        self.sizes = [int(torch.Size(sh).numel()) for sh in shapes]
        self.lengths = torch.tensor(self.sizes, device=device)
        self.ends = torch.cumsum(self.lengths, 0)
        self.starts = self.ends - self.lengths
        # segment id of every flat element: a gather index for the per-segment coefficients
        self.index = torch.repeat_interleave(
            torch.arange(len(self.sizes), device=device), self.lengths
        )
        offsets = [sum(self.sizes[:i]) for i, n in enumerate(self.sizes) if n == 1]
        self.scalar_idx = torch.tensor(offsets, dtype=torch.long, device=device)
        self.scalar_mask = (self.lengths == 1).index_select(0, self.index)


def _combine_flat(a: Tensor, b: Tensor, layout: _Layout, eps: float) -> Tensor:
    """Per-segment AdaSum of two flat vectors (segments = tensors)."""
    dot = torch.segment_reduce(a * b, "sum", lengths=layout.lengths).add_(eps)
    na = torch.segment_reduce(a * a, "sum", lengths=layout.lengths).add_(eps)
    nb = torch.segment_reduce(b * b, "sum", lengths=layout.lengths).add_(eps)
    ca = (1 - dot / (2 * na)).index_select(0, layout.index)
    cb = (1 - dot / (2 * nb)).index_select(0, layout.index)
    return torch.addcmul(ca.mul_(a), cb, b)


def _tree(rows: list[Tensor], layout: _Layout, eps: float) -> Tensor:
    while len(rows) > 1:
        nxt = [_combine_flat(rows[i], rows[i + 1], layout, eps) for i in range(0, len(rows) - 1, 2)]
        if len(rows) % 2:
            nxt.append(rows[-1])
        rows = nxt
    return rows[0]


def _average_scalars(out: Tensor, rows: list[Tensor], scalar_idx: Tensor) -> Tensor:
    """Single-element tensors are averaged over the rows (MindSpore cannot split them)."""
    if scalar_idx.numel():
        out[scalar_idx] = torch.stack([r[scalar_idx] for r in rows]).mean(0)
    return out


def adasum_reduce(deltas: Sequence[Sequence[Tensor]] | Sequence[Tensor], eps: float = EPS) -> Any:
    """AdaSum over ranks, in recursive-doubling order, without communication.

    Args:
        deltas: one entry per rank: a tensor, or a list of tensors (one per parameter, combined
            tensor by tensor).

    Returns:
        The combined tensor, or list of tensors. Single-element tensors are averaged.

    Example:
        >>> r = adasum_reduce([torch.tensor([1.0, 0]), torch.tensor([0, 1.0]),
        ...                    torch.tensor([1.0, 0]), torch.tensor([0, 1.0])])
        >>> r        # (a+b) with (a+b): parallel, averaged
        tensor([1., 1.])
    """
    if not deltas:
        raise ValueError("adasum_reduce: 'deltas' must hold at least one rank's deltas.")
    single = isinstance(deltas[0], Tensor)
    per_rank = [[d] if single else list(d) for d in deltas]  # type: ignore[list-item]
    shapes = [t.shape for t in per_rank[0]]
    rows = [torch.cat([t.reshape(-1) for t in r]) for r in per_rank]
    layout = _Layout(shapes, rows[0].device)
    out = _average_scalars(_tree(rows, layout, eps), rows, layout.scalar_idx)
    parts = list(torch.split(out, layout.sizes))
    res = [p.reshape(s) for p, s in zip(parts, shapes)]
    return res[0] if single else res


# ------------------------------------------------------------------ the exchange
#: bytes this process has sent in AdaSum exchanges (point-to-point sends counted exactly;
#: collectives by their ring algorithm's share per rank) — read by ``bench/adasum_bytes.py``
TRAFFIC = {"bytes_sent": 0}


def _count(numel: int, itemsize: int = 4) -> None:
    TRAFFIC["bytes_sent"] += int(numel) * itemsize


def _allgather_exchange(
    delta: Tensor,
    layout: _Layout,
    group: Any,
    local_size: int,
    buffers: Sequence[Tensor] = (),
    eps: float = EPS,
    channel: ShmAllGather | None = None,
) -> tuple[Tensor, Tensor | None]:
    """The all-gather exchange (every rank receives every rank's whole delta: traffic and
    memory grow with ranks x parameters): through ``channel`` (shared memory, one host) when
    given, else the process group. Kept for ``transport="shm"`` and as the reference the
    vector-halving exchange is tested against."""
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
    _count((world - 1) * flat.numel(), flat.element_size())
    rows = list(gathered[:, :n].unbind(0)) if buffers else list(gathered.unbind(0))
    rows = rows[::local_size] if local_size > 1 and world % local_size == 0 else rows
    combined = _average_scalars(_tree(rows, layout, eps), rows, layout.scalar_idx)
    mean = gathered[:, n:].mean(0) if buffers else None
    return combined, mean


Slice = tuple[int, int]


class _Halving:
    """Horovod's recursive vector-halving AdaSum of one flat vector, for one rank.

    The ranks taking part (block leaders, "virtual ranks" ``0..B-1``) form the combine tree of
    :func:`_tree`: at level ``k`` the node of ranks ``[g, g + 2^(k-1))`` (always complete)
    combines with the node ``[g + 2^(k-1), g + 2^k)`` (possibly cut short by ``B``, or empty:
    then carried up). Every rank holds one contiguous slice of its node's vector (``held``,
    known to all ranks). Two complete nodes halve: paired ranks hold the same slice, the left
    one keeps the first half and the right one the second, and they swap the other halves. A
    cut-short right node instead sends its pieces to the left node's holders (and holds
    nothing afterwards). Per-tensor dot products and norms are partial sums over the slices,
    summed over the node's holders (an aligned power-of-two group) by recursive doubling; at
    the end every rank all-gathers the slices. Sent per rank: ~N/2 + N/4 + ... + ~N in the
    final gather, about 2N floats whatever the number of ranks (plus 3 scalars per tensor and
    level). Single-element tensors are summed along the tree and divided by B at the end.
    With blocks (``local_size > 1``) only the block leaders halve; the closing all-gather
    includes every rank (non-leaders send padding), ~``local_size`` x N floats per rank.
    """

    def __init__(self, layout: _Layout, group: Any, local_size: int, eps: float) -> None:
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
            _count(t.numel(), t.element_size())
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
        _count((self.world - 1) * lmax, delta.element_size())
        out = delta.new_empty(n)
        for v, (s, e) in held.items():
            out[s:e] = gathered[v * self.ls, : e - s]
        if self.layout.scalar_idx.numel():
            out[self.layout.scalar_idx] /= self.blocks
        return out


def _intersect(x: Slice, y: Slice) -> Slice | None:
    s, e = max(x[0], y[0]), min(x[1], y[1])
    return (s, e) if s < e else None


def _exchange(
    delta: Tensor,
    layout: _Layout,
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
    all-gather: the same N floats sent per rank as halving, in one collective instead of three
    (``bench/adasum_bytes.py``)."""
    if channel is not None or dist.get_world_size(group) == 2:
        return _allgather_exchange(delta, layout, group, local_size, buffers, eps, channel)
    combined = _Halving(layout, group, local_size, eps).run(delta)
    if not buffers:
        return combined, None
    flat = torch.cat([b.detach().reshape(-1).float() for b in buffers])
    dist.all_reduce(flat, group=group)
    world = dist.get_world_size(group)
    _count(2 * (world - 1) * flat.numel() // world, flat.element_size())
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
    """
    if not tensors or not dist_ready():
        return
    if dist.get_world_size(group) == 1:
        return
    flat = torch.cat([t.detach().reshape(-1).float() for t in tensors])
    layout = _Layout([t.shape for t in tensors], flat.device)
    out, _ = _exchange(flat, layout, group, local_size, eps=eps)
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(out[offset : offset + n].view_as(t))
            offset += n


# ------------------------------------------------------------------ DDP communication hooks
def noop_comm_hook(state: Any, bucket: Any) -> torch.futures.Future:
    """A DDP communication hook that keeps each rank's own gradients (no averaging)."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def local_mean_comm_hook(process_group: Any, bucket: Any) -> torch.futures.Future:
    """A DDP communication hook averaging gradients inside ``process_group`` only."""
    buf = bucket.buffer()
    buf.div_(dist.get_world_size(process_group))
    work = dist.all_reduce(buf, group=process_group, async_op=True)
    return work.get_future().then(lambda f: f.value()[0])


# DDP checks the hooks' annotations against the real classes (not strings)
for _hook in (noop_comm_hook, local_mean_comm_hook):
    _hook.__annotations__ = {
        "bucket": dist.GradBucket,
        "return": torch.futures.Future[torch.Tensor],
    }


_UNSYNCED: dict[type, type] = {}


def _unsync_ddp(ddp: nn.parallel.DistributedDataParallel) -> type:
    """Switch off ``ddp``'s gradient synchronisation for good; returns its class (to restore).

    Lightning (manual optimisation) and ``no_sync`` set ``require_backward_grad_sync`` back to
    ``True`` around every step; a per-instance subclass whose property ignores those writes keeps
    it off. Without it, the reducer would still bucket every gradient (and, with
    ``find_unused_parameters``, search the graph) just to hand each rank its own gradients back.
    """
    cls = type(ddp)
    sub = _UNSYNCED.get(cls)
    if sub is None:
        sub = _UNSYNCED[cls] = type(
            f"AdaSum{cls.__name__}",
            (cls,),
            {"require_backward_grad_sync": property(lambda self: False, lambda self, v: None)},
        )
    ddp.__class__ = sub
    return cls


def _resync_ddp(ddp: nn.parallel.DistributedDataParallel, cls: type) -> None:
    ddp.__class__ = cls
    ddp.require_backward_grad_sync = True
    ddp.require_forward_param_sync = True


# ------------------------------------------------------------------ optimizer hooks
class AdaSumHooks:
    """Optimizer step hooks applying AdaSum to each step's weight deltas (pure torch).

    Args:
        optimizers: the torch optimizers (their parameters, in order, form the delta).
        group: the process group (None: the default group).
        local_size: ranks per block whose gradients are already averaged.
        buffers: floating tensors (BatchNorm running statistics) averaged over the ranks in
            the same exchange, for when DDP no longer broadcasts them (see :class:`AdaSum`).
        channel: a :class:`~lit_amp.boost._shm.ShmAllGather` for the exchange (ranks on one
            host, CPU); None: the process group's ``all_gather``.

    Example:
        >>> net = nn.Linear(2, 1); opt = torch.optim.SGD(net.parameters(), lr=0.1)
        >>> hooks = AdaSumHooks([opt])   # without torch.distributed: a no-op
        >>> hooks.remove()
    """

    def __init__(
        self,
        optimizers: Sequence[torch.optim.Optimizer],
        group: Any = None,
        local_size: int = 1,
        buffers: Sequence[Tensor] = (),
        channel: ShmAllGather | None = None,
    ) -> None:
        self.group = group
        self.local_size = local_size
        self.buffers = [b for b in buffers if b.is_floating_point()]
        self.channel = channel
        self.steps = 0
        self._old: dict[int, Tensor] = {}
        self._layouts: dict[tuple, _Layout] = {}
        self._handles: list[Any] = []
        for opt in optimizers:
            self._handles.append(opt.register_step_pre_hook(self._pre))
            self._handles.append(opt.register_step_post_hook(self._post))

    @staticmethod
    def _params(opt: torch.optim.Optimizer) -> list[Tensor]:
        return [p for g in opt.param_groups for p in g["params"]]

    def _layout(self, params: list[Tensor]) -> _Layout:
        key = tuple(id(p) for p in params)
        cached = self._layouts.get(key)
        if cached is None:
            cached = _Layout([p.shape for p in params], params[0].device)
            self._layouts = {key: cached}
        return cached

    @staticmethod
    def _flat(params: list[Tensor]) -> Tensor:
        return torch.cat([p.detach().reshape(-1) for p in params]).float()

    def _pre(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._old[id(opt)] = self._flat(self._params(opt))

    def _post(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        old = self._old.pop(id(opt), None)
        if old is None:
            return
        params = self._params(opt)
        if dist_ready() and dist.get_world_size(self.group) > 1:
            layout = self._layout(params)
            delta = old - self._flat(params)  # w_old - w_new
            bufs = self.buffers
            combined, buf_mean = _exchange(
                delta, layout, self.group, self.local_size, bufs, channel=self.channel
            )
            # w = w_old - combined: computed from values identical on every rank, so the
            # weights stay bit-identical across ranks
            result = old.sub_(combined)
            with torch.no_grad():
                views = [v.view_as(p) for v, p in zip(torch.split(result, layout.sizes), params)]
                if all(p.dtype == torch.float32 for p in params):
                    torch._foreach_copy_(params, views)
                else:
                    for p, v in zip(params, views):
                        p.copy_(v)
                if bufs:
                    means = torch.split(buf_mean, [b.numel() for b in bufs])
                    if all(b.dtype == torch.float32 for b in bufs):
                        torch._foreach_copy_(bufs, [m.view_as(b) for m, b in zip(means, bufs)])
                    else:
                        for b, m in zip(bufs, means):
                            b.copy_(m.view_as(b))
        self.steps += 1

    def remove(self) -> None:
        """Remove the hooks."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._old.clear()
        if self.channel is not None:
            self.channel.close()
            self.channel = None


class AdaSum(BoostAlgorithm):
    """AdaSum across data-parallel ranks as a Lightning callback.

    Works with Lightning's DDP strategies (``ddp``, ``ddp_spawn``, CPU/gloo or GPU/nccl): at
    fit start it registers a DDP communication hook (no averaging, or a block-local mean) and
    the optimizer step hooks. With one process it does nothing.

    Args:
        local_size: ranks per block (MindSpore's ``device_number``); used only when it splits
            the world into >= 2 equal blocks, else every rank is its own block.
        transport: how the weight deltas travel: ``"process_group"``: vector halving through
            ``torch.distributed`` point-to-point sends (~2N floats sent per rank for any number
            of ranks; gloo or NCCL, any number of hosts; with 2 ranks one all-gather);
            ``"shm"``: an all-gather through shared memory (ranks on one x86-64 host, gloo on
            CPU; memory and traffic grow with ranks x parameters; ValueError when it cannot be
            used); ``"auto"`` (default): ``"shm"`` for exactly 2 ranks where it can be used
            (measured faster there: ``docs/benchmarks.md``, "AdaSum traffic"), else
            ``"process_group"``. Results agree within float rounding (1e-6 relative).

    Example:
        >>> import lightning as L
        >>> trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn",
        ...                     callbacks=[AdaSum()])  # doctest: +SKIP
    """

    name = "adasum"

    TRANSPORTS = ("auto", "shm", "process_group")

    def __init__(self, local_size: int = 1, transport: str = "auto") -> None:
        if isinstance(local_size, bool) or not isinstance(local_size, int) or local_size < 1:
            raise ValueError(f"AdaSum: 'local_size' must be an int >= 1, but got {local_size!r}.")
        if transport not in self.TRANSPORTS:
            raise ValueError(
                f"AdaSum: 'transport' must be one of {list(self.TRANSPORTS)}, but got "
                f"{transport!r}."
            )
        self.local_size = local_size
        self.transport = transport
        self.transport_used: str | None = None  # what the last attach chose
        self.hooks: AdaSumHooks | None = None
        self._ddp: Any = None
        self._ddp_class: Any = None
        self.active = False
        self.steps = 0  # AdaSum-combined optimizer steps (finished attachments)

    def _splits(self, world: int) -> bool:
        ls = self.local_size
        return ls > 1 and world % ls == 0 and world // ls >= 2

    def unsyncs_ddp(self, world: int) -> bool:
        """Whether, over ``world`` ranks, AdaSum switches DDP's gradient synchronisation off
        (every rank its own block), so that no parameter needs DDP's unused-parameter search."""
        return world > 1 and not self._splits(world)

    def _effective_local_size(self, world: int) -> int:
        ls = self.local_size
        if self._splits(world):
            return ls
        if ls > 1:
            log.info(
                "AdaSum: local_size=%d does not split %d ranks into >= 2 blocks; combining "
                "across all ranks.",
                ls,
                world,
            )
        return 1

    def attach(
        self, network: nn.Module, optimizers: Sequence[torch.optim.Optimizer], **context: Any
    ) -> None:
        self.detach()
        if not dist_ready() or dist.get_world_size() == 1:
            return
        world, rank = dist.get_world_size(), dist.get_rank()
        ls = self._effective_local_size(world)
        trainer = context.get("trainer")
        ddp = getattr(getattr(trainer, "strategy", None), "model", None)
        buffers: list[Tensor] = []
        if isinstance(ddp, nn.parallel.DistributedDataParallel):
            if ls > 1:
                block = None
                for start in range(0, world, ls):  # every rank creates every group
                    g = dist.new_group(list(range(start, start + ls)))
                    if start <= rank < start + ls:
                        block = g
                ddp.register_comm_hook(block, local_mean_comm_hook)
            else:
                # each rank keeps its own gradients: switch DDP's gradient synchronisation off
                # altogether (no reducer work, no unused-parameter search in backward); the
                # buffers DDP would broadcast are averaged in AdaSum's own exchange instead
                self._ddp, self._ddp_class = ddp, _unsync_ddp(ddp)
                buffers = [b for b in network.buffers() if b.is_floating_point()]
        else:
            log.warning(
                "AdaSum: the model is not wrapped in DistributedDataParallel; the gradients are "
                "assumed to be each rank's own."
            )
        channel = self._channel(optimizers, buffers)
        self.transport_used = "shm" if channel is not None else "process_group"
        self.hooks = AdaSumHooks(optimizers, None, ls, buffers, channel=channel)
        self.active = True

    def _channel(
        self, optimizers: Sequence[torch.optim.Optimizer], buffers: Sequence[Tensor]
    ) -> ShmAllGather | None:
        """The shared-memory exchange, when chosen and usable (collective: every rank)."""
        if self.transport == "process_group":
            return None
        if self.transport == "auto" and dist.get_world_size() != 2:
            log.info("AdaSum: %d ranks: vector halving through the process group.",
                     dist.get_world_size())
            return None
        params = [p for o in optimizers for g in o.param_groups for p in g["params"]]
        cpu = all(p.device.type == "cpu" for p in params)
        why = ""
        if dist.get_backend() != "gloo" or not cpu:
            why = "the process group is not gloo on CPU tensors"
        else:
            ok, why = ShmAllGather.usable()
            if ok:
                numel = sum(p.numel() for p in params) + sum(
                    b.numel() for b in buffers if b.is_floating_point()
                )
                try:
                    return ShmAllGather(numel)
                except RuntimeError as exc:  # raised on every rank alike
                    why = str(exc)
        if self.transport == "shm":
            raise ValueError(f"AdaSum: transport='shm' cannot be used here: {why}.")
        log.info("AdaSum: exchanging through the process group (%s).", why)
        return None

    def detach(self) -> None:
        if self._ddp is not None:
            _resync_ddp(self._ddp, self._ddp_class)
            self._ddp = self._ddp_class = None
        if self.hooks is not None:
            self.steps += self.hooks.steps
            self.hooks.remove()
            self.hooks = None
        self.active = False
