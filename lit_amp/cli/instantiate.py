"""The one place where lit_amp turns a Hydra config node into an object.

Every ``_target_`` that lit_amp builds (by ``lit-amp`` and its tests) goes through
:func:`instantiate`. Hydra 1.4 deprecates resolving a config-selected ``_target_`` without an
execution whitelist and Hydra 1.5 makes it an error; framework code is asked to whitelist its
own targets around its internal instantiate calls. This helper feature-detects the whitelist API
of the installed Hydra and passes :data:`TRUSTED_TARGETS` (``lit_amp.*``, ``lightning.*``,
``torch.*``, ``torchmetrics.*``) plus any patterns the caller adds; with Hydra 1.3 (no whitelist)
it calls ``hydra.utils.instantiate`` as it is.

A user's own classes (``model.network._target_=my_pkg.MyNet``) are application targets: list them
in the config key ``extra_trusted_targets`` (``lit-amp '+extra_trusted_targets=[my_pkg.*]'``) and
``lit-amp`` forwards them here.

Example:
    >>> net = instantiate({"_target_": "torch.nn.Linear", "in_features": 2, "out_features": 3})
    >>> type(net).__name__
    'Linear'
    >>> make_sgd = instantiate({"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.1})
    >>> type(make_sgd(net.parameters())).__name__
    'SGD'
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["TRUSTED_TARGETS", "instantiate", "whitelist_support"]

#: Target patterns lit_amp trusts in its own configs (fnmatch-style, as Hydra 1.4 documents).
TRUSTED_TARGETS: tuple[str, ...] = ("lit_amp.*", "lightning.*", "torch.*", "torchmetrics.*")

# Names the Hydra 1.4 documentation has used for the whitelist (the final name is in flux):
# a context manager, or a reserved instantiate keyword.
_CONTEXT_NAMES = ("execution_whitelist", "target_whitelist")
_KWARG_NAMES = ("_execution_whitelist_", "_target_whitelist_")


def _hydra_instantiate() -> Callable[..., Any]:
    from hydra.utils import instantiate as hydra_instantiate

    return hydra_instantiate


def whitelist_support() -> tuple[str, str] | None:
    """How the installed Hydra takes an execution whitelist, or None (Hydra <= 1.3).

    Returns:
        ``("context", name)`` for a context manager ``hydra.utils.<name>(patterns)``,
        ``("kwarg", name)`` for a reserved ``instantiate`` keyword, or None.

    Example:
        >>> whitelist_support() is None or whitelist_support()[0] in ("context", "kwarg")
        True
    """
    import hydra.utils as hu

    for name in _CONTEXT_NAMES:
        if callable(getattr(hu, name, None)):
            return ("context", name)
    try:
        params = inspect.signature(hu.instantiate).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        params = {}
    for name in _KWARG_NAMES:
        if name in params:
            return ("kwarg", name)
    return None


@contextlib.contextmanager
def _no_context() -> Iterator[None]:
    yield


def instantiate(
    config: Any, *args: Any, trusted: Sequence[str] = (), **kwargs: Any
) -> Any:
    """``hydra.utils.instantiate`` with lit_amp's target whitelist where Hydra supports one.

    Args:
        config: a config node (DictConfig, dict, ListConfig) with ``_target_`` entries.
        *args: positional arguments for the target (after the config's ``_args_``).
        trusted: extra fnmatch patterns to whitelist besides :data:`TRUSTED_TARGETS`.
        **kwargs: call-site arguments; they override the config's values, as in Hydra.

    Returns:
        What the target returns (a ``functools.partial`` when ``_partial_: true``).

    Raises:
        hydra.errors.InstantiationException: the target cannot be imported or its call failed;
            Hydra's message names the target and the config key.
    """
    patterns = tuple(dict.fromkeys((*TRUSTED_TARGETS, *trusted)))
    hydra_instantiate = _hydra_instantiate()
    how = whitelist_support()
    if how is None:
        return hydra_instantiate(config, *args, **kwargs)
    kind, name = how
    if kind == "kwarg":
        return hydra_instantiate(config, *args, **{name: list(patterns)}, **kwargs)
    import hydra.utils as hu

    ctx = getattr(hu, name, None)
    with ctx(patterns) if ctx is not None else _no_context():
        return hydra_instantiate(config, *args, **kwargs)
