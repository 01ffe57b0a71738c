"""The boost algorithms, one entry each: what the config schema, AutoBoost and the docs derive from.

An :class:`Algorithm` entry names the algorithm (MindSpore's flag in
``boost_config_dict["boost"]``, also its config section), the module and callback class that
implement it, its functional core, its config section (:class:`Setting` per key, MindSpore's
defaults), the boost levels that turn it on and the algorithms it composes with.
:mod:`lit_amp.boost.config` builds ``BOOST_FEATURES``, ``LEVEL_TABLE`` and the section schema
from :data:`ALGORITHMS`; :class:`~lit_amp.boost.auto_boost.AutoBoost` builds the callbacks
from it (each class's ``from_boost_config``); the tables of docs/semantics.md §3 are
:func:`level_table` and :func:`algorithm_table` (a test compares them).

Adding an algorithm: its module (a functional core and a
:class:`~lit_amp.boost.base.BoostAlgorithm` callback), one entry here, and its section in
``lit_amp/cli/conf/boost/O1.yaml``. ``tests/boost/test_contract.py`` then runs it through a
training run, a checkpoint resume, 2-process DDP and AMP O1/O2.

Nothing here imports the algorithm modules (``Algorithm.load`` does), so the schema is read
without Lightning.

Example:
    >>> [a.name for a in ALGORITHMS if "O2" in a.levels]
    ['less_bn', 'grad_freeze', 'adasum']
    >>> get("grad_freeze").settings["freeze_p"].default
    0.7
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from lit_amp.amp.names import BOOST_LEVELS

__all__ = [
    "ALGORITHMS",
    "COMMON",
    "Algorithm",
    "Setting",
    "algorithm_table",
    "get",
    "level_table",
]

_KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "bool": ("a bool", lambda v: isinstance(v, bool)),
    "int": ("an int", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "float": ("a float", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
    "path": ("a str path or None", lambda v: v is None or isinstance(v, (str, os.PathLike))),
    "int list": ("a list of ints", lambda v: isinstance(v, (list, tuple)) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in v)),
}


@dataclass(frozen=True)
class Setting:
    """One key of a config section: its default, its type and the values it allows.

    Args:
        default: MindSpore's default.
        kind: ``"bool"``, ``"int"``, ``"float"``, ``"path"`` (a str path or None) or
            ``"int list"``.
        check: the values allowed beyond the type (None: every value of the type).
        allowed: ``check`` in words, for error messages (``"> 0"``).

    Example:
        >>> s = Setting(10, "int", lambda v: v > 0, "> 0")
        >>> s.type_ok(3), s.type_ok(True), s.value_ok(0)
        (True, False, False)
    """

    default: Any
    kind: str
    check: Callable[[Any], bool] | None = field(default=None, compare=False)
    allowed: str = ""

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"Setting: 'kind' must be one of {list(_KINDS)}, but got "
                             f"{self.kind!r}.")

    @property
    def type_name(self) -> str:
        """The type in words (``"an int"``)."""
        return _KINDS[self.kind][0]

    def type_ok(self, value: Any) -> bool:
        """Whether ``value`` has the setting's type."""
        return _KINDS[self.kind][1](value)

    def value_ok(self, value: Any) -> bool:
        """Whether ``value`` (of the right type) is allowed."""
        return self.check is None or bool(self.check(value))


@dataclass(frozen=True)
class Algorithm:
    """One boost algorithm.

    Attributes:
        name: MindSpore's flag in ``boost_config_dict["boost"]``; also the name of its config
            section and of its callback (``BoostAlgorithm.name``).
        module: the module that implements it.
        callback: the :class:`~lit_amp.boost.base.BoostAlgorithm` subclass in ``module``; its
            ``from_boost_config(config)`` builds it (or returns None when the config leaves it
            off).
        functional: the functional core's names in ``module`` (for the docs).
        settings: its config section, key -> :class:`Setting` (empty: no section).
        levels: the boost levels that turn it on (MindSpore's level table).
        composes_with: None: it runs beside every other algorithm that is on; a tuple: when it
            is on, only these others stay on (``dim_reduce``).
    """

    name: str
    module: str
    callback: str
    functional: tuple[str, ...] = ()
    settings: Mapping[str, Setting] = field(default_factory=dict)
    levels: tuple[str, ...] = ()
    composes_with: tuple[str, ...] | None = None

    def load(self) -> type:
        """The callback class (imports ``module``)."""
        return getattr(importlib.import_module(self.module), self.callback)

    def composes(self, other: str) -> bool:
        """Whether ``other`` stays on when this algorithm is on."""
        return self.composes_with is None or other == self.name or other in self.composes_with


def _positive(v: Any) -> bool:
    return v > 0


