"""The one place where lit_amp turns a Hydra config node into an object, and the target check.

Every ``_target_`` that lit_amp builds (by ``lit-amp`` and its tests) goes through
:func:`instantiate`, and only what :mod:`lit_amp.cli.allowlist` allows is built: lit_amp's
public classes and factories, ``torch.nn`` / ``torch.optim`` classes, Lightning's Trainer,
callbacks, loggers, strategies, plugins, profilers and accelerators, torchmetrics metrics, and
what the user lists in ``extra_trusted_targets`` (never a private name, a loader that unpickles,
nor code or shell access). Each target is checked on its string before anything is imported,
then on the object it resolves to. Three checkpoints:

- :func:`check_command_line`: ``_target_`` overrides on the command line, before Hydra starts;
- :func:`lit_amp.cli.trust.guard_composition` (around the Hydra app): every config Hydra
  composes, resolved whole, before Hydra builds anything from it (docs/security.md);
- :func:`check_targets`: a config node, all of it before anything is built (``build(cfg)``
  and :func:`instantiate`).

A user's own classes (``model.network._target_=my_pkg.MyNet``) are application targets: list them
in the config key ``extra_trusted_targets`` (``lit-amp '+extra_trusted_targets=[my_pkg.*]'``).
Hydra 1.4 deprecates resolving a config-selected ``_target_`` without an execution whitelist;
where the installed Hydra has one, :func:`instantiate` passes it :data:`TRUSTED_TARGETS` (the
packages) plus those patterns; Hydra 1.3 has none and lit_amp's own check is the only one.

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
import copy
import inspect
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from lit_amp.cli.allowlist import DENIED_TARGETS, refusal

__all__ = [
    "DENIED_TARGETS",
    "HYDRA_TARGETS",
    "TRUSTED_TARGETS",
    "check_command_line",
    "check_logging_factory",
    "check_targets",
    "instantiate",
    "whitelist_support",
]

#: The packages configs build from (Hydra >= 1.4's whitelist); :mod:`~lit_amp.cli.allowlist`
#: decides within them.
TRUSTED_TARGETS: tuple[str, ...] = ("lit_amp.*", "lightning.*", "torch.*", "torchmetrics.*")
#: The packages of what Hydra itself builds from ``hydra.*`` (callbacks, launchers, sweepers).
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


def _target_error(target: Any, where: str, why: str, scope: str = "config") -> Exception:
    from lit_amp.cli.schema import ConfigError

    what = f"the {'logging factory' if scope == 'logging' else '_target_'} {target!r}"
    if why.startswith("refused"):
        hint = (" Load weights with ckpt_path=<file> (read with weights_only=True) instead."
                if re.search("load|pickle", str(target).lower()) else "")
        return ConfigError(
            f"lit-amp: {what} at '{where}' is {why}; extra_trusted_targets cannot allow it.{hint}"
        )
    if why.startswith("not found"):
        return ConfigError(f"lit-amp: {what} at '{where}' is {why}.")
    return ConfigError(
        f"lit-amp: {what} at '{where}' is {why}. For your own classes add a pattern: "
        "lit-amp '+extra_trusted_targets=[my_pkg.*]' (or extra_trusted_targets in a config)."
    )


def _check(target: Any, where: str, scope: str, extra: Sequence[str], resolve: bool) -> None:
    why = refusal(target, scope, extra, resolve=resolve)
    if why:
        raise _target_error(target, where, why, scope)


def _items(node: Any, where: str) -> Iterator[tuple[str, str, Any]]:
    """``(key, path, value)`` of a mapping or list node's entries, interpolations resolved
    (a value that does not resolve yet, ``${hydra:...}`` before the job, is ``_UNRESOLVED``)."""
    from omegaconf import DictConfig, ListConfig

    if isinstance(node, (DictConfig, dict)):
        for key in list(node.keys()):
            path = f"{where}.{key}" if where else str(key)
            try:
                value = node[key]
            except Exception:  # noqa: BLE001 - an interpolation not resolvable here
                value = _UNRESOLVED
            yield str(key), path, value
    elif isinstance(node, (ListConfig, list, tuple)):
        for i in range(len(node)):
            try:
                value = node[i]
            except Exception:  # noqa: BLE001 - as above
                value = _UNRESOLVED
            yield "", f"{where}[{i}]", value


_UNRESOLVED = object()


def _walk_targets(node: Any, where: str) -> Iterator[tuple[str, Any]]:
    for key, path, value in _items(node, where):
        if key == "_target_":
            yield path, ("<an unresolvable interpolation>" if value is _UNRESOLVED else value)
        elif value is not _UNRESOLVED:
            yield from _walk_targets(value, path)


def check_targets(
    config: Any, trusted: Sequence[str] = (), where: str = "", *, scope: str = "config",
    resolve: bool = True,
) -> None:
    """Refuse a config node whose ``_target_`` s are not all allowed (nothing is built).

    Args:
        config: a config node (DictConfig, dict, list) to walk, nested nodes included.
        trusted: ``extra_trusted_targets`` patterns (fnmatch, starting with a package name).
        where: the node's key, for messages.
        scope: ``"config"`` (the job's nodes) or ``"hydra"`` (``hydra.*``); see
            :mod:`lit_amp.cli.allowlist`.
        resolve: also check the objects the targets resolve to (imports them once their
            names passed); False checks the names alone.

    Raises:
        ConfigError: a target the allowlist does not admit, naming it, its key and the way to
            allow one's own classes.

    Example:
        >>> check_targets({"net": {"_target_": "torch.nn.Linear"}})
        >>> check_targets({"f": {"_target_": "torch.load"}})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lit_amp.cli.schema.ConfigError: lit-amp: the _target_ 'torch.load' ... is refused: ...
    """
    for path, target in _walk_targets(config, where):
        _check(target, path, scope, trusted, resolve)


def check_logging_factory(target: Any, where: str, trusted: Sequence[str] = ()) -> None:
    """Refuse a logging config's ``()`` / ``class`` that is not a logging handler, formatter
    or filter (imports what it names once the name passed).

    Raises:
        ConfigError: the factory is not allowed, naming it and its key.
    """
    _check(target, where, "logging", trusted, True)


_TARGET_IN_VALUE = re.compile(r"_target_['\"]?\s*[:=]\s*['\"]?([^'\",}\s\]]+)")
_SWEEP = re.compile(r"^\s*(choice|shuffle)\((.*)\)\s*$")


def check_command_line(argv: Sequence[str], trusted: Sequence[str] = ()) -> None:
    """Refuse ``_target_`` s given as command-line overrides that are not allowed, before Hydra.

    ``key._target_=value`` overrides (each value of a ``a,b`` / ``choice(a,b)`` sweep) and
    ``_target_`` s inside dict values are checked by name against the allowlist
    (``hydra.*`` keys against Hydra's own), with the patterns of an
    ``extra_trusted_targets=[...]`` override. Nothing is imported: the objects are checked
    once Hydra composed the config (:func:`guard_composition`, ``build``).

    Args:
        argv: the command line without the program.
        trusted: ``extra_trusted_targets`` patterns granted besides the command line's own
            (``LIT_AMP_TRUSTED_TARGETS``).

    Raises:
        ConfigError: a target that is not allowed.

    Example:
        >>> check_command_line(["model.network._target_=torch.nn.Linear", "amp=O2"])
        >>> check_command_line(["+callbacks.x._target_=os.system"])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lit_amp.cli.schema.ConfigError: lit-amp: the _target_ 'os.system' ... is refused: ...
    """
    extra: list[str] = list(trusted)
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    for arg in overrides:
        key, _, value = arg.partition("=")
        if key.lstrip("+~") == "extra_trusted_targets":
            extra += [p.strip(" '\"") for p in value.strip("[]").split(",") if p.strip()]
    for arg in overrides:
        key, _, value = arg.partition("=")
        bare = key.lstrip("+~")
        scope = "hydra" if bare.startswith("hydra") else "config"
        targets: list[str] = []
        if bare.endswith("_target_"):
            sweep = _SWEEP.match(value)
            targets += (sweep.group(2) if sweep else value).split(",")
        targets += _TARGET_IN_VALUE.findall(value)
        for target in targets:
            _check(target.strip(" '\""), key, scope, extra, False)


@contextlib.contextmanager
def _no_context() -> Iterator[None]:
    yield


def _resolved(config: Any) -> Any:
    """A resolved copy of an OmegaConf node, as Hydra's instantiate makes it: the targets
    checked are the ones built, whatever a resolver would return a second time."""
    from omegaconf import OmegaConf

    if not OmegaConf.is_config(config):
        return config
    node = copy.deepcopy(config)
    node._set_flag(["allow_objects", "struct", "readonly"], [True, False, False])
    node._set_parent(config._get_parent())
    OmegaConf.resolve(node)
    return node


def instantiate(
    config: Any, *args: Any, trusted: Sequence[str] = (), **kwargs: Any
) -> Any:
    """``hydra.utils.instantiate`` of a node whose every ``_target_`` the allowlist admits.

    Args:
        config: a config node (DictConfig, dict, ListConfig) with ``_target_`` entries.
        *args: positional arguments for the target (after the config's ``_args_``).
        trusted: ``extra_trusted_targets`` patterns (see :mod:`lit_amp.cli.allowlist`).
        **kwargs: call-site arguments; they override the config's values, as in Hydra.

    Returns:
        What the target returns (a ``functools.partial`` when ``_partial_: true``).

    Raises:
        hydra.errors.InstantiationException: the target's call failed; Hydra's message names
            the target and the config key.
        ConfigError: a ``_target_`` in ``config`` is not allowed (see :func:`check_targets`).
    """
    config = _resolved(config)
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

