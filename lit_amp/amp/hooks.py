"""A mixed-precision conversion's installation (:func:`convert`) and removal, on the modules
themselves, in place (``DistributedDataParallel`` and Lightning's strategies discard a
replacement module).

:func:`plan_roles` gives every module a role (low, float32 island, float32). O2 and O3, and O1
on ``torch.autocast``, replace forwards (:mod:`lit_amp.amp.forwards`): no hook runs. A custom O1
white list (MindSpore's islands and :class:`~lit_amp.amp.casting.O1FunctionMode`), and a module
that already has an instance ``forward``, get a :class:`_AmpPreHook` / :class:`_AmpPostHook`
pair that casts inputs, swaps parameters in (:func:`lit_amp.amp.swap.swap_in`) and casts the
output.

Example:
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    >>> net = convert(net, mechanism="O2", dtype=torch.bfloat16, level_tag="O2")
    >>> is_converted(net), net(torch.randn(2, 4)).dtype
    (True, torch.float32)
    >>> remove_hooks(net), is_converted(net)
    (True, False)
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from lit_amp.amp import forwards
from lit_amp.amp.casting import _LOW_SRC, _cast_tree, _input_src, _linear_forward
from lit_amp.amp.levels import LOW_DTYPES
from lit_amp.amp.lists import (
    AUTOCAST_WHITE_GAPS,
    BLACK_LIST_MODULES,
    FP32_MODULES,
    WHITE_LIST_FUNCTIONS,
    WHITE_LIST_MODULES,
)
from lit_amp.amp.swap import (
    _B,
    _P,
    _STATS,
    AmpState,
    Frame,
    check_device,
    device_type,
    holds_float64,
    swap_in,
    swap_out,
)

__all__ = [
    "convert",
    "convert_level",
    "is_converted",
    "is_metric",
    "plan_roles",
    "remove_hooks",
]

# Roles of a module in a converted network.
_LOW = "low"  # computes in the low dtype (Cell.to_float(low))
_FP32_ISLAND = "fp32_island"  # computes in fp32, output cast to the low dtype (_OutputTo16)
_FP32 = "fp32"  # computes in fp32 (inside an island, loss modules, metrics)

# Norm layers whose kernels (cuDNN's, the CPU's) take a low-precision input with float32 weights
# and statistics and compute in float32, giving the same output as a float32 island cast back
# (bit for bit on this CPU): a float32 island of one gets the activation as it is, with no cast
# to float32 and back. Without weights and statistics the kernel would compute in the low dtype.
_LOW_INPUT_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def _takes_low_input(m: nn.Module) -> bool:
    return (type(m) in _LOW_INPUT_NORMS and "forward" not in m.__dict__
            and bool(m.affine or m.track_running_stats))


# ----------------------------------------------------------------------------- hooks
def _wrap_root_forward(root: nn.Module, state: AmpState) -> None:
    """Make :func:`~lit_amp.amp.forwards.autocast_forward` the forward of an O1 network's root
    (undone by :func:`remove_hooks`)."""
    if not forwards.wrap_forward(root, forwards.autocast_forward, state):
        raise TypeError(
            "For 'auto_mixed_precision', level 'O1' runs the network's forward in a "
            f"torch.autocast region by wrapping it, but this {type(root).__name__} already has "
            "an instance attribute 'forward'. Convert the module whose class defines its "
            "forward, or use custom_mixed_precision(network, white_list=get_white_list()).")


def _autocast_off(args: tuple, kwargs: dict) -> Any:
    """An ``autocast(enabled=False)`` region where one is active (float32 modules inside an O1
    network: the loss, metrics), else None."""
    dev = device_type(args, kwargs)
    if torch.is_autocast_enabled(dev):
        return torch.autocast(dev, enabled=False)
    return None


class _AmpPreHook:
    """Forward pre-hook: cast inputs, swap in low-precision parameters, enter the O1 mode."""

    def __init__(
        self,
        state: AmpState,
        in_dtype: torch.dtype | None,
        entries: list[tuple[nn.Module, str, int]] | None,
        enter_mode: bool,
        is_root: bool,
        leave_autocast: bool = False,
    ) -> None:
        self.state = state
        self.in_dtype = in_dtype
        self.entries = entries
        self.enter_mode = enter_mode
        self.is_root = is_root
        self.leave_autocast = leave_autocast

    @property
    def needs_frame(self) -> bool:
        return bool(self.entries) or self.enter_mode or self.leave_autocast

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> Any:
        state = self.state
        if self.is_root and not state.device_checked:
            check_device(state, args, kwargs)
        frame = None
        if self.needs_frame:
            frame = Frame()
            module.__dict__.setdefault("_amp_frames", []).append(frame)
        if self.enter_mode or self.leave_autocast:
            mode = state.mode() if self.enter_mode else _autocast_off(args, kwargs)
            if mode is not None:
                mode.__enter__()
                frame.mode = mode
        if self.entries:
            swap_in(self.entries, state, frame)
        if self.in_dtype is None:
            return None
        if self.in_dtype in LOW_DTYPES:
            src = _input_src(args, kwargs, lambda: holds_float64(module))
        else:
            src = _LOW_SRC
        new_args = _cast_tree(args, self.in_dtype, src)
        new_kwargs = _cast_tree(kwargs, self.in_dtype, src) if kwargs else kwargs
        if new_args is args and new_kwargs is kwargs:
            return None
        return new_args, new_kwargs


class _AmpPostHook:
    """Forward hook: restore the float32 parameters, cast the output, leave the O1 mode."""

    def __init__(self, state: AmpState, out_dtype: torch.dtype | None, pops_frame: bool):
        self.state = state
        self.out_dtype = out_dtype
        self.pops_frame = pops_frame

    def __call__(self, module: nn.Module, args: tuple, output: Any) -> Any:
        if self.pops_frame:
            frames = module.__dict__.get("_amp_frames")
            if frames:
                frame = frames.pop()
                swap_out(frame)
                if frame.mode is not None:
                    frame.mode.__exit__(None, None, None)
        if self.out_dtype is None or output is None:
            return None
        src = _LOW_SRC if self.out_dtype == torch.float32 else (torch.float32,)
        new = _cast_tree(output, self.out_dtype, src)
        return None if new is output else new


# ----------------------------------------------------------------------------- planning
def is_metric(m: nn.Module) -> bool:
    """Whether ``m`` is a torchmetrics metric (computed in float32 at every level).

    Example:
        >>> is_metric(torch.nn.Linear(1, 1))
        False
    """
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


def plan_roles(
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
        if isinstance(m, FP32_MODULES) or is_metric(m):
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


def remove_hooks(network: nn.Module) -> bool:
    """Remove a conversion's hooks, caches and swapped tensors from ``network`` (in place).

    Args:
        network: a network converted by :func:`convert` (anything else is left unchanged).

    Returns:
        Whether anything (a hook or a forward) was removed.
    """
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
                swap_out(fr)
        m.__dict__.pop("_amp_cast_cache", None)
        if m.__dict__.pop("_amp_forward", False):
            m.__dict__.pop("forward", None)
            removed = True
    for attr in ("_amp_level", "_amp_state", "_amp_dtype", "_amp_custom"):
        network.__dict__.pop(attr, None)
    return removed


def is_converted(network: nn.Module) -> bool:
    """Whether any module of ``network`` carries the hooks of a lit_amp conversion.

    Example:
        >>> is_converted(torch.nn.Linear(1, 1))
        False
    """
    return any("_amp_handles" in m.__dict__ for m in network.modules())


def _install_forward(m: nn.Module, role: str | None, state: AmpState, entries: dict,
                     root: nn.Module, out_roots: set) -> bool:
    """O2/O3: give ``m`` the forward its role needs, if any (:mod:`lit_amp.amp.forwards`).

    False when ``m`` already has an instance ``forward``: it gets hooks instead."""
    if role == _LOW:
        if m in out_roots:
            return forwards.wrap_forward(m, forwards.low_root_forward, state, entries.get(m, []))
        own = [e for e in entries.get(m, ()) if e[0] is m]
        return not own or forwards.wrap_forward(m, forwards.low_forward, state, own)
    if role == _FP32_ISLAND:
        if m is not root and _takes_low_input(m):
            return True  # the kernel takes the low activation as it is
        return forwards.wrap_forward(m, forwards.island_forward, state)
    if m is root or isinstance(m, FP32_MODULES) or is_metric(m):  # float32 entry points
        return forwards.wrap_forward(m, forwards.fp32_forward, state)
    return True  # inside an island: its inputs are float32 already


def _install_hooks(m: nn.Module, role: str | None, state: AmpState, entries: dict,
                   network: nn.Module, out_roots: set, islands: set, mechanism: str) -> None:
    """The forward pre-hook / hook pair of ``m`` (O1; a module O2/O3 cannot wrap)."""
    dtype, functions, on_autocast = state.dtype, state.functions, state.autocast
    cache_casts = state.cache_casts
    is_root = m is network
    enter_mode = is_root and bool(functions)
    handles = []
    if is_root and on_autocast and role != _FP32:
        _wrap_root_forward(m, state)
    if (
        not is_root
        and m not in out_roots
        and m not in islands
        and role in (_LOW, _FP32)
        and not (isinstance(m, FP32_MODULES) or is_metric(m))  # fp32 entry points
        and _needs_no_hooks(m)
    ):
        return  # its inputs already have the region's dtype (see _needs_no_hooks)
    if role == _LOW:
        out_dtype = None
        if m in out_roots and mechanism != "O1":
            out_dtype = torch.float32
        elif m in islands:
            out_dtype = torch.float32  # an O1 island: cast back after the node
        pre = _AmpPreHook(state, dtype, entries.get(m), enter_mode, is_root)
        post = _AmpPostHook(state, out_dtype, pre.needs_frame)
    elif role == _FP32_ISLAND:
        low_in = not is_root and _takes_low_input(m)
        pre = _AmpPreHook(state, None if low_in else torch.float32, None, enter_mode,
                          is_root)
        post = _AmpPostHook(state, dtype, pre.needs_frame)
    elif role == _FP32:
        leave = on_autocast and not is_root  # a loss or metric: autocast off inside
        pre = _AmpPreHook(state, torch.float32, None, enter_mode, is_root, leave)
        post = _AmpPostHook(state, None, pre.needs_frame)
    else:  # O1, outside white-listed modules
        if on_autocast and m in out_roots and not is_root:
            # autocast hands the low dtype on: the plugin's top-level modules' outputs
            # return to float32 (the root's: its forward, forwards.autocast_forward)
            pre = _AmpPreHook(state, None, None, False, False)
            post = _AmpPostHook(state, torch.float32, False)
        elif not enter_mode:
            return
        else:
            pre = _AmpPreHook(state, None, None, True, is_root)
            post = _AmpPostHook(state, None, True)
    if pre.in_dtype is not None or pre.needs_frame or is_root:
        handles.append(m.register_forward_pre_hook(pre, prepend=True, with_kwargs=True))
    if post.pops_frame or post.out_dtype is not None:
        handles.append(m.register_forward_hook(post, always_call=post.pops_frame))
    m.__dict__["_amp_handles"] = handles
    if role == _LOW and type(m) is nn.Linear and cache_casts and "forward" not in m.__dict__:
        m.forward = functools.partial(_linear_forward, m)  # see _LowLinear (picklable)
        m.__dict__["_amp_forward"] = True


def convert(
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
    """Install the hooks of ``mechanism`` on ``network`` (in place).

    ``mechanism``: ``"autocast"`` (level O1 with the built-in lists: the root's forward runs in
    a ``torch.autocast`` region, see :data:`lit_amp.amp.lists.AUTOCAST_WHITE_GAPS`), ``"O1"``
    (a custom white list: MindSpore's islands and function mode), ``"O2"``, ``"O3"``.
    """
    if on_autocast := mechanism == "autocast":
        mechanism, white_classes, white_patterns = "O1", AUTOCAST_WHITE_GAPS, ()
    functions = frozenset(white_functions if mechanism == "O1" and not on_autocast else ())
    state = AmpState(level=level_tag, dtype=dtype, cache_casts=cache_casts, functions=functions,
                      autocast=on_autocast)
    roles, islands = plan_roles(
        network, mechanism, tuple(white_classes), white_patterns, tuple(black_classes),
        black_patterns,
    )
    entries = _entries_for(roles)
    out_roots = {network, *output_roots}
    lean = mechanism in ("O2", "O3")
    for m, role in roles.items():
        if lean and _install_forward(m, role, state, entries, network, out_roots):
            continue
        _install_hooks(m, role, state, entries, network, out_roots, islands, mechanism)
    if network not in roles or "_amp_handles" not in network.__dict__:
        network.__dict__["_amp_handles"] = []
    network._amp_level = level_tag
    network._amp_dtype = dtype
    network._amp_state = state
    return network


def convert_level(
    network: nn.Module, level: str, dtype: torch.dtype, *, cache_casts: bool, func: str
) -> nn.Module:
    """Convert ``network`` at a plain level (``"O0"``-``"O3"``), replacing an earlier conversion.

    Args:
        network: the network (converted in place).
        level: ``"O0"`` (hooks removed only), ``"O1"``, ``"O2"`` or ``"O3"``.
        dtype: the low compute dtype.
        cache_casts: keep low-precision parameter copies between optimizer steps.
        func: the public function named in the repeated-conversion warning.

    Returns:
        ``network`` itself.
    """
    if is_converted(network) or getattr(network, "_amp_level", None) is not None:
        warnings.warn(
            f"For '{func}', the network has already been converted to mixed precision "
            f"(level {getattr(network, '_amp_level', '?')!r}); repeated calls replace the "
            "previous conversion. Train an already converted network with level 'O0' to avoid "
            "a repeated conversion.",
            UserWarning,
            stacklevel=3,
        )
        remove_hooks(network)
    if level == "O0":
        return network
    return convert(network, mechanism="autocast" if level == "O1" else level, dtype=dtype,
                   level_tag=level, cache_casts=cache_casts)