#: the ``common`` section: settings shared by the algorithms (always read)
COMMON: Mapping[str, Setting] = MappingProxyType({
    # MindSpore's allreduce fusion split points: accepted, not used (DDP's bucket_cap_mb is
    # PyTorch's knob for the same thing)
    "gradient_split_groups": Setting([50, 100], "int list"),
    "device_number": Setting(8, "int", _positive, "> 0"),  # AdaSum's block of ranks
})

#: every algorithm, in MindSpore's order (the order AutoBoost applies them)
ALGORITHMS: tuple[Algorithm, ...] = (
    Algorithm(
        "less_bn", "lit_amp.boost.less_bn", "LessBN",
        functional=("remove_residual_bn", "replace_head_with_fn", "centralize_gradients_"),
        settings={"fn_flag": Setting(True, "bool"), "gc_flag": Setting(True, "bool")},
        levels=("O1", "O2"),
    ),
    Algorithm(
        "grad_freeze", "lit_amp.boost.grad_freeze", "GradientFreeze",
        functional=("split_parameter_groups", "freeze_schedule"),
        settings={
            "param_groups": Setting(10, "int", _positive, "> 0"),
            "freeze_type": Setting(1, "int", lambda v: v in (0, 1), "0 or 1"),
            "freeze_p": Setting(0.7, "float", lambda v: 0.0 <= v <= 1.0, "in [0, 1]"),
            "total_steps": Setting(65536, "int", _positive, "> 0"),
            "seed": Setting(0, "int", lambda v: v >= 0, ">= 0"),  # lit_amp's addition
        },
        levels=("O1", "O2"),
    ),
    Algorithm(
        "adasum", "lit_amp.boost.adasum", "AdaSum",
        functional=("adasum_combine", "adasum_allreduce_"),
        levels=("O2",),
    ),
    Algorithm(
        "grad_accumulation", "lit_amp.boost.grad_accumulation", "GradientAccumulation",
        functional=("accumulation_boundary",),
        settings={"grad_accumulation_step": Setting(1, "int", lambda v: v >= 1, ">= 1")},
    ),
    Algorithm(
        "dim_reduce", "lit_amp.boost.dim_reduce", "DimReduce",
        functional=("DimReduceOptimizer", "compute_pca_matrix"),
        settings={
            "rho": Setting(0.55, "float", lambda v: 0.0 < v < 1.0, "in (0, 1)"),
            "gamma": Setting(0.9, "float", lambda v: 0.0 <= v <= 1.0, "in [0, 1]"),
            "alpha": Setting(0.001, "float", lambda v: v >= 0.0, ">= 0"),
            "sigma": Setting(0.4, "float", lambda v: 0.0 < v < 1.0, "in (0, 1)"),
            "n_components": Setting(32, "int", _positive, "> 0"),
            "pca_mat_path": Setting(None, "path"),
            "weight_load_dir": Setting(None, "path"),
            "timeout": Setting(1800, "int", _positive, "> 0"),
        },
        composes_with=("loss_scale_group",),
    ),
    Algorithm(
        "loss_scale_group", "lit_amp.boost.group_loss_scale", "LossScaleGroup",
        functional=("GroupLossScaleManager",),
    ),
)


def get(name: str) -> Algorithm:
    """The entry called ``name``.

    Raises:
        ValueError: no algorithm has that name.
    """
    for algo in ALGORITHMS:
        if algo.name == name:
            return algo
    raise ValueError(f"'name' must be one of {[a.name for a in ALGORITHMS]}, but got {name!r}.")


def level_table() -> str:
    """The level table of docs/semantics.md §3.1 (Markdown), from the entries' ``levels``."""
    rows = ["| level | " + " | ".join(a.name for a in ALGORITHMS) + " |",
            "|---|" + "---|" * len(ALGORITHMS)]
    for level in BOOST_LEVELS:
        cells = ["on" if level in a.levels else "off" for a in ALGORITHMS]
        rows.append(f"| {level} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def algorithm_table() -> str:
    """The algorithm table of docs/semantics.md §3.3 (Markdown), one row per entry."""
    rows = ["| algorithm | callback | functional core | section (defaults) | levels | "
            "composes with |",
            "|---|---|---|---|---|---|"]
    for a in ALGORITHMS:
        section = ", ".join(f"`{k}={s.default!r}`" for k, s in a.settings.items()) or "-"
        others = "all" if a.composes_with is None else ", ".join(a.composes_with)
        rows.append(
            f"| `{a.name}` | `{a.module}.{a.callback}` | "
            + (", ".join(f"`{f}`" for f in a.functional) or "-")
            + f" | {section} | {', '.join(a.levels) or '-'} | {others} |"
        )
    return "\n".join(rows)
