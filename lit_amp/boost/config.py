"""Boost levels and ``boost_config_dict``: MindSpore's schema, checked (docs/semantics.md §3.1-3.2).

:func:`parse_boost_config` turns a level and a ``boost_config_dict`` (a dict, a JSON file path,
``""`` or None) into a frozen :class:`BoostConfig`: which algorithms are on and the settings of
each, with MindSpore's defaults filled in. Nothing here is global or mutable: MindSpore's
``AutoBoost`` singleton and its in-place edit of the level table are bugs that lit_amp does not
reproduce.

The schema (every key optional) comes from :mod:`lit_amp.boost.registry`::

    {"boost": {"mode": "auto" | "manual" | "enable_all" | "disable_all",
               <algorithm name>: bool, ...},
     "common": {"gradient_split_groups": [50, 100], "device_number": 8},
     <algorithm name>: {<setting>: <value>, ...}, ...}

Unknown keys, unknown modes and values of the wrong type raise ValueError / TypeError naming
the key, the value and what is allowed.

Example:
    >>> cfg = parse_boost_config("O1")
    >>> cfg.enabled
    ('less_bn', 'grad_freeze')
    >>> cfg = parse_boost_config("O1", {"boost": {"mode": "manual", "grad_freeze": False}})
    >>> cfg.enabled, cfg.section("less_bn")["fn_flag"]
    (('less_bn',), True)
    >>> DEFAULT_SECTIONS["grad_freeze"]["seed"]  # lit_amp's addition: a seeded schedule
    0
"""

from __future__ import annotations

import copy
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from lit_amp.amp.names import BOOST_LEVELS
from lit_amp.boost.registry import ALGORITHMS, COMMON, Setting

__all__ = [
    "BOOST_MODES",
    "BOOST_FEATURES",
    "LEVEL_TABLE",
    "DEFAULT_SECTIONS",
    "BoostConfig",
    "parse_boost_config",
    "load_boost_config",
]

BOOST_MODES = ("auto", "manual", "enable_all", "disable_all")
#: the algorithms' flags, in MindSpore's order
BOOST_FEATURES: tuple[str, ...] = tuple(a.name for a in ALGORITHMS)

#: MindSpore's ``_boost_config_level`` (read-only here): level -> flag -> on
LEVEL_TABLE: Mapping[str, Mapping[str, bool]] = MappingProxyType({
    level: MappingProxyType({a.name: level in a.levels for a in ALGORITHMS})
    for level in BOOST_LEVELS
})

#: section -> key -> its Setting
_SCHEMA: dict[str, Mapping[str, Setting]] = {
    "common": COMMON,
    **{a.name: a.settings for a in ALGORITHMS if a.settings},
}

#: Every section's defaults (MindSpore's, plus ``grad_freeze.seed``).
DEFAULT_SECTIONS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {s: MappingProxyType({k: spec.default for k, spec in keys.items()})
     for s, keys in _SCHEMA.items()}
)
_TOP_KEYS = ("boost", *_SCHEMA)


