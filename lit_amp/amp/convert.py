"""The public conversion API: ``auto_mixed_precision``, ``custom_mixed_precision``,
``remove_mixed_precision`` and ``apply_amp_config`` (MindSpore's levels in pure PyTorch).

Parameters stay stored in float32 at every level; a converted network computes in the low
dtype the way MindSpore's ``Cell.to_float`` does, in place on the modules themselves, so DDP
and Lightning's strategies (which discard a replacement module) keep working. What each level
computes in the low dtype is docs/semantics.md §2.2-2.3; where it differs from MindSpore,
docs/differences.md, "Mixed precision". The casts themselves live in :mod:`lit_amp.amp.casting`,
:mod:`lit_amp.amp.hooks` and :mod:`lit_amp.amp.forwards`.

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

import re
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from lit_amp._validation import check_type
from lit_amp.amp.casting import invalidate_cast_cache
from lit_amp.amp.hooks import convert, convert_level, is_converted, remove_hooks
from lit_amp.amp.levels import (
    AmpConfig,
    resolve_amp_config,
    validate_amp_dtype,
    validate_amp_level,
)
from lit_amp.amp.lists import BLACK_LIST_MODULES

__all__ = [
    "auto_mixed_precision",
    "custom_mixed_precision",
    "remove_mixed_precision",
    "apply_amp_config",
    "invalidate_cast_cache",
    "get_amp_level",
    "split_amp_list",
]


def _check_network(network: Any, func: str) -> None:
    check_type(func, "network", network, nn.Module, "a torch.nn.Module")


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
            :func:`lit_amp.amp.levels.resolve_amp_config`).
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
    validate_amp_level(amp_level, "amp_level", "auto_mixed_precision")
    validate_amp_dtype(dtype, "dtype", "auto_mixed_precision")
    if amp_level == "auto":
        p = next(network.parameters(), None)
        device = p.device if p is not None else torch.device("cpu")
        cfg = resolve_amp_config("auto", device=device)
        amp_level, dtype = cfg.level, cfg.dtype
    return convert_level(network, amp_level, dtype, cache_casts=cache_casts,
                          func="auto_mixed_precision")


def split_amp_list(
    items: Any, name: str, allow_functions: bool
) -> tuple[tuple, tuple, tuple]:
    r"""Split a white or black list into module classes, torch functions and compiled regexes.

    Args:
        items: the list (a ``list`` or ``tuple``).
        name: ``"white_list"`` or ``"black_list"`` (used in messages).
        allow_functions: whether torch functions are allowed (white lists only).

    Returns:
        ``(classes, functions, patterns)``.

    Raises:
        TypeError: ``items`` not a list, or an element of the wrong kind.
        ValueError: a string that is not a valid regular expression.

    Example:
        >>> split_amp_list([torch.nn.Linear, torch.matmul, r"head\..*"], "white_list", True)[0]
        (<class 'torch.nn.modules.linear.Linear'>,)
    """
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
    if is_converted(network) or getattr(network, "_amp_level", None) is not None:
        warnings.warn(
            f"For '{func}', the network has already been converted to mixed precision; "
            "repeated calls replace the previous conversion.",
            UserWarning,
            stacklevel=2,
        )
        remove_hooks(network)
    if white_list is not None:
        classes, functions, patterns = split_amp_list(white_list, "white_list", True)
        convert(network, mechanism="O1", dtype=dtype, level_tag="O1",
                 white_classes=classes, white_functions=functions, white_patterns=patterns,
                 cache_casts=cache_casts)
    else:
        classes, _, patterns = split_amp_list(black_list, "black_list", False)
        for default in BLACK_LIST_MODULES:
            if default not in classes:
                warnings.warn(
                    f"For '{func}', {default.__name__} is removed from internal black list.",
                    UserWarning,
                    stacklevel=2,
                )
        convert(network, mechanism="O2", dtype=dtype, level_tag="O2",
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
    remove_hooks(network)
    return network


def get_amp_level(network: nn.Module) -> str | None:
    """The level a network was converted to (``None`` if not converted).

    Example:
        >>> get_amp_level(auto_mixed_precision(torch.nn.Linear(2, 2), "O2", torch.bfloat16))
        'O2'
    """
    return getattr(network, "_amp_level", None)


def apply_amp_config(
    network: nn.Module, cfg: AmpConfig, *, output_roots: Iterable[nn.Module] = ()
) -> nn.Module:
    """Convert ``network`` in place as ``cfg`` says; returns the same object.

    A network already converted by lit_amp is re-converted (with a warning) - MindSpore's
    "repeated conversion" rule.

    Args:
        network: the network (the root whose output is cast to float32 at O2/O3).
        cfg: from :func:`resolve_amp_config`.
        output_roots: further modules whose outputs are cast to float32 (used by the Lightning
            plugin for a LightningModule's top-level submodules).

    Example:
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
        >>> net = apply_amp_config(net, resolve_amp_config("O2", device="cpu"))
        >>> net._amp_level
        'O2'
    """
    _check_network(network, "apply_amp_config")
    mech = cfg.mechanism
    if mech == "none":
        return network  # O0 (or a float32 override): a network converted earlier stays as is
    if is_converted(network) or getattr(network, "_amp_level", None) is not None:
        warnings.warn(
            "The network has already been converted to mixed precision; the previous "
            "conversion is replaced. Use level 'O0' for a network converted by "
            "auto_mixed_precision/custom_mixed_precision.",
            UserWarning,
            stacklevel=2,
        )
        remove_hooks(network)
    kwargs: dict[str, Any] = {}
    if mech == "O1":
        if cfg.white_list is not None:
            classes, functions, patterns = split_amp_list(list(cfg.white_list), "white_list", True)
            kwargs.update(white_classes=classes, white_functions=functions,
                          white_patterns=patterns)
        else:
            mech = "autocast"  # the built-in lists: on torch.autocast (hooks.convert)
    elif mech == "O2":
        if cfg.black_list is not None:
            classes, _, patterns = split_amp_list(list(cfg.black_list), "black_list", False)
            kwargs.update(black_classes=classes, black_patterns=patterns)
        else:
            kwargs.update(black_classes=BLACK_LIST_MODULES)
    convert(
        network,
        mechanism=mech,
        dtype=cfg.dtype,
        level_tag=cfg.level,
        output_roots=output_roots,
        cache_casts=cfg.cache_casts,
        **kwargs,
    )
    return network
