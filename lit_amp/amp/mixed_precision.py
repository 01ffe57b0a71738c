"""MindSpore's mixed-precision levels in pure PyTorch: ``auto_mixed_precision`` and
``custom_mixed_precision`` (spec §2.2-2.3).

How it works
------------
Parameters stay **stored in float32** at every level. A converted module computes in the low
dtype the way MindSpore's ``Cell.to_float`` does: forward hooks, installed **in place** on the
modules themselves (so ``DistributedDataParallel`` and Lightning's strategies, which discard a
replacement module, keep working), cast the module's floating inputs to the low dtype and, for
the duration of its ``forward``, replace its parameters by low-precision copies made with an
autograd cast (gradients flow back, in float32, to the float32 parameters). Floating buffers are
cast the same way; a buffer the forward updates in place (BatchNorm's running statistics at
``O3``) is copied back into the float32 buffer afterwards.

=====  ==================================================================================
Level  What computes in the low dtype
=====  ==================================================================================
O0     nothing: the network is returned unchanged.
O1     white-listed modules (:func:`~lit_amp.amp.lists.get_white_list`; their output is
       cast back to float32) and white-listed torch functions called anywhere inside the
       network's forward (``torch.matmul``, ``@``, ``F.linear``, ``F.conv*``, ``F.relu``, ...;
       intercepted with a ``TorchFunctionMode`` that is active only during that forward:
       inputs cast to the low dtype, result cast back to float32).
O2     everything except black-listed modules (BatchNorm*, LayerNorm, SyncBatchNorm,
       GroupNorm), which compute in float32 and hand the low dtype on; the network's output
       is cast to float32.
O3     everything, BatchNorm included; the network's output is cast to float32.
=====  ==================================================================================

At every level, loss modules (``nn.modules.loss._Loss``) and torchmetrics metrics inside the
network compute in float32 (MindSpore computes the loss in float32). At O2/O3 every function a
module calls computes in the low dtype because its inputs and weights are low (PyTorch's type
promotion), except where a module creates float32 tensors itself (``torch.zeros(...)`` with the
default dtype) - those ops follow PyTorch's promotion rules. ``float64`` tensors are never cast.

Low-precision copies of the parameters are cached between optimizer steps (``cache_casts``): a
copy is refreshed when the parameter's version counter, storage or object changes or when it
has received a gradient since (which covers fused optimizers that do not bump the version
counter). Writes through ``param.data`` bypass all three: call
:func:`invalidate_cast_cache` after them, or convert with ``cache_casts=False``.

On CPU, where every fresh tensor the size of a large weight is mapped anew by the allocator
(page faults cost several times the arithmetic of a cast), the gradients of cached weights
are written into reused buffers: the float32 gradient handed to the parameter, and for
``nn.Linear`` (whose ``forward`` a conversion replaces by :class:`_LowLinear`, same arithmetic as
``F.linear``) the low-precision weight gradient too. A buffer is reused only while nothing else
holds it, so a ``.grad`` kept across steps is never overwritten.

Example:
    >>> import torch
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    >>> net = auto_mixed_precision(net, "O2", dtype=torch.bfloat16)
    >>> out = net(torch.randn(3, 4))
    >>> out.dtype, net[0].weight.dtype          # output fp32, storage fp32
    (torch.float32, torch.float32)
    >>> out.sum().backward(); net[0].weight.grad.dtype
    torch.float32
"""

from __future__ import annotations

import functools
import logging
import re
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from lit_amp.amp.lists import (
    BLACK_LIST_MODULES,
    FP32_MODULES,
    WHITE_LIST_FUNCTIONS,
    WHITE_LIST_MODULES,
)

__all__ = [
    "auto_mixed_precision",
    "custom_mixed_precision",
    "remove_mixed_precision",
    "invalidate_cast_cache",
    "get_amp_level",
    "validate_amp_level",
    "validate_amp_dtype",
    "AMP_LEVELS",
    "LOW_DTYPES",
]

log = logging.getLogger(__name__)

#: Levels accepted by ``amp_level`` / ``level`` arguments.
AMP_LEVELS: tuple[str, ...] = ("O0", "O1", "O2", "O3", "auto")
#: The supported low-precision compute dtypes.
LOW_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)

_HALF_AND_SINGLE = (torch.float32, torch.float16, torch.bfloat16)
_LOW_SRC = (torch.float16, torch.bfloat16)

# Roles of a module in a converted network.
_LOW = "low"  # computes in the low dtype (Cell.to_float(low))
_FP32_ISLAND = "fp32_island"  # computes in fp32, output cast to the low dtype (_OutputTo16)
_FP32 = "fp32"  # computes in fp32 (inside an island, loss modules, metrics)

