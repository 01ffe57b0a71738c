"""The forwards a conversion puts on modules instead of forward hooks.

A forward hook sends every call of its module down ``nn.Module``'s slow call path; an instance
``forward`` (a ``functools.partial`` of a function here, so the network still pickles,
deep-copies and traces under ``torch.compile``) costs one Python call. O1 on autocast wraps the
network's root (:func:`autocast_forward`). O2 and O3 wrap the root, which swaps the whole low
region's parameters in once per forward (:func:`low_root_forward`), the modules that hold
parameters, which cast their inputs as MindSpore's cells do (:func:`low_forward`), and the
float32 islands and entry points (:func:`island_forward`, :func:`fp32_forward`).
:func:`lit_amp.amp.hooks.remove_hooks` removes them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from lit_amp.amp.casting import _LOW_SRC, _cast_tree, _has_float64, _input_src, _linear_forward
from lit_amp.amp.swap import (
    AmpState,
    Frame,
    check_device,
    device_type,
    holds_float64,
    swap_in,
    swap_out,
)

__all__ = [
    "autocast_forward",
    "fp32_forward",
    "island_forward",
    "low_forward",
    "low_root_forward",
    "wrap_forward",
]


def wrap_forward(module: nn.Module, fn: Callable, *bound: Any) -> bool:
    """Make ``fn(*bound, module, *args, **kwargs)`` the forward of ``module``; False (nothing
    done) when the module already has an instance attribute ``forward``."""
    if "forward" in module.__dict__:
        return False
    module.forward = functools.partial(fn, *bound, module)
    module.__dict__["_amp_forward"] = True
    return True


def autocast_forward(state: AmpState, module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``forward`` of the root of a network at O1 on autocast: the class's forward in a
    ``torch.autocast`` region of the level's dtype, its low-precision output cast to float32.

    A ``with`` block in the forward itself (not a region entered by a pre-hook and left by a
    post-hook), so that ``torch.compile`` traces it.
    """
    if not state.device_checked:
        check_device(state, args, kwargs)
    if (_has_float64(args) or _has_float64(kwargs)) and not holds_float64(module):
        # autocast leaves float64 alone; MindSpore casts a float64 input of a low layer like a
        # float32 one: float32 here, autocast takes it to the low dtype
        args = _cast_tree(args, torch.float32, (torch.float64,))
        kwargs = _cast_tree(kwargs, torch.float32, (torch.float64,)) if kwargs else kwargs
    dev = device_type(args, kwargs)
    if torch.is_autocast_enabled(dev) and torch.get_autocast_dtype(dev) == state.dtype:
        out = type(module).forward(module, *args, **kwargs)  # inside the plugin's region
    else:
        with torch.autocast(dev, dtype=state.dtype, cache_enabled=state.cache_casts):
            out = type(module).forward(module, *args, **kwargs)
    return _cast_tree(out, torch.float32, _LOW_SRC)


def _low_inputs(state: AmpState, module: nn.Module, args: tuple, kwargs: dict) -> tuple:
    # float32 (and float64 meeting no float64 weight) inputs to the low dtype, as a cell's
    # to_float does
    src = _input_src(args, kwargs, lambda: holds_float64(module))
    return _cast_tree(args, state.dtype, src), (
        _cast_tree(kwargs, state.dtype, src) if kwargs else kwargs)


def _call(state: AmpState, module: nn.Module, args: tuple, kwargs: dict) -> Any:
    if type(module) is nn.Linear and state.cache_casts and len(args) == 1 and not kwargs:
        return _linear_forward(module, args[0])  # the pooled weight-gradient path (CPU)
    return type(module).forward(module, *args, **kwargs)


def low_root_forward(state: AmpState, entries: list, module: nn.Module, *args: Any,
                     **kwargs: Any) -> Any:
    """``forward`` of an O2/O3 network's root (and of a plugin's top-level modules): inputs to
    the low dtype, the low region's parameters and buffers swapped in for the call, the output
    cast to float32."""
    if not state.device_checked:
        check_device(state, args, kwargs)
    args, kwargs = _low_inputs(state, module, args, kwargs)
    frame = Frame()
    swap_in(entries, state, frame)
    try:
        out = _call(state, module, args, kwargs)
    finally:
        swap_out(frame)
    return _cast_tree(out, torch.float32, _LOW_SRC)


def low_forward(state: AmpState, own: list, module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``forward`` of a module holding parameters or buffers inside an O2/O3 low region: inputs
    to the low dtype. Its own tensors were swapped in by the root; a module called outside the
    root's forward, or whose parameters a sharded strategy gathered after it, swaps them here."""
    args, kwargs = _low_inputs(state, module, args, kwargs)
    frame = Frame()
    swap_in(own, state, frame)
    if not (frame.params or frame.buffers or frame.attrs):
        return _call(state, module, args, kwargs)
    try:
        return _call(state, module, args, kwargs)
    finally:
        swap_out(frame)


def island_forward(state: AmpState, module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``forward`` of an O2 float32 island (a black-listed module): low inputs to float32, the
    float32 output to the low dtype (MindSpore's ``_OutputTo16``)."""
    if not state.device_checked:
        check_device(state, args, kwargs)
    args = _cast_tree(args, torch.float32, _LOW_SRC)
    kwargs = _cast_tree(kwargs, torch.float32, _LOW_SRC) if kwargs else kwargs
    out = type(module).forward(module, *args, **kwargs)
    return _cast_tree(out, state.dtype, (torch.float32,))


def fp32_forward(state: AmpState, module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``forward`` of a float32 entry point (a loss module, a metric): low inputs to float32."""
    if not state.device_checked:
        check_device(state, args, kwargs)
    args = _cast_tree(args, torch.float32, _LOW_SRC)
    kwargs = _cast_tree(kwargs, torch.float32, _LOW_SRC) if kwargs else kwargs
    return type(module).forward(module, *args, **kwargs)
