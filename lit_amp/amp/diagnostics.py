"""Overflow diagnostics: which layer first produced a non-finite value (opt-in).

A ``detect_anomaly``-like report for mixed precision, at a fraction of its cost: forward hooks
on every module record, *without a host sync*, whether the module's floating outputs are all
finite, and tensor hooks on those outputs record whether the gradient flowing back into them is.
Nothing is read back until :meth:`OverflowDiagnostics.first_nonfinite` is called (typically
after the loss-scale controller saw an overflow), which then names the first module - in
forward execution order, else in backward order - whose output or output-gradient was inf/NaN.

Off by default: attach it explicitly, or through ``AmpPrecision(overflow_diagnostics=True)``.
Records cover the last forward/backward pass of the network (they restart at each forward of
the root module).

Example:
    >>> import torch
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1))
    >>> diag = OverflowDiagnostics(net, low_precision_only=False).attach()
    >>> with torch.no_grad():
    ...     _ = net[2].weight.fill_(float("inf"))
    >>> _ = net(torch.ones(1, 2))
    >>> diag.first_nonfinite()
    "'2' (Linear): non-finite forward output (torch.float32)"
    >>> diag.detach()
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from lit_amp._validation import check_bool

__all__ = ["CastCounter", "OverflowDiagnostics", "NonFiniteRecord"]

log = logging.getLogger(__name__)

_LOW = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class NonFiniteRecord:
    """Where a non-finite value was first seen.

    Attributes:
        module: the module's qualified name (``"<root>"`` for the network itself).
        module_type: the module's class name.
        phase: ``"forward"`` (its output) or ``"backward"`` (the gradient w.r.t. its output).
        dtype: dtype of the offending tensor.
    """

    module: str
    module_type: str
    phase: str
    dtype: torch.dtype

    def __str__(self) -> str:
        what = "forward output" if self.phase == "forward" else "gradient of its output"
        return f"'{self.module}' ({self.module_type}): non-finite {what} ({self.dtype})"


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    return []


class OverflowDiagnostics:
    """Records per-module finiteness of outputs and output-gradients, cheaply.

    Args:
        network: the network to watch (every submodule, including itself).
        low_precision_only: only check float16/bfloat16 tensors (the ones that overflow under
            mixed precision). False checks float32 too.
        check_gradients: also record the gradients flowing into module outputs.

    Example:
        >>> net = torch.nn.Linear(2, 2)
        >>> with OverflowDiagnostics(net, low_precision_only=False) as diag:
        ...     _ = net(torch.tensor([[float("nan"), 0.0]]))
        ...     print(diag.first_nonfinite())
        '<root>' (Linear): non-finite forward output (torch.float32)
    """

    def __init__(
        self, network: nn.Module, *, low_precision_only: bool = True, check_gradients: bool = True
    ) -> None:
        if not isinstance(network, nn.Module):
            raise TypeError(
                "For 'OverflowDiagnostics', the argument 'network' must be a torch.nn.Module, "
                f"but got {type(network).__name__}."
            )
        self.network = network
        self.low_precision_only = check_bool("OverflowDiagnostics", "low_precision_only",
                                             low_precision_only)
        self.check_gradients = check_bool("OverflowDiagnostics", "check_gradients",
                                          check_gradients)
        self._handles: list[Any] = []
        self._forward: list[tuple[str, str, torch.dtype, torch.Tensor]] = []
        self._backward: list[tuple[str, str, torch.dtype, torch.Tensor]] = []

    # ------------------------------------------------------------------ lifecycle
    @property
    def attached(self) -> bool:
        """Whether the hooks are installed."""
        return bool(self._handles)

    def attach(self) -> OverflowDiagnostics:
        """Install the hooks (idempotent); returns ``self``."""
        if self._handles:
            return self
        self._handles.append(
            self.network.register_forward_pre_hook(self._on_root_forward, prepend=True)
        )
        for name, module in self.network.named_modules():
            label = name or "<root>"
            hook = _RecordHook(self, label, type(module).__name__)
            self._handles.append(module.register_forward_hook(hook, prepend=True))
        return self

    def detach(self) -> None:
        """Remove the hooks and the records."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.reset()

    def __enter__(self) -> OverflowDiagnostics:
        return self.attach()

    def __exit__(self, *exc: Any) -> None:
        self.detach()

    def reset(self) -> None:
        """Forget the records (done automatically at each forward of the network)."""
        self._forward.clear()
        self._backward.clear()

    def _on_root_forward(self, module: nn.Module, args: Any) -> None:
        self.reset()

    # ------------------------------------------------------------------ recording
    def _watch(self, t: torch.Tensor) -> bool:
        if not t.is_floating_point() or t.numel() == 0:
            return False
        return not self.low_precision_only or t.dtype in _LOW

    def _record_output(self, label: str, kind: str, output: Any) -> None:
        for t in _tensors(output):
            if not self._watch(t):
                continue
            with torch.no_grad():
                self._forward.append((label, kind, t.dtype, torch.isfinite(t).all()))
            if self.check_gradients and t.requires_grad:
                t.register_hook(_GradHook(self, label, kind))

    def _record_grad(self, label: str, kind: str, grad: torch.Tensor) -> None:
        if grad is None or not grad.is_floating_point():
            return
        with torch.no_grad():
            self._backward.append((label, kind, grad.dtype, torch.isfinite(grad).all()))

    # ------------------------------------------------------------------ report
    def report(self) -> NonFiniteRecord | None:
        """The first non-finite record (forward first, then backward), or None. One host sync."""
        for records, phase in ((self._forward, "forward"), (self._backward, "backward")):
            if not records:
                continue
            flags = torch.stack([r[3].to("cpu", non_blocking=False) for r in records])
            bad = (~flags).nonzero()
            if bad.numel():
                label, kind, dtype, _ = records[int(bad[0, 0])]
                return NonFiniteRecord(label, kind, phase, dtype)
        return None

    def first_nonfinite(self) -> str | None:
        """A one-line description of :meth:`report` (None when everything was finite)."""
        rec = self.report()
        return None if rec is None else str(rec)


class _RecordHook:
    def __init__(self, diag: OverflowDiagnostics, label: str, kind: str) -> None:
        self.diag, self.label, self.kind = diag, label, kind

    def __call__(self, module: nn.Module, args: Any, output: Any) -> None:
        self.diag._record_output(self.label, self.kind, output)


class _GradHook:
    def __init__(self, diag: OverflowDiagnostics, label: str, kind: str) -> None:
        self.diag, self.label, self.kind = diag, label, kind

    def __call__(self, grad: torch.Tensor) -> None:
        self.diag._record_grad(self.label, self.kind, grad)


class CastCounter(TorchDispatchMode):
    """Counts the dtype casts (``aten._to_copy`` kernels) that run inside it, backward included.

    What a mixed-precision level costs beyond its arithmetic (``bench/amp_casts.py``).

    Example:
        >>> with CastCounter() as casts:
        ...     _ = torch.ones(2).to(torch.bfloat16) + 1
        >>> casts.count
        1
    """

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        self.count += func is torch.ops.aten._to_copy.default
        return func(*args, **(kwargs or {}))
