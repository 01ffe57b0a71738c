"""Facts about the running torch process that every layer asks (is a process group up, this
rank, the world size, the torch optimizer behind a wrapper), and the small collectives of the
default group that callbacks and loops agree through: a flag set on any rank, a mean, an
element-wise sum or maximum of a few ints, every rank's object, a barrier.

Each collective is a no-op (it returns its input, or ``[obj]``) without an initialized
multi-process group, so callers need no guard. Tensors of a collective live on
:func:`reduce_device` (the current CUDA device under NCCL, else the CPU). The bulk exchanges of
a subsystem (AdaSum's transport, metric states, gradient sums) stay with that subsystem.

Example:
    >>> dist_ready(), rank(), world_size()
    (False, 0, 1)
    >>> any_rank(True), reduce_mean(2.5), reduce_sum([1, 2]), gather("x")
    (True, 2.5, [1, 2], ['x'])
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "any_rank",
    "barrier",
    "dist_ready",
    "gather",
    "rank",
    "reduce_device",
    "reduce_max",
    "reduce_mean",
    "reduce_sum",
    "unwrap_optimizer",
    "world_size",
]


def dist_ready() -> bool:
    """Whether ``torch.distributed`` is built in and a default process group is initialized."""
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """This process's rank in the default group (0 without one)."""
    return dist.get_rank() if dist_ready() else 0


def world_size() -> int:
    """The default group's size (1 without one)."""
    return dist.get_world_size() if dist_ready() else 1


def reduce_device() -> torch.device:
    """Where a collective of the default process group runs: the current CUDA device under
    NCCL, else the CPU."""
    if dist_ready() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_reduce_ints(values: list[int], op: Any, device: torch.device | None) -> list[int]:
    t = torch.tensor(values, dtype=torch.int64, device=device or reduce_device())
    dist.all_reduce(t, op=op)
    return [int(v) for v in t.tolist()]


def reduce_sum(values: list[int], device: torch.device | None = None) -> list[int]:
    """The element-wise sum of ``values`` over all ranks (one all-reduce on ``device``,
    default :func:`reduce_device`)."""
    if world_size() <= 1:
        return list(values)
    return _all_reduce_ints(values, dist.ReduceOp.SUM, device)


def reduce_max(values: list[int], device: torch.device | None = None) -> list[int]:
    """The element-wise maximum of ``values`` over all ranks (one all-reduce)."""
    if world_size() <= 1:
        return list(values)
    return _all_reduce_ints(values, dist.ReduceOp.MAX, device)


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` is set on any rank (one all-reduce)."""
    return bool(reduce_max([int(bool(flag))])[0])


def reduce_mean(value: float) -> float:
    """The mean of ``value`` over all ranks (one all-reduce in float64)."""
    world = world_size()
    if world <= 1:
        return value
    t = torch.tensor([float(value)], dtype=torch.float64, device=reduce_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item()) / world


def gather(obj: Any) -> list[Any]:
    """``obj`` of every rank, indexed by rank (one ``all_gather_object``)."""
    size = world_size()
    if size <= 1:
        return [obj]
    out: list[Any] = [None] * size
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    """Wait for every rank (nothing in one process)."""
    if world_size() > 1:
        dist.barrier()


def unwrap_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer behind a wrapper such as Lightning's ``LightningOptimizer``.

    Example:
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        >>> unwrap_optimizer(opt) is opt
        True
    """
    return getattr(optimizer, "_optimizer", optimizer)
