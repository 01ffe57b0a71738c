"""Lazy (PEP 562) exports shared by the package ``__init__`` files."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: dict[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Build a package's ``__getattr__`` and ``__dir__`` from ``{name: module}``.

    A name is imported from its module on first access and cached in ``namespace``.

    Example:
        >>> ga, _ = lazy_exports("pkg", {"sqrt": "math"}, {})
        >>> ga("sqrt")(4.0)
        2.0
    """

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        mod = importlib.import_module(module)
        # a name that is also the subpackage (``lit_amp.thor``) resolves to the subpackage
        # (which then has to provide the behaviour, e.g. be callable): a function bound to the
        # package would shadow the subpackage and break dotted paths such as Hydra's
        # ``_target_: lit_amp.thor.get_thor_lr``
        value = mod if module == f"{package}.{name}" else getattr(mod, name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
