"""The momentum-SGD half of every THOR step: weight decay, clipping, momentum, the update.

:class:`~lit_amp.thor.optimizer.THOR` preconditions the gradients, then hands them here. The
update is MindSpore's (``ThorGpu.construct``): ``g += weight_decay * w`` where the decay filter
says, optional per-tensor clipping to norm 1, ``buf = momentum * buf + g`` and ``w -= lr * buf``
(Nesterov: ``w -= lr * (g + momentum * buf)``). The momentum buffers are views of one flat
tensor, so the momentum decay is one kernel for every parameter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["decayed_positions", "momentum_buffers", "update_"]


def update_(
    group: dict[str, Any],
    params: list[Tensor],
    grads: list[Tensor],
    *,
    decayed: Callable[[], list[int]],
    buffers: Callable[[], tuple[Tensor | None, list[Tensor]]],
    clip: bool,
) -> None:
    """Weight decay, clipping, momentum (Nesterov) and the parameter update, in place.

    ``grads`` are the preconditioned gradients (tensors that are not ``p.grad`` may be
    changed in place); ``decayed()`` gives the positions taking weight decay and ``buffers()``
    the momentum buffers (:func:`momentum_buffers`), each asked only when needed.
    """
    wd = group["weight_decay"]
    if wd:
        idx = decayed()
        if len(idx) == len(params) and all(g is not p.grad for g, p in zip(grads, params)):
            torch._foreach_add_(grads, params, alpha=wd)  # all new tensors: in place
        elif len(idx) == len(params):
            grads = list(torch._foreach_add(grads, params, alpha=wd))
        elif idx:
            dec = torch._foreach_add([grads[i] for i in idx], [params[i] for i in idx],
                                     alpha=wd)
            for i, d in zip(idx, dec):
                grads[i] = d
    if clip:
        norms = torch._foreach_norm(grads)
        grads = [g * (1.0 / torch.clamp_min(n, 1.0)).to(g.dtype) for g, n in zip(grads, norms)]
    m = group["momentum"]
    upd = grads
    if m != 0:
        flat, bufs = buffers()
        if flat is not None:
            flat.mul_(m)  # one kernel for every buffer (same values as per tensor)
        else:
            torch._foreach_mul_(bufs, m)
        torch._foreach_add_(bufs, grads)
        upd = torch._foreach_add(grads, bufs, alpha=m) if group["nesterov"] else bufs
    torch._foreach_add_(params, upd, alpha=-group["lr"])


def decayed_positions(
    params: list[Tensor], decay: dict[Tensor, bool], cache: dict[tuple[int, ...], list[int]]
) -> list[int]:
    """Positions of the parameters that take weight decay (cached per parameter list)."""
    key = tuple(map(id, params))
    hit = cache.get(key)
    if hit is None:
        if len(cache) > 8:
            cache.clear()
        hit = cache[key] = [i for i, p in enumerate(params) if decay.get(p, True)]
    return hit


def momentum_buffers(
    state: Any, params: list[Tensor], cache: dict[tuple[int, ...], tuple[Tensor, list[Tensor]]]
) -> tuple[Tensor | None, list[Tensor]]:
    """Each parameter's momentum buffer (zeros on first use), and the flat tensor they are
    views of (None when the parameters differ in dtype / device or are not contiguous).

    The buffers live in ``optimizer.state`` as usual (checkpoints see ordinary tensors); a
    buffer replaced from outside (``load_state_dict``) is copied into a new flat tensor.
    """
    key = tuple(map(id, params))
    hit = cache.get(key)
    if hit is not None and all(
        state[p].get("momentum_buffer") is v for p, v in zip(params, hit[1])
    ):
        return hit
    bufs = []
    for p in params:
        st = state[p]
        buf = st.get("momentum_buffer")
        if buf is None:
            buf = st["momentum_buffer"] = torch.zeros_like(
                p, memory_format=torch.preserve_format
            )
        bufs.append(buf)
    p0 = params[0]
    if not all(p.dtype == p0.dtype and p.device == p0.device and p.is_contiguous()
               and b.shape == p.shape for p, b in zip(params, bufs)):
        return None, bufs
    flat = torch.empty(sum(p.numel() for p in params), dtype=p0.dtype, device=p0.device)
    views, offset = [], 0
    for p, b in zip(params, bufs):
        v = flat[offset: offset + p.numel()].view(p.shape)
        v.copy_(b)
        state[p]["momentum_buffer"] = v
        views.append(v)
        offset += p.numel()
    if len(cache) > 8:
        cache.clear()
    cache[key] = (flat, views)
    return flat, views