class _FrozenDict(dict):
    """A read-only, picklable dict (``MappingProxyType`` cannot be pickled for ddp_spawn)."""

    def _readonly(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("BoostConfig values are read-only; build a new config instead.")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _readonly

    def __reduce__(self) -> tuple:
        return (type(self), (dict(self),))


@dataclass(frozen=True)
class BoostConfig:
    """A resolved boost configuration (immutable).

    Attributes:
        level: "O0", "O1" or "O2".
        mode: the ``boost.mode`` used.
        flags: feature name -> on/off, after the mode was applied.
        sections: section name -> settings, defaults filled in (a deep copy; yours to keep).
    """

    level: str
    mode: str
    flags: Mapping[str, bool]
    sections: Mapping[str, Mapping[str, Any]] = field(repr=False)

    @property
    def enabled(self) -> tuple[str, ...]:
        """The features that are on, in MindSpore's order."""
        return tuple(f for f in BOOST_FEATURES if self.flags[f])

    def section(self, name: str) -> dict[str, Any]:
        """A copy of one section's settings (``common``, ``less_bn``, ``grad_freeze``, ...).

        Raises:
            ValueError: ``name`` is not a section.
        """
        if name not in self.sections:
            raise ValueError(
                f"BoostConfig.section: 'name' must be one of {list(self.sections)}, but got "
                f"{name!r}."
            )
        return copy.deepcopy(dict(self.sections[name]))


def load_boost_config(path: str | os.PathLike) -> dict[str, Any]:
    """Read a ``boost_config_dict`` from a JSON file.

    Raises:
        ValueError: the file does not exist or is not a JSON object.

    Example:
        >>> import json, tempfile
        >>> with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        ...     json.dump({"boost": {"mode": "disable_all"}}, f)
        >>> load_boost_config(f.name)
        {'boost': {'mode': 'disable_all'}}
    """
    p = os.fspath(path)
    if not os.path.isfile(p):
        raise ValueError(
            f"'boost_config_dict' must be a dict or the path of a JSON file, but the path {p!r} "
            "is not a file."
        )
    with open(p, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"'boost_config_dict' file {p!r} is not valid JSON: {exc}.") from exc
    if not isinstance(data, dict):
        raise ValueError(
            f"'boost_config_dict' file {p!r} must hold a JSON object, but holds "
            f"{type(data).__name__}."
        )
    return data


def _check_section(name: str, values: Any) -> dict[str, Any]:
    schema = _SCHEMA[name]
    if not isinstance(values, Mapping):
        raise TypeError(
            f"boost_config_dict['{name}'] must be a dict, but got {type(values).__name__}."
        )
    unknown = sorted(set(values) - set(schema))
    if unknown:
        raise ValueError(
            f"boost_config_dict['{name}'] has unknown key(s) {unknown}; the allowed keys are "
            f"{list(schema)}."
        )
    out = {k: copy.deepcopy(spec.default) for k, spec in schema.items()}
    for key, value in values.items():
        spec = schema[key]
        if not spec.type_ok(value):
            raise TypeError(
                f"boost_config_dict['{name}']['{key}'] must be {spec.type_name}, but got "
                f"{value!r}."
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(
                f"boost_config_dict['{name}']['{key}'] must be finite, but got {value!r}."
            )
        if not spec.value_ok(value):
            raise ValueError(
                f"boost_config_dict['{name}']['{key}'] must be {spec.allowed}, but got {value!r}."
            )
        out[key] = list(value) if isinstance(value, tuple) else value
    return out


def parse_boost_config(level: str = "O0", boost_config_dict: Any = None) -> BoostConfig:
    """Resolve ``level`` and ``boost_config_dict`` into a :class:`BoostConfig`.

    Args:
        level: "O0", "O1" or "O2" (the level table, docs/semantics.md §3.1).
        boost_config_dict: a dict in MindSpore's schema, the path of a JSON file holding one,
            or None / ``""`` / ``{}`` (the level's table and the defaults).

    Returns:
        The resolved configuration. Mode ``auto`` uses the level's table; ``manual`` lets the
        keys of ``boost`` override it; ``enable_all`` / ``disable_all`` turn every feature on /
        off. Every section is validated and filled with defaults, whether or not its feature
        is on (MindSpore applies a section only when its flag is on; see :attr:`flags`).

    Raises:
        TypeError: ``level`` is not a str, ``boost_config_dict`` is not a dict / path / None,
            or a value has the wrong type.
        ValueError: unknown level, mode, top-level key or section key; out-of-range value; a
            path that is not a JSON file.

    Example:
        >>> parse_boost_config("O2", {"boost": {"mode": "disable_all"}}).enabled
        ()
    """
    if not isinstance(level, str):
        raise TypeError(f"'level' must be a str, one of {list(BOOST_LEVELS)}, but got {level!r}.")
    if level not in BOOST_LEVELS:
        raise ValueError(f"'level' must be one of {list(BOOST_LEVELS)}, but got {level!r}.")
    if boost_config_dict is None or boost_config_dict == "":
        cfg: Mapping[str, Any] = {}
    elif isinstance(boost_config_dict, (str, os.PathLike)):
        cfg = load_boost_config(boost_config_dict)
    elif isinstance(boost_config_dict, Mapping):
        cfg = boost_config_dict
    else:
        raise TypeError(
            "'boost_config_dict' must be a dict, the path of a JSON file, '' or None, but got "
            f"{type(boost_config_dict).__name__}."
        )
    unknown = sorted(set(cfg) - set(_TOP_KEYS))
    if unknown:
        raise ValueError(
            f"'boost_config_dict' has unknown key(s) {unknown}; the allowed keys are "
            f"{list(_TOP_KEYS)}."
        )
    boost = cfg.get("boost", {})
    if not isinstance(boost, Mapping):
        raise TypeError(
            f"boost_config_dict['boost'] must be a dict, but got {type(boost).__name__}."
        )
    allowed_boost = ("mode", *BOOST_FEATURES)
    unknown = sorted(set(boost) - set(allowed_boost))
    if unknown:
        raise ValueError(
            f"boost_config_dict['boost'] has unknown key(s) {unknown}; the allowed keys are "
            f"{list(allowed_boost)}."
        )
    mode = boost.get("mode", "auto")
    if mode not in BOOST_MODES:
        raise ValueError(
            f"boost_config_dict['boost']['mode'] must be one of {list(BOOST_MODES)}, but got "
            f"{mode!r}."
        )
    for f in BOOST_FEATURES:
        if f in boost and not isinstance(boost[f], bool):
            raise TypeError(
                f"boost_config_dict['boost']['{f}'] must be a bool, but got {boost[f]!r}."
            )
    flags = dict(LEVEL_TABLE[level])
    if mode == "manual":
        flags.update({f: boost[f] for f in BOOST_FEATURES if f in boost})
    elif mode == "enable_all":
        flags = dict.fromkeys(BOOST_FEATURES, True)
    elif mode == "disable_all":
        flags = dict.fromkeys(BOOST_FEATURES, False)
    sections = {name: _check_section(name, cfg.get(name, {})) for name in _SCHEMA}
    return BoostConfig(
        level=level,
        mode=mode,
        flags=_FrozenDict(flags),
        sections=_FrozenDict({k: _FrozenDict(v) for k, v in sections.items()}),
    )
