"""The one place where lit_amp turns a Hydra config node into an object.

Every ``_target_`` that lit_amp builds (by ``lit-amp`` and its tests) goes through
:func:`instantiate`. Hydra 1.4 deprecates resolving a config-selected ``_target_`` without an
execution whitelist and Hydra 1.5 makes it an error; framework code is asked to whitelist its
own targets around its internal instantiate calls. This helper feature-detects the whitelist API
of the installed Hydra and passes :data:`TRUSTED_TARGETS` (``lit_amp.*``, ``lightning.*``,
``torch.*``, ``torchmetrics.*``) plus any patterns the caller adds; with Hydra 1.3 (no whitelist)
it calls ``hydra.utils.instantiate`` as it is.

Hydra 1.3 has no whitelist, so lit_amp enforces its own: :func:`check_targets` walks a config
node before anything is built and refuses (with :class:`~lit_amp.cli.schema.ConfigError`) every
``_target_`` that matches no trusted pattern, and every target in :data:`DENIED_TARGETS` even
under a trusted prefix: loaders that unpickle (``torch.load``, ``lit_amp.load_checkpoint``, a
``load_from_checkpoint``), code loaders (``torch.hub``, ``torch.jit``, ``torch.package``), and
process / shell access. :func:`check_command_line` applies the same rules to the command line
before Hydra runs anything (Hydra itself instantiates ``hydra.callbacks`` at start-up).

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
import fnmatch
import inspect
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = [
    "DENIED_TARGETS",
    "HYDRA_TARGETS",
    "TRUSTED_TARGETS",
    "check_command_line",
    "check_targets",
    "instantiate",
    "whitelist_support",
]

#: Target patterns lit_amp trusts in its own configs (fnmatch-style, as Hydra 1.4 documents).
TRUSTED_TARGETS: tuple[str, ...] = ("lit_amp.*", "lightning.*", "torch.*", "torchmetrics.*")

#: Targets refused even under a trusted prefix (fnmatch patterns, matched case-insensitively):
#: they unpickle files, load code, or reach the shell.
DENIED_TARGETS: tuple[str, ...] = (
    "*.load", "*.load_*", "*load_checkpoint*", "*load_from_checkpoint", "*.loads",
    "*pickle*", "*dill*", "*marshal*", "*shelve*", "torch.serialization.*", "torch.hub.*",
    "torch.jit.*", "torch.package.*", "torch.utils.cpp_extension.*", "torch._*",
    "torch.multiprocessing.*", "torch.distributed.*", "torch.compile", "*.eval", "*.exec",
    "*.compile", "*__import__*", "*importlib*", "builtins.*", "os.*", "posix.*", "subprocess.*",
    "shutil.*", "sys.*", "runpy.*", "lit_amp._*", "lit_amp.cli.main", "lit_amp.__main__*",
)
#: What Hydra itself may build from a command-line ``hydra.*`` override (callbacks, launchers,
#: sweepers and their samplers); torch's and Lightning's names have no business there.
HYDRA_TARGETS: tuple[str, ...] = (
    "lit_amp.cli.*", "hydra.*", "hydra_plugins.*", "optuna.samplers.*", "optuna.pruners.*",
)

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


def _target_error(target: str, where: str, patterns: Sequence[str]) -> Any:
    from lit_amp.cli.schema import ConfigError

    if _denied(target):
        return ConfigError(
            f"lit-amp: the _target_ {target!r} at '{where}' is refused: it can unpickle files, "
            "load code or reach the shell. Load weights with ckpt_path=<file> (read with "
            "weights_only=True) instead."
        )
    return ConfigError(
        f"lit-amp: the _target_ {target!r} at '{where}' is not trusted: lit-amp builds only "
        f"targets matching {list(patterns)}. For your own classes add a pattern: "
        f"lit-amp '+extra_trusted_targets=[my_pkg.*]' (or extra_trusted_targets in a config)."
    )


def _denied(target: str) -> bool:
    low = target.lower()
    return any(fnmatch.fnmatchcase(low, p.lower()) for p in DENIED_TARGETS)


def _allowed(target: str, patterns: Sequence[str]) -> bool:
    return not _denied(target) and any(fnmatch.fnmatchcase(target, p) for p in patterns)


def _walk_targets(node: Any, where: str) -> Iterator[tuple[str, Any]]:
    from omegaconf import DictConfig, ListConfig

    if isinstance(node, (DictConfig, dict)):
        keys = list(node.keys())
        for key in keys:
            path = f"{where}.{key}" if where else str(key)
            try:
                value = node[key]
            except Exception:  # noqa: BLE001 - an interpolation not resolvable here
                if key == "_target_":
                    raise
                continue
            if key == "_target_":
                yield path, value
            else:
                yield from _walk_targets(value, path)
    elif isinstance(node, (ListConfig, list, tuple)):
        for i, value in enumerate(node):
            yield from _walk_targets(value, f"{where}[{i}]")


def check_targets(config: Any, trusted: Sequence[str] = (), where: str = "") -> None:
    """Refuse a config node whose ``_target_`` s are not all trusted (nothing is built).

    Args:
        config: a config node (DictConfig, dict, list) to walk, nested nodes included.
        trusted: fnmatch patterns trusted besides :data:`TRUSTED_TARGETS`.
        where: the node's key, for messages.

    Raises:
        ConfigError: a target matches no trusted pattern, or matches :data:`DENIED_TARGETS`.

    Example:
        >>> check_targets({"net": {"_target_": "torch.nn.Linear"}})
        >>> check_targets({"f": {"_target_": "torch.load"}})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lit_amp.cli.schema.ConfigError: lit-amp: the _target_ 'torch.load' ... is refused: ...
    """
    patterns = tuple(dict.fromkeys((*TRUSTED_TARGETS, *trusted)))
    for path, target in _walk_targets(config, where):
        if not isinstance(target, str) or not _allowed(target, patterns):
            raise _target_error(str(target), path, patterns)


_TARGET_IN_VALUE = re.compile(r"_target_['\"]?\s*[:=]\s*['\"]?([^'\",}\s\]]+)")


def check_command_line(argv: Sequence[str]) -> None:
    """Refuse untrusted ``_target_`` s given as command-line overrides, before Hydra starts.

    ``key._target_=value`` overrides and ``_target_`` s inside dict values are checked against
    :data:`TRUSTED_TARGETS` (``hydra.*`` keys against :data:`HYDRA_TARGETS`) plus the
    patterns of an ``extra_trusted_targets=[...]`` override; denied targets are always refused.

    Args:
        argv: the command line without the program.

    Raises:
        ConfigError: an untrusted or denied target.

    Example:
        >>> check_command_line(["model.network._target_=torch.nn.Linear", "amp=O2"])
        >>> check_command_line(["+callbacks.x._target_=os.system"])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lit_amp.cli.schema.ConfigError: lit-amp: the _target_ 'os.system' ... is refused: ...
    """
    extra: list[str] = []
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    for arg in overrides:
        key, _, value = arg.partition("=")
        if key.lstrip("+~") == "extra_trusted_targets":
            extra += [p.strip(" '\"") for p in value.strip("[]").split(",") if p.strip()]
    for arg in overrides:
        key, _, value = arg.partition("=")
        bare = key.lstrip("+~")
        trusted = HYDRA_TARGETS if bare.startswith("hydra") else TRUSTED_TARGETS
        patterns = (*trusted, *extra)
        targets = [value.strip(" '\"")] if bare.endswith("_target_") else []
        targets += _TARGET_IN_VALUE.findall(value)
        for target in targets:
            if not _allowed(target, patterns):
                raise _target_error(target, key, patterns)


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
        ConfigError: a ``_target_`` in ``config`` is not trusted (see :func:`check_targets`).
    """
    check_targets(config, trusted)
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
