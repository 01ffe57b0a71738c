"""What a ``lit-amp`` config may build: the ``_target_`` allowlist, checked on the resolved object.

A config's ``_target_`` (and, in Hydra's logging configs, a ``()`` / ``class`` entry) is built
only when :func:`refusal` finds no reason against it. Three scopes:

- ``"config"`` (everything but ``hydra.*``): lit_amp's public classes (a class named in the
  ``__all__`` of the public lit_amp module the target names, ``lit_amp.cli`` excepted) and its
  factories (:data:`LIT_AMP_FACTORIES`); ``torch.nn`` modules, ``torch.optim`` optimizers and
  LR schedulers (classes of those families defined there); ``torch.tensor`` /
  ``torch.as_tensor`` / ``torch.device``; Lightning's ``Trainer`` and its callbacks, loggers,
  strategies, plugins (precision, checkpoint I/O, cluster environments, layer sync),
  profilers and accelerators; torchmetrics metrics;
- ``"hydra"`` (``hydra.*``, built by Hydra itself): Hydra callbacks (``lit_amp.cli``,
  ``hydra``, ``hydra_plugins``), Hydra's launcher / sweeper plugins, Optuna samplers/pruners;
- ``"logging"`` (``hydra.job_logging`` / ``hydra.hydra_logging``): ``logging`` (and
  ``colorlog``) handlers, formatters and filters.

The target string passes a prefix gate before anything is imported (a refused target never
imports its module), then the object it resolves to must belong to its family. The user's
``extra_trusted_targets`` patterns (fnmatch, starting with a package name) admit more (private
modules of the user's own packages included), but never a dunder name, a private name of the
packages above, nor the loader / code / shell families of :data:`DENIED_TARGETS` (matched on the
target and on the resolved object's own module and name).
"""

from __future__ import annotations

import fnmatch
import inspect
import re
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

__all__ = [
    "ALLOWED",
    "DENIED_TARGETS",
    "LIT_AMP_FACTORIES",
    "check_pattern",
    "refusal",
]

#: What each scope builds, in words (error messages and docs).
ALLOWED: dict[str, str] = {
    "config": (
        "lit_amp's public classes and factories, torch.nn modules, torch.optim optimizers and "
        "LR schedulers, torch.tensor/as_tensor/device, Lightning's Trainer, callbacks, "
        "loggers, strategies, plugins, profilers and accelerators, and torchmetrics metrics"
    ),
    "hydra": "Hydra callbacks, Hydra's launcher/sweeper plugins and Optuna samplers/pruners",
    "logging": "logging handlers, formatters and filters",
}

#: The lit_amp functions a config may call (its public classes are found from ``__all__``).
LIT_AMP_FACTORIES: tuple[str, ...] = (
    "lit_amp.thor.thor", "lit_amp.thor.get_thor_lr", "lit_amp.thor.get_thor_damping",
    "lit_amp.demos.synthetic_loaders", "lit_amp.demos.mnist1d_loaders",
    "lit_amp.rec.sources.kafka_consumer_factory",
)

#: Refused in every scope, also when ``extra_trusted_targets`` matches (fnmatch, any case):
#: they unpickle files, load or run code, reach the shell or build arbitrary targets.
DENIED_TARGETS: tuple[str, ...] = (
    "*.load", "*.load_*", "*.loads", "*load_checkpoint*", "*load_from_checkpoint",
    "*load_published*", "*pickle*", "*dill*", "*marshal*", "*shelve*", "*joblib*",
    "torch.serialization.*", "torch.hub.*", "torch.jit.*", "torch.package.*",
    "torch.utils.cpp_extension.*", "torch.multiprocessing.*", "torch.distributed.*",
    "torch.compile", "*.eval", "*.exec", "*.compile", "*__import__*", "*importlib*",
    "*instantiate*", "builtins.*", "os.*", "posix.*", "nt.*", "subprocess.*", "pty.*",
    "shutil.*", "sys.*", "runpy.*", "code.*", "codeop.*", "timeit.*", "pdb.*", "ctypes.*",
    "multiprocessing.*", "webbrowser.*", "operator.*", "functools.*", "hydra.utils.*",
    "lightning.pytorch.cli.*", "lightning.fabric.utilities.cloud_io.*", "lit_amp.cli.main",
    "lit_amp.cli.app.main",
)

_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")
_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9_]*(\.|$)")
# the packages the allowlist draws from: a private name there is refused even when an
# extra_trusted_targets pattern matches it (a user's own package may have private modules)
_PACKAGES = frozenset({"lit_amp", "torch", "lightning", "torchmetrics", "hydra", "hydra_plugins",
                       "optuna", "logging", "colorlog"})