# Kinds of swap entries.
_P, _B, _STATS = 0, 1, 2  # parameter, buffer, running statistics (copied back in training)


# ----------------------------------------------------------------------------- validation
def validate_amp_level(level: Any, name: str = "amp_level") -> None:
    """Check an AMP level: a ``str`` (TypeError) among ``O0, O1, O2, O3, auto`` (ValueError).

    Args:
        level: the value to check.
        name: the argument name used in the error message.

    Raises:
        TypeError: ``level`` is not a string.
        ValueError: ``level`` is not one of the allowed levels.

    Example:
        >>> validate_amp_level("O2")
        >>> validate_amp_level("O4")
        Traceback (most recent call last):
        ...
        ValueError: For '...', the argument 'amp_level' must be one of ['O0', 'O1', 'O2', 'O3', 'auto'], but got 'O4'.
    """  # noqa: E501
    if not isinstance(level, str):
        raise TypeError(
            f"For '{name}', the argument '{name}' must be a str, but got {type(level).__name__}: "
            f"{level!r}."
        )
    if level not in AMP_LEVELS:
        raise ValueError(
            f"For '{name}', the argument '{name}' must be one of {list(AMP_LEVELS)}, "
            f"but got {level!r}."
        )


def validate_amp_dtype(dtype: Any, name: str = "dtype", func: str = "auto_mixed_precision") -> None:
    """Check a low-precision dtype: ``torch.float16`` or ``torch.bfloat16`` (ValueError).

    Example:
        >>> validate_amp_dtype(torch.bfloat16)
        >>> validate_amp_dtype(torch.float32)
        Traceback (most recent call last):
        ...
        ValueError: For 'auto_mixed_precision', the argument 'dtype' must be torch.float16 or torch.bfloat16, but got torch.float32.
    """  # noqa: E501
    if dtype not in LOW_DTYPES:
        raise ValueError(
            f"For '{func}', the argument '{name}' must be torch.float16 or torch.bfloat16, "
            f"but got {dtype!r}."
        )


def _check_network(network: Any, func: str) -> None:
    if not isinstance(network, nn.Module):
        raise TypeError(
            f"For '{func}', the argument 'network' must be a torch.nn.Module, "
            f"but got {type(network).__name__}."
        )


# ----------------------------------------------------------------------------- casting
def _cast_tree(obj: Any, dtype: torch.dtype, src: tuple[torch.dtype, ...]) -> Any:
    """Cast every tensor in ``obj`` whose dtype is in ``src`` (and differs) to ``dtype``.

    Walks tuples (incl. named tuples), lists and dicts; returns ``obj`` itself when nothing
    changed.
    """
    if isinstance(obj, torch.Tensor):
        if obj.dtype != dtype and obj.dtype in src:
            return obj.to(dtype)
        return obj
    if isinstance(obj, (tuple, list)):
        if not obj:
            return obj
        new = [_cast_tree(o, dtype, src) for o in obj]
        if all(a is b for a, b in zip(new, obj)):
            return obj
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return type(obj)(*new)
        return type(obj)(new) if isinstance(obj, list) else tuple(new)
    if isinstance(obj, dict):
        changed = False
        out = {}
        for k, v in obj.items():
            nv = _cast_tree(v, dtype, src)
            changed |= nv is not v
            out[k] = nv
        if not changed:
            return obj
        try:
            return type(obj)(out)
        except TypeError:
            return out
    return obj


def _first_tensor(obj: Any) -> torch.Tensor | None:
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, (tuple, list)):
        for o in obj:
            t = _first_tensor(o)
            if t is not None:
                return t
    if isinstance(obj, dict):
        for o in obj.values():
            t = _first_tensor(o)
            if t is not None:
                return t
    return None


