"""The gradient pass of a loss-scaled step: unscale and check in one fused kernel, then agree.

:class:`~lit_amp.amp.loss_scale.controller.LossScaleController` owns the state machine; this
module holds what it does to the gradients. :func:`unscale_and_check_` multiplies gradients by a
factor and records inf/NaN in the same pass (``torch._amp_foreach_non_finite_check_and_unscale_``,
the kernel behind ``torch.amp.GradScaler``), :func:`declared_loss_scale` reads the scale an
optimizer divides by itself, and :func:`any_overflow` turns the per-device flags into one answer
shared by every rank (docs/differences.md, "Loss scaling").
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_amp._runtime import dist_ready

__all__ = ["FactorCache", "any_overflow", "declared_loss_scale", "local_shard",
           "unscale_and_check_"]


def declared_loss_scale(optimizer: Any, group: dict) -> float:
    """The loss scale an optimizer divides gradients by itself (1.0 when it does not).

    Read from the param group, then the optimizer's ``loss_scale`` attribute, then its
    ``defaults``.

    Example:
        >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
        >>> declared_loss_scale(opt, opt.param_groups[0])
        1.0
        >>> opt.param_groups[0]["loss_scale"] = 128
        >>> declared_loss_scale(opt, opt.param_groups[0])
        128.0
    """
    value = group.get("loss_scale")
    if value is None:
        value = getattr(optimizer, "loss_scale", None)
    if value is None:
        value = getattr(optimizer, "defaults", {}).get("loss_scale")
    if isinstance(value, Tensor) and value.numel() == 1:
        value = float(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return 1.0


def local_shard(grad: Tensor) -> Tensor:
    """A ``DTensor`` gradient's local shard (the same storage); other tensors as they are.

    FSDP2 / tensor parallelism leave ``DTensor`` gradients; the fused unscale-and-check kernel
    runs on each rank's shard, and :func:`any_overflow` all-reduces the flag, so an inf in one
    rank's shard skips the step on every rank.
    """
    to_local = getattr(grad, "to_local", None)
    if to_local is None:
        return grad
    with torch.no_grad():
        return to_local()


class FactorCache:
    """One-element fp32 factor tensors per (device, factor), reused across steps."""

    def __init__(self, limit: int = 16) -> None:
        self.limit = limit
        self._tensors: dict[tuple[torch.device, float], Tensor] = {}

    def get(self, device: torch.device, factor: float) -> Tensor:
        """The factor as a ``(1,)`` fp32 tensor on ``device`` (made once, then cached)."""
        key = (device, factor)
        t = self._tensors.get(key)
        if t is None:
            if len(self._tensors) > self.limit:
                self._tensors.clear()
            t = torch.full((1,), factor, dtype=torch.float32, device=device)
            self._tensors[key] = t
        return t


def unscale_and_check_(grads: list[Tensor], factor: float, cache: FactorCache) -> list[Tensor]:
    """Multiply ``grads`` by ``factor`` in place and return per-device found-inf flags.

    One fused pass per (device, dtype) group; no host sync. ``factor == 1`` only checks.
    Sparse gradients are scaled and checked through their values.

    Example:
        >>> g = [torch.tensor([2.0, 4.0]), torch.tensor([float("inf")])]
        >>> flags = unscale_and_check_(g, 0.5, FactorCache())
        >>> g[0].tolist(), [float(f) for f in flags]
        ([1.0, 2.0], [1.0])
    """
    groups: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
    flags: list[Tensor] = []
    for g in grads:
        g = local_shard(g)
        if g.is_sparse:
            if g.dtype == torch.float16:
                g = g.coalesce()
            vals = g._values()
            if factor != 1.0:
                vals.mul_(factor)
            flags.append((~torch.isfinite(vals)).any().float().reshape(1))
            continue
        groups.setdefault((g.device, g.dtype), []).append(g)
    found: dict[torch.device, Tensor] = {}
    for (device, _), ts in groups.items():
        if device not in found:
            found[device] = torch.zeros(1, dtype=torch.float32, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(
            ts, found[device], cache.get(device, factor)
        )
    flags.extend(found.values())
    return flags


def _comm_device(flags: list[Tensor]) -> torch.device:
    if dist_ready():
        backend = str(torch.distributed.get_backend()).lower()
        if "nccl" in backend and torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        if "gloo" in backend or not flags:
            return torch.device("cpu")
    return flags[0].device if flags else torch.device("cpu")


def any_overflow(flags: list[Tensor]) -> bool:
    """Whether any flag is set, on any rank: one host sync.

    When ``torch.distributed`` is initialized the flag is all-reduced with MAX, so every rank
    gets the same answer (all ranks must call this).

    Example:
        >>> any_overflow([torch.zeros(1), torch.ones(1)]), any_overflow([])
        (True, False)
    """
    distributed = dist_ready()
    if not distributed and len(flags) == 1:
        return flags[0].item() > 0
    device = _comm_device(flags)
    if flags:
        flag = torch.stack([f.reshape(()).to(device) for f in flags]).amax()
    else:
        flag = torch.zeros((), dtype=torch.float32, device=device)
    if distributed:
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return bool(flag.item() > 0)