# private names allowed in the hydra scope: Hydra's own core plugins (basic launcher/sweeper)
_PRIVATE_OK = {"hydra": ("hydra._internal.core_plugins.",)}


def _denied(name: str) -> bool:
    low = name.lower()
    return any(fnmatch.fnmatchcase(low, p.lower()) for p in DENIED_TARGETS)


def _resolve(target: str) -> Any:
    from hydra.utils import get_object  # the lookup Hydra's instantiate uses for _target_

    return get_object(target)


def _class_of(obj: Any, bases: Sequence[type], modules: tuple[str, ...]) -> str | None:
    if not inspect.isclass(obj):
        return f"it is a {type(obj).__name__}, not a class"
    if not issubclass(obj, tuple(bases)):
        return f"it is not a {' / '.join(b.__name__ for b in bases)} subclass"
    module = obj.__module__
    if not any(module == m or module.startswith(m + ".") for m in modules):
        return f"it is defined in {module}"
    return None


@cache
def _factories() -> tuple[Any, ...]:
    return tuple(_resolve(name) for name in LIT_AMP_FACTORIES)


def _lit_amp(target: str, obj: Any) -> str | None:
    parent_name, name = target.rsplit(".", 1)
    parent = _resolve(parent_name)
    if not inspect.ismodule(parent) or name not in getattr(parent, "__all__", ()):
        return f"it is not in the __all__ of a lit_amp module ({parent_name})"
    if any(obj is f for f in _factories()):
        return None
    if inspect.isclass(obj):
        return _class_of(obj, [object], ("lit_amp",))
    return f"it is a {type(obj).__name__}, not a class nor one of {list(LIT_AMP_FACTORIES)}"


def _torch_nn(target: str, obj: Any) -> str | None:
    import torch

    return _class_of(obj, [torch.nn.Module], ("torch.nn",))


def _torch_optim(target: str, obj: Any) -> str | None:
    import torch

    sched = torch.optim.lr_scheduler
    return _class_of(obj, [torch.optim.Optimizer, sched.LRScheduler, sched.ReduceLROnPlateau],
                     ("torch.optim",))


def _torch_value(target: str, obj: Any) -> str | None:
    import torch

    return None if any(obj is f for f in (torch.tensor, torch.as_tensor, torch.device)) else (
        "it is not torch.tensor / torch.as_tensor / torch.device")


def _lightning(target: str, obj: Any) -> str | None:
    import lightning.pytorch as lp
    from lightning.pytorch import accelerators, loggers, plugins, profilers, strategies
    from lightning.pytorch.plugins.environments import ClusterEnvironment
    from lightning.pytorch.plugins.io import CheckpointIO
    from lightning.pytorch.plugins.precision import Precision

    if obj is lp.Trainer:
        return None
    bases = [lp.Callback, loggers.Logger, strategies.Strategy, profilers.Profiler,
             accelerators.Accelerator, Precision, CheckpointIO, ClusterEnvironment,
             plugins.LayerSync]
    return _class_of(obj, bases, ("lightning",))


def _torchmetrics(target: str, obj: Any) -> str | None:
    import torchmetrics

    return _class_of(obj, [torchmetrics.Metric], ("torchmetrics",))


def _hydra_callback(target: str, obj: Any) -> str | None:
    from hydra.experimental.callback import Callback

    return _class_of(obj, [Callback], ("lit_amp.cli", "hydra", "hydra_plugins"))


def _hydra_plugin(target: str, obj: Any) -> str | None:
    from hydra.plugins.plugin import Plugin

    return _class_of(obj, [Plugin], ("hydra", "hydra_plugins"))


def _optuna(target: str, obj: Any) -> str | None:
    import optuna

    return _class_of(obj, [optuna.samplers.BaseSampler, optuna.pruners.BasePruner],
                     ("optuna",))


def _logging(target: str, obj: Any) -> str | None:
    import logging

    return _class_of(obj, [logging.Handler, logging.Formatter, logging.Filter],
                     ("logging", "colorlog"))


_LIGHTNING_TOP = re.compile(r"lightning(\.pytorch)?\.[A-Za-z][A-Za-z0-9_]*")
_LIGHTNING_PARTS = tuple(
    f"lightning.pytorch.{p}."
    for p in ("callbacks", "loggers", "strategies", "plugins", "profilers", "accelerators")
)

Gate = Callable[[str], bool]
Check = Callable[[str, Any], "str | None"]


def _under(*prefixes: str) -> Gate:
    return lambda t: t.startswith(prefixes)


