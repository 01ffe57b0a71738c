"""Casting machinery of the mixed-precision conversion: tensor-tree casts and the cast cache.

Parameters stay stored in float32; a converted module computes on low-precision copies made
with an autograd cast (:class:`_CachedCast`), so gradients flow back, in float32, to the
float32 parameters.

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

The hooks that use this module live in :mod:`lit_amp.amp.hooks`.

Example:
    >>> import torch
    >>> t = (torch.ones(2), {"x": torch.zeros(1, dtype=torch.float64)})
    >>> out = _cast_tree(t, torch.bfloat16, (torch.float32,))
    >>> out[0].dtype, out[1]["x"].dtype          # float64 is never cast
    (torch.bfloat16, torch.float64)
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

__all__ = ["invalidate_cast_cache", "CACHE_MIN_NUMEL", "O1FunctionMode"]

#: float32 and the two low dtypes: the tensors a conversion casts (never float64 or ints).
_HALF_AND_SINGLE = (torch.float32, torch.float16, torch.bfloat16)
#: The low dtypes, cast back to float32 at the end of a low region.
_LOW_SRC = (torch.float16, torch.bfloat16)
#: What an input entering a low region is cast from when float64 tensors meet float32 weights
#: (MindSpore 2.10 casts a float64 input of a low-precision cell too).
_ALL_FLOATS = (torch.float64, *_HALF_AND_SINGLE)


def _has_float64(obj: Any) -> bool:
    """Whether a float64 tensor is in ``obj`` (tuples, lists and dict values walked)."""
    if isinstance(obj, torch.Tensor):
        return obj.dtype == torch.float64
    if isinstance(obj, (tuple, list)):
        return any(_has_float64(o) for o in obj)
    if isinstance(obj, dict):
        return any(_has_float64(o) for o in obj.values())
    return False


def _input_src(args: Any, kwargs: Any, float64_weights: Any) -> tuple[torch.dtype, ...]:
    """The dtypes cast to the low dtype at the entry of a low region.

    float32 and the low dtypes always; float64 too when a float64 input meets no float64
    weight (``float64_weights()`` is evaluated only then), so a float64 network stays float64.
    """
    if (_has_float64(args) or _has_float64(kwargs)) and not float64_weights():
        return _ALL_FLOATS
    return _HALF_AND_SINGLE


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
    def forward(ctx: Any, param: torch.Tensor, low: torch.Tensor, entry: Any) -> torch.Tensor:
        ctx.param_dtype = param.dtype
        ctx.entry = entry
        return low.view_as(low)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
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
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, low: torch.Tensor,
                bias: torch.Tensor | None, entry: Any) -> torch.Tensor:
        ctx.entry = entry
        ctx.param_dtype = weight.dtype
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, low)
        return torch.nn.functional.linear(x, low, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
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
        >>> from lit_amp.amp.convert import auto_mixed_precision
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
class O1FunctionMode(TorchFunctionMode):
    """Casts white-listed torch functions to the low dtype, and their result back to fp32.

    The O1 mechanism: active during a converted network's forward (and, with ``AmpPrecision``,
    during the whole training step).

    Args:
        dtype: the low compute dtype.
        functions: the torch functions to intercept (``lists.WHITE_LIST_FUNCTIONS``).

    Example:
        >>> with O1FunctionMode(torch.bfloat16, frozenset({torch.matmul})):
        ...     torch.matmul(torch.ones(2, 2), torch.ones(2, 2)).dtype
        torch.float32
    """

    def __init__(self, dtype: torch.dtype, functions: frozenset) -> None:
        super().__init__()
        self.dtype = dtype
        self.functions = functions

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func in self.functions and "out" not in kwargs and not kwargs.get("inplace", False):
            if not (len(args) > 1 and args[1] is True):  # F.relu(x, True): in place, leave it
                low = self.dtype
                src = _input_src(args, kwargs, lambda: _has_float64_param(args, kwargs))
                cargs = _cast_tree(args, low, src)
                ckw = _cast_tree(kwargs, low, src) if kwargs else kwargs
                if cargs is args and ckw is kwargs:
                    return func(*args, **kwargs)  # already low: inside a low module
                return _cast_tree(func(*cargs, **ckw), torch.float32, _LOW_SRC)
        return func(*args, **kwargs)


def _has_float64_param(args: Any, kwargs: Any) -> bool:
    """Whether a float64 ``nn.Parameter`` is among a function's arguments (a float64 layer)."""

    def walk(obj: Any) -> bool:
        if isinstance(obj, torch.Tensor):
            return isinstance(obj, nn.Parameter) and obj.dtype == torch.float64
        if isinstance(obj, (tuple, list)):
            return any(walk(o) for o in obj)
        if isinstance(obj, dict):
            return any(walk(o) for o in obj.values())
        return False

    return walk(args) or walk(kwargs)


def _mode_active(mode: O1FunctionMode) -> bool:
    from torch.overrides import _get_current_function_mode_stack

    for m in _get_current_function_mode_stack():
        if isinstance(m, O1FunctionMode) and m.dtype == mode.dtype and (
            m.functions == mode.functions
        ):
            return True
    return False
