"""What a mixed-precision conversion shares at run time: its state and the parameter swap.

A converted module computes on low-precision copies of its float32 parameters and buffers for
the duration of its ``forward``: :func:`swap_in` puts the copies (autograd casts, cached between
optimizer steps: :mod:`lit_amp.amp.casting`) into the modules' ``_parameters`` / ``_buffers``,
:func:`swap_out` puts the float32 tensors back and copies updated running statistics home. The
hooks (:mod:`lit_amp.amp.hooks`) and the forward wrappers (:mod:`lit_amp.amp.forwards`) both use
it; ``state_dict`` and optimizers only ever see the float32 tensors.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lit_amp.amp.casting import (
    _HALF_AND_SINGLE,
    O1FunctionMode,
    _cast_param,
    _first_tensor,
    _mode_active,
)

__all__ = [
    "AmpState", "Frame", "check_device", "device_type", "holds_float64", "swap_in", "swap_out",
]

# Kinds of swap entries.
_P, _B, _STATS = 0, 1, 2  # parameter, buffer, running statistics (copied back in training)


@dataclass(eq=False)
class AmpState:
    """What one conversion shares between its hooks and forwards (``network._amp_state``)."""

    level: str
    dtype: torch.dtype
    cache_casts: bool = True
    functions: frozenset = field(default_factory=frozenset)
    device_checked: bool = False
    #: O1 on torch.autocast: the root's forward runs in an autocast region of ``dtype``
    autocast: bool = False

    def mode(self) -> O1FunctionMode | None:
        """The function mode a custom white list's root enters (None: none, or already active)."""
        if not self.functions:
            return None
        mode = O1FunctionMode(self.dtype, self.functions)
        return None if _mode_active(mode) else mode


def device_type(args: tuple, kwargs: dict) -> str:
    """The device type of the first tensor of a call (``"cpu"`` without one)."""
    t = _first_tensor(args) if args else None
    if t is None and kwargs:
        t = _first_tensor(kwargs)
    return t.device.type if t is not None else "cpu"


class Frame:
    """What one swap replaced (restored by :func:`swap_out`), and a region entered with it."""

    __slots__ = ("params", "buffers", "attrs", "mode")

    def __init__(self) -> None:
        self.params: list = []
        self.buffers: list = []
        self.attrs: list = []
        self.mode: Any = None  # an O1FunctionMode or a torch.autocast region


def holds_float64(module: nn.Module) -> bool:
    """Whether ``module`` has a float64 parameter or buffer (a float64 network is left alone)."""
    return any(t.dtype == torch.float64 for t in module.parameters()) or any(
        t.dtype == torch.float64 for t in module.buffers())


def check_device(state: AmpState, args: tuple, kwargs: dict) -> None:
    """Warn once for float16 on CPU (looked at on the first call with a tensor)."""
    t = _first_tensor(args) if args else _first_tensor(kwargs)
    if t is None:
        return
    state.device_checked = True
    if state.dtype == torch.float16 and t.device.type == "cpu":
        warnings.warn(
            "Mixed precision with dtype=torch.float16 runs on CPU, where float16 matrix "
            "multiplication is orders of magnitude slower than bfloat16 (and than float32). "
            "Use dtype=torch.bfloat16 on CPU.",
            UserWarning,
            stacklevel=4,
        )


def swap_in(entries: list, state: AmpState, frame: Frame) -> None:
    """Put low-precision copies of the ``(owner, name, kind)`` entries in place (entries already
    low, float64 or not floating are left), recording the originals in ``frame``."""
    low = state.dtype
    for owner, name, kind in entries:
        if kind == _P:
            params = owner._parameters
            p = params.get(name)
            if p is None:
                # FSDP (use_orig_params=False) exposes unsharded views as plain attributes
                a = owner.__dict__.get(name)
                if isinstance(a, torch.Tensor) and a.dtype in _HALF_AND_SINGLE and a.dtype != low:
                    frame.attrs.append((owner, name, a))
                    owner.__dict__[name] = a.to(low)
                continue
            if p.dtype not in _HALF_AND_SINGLE or p.dtype == low:
                continue  # fp64/int, or already low (swapped by an ancestor)
            frame.params.append((owner, name, p))
            cast = params[name] = _cast_param(owner, name, p, low, state.cache_casts)
            if owner.__dict__.get(name) is p:
                # FSDP (use_orig_params) in forward: the unsharded view is both in
                # ``_parameters`` and a plain attribute, and the attribute wins the lookup
                frame.attrs.append((owner, name, p))
                owner.__dict__[name] = cast
        else:
            bufs = owner._buffers
            b = bufs.get(name)
            if b is None or b.dtype not in _HALF_AND_SINGLE or b.dtype == low:
                continue
            cast = b.to(low)
            if kind == _STATS and owner.training:
                version = -1  # always copied back
            else:  # copied back if modified in place (inference tensors have no version)
                version = None if cast.is_inference() else cast._version
            frame.buffers.append((owner, name, b, cast, version))
            bufs[name] = cast


def swap_out(frame: Frame) -> None:
    """Undo :func:`swap_in`; running statistics updated in the copies are copied home."""
    for owner, name, p in reversed(frame.params):
        owner._parameters[name] = p
    for owner, name, a in reversed(frame.attrs):
        owner.__dict__[name] = a
    for owner, name, orig, cast, version in reversed(frame.buffers):
        cur = owner._buffers.get(name)
        if cur is cast:
            if version == -1 or (version is not None and cast._version != version):
                with torch.no_grad():
                    orig.copy_(cast)
            owner._buffers[name] = orig
        elif cur is not None and cur.is_floating_point() and cur.dtype != orig.dtype:
            owner._buffers[name] = cur.to(orig.dtype)  # the forward re-assigned it


