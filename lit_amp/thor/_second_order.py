"""THOR's second-order half: which layers carry factors, and the refresh of their inverses.

Cut out of :mod:`.optimizer`, which keeps the step itself, the timing of the statistics hooks
and the checkpoint state. A refresh (one every ``frequency`` steps) runs in this order:

1. consume each hooked layer's pending statistics (divided by the loss scale the backward
   passes ran with); under ``torch.distributed`` all-reduce them (mean over the ranks that
   have one, one call per ``split_indices`` bucket); drop non-finite ones (an overflowing
   fp16 batch keeps the old factor);
2. running average ``F ← β·F + (1-β)·F_batch`` (``β = factor_decay``);
3. trace rule against the damped trace of the factor last inverted (one host sync);
4. Cholesky-invert the factors the rule selected, in ``split_dim`` blocks.

Example:
    >>> import torch
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    >>> layers, handler = plan_layers(net, ())
    >>> [lf.name for lf in layers], list(handler.values()).count(LAYERNORM)
    (['0'], 2)
    >>> layers[0].install()
    >>> net(torch.randn(8, 4)).pow(2).mean().backward()
    >>> refresh(layers, 0.01, 1.0, factor_decay=0.0, trace_thresholds=(0.0, 0.0),
    ...         split_dim=128, split_indices=[0])
    (True, 2, 91.0)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from lit_amp._runtime import dist_ready
from lit_amp.thor.factors import LayerFactors, invert_factors, is_supported_layer

__all__ = ["LAYERNORM", "BIAS", "plan_layers", "dist_world", "refresh", "allreduce_factors"]

#: Handler marker of LayerNorm weight and bias (diagonal Fisher, every step).
LAYERNORM = "layernorm"
#: Handler marker of a bias preconditioned together with its layer's weight (``bias_in_a``).
BIAS = "bias"

_Pending = list[list[Tensor | None]]  # per active layer: [A_batch, G_batch]


def plan_layers(
    net: nn.Module, skip_layers: Sequence[str], bias_in_a: bool = False
) -> tuple[list[LayerFactors], dict[Tensor, Any]]:
    """The preconditioned layers of ``net`` and the handler of each special parameter.

    A supported layer's weight is handled by its :class:`LayerFactors` (a tied weight by the
    first layer that holds it), LayerNorm parameters by :data:`LAYERNORM`; modules named in
    ``skip_layers`` (or below them) are left out.

    Example:
        >>> layers, _ = plan_layers(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)), ["1"])
        >>> len(layers)
        1
    """
    layers: list[LayerFactors] = []
    handler: dict[Tensor, Any] = {}
    seen: set[int] = set()
    for name, module in net.named_modules():
        if any(name == s or name.startswith(s + ".") for s in skip_layers):
            continue
        if is_supported_layer(module):
            w = module.weight
            if id(w) in seen:
                continue  # a tied weight is preconditioned by its first layer
            seen.add(id(w))
            lf = LayerFactors(module, name, len(layers), bias_in_a=bias_in_a)
            layers.append(lf)
            handler[w] = lf
            if lf.bias is not None and id(lf.bias) not in seen:
                seen.add(id(lf.bias))
                handler[lf.bias] = BIAS
        elif isinstance(module, nn.LayerNorm):
            for p in module.parameters(recurse=False):
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    handler[p] = LAYERNORM
    return layers, handler


def dist_world() -> int:
    """The ``torch.distributed`` world size, 1 outside a process group.

    Example:
        >>> dist_world()
        1
    """
    dist = torch.distributed
    if dist_ready():
        return dist.get_world_size()
    return 1


def refresh(
    layers: Sequence[LayerFactors],
    damping: float,
    grad_scale: float,
    *,
    factor_decay: float,
    trace_thresholds: tuple[float, float],
    split_dim: int | None,
    split_indices: Sequence[int],
    pi_damping: bool = False,
) -> tuple[bool, int, float]:
    """One second-order refresh of the hooked ``layers`` (steps 1-4 of the module docstring).

    Args:
        layers: every preconditioned layer (only those with hooks installed take part).
        damping: λ at this step; √λ is added to each factor.
        grad_scale: the loss scale the backward passes ran with.
        factor_decay: β of the running average.
        trace_thresholds: (ω1, ω2) of the trace rule.
        split_dim: block size of the inverses (None: whole factors).
        split_indices: all-reduce bucket split points over layer indices.
        pi_damping: split √λ between the factors as K-FAC's factored Tikhonov damping does
            (Martens & Grosse 2015 §6.3, ASDL's default): A gets √λ·π, G gets √λ/π with
            π = √((tr A / d_A) / (tr G / d_G)); False adds √λ to both (MindSpore).

    Returns:
        ``(refreshed, inversions, flops)``: whether any factor was a candidate (a refresh to
        count), the number of inverses computed and their approximate cost.
    """
    sq = math.sqrt(damping)
    active = [lf for lf in layers if lf.installed]
    pend = _collect(active, grad_scale, split_indices)
    _average(active, pend, factor_decay)
    traces = _traces(active)
    _set_damping(active, traces, sq, pi_damping)
    todo = _trace_rule(active, traces, trace_thresholds)
    if todo is None:
        return False, 0, 0.0
    if not todo:
        return True, 0, 0.0
    return True, len(todo), _invert(todo, split_dim)


def _traces(active: list[LayerFactors]) -> dict[tuple[int, int], float]:
    """``tr F`` of every factor of the active layers, by ``(id(layer), factor)``: one host sync
    shared by the π split and the trace rule."""
    keys: list[tuple[int, int]] = []
    vals: list[Tensor] = []
    for lf in active:
        for f, mat in ((0, lf.A), (1, lf.G)):
            if mat is not None:
                keys.append((id(lf), f))
                vals.append(mat.sum() if mat.dim() == 1 else mat.diagonal().sum())
    return dict(zip(keys, torch.stack(vals).tolist())) if vals else {}


def _set_damping(active: list[LayerFactors], traces: dict[tuple[int, int], float], sq: float,
                 pi_damping: bool) -> None:
    """Each layer's damping of A and G (π-corrected when asked and both factors exist)."""
    for lf in active:
        lf.sqrt_damping = [sq, sq]
        if not pi_damping or lf.A is None or lf.G is None:
            continue
        a_mean = traces[(id(lf), 0)] / lf.a_dim
        g_mean = traces[(id(lf), 1)] / lf.g_dim
        if a_mean > 0 and g_mean > 0 and math.isfinite(a_mean / g_mean):
            pi = math.sqrt(a_mean / g_mean)
            lf.sqrt_damping = [sq * pi, sq / pi]


def _collect(active: list[LayerFactors], scale: float, split_indices: Sequence[int]) -> _Pending:
    pend: _Pending = [list(lf.take_pending(scale)) for lf in active]
    if dist_world() > 1:
        pend = allreduce_factors(active, pend, split_indices)
    flat = [t for pair in pend for t in pair if t is not None]
    if flat:
        # one host sync: a factor is finite iff its sum is (a sum past fp32's range also
        # counts as non-finite: such a factor is kept out like an overflowing one)
        ok = iter(torch.stack([t.sum() for t in flat]).isfinite().tolist())
        for pair in pend:
            for f in (0, 1):
                if pair[f] is not None and not next(ok):
                    pair[f] = None  # an overflowing batch: keep the old factor
    return pend


def _average(active: list[LayerFactors], pend: _Pending, beta: float) -> None:
    """``F ← β·F + (1-β)·F_batch`` for every new factor (one foreach call each way)."""
    olds: list[Tensor] = []
    news: list[Tensor] = []
    slots: list[tuple[LayerFactors, int]] = []
    for lf, (a, g) in zip(active, pend):
        for f, new in ((0, a), (1, g)):
            if new is None:
                continue
            old = lf.A if f == 0 else lf.G
            if old is None or beta == 0:
                _set_factor(lf, f, new)
            else:
                olds.append(old)
                news.append(new)
                slots.append((lf, f))
    if olds:
        mixed = torch._foreach_mul(olds, beta)
        torch._foreach_add_(mixed, news, alpha=1 - beta)
        for (lf, f), t in zip(slots, mixed):
            _set_factor(lf, f, t)


def _set_factor(lf: LayerFactors, f: int, value: Tensor) -> None:
    if f == 0:
        lf.A = value
    else:
        lf.G = value


def _trace_rule(
    active: list[LayerFactors], traces: dict[tuple[int, int], float],
    thresholds: tuple[float, float],
) -> list[tuple[LayerFactors, int, float]] | None:
    """The factors to re-invert (with their damped traces); None when no factor is a candidate.

    Δ = |tr(F+√λI) − tr(F_ref+√λI)| / tr(F_ref+√λI): Δ > ω1 re-inverts, ω2 ≤ Δ ≤ ω1 reuses the
    old inverse, Δ < ω2 freezes the factor for good (a layer with both frozen loses its hook).
    """
    w1, w2 = thresholds
    todo: list[tuple[LayerFactors, int, float]] = []
    candidate = False
    for lf in active:
        for f, mat in ((0, lf.A), (1, lf.G)):
            if mat is None or lf.frozen[f]:
                continue
            candidate = True
            dim = lf.a_dim if f == 0 else lf.g_dim
            tr = traces[(id(lf), f)] + lf.sqrt_damping[f] * dim
            inv = lf.A_inv if f == 0 else lf.G_inv
            ref = lf.trace_ref[f]
            if inv is None or ref is None or ref <= 0:
                todo.append((lf, f, tr))
                continue
            delta = abs(tr - ref) / ref
            if delta > w1:
                todo.append((lf, f, tr))
            elif delta < w2:
                lf.frozen[f] = True
                if all(lf.frozen):
                    lf.remove()
    return todo if candidate else None


def _invert(todo: list[tuple[LayerFactors, int, float]], split_dim: int | None) -> float:
    """Invert the selected factors in place; return the approximate flops spent."""
    mats, where, damps = [], [], []
    for lf, f, tr in todo:
        lf.trace_ref[f] = tr
        if lf.kind == "embedding" and f == 0:
            assert lf.A is not None
            lf.A_inv = 1.0 / (lf.A + lf.sqrt_damping[0])
            continue
        mats.append(lf.A if f == 0 else lf.G)
        damps.append(lf.sqrt_damping[f])
        where.append((lf, f))
    invs = invert_factors(mats, damps, split_dim)
    for (lf, f), inv in zip(where, invs):
        if f == 0:
            lf.A_inv = inv
        else:
            lf.G_inv = inv
    flops = 0.0
    for lf, f, _ in todo:
        d = lf.a_dim if f == 0 else lf.g_dim
        if lf.kind == "embedding" and f == 0:
            flops += d
            continue
        b = d if split_dim is None else min(d, split_dim)
        flops += math.ceil(d / b) * b**3  # Cholesky + inverse ~ b³ a block
    return flops


def _buckets(active: list[LayerFactors], split_indices: Sequence[int]) -> list[list[int]]:
    """Positions in ``active`` grouped by the split points (one all-reduce per group)."""
    buckets: list[list[int]] = [[]]
    bounds = list(split_indices)
    for i, lf in enumerate(active):
        buckets[-1].append(i)
        if bounds and lf.index >= bounds[0]:
            while bounds and lf.index >= bounds[0]:
                bounds.pop(0)
            buckets.append([])
    return buckets


def _factor_shape(lf: LayerFactors, f: int, t: Tensor | None) -> torch.Size:
    ref = lf.A if f == 0 else lf.G
    if t is None and ref is None:
        dim = lf.a_dim if f == 0 else lf.g_dim
        return torch.Size([dim]) if (lf.kind == "embedding" and f == 0) else torch.Size([dim, dim])
    return (t if t is not None else ref).shape


def allreduce_factors(
    active: list[LayerFactors], pend: _Pending, split_indices: Sequence[int]
) -> _Pending:
    """Mean of each new factor over the ranks that have one (identical on every rank).

    A rank without statistics for a factor sends zeros and a 0 flag; the flags, summed in the
    same buffer, count the ranks that contributed. A factor no rank has stays None.
    """
    out = [list(p) for p in pend]
    for bucket in _buckets(active, split_indices):
        slots: list[tuple[int, int, torch.Size]] = []
        parts: list[Tensor] = []
        for i in bucket:
            lf = active[i]
            for f in (0, 1):
                if lf.frozen[f]:
                    continue
                t = pend[i][f]
                shape = _factor_shape(lf, f, t)
                parts.append(t.reshape(-1).float() if t is not None
                             else torch.zeros(shape.numel(), device=lf.weight.device))
                slots.append((i, f, shape))
        if not slots:
            continue
        dev = parts[0].device
        flags = torch.tensor([0.0 if pend[i][f] is None else 1.0 for i, f, _ in slots], device=dev)
        buf = torch.cat([*(p.to(dev) for p in parts), flags])
        torch.distributed.all_reduce(buf)
        counts = buf[-len(slots):].tolist()
        offset = 0
        for (i, f, shape), c in zip(slots, counts):
            n = shape.numel()
            chunk = buf[offset: offset + n]
            offset += n
            out[i][f] = None if c == 0 else (chunk / c).view(shape).to(active[i].weight.device)
    return out