#: scope -> (string gate, check of the resolved object), tried in order.
_RULES: dict[str, tuple[tuple[Gate, Check], ...]] = {
    "config": (
        (lambda t: t.startswith("lit_amp.") and not t.startswith("lit_amp.cli."), _lit_amp),
        (_under("torch.nn."), _torch_nn),
        (_under("torch.optim."), _torch_optim),
        (lambda t: t in ("torch.tensor", "torch.as_tensor", "torch.device"), _torch_value),
        (lambda t: t.startswith(_LIGHTNING_PARTS) or bool(_LIGHTNING_TOP.fullmatch(t)),
         _lightning),
        (_under("torchmetrics."), _torchmetrics),
    ),
    "hydra": (
        (_under("lit_amp.cli.", "hydra.", "hydra_plugins."), _hydra_callback),
        (_under("hydra._internal.core_plugins.", "hydra_plugins."), _hydra_plugin),
        (_under("optuna.samplers.", "optuna.pruners."), _optuna),
    ),
    "logging": ((_under("logging.", "colorlog."), _logging),),
}


def check_pattern(pattern: str) -> str | None:
    """Why an ``extra_trusted_targets`` pattern is refused, or None.

    A pattern must start with a package name (``my_pkg.*``, ``my_pkg.nets.MyNet``): ``*`` or
    ``*.Net`` would trust every module on ``sys.path``.

    Example:
        >>> check_pattern("my_pkg.*") is None, check_pattern("*") is not None
        (True, True)
    """
    if not isinstance(pattern, str) or not _PATTERN.match(pattern):
        return "a pattern must start with a package name, e.g. my_pkg.* or my_pkg.nets.MyNet"
    return None


def refusal(
    target: Any, scope: str = "config", extra: Sequence[str] = (), *, resolve: bool = True
) -> str | None:
    """Why a ``_target_`` is not built, or None when it may be.

    Args:
        target: the ``_target_`` value (a dotted name).
        scope: ``"config"``, ``"hydra"`` or ``"logging"`` (see the module docstring).
        extra: ``extra_trusted_targets`` patterns (checked with :func:`check_pattern` first).
        resolve: also import the target (only after its string passed) and check the object;
            False checks the string alone (the command line, before Hydra starts).

    Returns:
        None, or a reason starting with ``"refused"`` (never buildable), ``"not trusted"``
        (outside the allowlist: ``extra_trusted_targets`` may admit it) or ``"not found"``.

    Example:
        >>> refusal("torch.nn.Linear") is None
        True
        >>> refusal("lightning.pytorch.cli.instantiate_class")[:7]
        'refused'
    """
    if not isinstance(target, str) or not _DOTTED.fullmatch(target):
        return f"not trusted: {target!r} is not a dotted name such as my_pkg.MyClass"
    if _denied(target):
        return "refused: it can unpickle files, load or run code, or reach the shell"
    parts = target.split(".")
    if any(part.startswith("__") for part in parts):
        return "refused: a dunder name (a part starting with '__')"
    for pattern in extra:
        why = check_pattern(pattern)
        if why:
            return f"refused: extra_trusted_targets entry {pattern!r}: {why}"
    own = parts[0] not in _PACKAGES and any(fnmatch.fnmatchcase(target, p) for p in extra)
    public = target
    for prefix in _PRIVATE_OK.get(scope, ()):
        public = public.removeprefix(prefix)
    if not own and any(part.startswith("_") for part in public.split(".")):
        return "refused: a private name (a part starting with '_')"
    if own or any(fnmatch.fnmatchcase(target, p) for p in extra):
        return _resolved_denied(target) if resolve else None
    rules = [check for gate, check in _RULES[scope] if gate(target)]
    if not rules:
        return f"not trusted: configs build only {ALLOWED[scope]}"
    if not resolve:
        return None
    try:
        obj = _resolve(target)
    except Exception as exc:  # noqa: BLE001 - ImportError, AttributeError, ...
        return f"not found: it cannot be imported ({type(exc).__name__}: {exc})"
    why = _resolved_denied(target, obj)
    if why:
        return why
    reasons = [check(target, obj) for check in rules]
    if all(reasons):
        return f"not trusted: {'; '.join(r for r in reasons if r)} (configs build only " \
               f"{ALLOWED[scope]})"
    return None


def _resolved_denied(target: str, obj: Any = None) -> str | None:
    """The denied families, matched on the object's own module and name (re-exports)."""
    if obj is None:
        try:
            obj = _resolve(target)
        except Exception:  # noqa: BLE001 - Hydra reports a target that does not import
            return None
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and _denied(f"{module}.{qualname}"):
        return f"refused: it is {module}.{qualname}, which can unpickle files, load or run " \
               "code, or reach the shell"
    return None
