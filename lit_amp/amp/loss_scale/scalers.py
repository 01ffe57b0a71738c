"""Functional loss scalers: MindSpore's ``mindspore.amp`` ``LossScaler`` family in PyTorch.

Pure PyTorch (no Lightning). :class:`StaticLossScaler`, :class:`DynamicLossScaler` and
:func:`all_finite` are the building blocks for a hand-written training loop, ported so that
MindSpore loops that use them run unchanged (docs/semantics.md §2.5); ``Model`` / ``LitModel``
/ ``AmpPrecision`` use :class:`~lit_amp.amp.loss_scale.controller.LossScaleController` instead.
The dynamic rule is the one every lit_amp scale moves by (:mod:`~lit_amp.amp.loss_scale.rule`).

Example:
    >>> import torch
    >>> from lit_amp.amp.loss_scale.scalers import DynamicLossScaler, all_finite
    >>> net = torch.nn.Linear(4, 1)
    >>> opt = torch.optim.SGD(net.parameters(), lr=0.1)
    >>> scaler = DynamicLossScaler(scale_value=2**10, scale_factor=2, scale_window=1000)
    >>> loss = net(torch.randn(8, 4)).pow(2).mean()
    >>> scaler.scale(loss).backward()
    >>> grads = scaler.unscale(tuple(p.grad for p in net.parameters()))
    >>> finite = all_finite(grads)
    >>> if finite:
    ...     for p, g in zip(net.parameters(), grads):
    ...         p.grad = g
    ...     opt.step()
    >>> scaler.adjust(finite)
    True
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any, Union

import torch
from torch import Tensor

from lit_amp._sparse import coalesced
from lit_amp._validation import check_int, check_number, check_positive_int
from lit_amp.amp.loss_scale.rule import TENSOR, DynamicScaleRule, next_scale_state

__all__ = [
    "LossScaler",
    "StaticLossScaler",
    "DynamicLossScaler",
    "all_finite",
    "init_status",
]

TensorOrSeq = Union[Tensor, tuple, list]


def _map_tensors(fn: Callable[[Tensor], Tensor], inputs: Any, where: str) -> Any:
    """Apply ``fn`` to a tensor or elementwise over a (nested) tuple/list, keeping the container."""
    if isinstance(inputs, Tensor):
        return fn(inputs)
    if isinstance(inputs, (tuple, list)):
        return type(inputs)(_map_tensors(fn, x, where) for x in inputs)
    raise TypeError(
        f"{where}: 'inputs' must be a Tensor or a tuple/list of Tensors, but got "
        f"{type(inputs).__name__}."
    )


def _flatten_tensors(inputs: Any, where: str) -> list[Tensor]:
    out: list[Tensor] = []
    stack = [inputs]
    while stack:
        x = stack.pop()
        if isinstance(x, Tensor):
            out.append(x)
        elif isinstance(x, (tuple, list)):
            stack.extend(reversed(x))
        else:
            raise TypeError(
                f"{where}: 'inputs' must be a Tensor or a tuple/list of Tensors, but got an "
                f"element of type {type(x).__name__}."
            )
    return out


def _dense_values(t: Tensor) -> Tensor:
    if t.is_sparse:
        return coalesced(t)._values()
    return t


def _has_nonfinite(tensors: Iterable[Tensor]) -> bool:
    """True when any element of ``tensors`` is inf or NaN (exact; read-only; one host sync).

    Fast path: one L2 ``torch._foreach_norm`` per (device, dtype) group and ``isfinite`` on the
    stacked norms. A finite norm proves the tensor finite; a non-finite norm can also come from
    squares overflowing (|x| > ~1.8e19 in fp32/bf16), so only those tensors are re-checked
    elementwise. Integer and bool tensors are always finite and are skipped.
    """
    groups: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
    for t in tensors:
        if not (t.is_floating_point() or t.is_complex()):
            continue
        t = _dense_values(t)
        if t.numel() == 0:
            continue
        groups.setdefault((t.device, t.dtype), []).append(t)
    if not groups:
        return False
    suspects: list[tuple[list[Tensor], Tensor]] = []
    for ts in groups.values():
        norms = torch.stack(torch._foreach_norm(ts))
        suspects.append((ts, ~torch.isfinite(norms)))
    if not any(bool(bad.any()) for _, bad in suspects):  # the one sync of the common path
        return False
    for ts, bad in suspects:
        for i in torch.nonzero(bad).flatten().tolist():
            if not bool(torch.isfinite(ts[i]).all()):
                return True
    return False


def all_finite(inputs: TensorOrSeq, status: Tensor | None = None) -> Tensor:
    """Whether every element of ``inputs`` is finite (MindSpore ``amp.all_finite``).

    Args:
        inputs: a tensor, or a (nested) tuple/list of tensors, e.g. the gradients.
        status: accepted for compatibility with MindSpore's Ascend float-status API and ignored.

    Returns:
        A 0-d bool tensor (on the device of the first input; CPU for no input), True when no
        element is inf or NaN. An empty tuple is finite. The check is read-only and exact; it
        costs one fused norm per (device, dtype) and a single host sync.

    Raises:
        TypeError: ``inputs`` is not a tensor or a tuple/list of tensors.

    Example:
        >>> import torch
        >>> all_finite((torch.tensor([1.0, float("nan")]), torch.tensor([2.0])))
        tensor(False)
        >>> all_finite([torch.tensor([1e30, -3.0])])
        tensor(True)
    """
    del status
    tensors = _flatten_tensors(inputs, "all_finite")
    device = tensors[0].device if tensors else torch.device("cpu")
    return torch.tensor(not _has_nonfinite(tensors), dtype=torch.bool, device=device)


def init_status() -> Tensor:
    """MindSpore's Ascend float-status buffer: here a zero ``(8,)`` fp32 tensor, never needed.

    Example:
        >>> init_status().shape
        torch.Size([8])
    """
    return torch.zeros(8, dtype=torch.float32)


class LossScaler(ABC):
    """Abstract loss scaler: ``scale`` the loss, ``unscale`` the gradients, ``adjust`` the scale.

    Subclasses implement all three. ``inputs`` is a tensor or a tuple/list of tensors; the
    result has the same structure and each tensor keeps its dtype.

    Example:
        >>> class Times2(LossScaler):
        ...     def scale(self, inputs): return inputs * 2
        ...     def unscale(self, inputs): return inputs / 2
        ...     def adjust(self, grads_finite): return False
        >>> Times2().scale(torch.ones(1))
        tensor([2.])
    """

    @abstractmethod
    def scale(self, inputs: TensorOrSeq) -> TensorOrSeq:
        """Multiply ``inputs`` (the loss or the gradients) by the loss scale."""

    @abstractmethod
    def unscale(self, inputs: TensorOrSeq) -> TensorOrSeq:
        """Multiply ``inputs`` (usually the gradients) by the reciprocal of the loss scale."""

    @abstractmethod
    def adjust(self, grads_finite: Tensor | bool) -> bool:
        """Update the scale from whether the gradients of this step were finite."""


class _TensorScaler(LossScaler):
    """Shared ``scale`` / ``unscale`` / device handling for the two concrete scalers."""

    scale_value: Tensor

    def scale(self, inputs: TensorOrSeq) -> TensorOrSeq:
        """``x * scale_value``, the scale cast to ``x.dtype`` first (MindSpore ``_grad_scale``)."""
        s = self.scale_value
        return _map_tensors(
            lambda x: x * s.to(device=x.device, dtype=x.dtype), inputs, type(self).__name__
        )

    def unscale(self, inputs: TensorOrSeq) -> TensorOrSeq:
        """``x * (1 / scale_value)``, the fp32 reciprocal cast to ``x.dtype`` first."""
        r = torch.reciprocal(self.scale_value)
        return _map_tensors(
            lambda x: x * r.to(device=x.device, dtype=x.dtype), inputs, type(self).__name__
        )

    def to(self, device: torch.device | str) -> _TensorScaler:
        """Move the state tensors to ``device`` (in place); returns ``self``."""
        for name, value in vars(self).items():
            if isinstance(value, Tensor):
                setattr(self, name, value.to(device))
        return self

    def state_dict(self) -> dict[str, Tensor]:
        """The state tensors (cloned), e.g. for a checkpoint."""
        return {k: v.detach().clone() for k, v in vars(self).items() if isinstance(v, Tensor)}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """Restore :meth:`state_dict` (values are copied into the existing tensors)."""
        own = self.state_dict()
        missing = sorted(set(own) - set(state))
        if missing:
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: missing keys {missing}; expected "
                f"{sorted(own)}."
            )
        for k in own:
            getattr(self, k).copy_(torch.as_tensor(state[k]))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(scale_value={float(self.scale_value)})"


class StaticLossScaler(_TensorScaler):
    """Scale and unscale by a fixed constant (MindSpore ``amp.StaticLossScaler``).

    Args:
        scale_value: the loss scale, an int or float >= 1; stored as a 0-d fp32 tensor.

    Raises:
        TypeError: ``scale_value`` is not an int or a float.
        ValueError: ``scale_value`` < 1 or not finite.

    Example:
        >>> import torch
        >>> scaler = StaticLossScaler(scale_value=2**10)
        >>> scaler.scale(torch.tensor([1.0]))
        tensor([1024.])
        >>> scaler.unscale((torch.tensor([1.5, 1.0], dtype=torch.float16),))[0].dtype
        torch.float16
        >>> scaler.adjust(torch.tensor(False))
        False
    """

    def __init__(self, scale_value: float) -> None:
        value = check_number("StaticLossScaler", "scale_value", scale_value, minimum=1.0)
        self.scale_value = torch.tensor(value, dtype=torch.float32)

    def adjust(self, grads_finite: Tensor | bool) -> bool:
        """The scale is fixed: does nothing and returns False."""
        return False


class DynamicLossScaler(_TensorScaler):
    """Dynamic loss scale (MindSpore ``amp.DynamicLossScaler``).

    :meth:`adjust` implements docs/semantics.md §2.5 exactly::

        if finite:
            if counter == scale_window - 1 and isfinite(scale * factor): scale = scale * factor
            counter = (counter + 1) % scale_window
        else:
            scale = max(1, scale / factor); counter = 0

    This is the dynamic rule of the managers without hysteresis or ceiling
    (:func:`~lit_amp.amp.loss_scale.rule.next_scale_state`, whose counter is this one).

    Args:
        scale_value: initial scale, an int or float >= 1 (0-d fp32 tensor ``scale_value``).
        scale_factor: growth/shrink factor, a positive int.
        scale_window: number of consecutive finite steps before growing, a positive int.

    Raises:
        TypeError: a wrong argument type.
        ValueError: ``scale_value`` < 1, or a factor/window <= 0.

    Example:
        >>> import torch
        >>> scaler = DynamicLossScaler(scale_value=2**10, scale_factor=2, scale_window=1)
        >>> grads = (torch.tensor([float("nan"), 1.0], dtype=torch.float16), torch.tensor([0.2]))
        >>> scaler.adjust(all_finite(scaler.unscale(grads)))
        True
        >>> float(scaler.scale_value)
        512.0
    """

    def __init__(self, scale_value: float, scale_factor: int, scale_window: int) -> None:
        value = check_number("DynamicLossScaler", "scale_value", scale_value, minimum=1.0)
        # a factor of 1 never moves the scale (and < 1 would move it the wrong way)
        self.scale_factor = check_int("DynamicLossScaler", "scale_factor", scale_factor, minimum=2)
        self.scale_window = check_positive_int("DynamicLossScaler", "scale_window", scale_window)
        self.scale_value = torch.tensor(value, dtype=torch.float32)
        self.counter = torch.tensor(0, dtype=torch.int32)

    @torch.no_grad()
    def adjust(self, grads_finite: Tensor | bool) -> bool:
        """Grow, keep or shrink ``scale_value`` from ``grads_finite``; always returns True.

        Uses tensor ops only (no host sync) so the state can live on an accelerator.
        """
        s = self.scale_value
        finite = torch.as_tensor(grads_finite, device=s.device).to(torch.bool).reshape(())
        rule = DynamicScaleRule(factor=self.scale_factor, window=self.scale_window)
        scale, counter, _ = next_scale_state(s, self.counter, None, ~finite, rule, TENSOR)
        s.copy_(scale)
        self.counter.copy_(counter)
        return True

    def __repr__(self) -> str:
        return (
            f"DynamicLossScaler(scale_value={float(self.scale_value)}, "
            f"scale_factor={self.scale_factor}, scale_window={self.scale_window})"
        )