class _CachedCast(torch.autograd.Function):
    """Identity onto a cached low-precision copy; the gradient is cast back to the param dtype.

    On CPU the float32 gradient is written into a storage pooled in the cache entry instead of
    a fresh allocation: a fresh tensor the size of a large weight is mapped anew at every step
    (page faults cost ~6x the cast itself). The pool is reused only when nothing else holds it
    (storage use count), so a ``.grad`` kept across steps (accumulation without zeroing, or a
    user's reference) is never overwritten: a new pool is allocated instead.
    """

    @staticmethod
    def forward(ctx: Any, param: torch.Tensor, low: torch.Tensor, entry: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.param_dtype = param.dtype
        ctx.entry = entry
        return low.view_as(low)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        entry = ctx.entry
        if entry is None or grad.device.type != "cpu" or grad.layout != torch.strided:
            return grad.to(ctx.param_dtype), None, None
        return _pooled_cast(entry, grad, ctx.param_dtype), None, None


def _storage_free(storage: Any) -> bool:
    return torch._C._storage_Use_Count(storage._cdata) == 1


def _pool_view(entry: _CacheEntry, slot: str, shape: torch.Size, dtype: torch.dtype):
    """A contiguous CPU tensor on the storage kept in ``entry.<slot>``, reused while nothing else
    holds it (else a new storage replaces it in the slot)."""
    nbytes = shape.numel() * torch.empty((), dtype=dtype).element_size()
    pool = getattr(entry, slot)
    if pool is None or pool.nbytes() != nbytes or not _storage_free(pool):
        pool = torch.empty(shape, dtype=dtype).untyped_storage()
        setattr(entry, slot, pool)
    return torch.empty(0, dtype=dtype).set_(pool, 0, shape, _contiguous_strides(shape))


def _pooled_cast(entry: _CacheEntry, grad: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``grad.to(dtype)`` written into ``entry``'s pooled storage (contiguous)."""
    return _pool_view(entry, "grad_pool", grad.shape, dtype).copy_(grad)


def _contiguous_strides(shape: torch.Size) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def _count_grad(p: torch.Tensor) -> None:
    # post-accumulate-grad hook: a parameter that received a gradient may be stepped next, so
    # its cached low copy is refreshed at the next forward (fused optimizers do not bump
    # ``_version``).
    p.__dict__["_lit_amp_grads"] = p.__dict__.get("_lit_amp_grads", 0) + 1


class _LowLinear(torch.autograd.Function):
    """``F.linear`` on a cached low-precision weight whose weight gradient never touches fresh
    memory (CPU): ``grad_out.T @ x`` is computed into a pooled low-precision buffer and cast into
    the pooled float32 gradient. The float32 parameter is an input, so its ``AccumulateGrad``
    (and DDP's hooks on it) run as usual."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, low: torch.Tensor,  # type: ignore[override]
                bias: torch.Tensor | None, entry: Any) -> torch.Tensor:
        ctx.entry = entry
        ctx.param_dtype = weight.dtype
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, low)
        return torch.nn.functional.linear(x, low, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:  # type: ignore[override]
        x, low = ctx.saved_tensors
        gx = gw = gb = None
        g2 = grad.reshape(-1, grad.shape[-1])
        if ctx.needs_input_grad[0]:
            gx = grad.matmul(low)
        if ctx.needs_input_grad[1]:
            buf = _pool_view(ctx.entry, "low_grad_pool", low.shape, low.dtype)
            torch.mm(g2.t(), x.reshape(-1, x.shape[-1]), out=buf)
            gw = _pooled_cast(ctx.entry, buf, ctx.param_dtype)
            del buf  # frees the low pool for the next step
        if ctx.has_bias and ctx.needs_input_grad[3]:
            gb = g2.sum(0)
        return gx, gw, None, gb, None


def _linear_forward(self: nn.Linear, input: torch.Tensor) -> torch.Tensor:
    """``forward`` of a converted ``nn.Linear``: the pooled path when its weight is cached."""
    w = self.weight
    entry = getattr(w, "_lit_amp_entry", None)
    if (
        entry is None
        or input.dtype != w.dtype
        or input.dim() < 2
        or not torch.is_grad_enabled()
        or torch.is_autocast_enabled("cpu")
    ):
        return nn.Linear.forward(self, input)
    param = entry.ref()
    if param is None:
        return nn.Linear.forward(self, input)
    return _LowLinear.apply(input, param, entry.low, self.bias, entry)


class _CastCache(dict):
    """Per-module ``name -> _CacheEntry``; deep copies and pickles start empty."""

    def __deepcopy__(self, memo: dict) -> _CastCache:
        return _CastCache()

    def __reduce__(self) -> tuple:
        return (_CastCache, ())


class _CacheEntry:
    __slots__ = ("ref", "key", "low", "grad_pool", "low_grad_pool")

    def __init__(self, ref: weakref.ref, key: tuple, low: torch.Tensor) -> None:
        self.ref = ref
        self.key = key
        self.low = low
        self.grad_pool: Any = None  # UntypedStorage reused for the float32 gradient (CPU)
        self.low_grad_pool: Any = None  # ... and for the low-precision one (nn.Linear, CPU)


#: Parameters with fewer elements are cast with a plain ``.to()`` (cheaper than the cache's
#: bookkeeping; the cache pays off for large tensors, whose fresh allocation costs page faults).
CACHE_MIN_NUMEL = 1 << 18


def _cast_param(owner: nn.Module, name: str, p: torch.Tensor, dtype: torch.dtype, cache: bool):
    """The low-precision view of parameter ``p`` used during one forward (an autograd op)."""
    if not cache or p.numel() < CACHE_MIN_NUMEL or not isinstance(p, nn.Parameter):
        return p.to(dtype)
    d = p.__dict__
    if not d.get("_lit_amp_hooked", False) and p.requires_grad:
        p.register_post_accumulate_grad_hook(_count_grad)
        d["_lit_amp_hooked"] = True
    key = (p._version, p.data_ptr(), d.get("_lit_amp_grads", 0))
    store = owner.__dict__.get("_amp_cast_cache")
    if store is None:
        store = owner.__dict__["_amp_cast_cache"] = _CastCache()
    entry = store.get(name)
    if entry is None or entry.ref() is not p or entry.low.shape != p.shape or (
        entry.low.device != p.device or entry.low.dtype != dtype
    ):
        with torch.inference_mode(False), torch.no_grad():
            low = torch.empty(p.shape, dtype=dtype, device=p.device)
            low.copy_(p.detach())
        entry = store[name] = _CacheEntry(weakref.ref(p), key, low)
    elif entry.key != key:
        with torch.no_grad():
            entry.low.copy_(p.detach())
        entry.key = key
    low_view = _CachedCast.apply(p, entry.low, entry)
    if p.device.type == "cpu":
        low_view._lit_amp_entry = entry  # lets a converted nn.Linear take the pooled path
    return low_view


def invalidate_cast_cache(network: nn.Module) -> None:
    """Drop the cached low-precision parameter copies of a converted network.

    Needed only after writing parameters through ``param.data`` (which bypasses the version
    counter the cache watches).

    Example:
        >>> net = auto_mixed_precision(torch.nn.Linear(2, 2), "O3", dtype=torch.bfloat16)
        >>> _ = net(torch.randn(1, 2))
        >>> _ = net.weight.data.zero_()      # invisible to the cache...
        >>> invalidate_cast_cache(net)       # ...so drop it
        >>> bool((net(torch.ones(1, 2)) == net.bias.bfloat16().float()).all())
        True
    """
    for m in network.modules():
        store = m.__dict__.get("_amp_cast_cache")
        if store is not None:
            store.clear()


# ----------------------------------------------------------------------------- O1 mode
class _O1FunctionMode(TorchFunctionMode):
    """Casts white-listed torch functions to the low dtype, and their result back to fp32."""

    def __init__(self, dtype: torch.dtype, functions: frozenset) -> None:
        super().__init__()
        self.dtype = dtype
        self.functions = functions

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func in self.functions and "out" not in kwargs and not kwargs.get("inplace", False):
            if not (len(args) > 1 and args[1] is True):  # F.relu(x, True): in place, leave it
                low = self.dtype
                cargs = _cast_tree(args, low, _HALF_AND_SINGLE)
                ckw = _cast_tree(kwargs, low, _HALF_AND_SINGLE) if kwargs else kwargs
                if cargs is args and ckw is kwargs:
                    return func(*args, **kwargs)  # already low: inside a low module
                return _cast_tree(func(*cargs, **ckw), torch.float32, _LOW_SRC)
        return func(*args, **kwargs)


def _mode_active(mode: _O1FunctionMode) -> bool:
    from torch.overrides import _get_current_function_mode_stack

    for m in _get_current_function_mode_stack():
        if isinstance(m, _O1FunctionMode) and m.dtype == mode.dtype and (
            m.functions == mode.functions
        ):
            return True
    return False


# ----------------------------------------------------------------------------- hooks
@dataclass(eq=False)
class _AmpState:
    """What one conversion shares between its hooks (stored as ``network._amp_state``)."""

    level: str
    dtype: torch.dtype
    cache_casts: bool = True
    functions: frozenset = field(default_factory=frozenset)
    device_checked: bool = False

    def mode(self) -> _O1FunctionMode | None:
        return _O1FunctionMode(self.dtype, self.functions) if self.functions else None


class _Frame:
    __slots__ = ("params", "buffers", "attrs", "mode")

    def __init__(self) -> None:
        self.params: list = []
        self.buffers: list = []
        self.attrs: list = []
        self.mode: _O1FunctionMode | None = None


class _AmpPreHook:
    """Forward pre-hook: cast inputs, swap in low-precision parameters, enter the O1 mode."""

    def __init__(
        self,
        state: _AmpState,
        in_dtype: torch.dtype | None,
        entries: list[tuple[nn.Module, str, int]] | None,
        enter_mode: bool,
        is_root: bool,
    ) -> None:
        self.state = state
        self.in_dtype = in_dtype
        self.entries = entries
        self.enter_mode = enter_mode
        self.is_root = is_root

    @property
    def needs_frame(self) -> bool:
        return bool(self.entries) or self.enter_mode

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> Any:
        state = self.state
        if self.is_root and not state.device_checked:
            _check_device(state, args, kwargs)
        frame = None
        if self.needs_frame:
            frame = _Frame()
            module.__dict__.setdefault("_amp_frames", []).append(frame)
        if self.enter_mode:
            mode = state.mode()
            if mode is not None and not _mode_active(mode):
                mode.__enter__()
                frame.mode = mode  # type: ignore[union-attr]
        if self.entries:
            _swap_in(self.entries, state, frame)  # type: ignore[arg-type]
        if self.in_dtype is None:
            return None
        src = _HALF_AND_SINGLE if self.in_dtype in LOW_DTYPES else _LOW_SRC
        new_args = _cast_tree(args, self.in_dtype, src)
        new_kwargs = _cast_tree(kwargs, self.in_dtype, src) if kwargs else kwargs
        if new_args is args and new_kwargs is kwargs:
            return None
        return new_args, new_kwargs


class _AmpPostHook:
    """Forward hook: restore the float32 parameters, cast the output, leave the O1 mode."""

    def __init__(self, state: _AmpState, out_dtype: torch.dtype | None, pops_frame: bool):
        self.state = state
        self.out_dtype = out_dtype
        self.pops_frame = pops_frame

    def __call__(self, module: nn.Module, args: tuple, output: Any) -> Any:
        if self.pops_frame:
            frames = module.__dict__.get("_amp_frames")
            if frames:
                frame = frames.pop()
                _swap_out(frame)
                if frame.mode is not None:
                    frame.mode.__exit__(None, None, None)
        if self.out_dtype is None or output is None:
            return None
        src = _LOW_SRC if self.out_dtype == torch.float32 else (torch.float32,)
        new = _cast_tree(output, self.out_dtype, src)
        return None if new is output else new


def _check_device(state: _AmpState, args: tuple, kwargs: dict) -> None:
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


def _swap_in(entries: list, state: _AmpState, frame: _Frame) -> None:
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


def _swap_out(frame: _Frame) -> None:
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


# ----------------------------------------------------------------------------- planning
def _is_metric(m: nn.Module) -> bool:
    return type(m).__module__.split(".")[0] == "torchmetrics"


def _matches(m: nn.Module, names: Sequence[str], classes: tuple, patterns: Sequence) -> bool:
    if classes and isinstance(m, classes):
        return True
    return any(p.fullmatch(n) for p in patterns for n in names)


def _module_names(network: nn.Module) -> dict[int, list[str]]:
    names: dict[int, list[str]] = {}
    for n, m in network.named_modules(remove_duplicate=False):
        names.setdefault(id(m), []).append(n)
    return names


def _plan_roles(
    network: nn.Module,
    mechanism: str,
    white_classes: tuple,
    white_patterns: Sequence,
    black_classes: tuple,
    black_patterns: Sequence,
) -> tuple[dict[nn.Module, str | None], set[nn.Module]]:
    """Role of every module (first path wins for a module reachable twice), and the O1 islands
    (outermost white-listed modules, whose output is cast back to float32)."""
    names = _module_names(network)
    roles: dict[nn.Module, str | None] = {}
    islands: set[nn.Module] = set()

    def fp32_subtree(m: nn.Module) -> None:
        for sub in m.modules():
            if sub not in roles:
                roles[sub] = _FP32

    def visit(m: nn.Module, ctx: str | None) -> None:
        # ctx: None (fp32 context, O1 outside islands) or _LOW (inside a low region)
        if m in roles:
            return
        if isinstance(m, FP32_MODULES) or _is_metric(m):
            roles[m] = _FP32
            fp32_subtree(m)
            return
        mnames = names.get(id(m), [])
        if mechanism == "O1":
            if ctx is None and _matches(m, mnames, white_classes, white_patterns):
                roles[m] = _LOW
                islands.add(m)
                for c in m.children():
                    visit(c, _LOW)
                return
            roles[m] = ctx
            for c in m.children():
                visit(c, ctx)
            return
        if mechanism == "O2" and _matches(m, mnames, black_classes, black_patterns):
            roles[m] = _FP32_ISLAND
            for sub in m.modules():
                if sub is not m and sub not in roles:
                    roles[sub] = _FP32
            return
        roles[m] = _LOW
        for c in m.children():
            visit(c, _LOW)

    visit(network, None if mechanism == "O1" else _LOW)
    return roles, islands


def _entries_for(roles: dict[nn.Module, str | None]) -> dict[nn.Module, list]:
    """Swap entries (owner, name, kind) of each low module's low subtree."""
    memo: dict[nn.Module, list] = {}

    def collect(m: nn.Module, seen: set) -> list:
        if m in memo:
            return memo[m]
        own = [(m, n, _P) for n, p in m._parameters.items() if p is not None]
        # normalisation running statistics are updated in place by kernels that do not bump
        # the version counter: copy them back whenever the module ran in training mode
        kind = _STATS if isinstance(m, nn.modules.batchnorm._NormBase) else _B
        own += [
            (m, n, kind)
            for n, b in m._buffers.items()
            if b is not None and b.is_floating_point()
        ]
        out = list(own)
        for c in m.children():
            if roles.get(c) == _LOW and c not in seen:
                seen.add(c)
                out.extend(collect(c, seen))
        # parameters first (buffers are cheap and rarely shared)
        out.sort(key=lambda e: e[2] != _P)
        memo[m] = out
        return out

    return {m: collect(m, {m}) for m, r in roles.items() if r == _LOW}


# ----------------------------------------------------------------------------- convert
def _needs_no_hooks(m: nn.Module) -> bool:
    """Modules inside a low (or float32) region that can go without hooks: parameter-less
    leaves (activations, pooling, dropout, flatten) and plain ``nn.Sequential`` containers. Their
    inputs come from hooked modules of the same region, which hand the region's dtype on; a
    parameter-less leaf fed a float32 tensor that the user's own code created computes in float32
    (PyTorch's promotion), which is the one deviation from MindSpore's per-cell input casts."""
    if any(p is not None for p in m._parameters.values()):
        return False
    if any(b is not None and b.is_floating_point() for b in m._buffers.values()):
        return False
    if next(m.children(), None) is None:
        return True
    return type(m).forward is nn.Sequential.forward


def _remove_hooks(network: nn.Module) -> bool:
    removed = False
    for m in network.modules():
        handles = m.__dict__.pop("_amp_handles", None)
        if handles:
            removed = True
            for h in handles:
                h.remove()
        frames = m.__dict__.pop("_amp_frames", None)
        if frames:
            for fr in reversed(frames):
                _swap_out(fr)
        m.__dict__.pop("_amp_cast_cache", None)
        if m.__dict__.pop("_amp_forward", False):
            m.__dict__.pop("forward", None)
    for attr in ("_amp_level", "_amp_state", "_amp_dtype", "_amp_custom"):
        network.__dict__.pop(attr, None)
    return removed


def _is_converted(network: nn.Module) -> bool:
    return any("_amp_handles" in m.__dict__ for m in network.modules())


def _convert(
    network: nn.Module,
    *,
    mechanism: str,
    dtype: torch.dtype,
    level_tag: str,
    white_classes: tuple = WHITE_LIST_MODULES,
    white_functions: Iterable[Callable] = WHITE_LIST_FUNCTIONS,
    white_patterns: Sequence = (),
    black_classes: tuple = BLACK_LIST_MODULES,
    black_patterns: Sequence = (),
    output_roots: Iterable[nn.Module] = (),
    cache_casts: bool = True,
) -> nn.Module:
    """Install the hooks of ``mechanism`` ("O1", "O2", "O3") on ``network`` (in place)."""
    functions = frozenset(white_functions) if mechanism == "O1" else frozenset()
    state = _AmpState(level=level_tag, dtype=dtype, cache_casts=cache_casts, functions=functions)
    roles, islands = _plan_roles(
        network, mechanism, tuple(white_classes), white_patterns, tuple(black_classes),
        black_patterns,
    )
    entries = _entries_for(roles)
    out_roots = {network, *output_roots}
    for m, role in roles.items():
        is_root = m is network
        enter_mode = is_root and bool(functions)
        handles = []
        if (
            not is_root
            and m not in out_roots
            and m not in islands
            and role in (_LOW, _FP32)
            and not (isinstance(m, FP32_MODULES) or _is_metric(m))  # fp32 entry points
            and _needs_no_hooks(m)
        ):
            continue  # its inputs already have the region's dtype (see _needs_no_hooks)
        if role == _LOW:
            out_dtype = None
            if m in out_roots and mechanism != "O1":
                out_dtype = torch.float32
            elif m in islands:
                out_dtype = torch.float32  # an O1 island: cast back after the node
            pre = _AmpPreHook(state, dtype, entries.get(m), enter_mode, is_root)
            post = _AmpPostHook(state, out_dtype, pre.needs_frame)
        elif role == _FP32_ISLAND:
            pre = _AmpPreHook(state, torch.float32, None, enter_mode, is_root)
            post = _AmpPostHook(state, dtype, pre.needs_frame)
        elif role == _FP32:
            pre = _AmpPreHook(state, torch.float32, None, enter_mode, is_root)
            post = _AmpPostHook(state, None, pre.needs_frame)
        else:  # O1, outside white-listed modules
            if not enter_mode:
                continue
            pre = _AmpPreHook(state, None, None, True, is_root)
            post = _AmpPostHook(state, None, True)
        handles.append(m.register_forward_pre_hook(pre, prepend=True, with_kwargs=True))
        if post.pops_frame or post.out_dtype is not None:
            handles.append(m.register_forward_hook(post, always_call=post.pops_frame))
        m.__dict__["_amp_handles"] = handles
        if role == _LOW and type(m) is nn.Linear and cache_casts and "forward" not in m.__dict__:
            m.forward = functools.partial(_linear_forward, m)  # see _LowLinear (picklable)
            m.__dict__["_amp_forward"] = True
    if network not in roles or "_amp_handles" not in network.__dict__:
        network.__dict__["_amp_handles"] = []
    network._amp_level = level_tag
    network._amp_dtype = dtype
    network._amp_state = state
    return network


def _convert_level(
    network: nn.Module, level: str, dtype: torch.dtype, *, cache_casts: bool, func: str
) -> nn.Module:
    if _is_converted(network) or getattr(network, "_amp_level", None) is not None:
        warnings.warn(
            f"For '{func}', the network has already been converted to mixed precision "
            f"(level {getattr(network, '_amp_level', '?')!r}); repeated calls replace the "
            "previous conversion. Train an already converted network with level 'O0' to avoid "
            "a repeated conversion.",
            UserWarning,
            stacklevel=3,
        )
        _remove_hooks(network)
    if level == "O0":
        return network
    return _convert(network, mechanism=level, dtype=dtype, level_tag=level,
                    cache_casts=cache_casts)


# ----------------------------------------------------------------------------- public API
def auto_mixed_precision(
    network: nn.Module,
    amp_level: str = "O0",
    dtype: torch.dtype = torch.float16,
    *,
    cache_casts: bool = True,
) -> nn.Module:
    """Convert ``network`` in place to mixed precision at ``amp_level`` (MindSpore §2.2).

    Args:
        network: the network to convert (converted in place; the same object is returned).
        amp_level: ``"O0"`` (unchanged), ``"O1"`` (white list), ``"O2"`` (all but the black
            list), ``"O3"`` (everything) or ``"auto"`` (chosen from the hardware of the
            network's parameters; ``dtype`` is then chosen too, see
            :func:`lit_amp.amp.config.resolve_amp_config`).
        dtype: the low compute dtype, ``torch.float16`` (MindSpore's default) or
            ``torch.bfloat16``. On CPU use bfloat16: float16 is ~100x slower there (warned).
        cache_casts: keep low-precision parameter copies between optimizer steps.

    Returns:
        ``network`` itself, with ``network._amp_level`` set.

    Raises:
        TypeError: ``network`` is not an ``nn.Module`` or ``amp_level`` is not a str.
        ValueError: unknown level, or ``dtype`` not float16/bfloat16.

    Example:
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
        >>> net = auto_mixed_precision(net, "O1", dtype=torch.bfloat16)
        >>> net(torch.randn(2, 4)).dtype
        torch.float32
    """
    _check_network(network, "auto_mixed_precision")
    validate_amp_level(amp_level, "amp_level")
    validate_amp_dtype(dtype, "dtype", "auto_mixed_precision")
    if amp_level == "auto":
        from lit_amp.amp.config import resolve_amp_config

        p = next(network.parameters(), None)
        device = p.device if p is not None else torch.device("cpu")
        cfg = resolve_amp_config("auto", device=device)
        amp_level, dtype = cfg.level, cfg.dtype
    return _convert_level(network, amp_level, dtype, cache_casts=cache_casts,
                          func="auto_mixed_precision")


def _split_list(
    items: Any, name: str, allow_functions: bool
) -> tuple[tuple, tuple, tuple]:
    if not isinstance(items, (list, tuple)):
        raise TypeError(
            f"For 'custom_mixed_precision', the argument '{name}' must be a list, "
            f"but got {type(items).__name__}."
        )
    classes, functions, patterns = [], [], []
    for e in items:
        if isinstance(e, type) and issubclass(e, nn.Module):
            classes.append(e)
        elif isinstance(e, str):
            try:
                patterns.append(re.compile(e))
            except re.error as err:
                raise ValueError(
                    f"For 'custom_mixed_precision', the element {e!r} of '{name}' is not a "
                    f"valid regular expression: {err}."
                ) from err
        elif allow_functions and callable(e) and not isinstance(e, type):
            functions.append(e)
        else:
            allowed = (
                "an nn.Module subclass, a torch function or a module-path regex (str)"
                if allow_functions
                else "an nn.Module subclass or a module-path regex (str); functions "
                "(MindSpore's Primitives) are not supported in a black list"
            )
            raise TypeError(
                f"For 'custom_mixed_precision', each element of '{name}' must be {allowed}, "
                f"but got {e!r} ({type(e).__name__})."
            )
    return tuple(classes), tuple(functions), tuple(patterns)


def custom_mixed_precision(
    network: nn.Module,
    *,
    white_list: list | None = None,
    black_list: list | None = None,
    dtype: torch.dtype = torch.float16,
    cache_casts: bool = True,
) -> nn.Module:
    """Convert ``network`` in place with a user white list (O1 mechanism) or black list (O2).

    Exactly one list must be given (MindSpore §2.3). Elements may be:

    * ``nn.Module`` subclasses (matched with ``isinstance``);
    * module-path regular expressions (``str``, matched with ``re.fullmatch`` against the
      names of ``network.named_modules()``, e.g. ``r"encoder\\.layers\\.[0-3]\\..*"``) - an
      addition to MindSpore;
    * white list only: torch functions (MindSpore's Primitives), e.g. ``torch.matmul``,
      ``torch.einsum``, intercepted inside the network's forward.

    Args:
        network: the network to convert (in place).
        white_list: what computes in ``dtype`` (everything else in float32).
        black_list: what stays in float32 (everything else in ``dtype``).
        dtype: ``torch.float16`` or ``torch.bfloat16``.
        cache_casts: keep low-precision parameter copies between optimizer steps.

    Returns:
        ``network`` itself.

    Raises:
        TypeError: ``network`` not an ``nn.Module``; a list element of the wrong type.
        ValueError: neither or both lists given; ``dtype`` not float16/bfloat16; a bad regex.

    Example:
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
        >>> net = custom_mixed_precision(net, white_list=[r"0"], dtype=torch.bfloat16)
        >>> net(torch.randn(2, 4)).dtype
        torch.float32
    """
    func = "custom_mixed_precision"
    _check_network(network, func)
    if (white_list is None) == (black_list is None):
        raise ValueError(
            f"For '{func}', exactly one of 'white_list' and 'black_list' must be given, "
            f"but got white_list={white_list!r} and black_list={black_list!r}."
        )
    validate_amp_dtype(dtype, "dtype", func)
    if _is_converted(network) or getattr(network, "_amp_level", None) is not None:
        warnings.warn(
            f"For '{func}', the network has already been converted to mixed precision; "
            "repeated calls replace the previous conversion.",
            UserWarning,
            stacklevel=2,
        )
        _remove_hooks(network)
    if white_list is not None:
        classes, functions, patterns = _split_list(white_list, "white_list", True)
        _convert(network, mechanism="O1", dtype=dtype, level_tag="O1",
                 white_classes=classes, white_functions=functions, white_patterns=patterns,
                 cache_casts=cache_casts)
    else:
        classes, _, patterns = _split_list(black_list, "black_list", False)
        for default in BLACK_LIST_MODULES:
            if default not in classes:
                warnings.warn(
                    f"For '{func}', {default.__name__} is removed from internal black list.",
                    UserWarning,
                    stacklevel=2,
                )
        _convert(network, mechanism="O2", dtype=dtype, level_tag="O2",
                 black_classes=classes, black_patterns=patterns, cache_casts=cache_casts)
    network._amp_custom = True
    return network


def remove_mixed_precision(network: nn.Module) -> nn.Module:
    """Undo a conversion: remove the hooks and caches (parameters were never changed).

    Example:
        >>> net = auto_mixed_precision(torch.nn.Linear(2, 2), "O3", dtype=torch.bfloat16)
        >>> remove_mixed_precision(net)(torch.randn(1, 2)).dtype
        torch.float32
    """
    _check_network(network, "remove_mixed_precision")
    _remove_hooks(network)
    return network


def get_amp_level(network: nn.Module) -> str | None:
    """The level a network was converted to (``None`` if not converted).

    Example:
        >>> get_amp_level(auto_mixed_precision(torch.nn.Linear(2, 2), "O2", torch.bfloat16))
        'O2'
    """
    return getattr(network, "_amp_level", None)
