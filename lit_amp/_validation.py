"""Argument checks at the API boundary, in one message format (torch-free).

Every public constructor and method of lit_amp validates its arguments with these helpers,
so every error a user can trigger reads the same way and has MindSpore's exception type:
a wrong *type* is a ``TypeError``, a right type with a wrong *value* a ``ValueError``::

    For '<owner>', the argument '<name>' must be <what is allowed>, but got <value> of type <type>.

``owner`` is the public name the user called (``'Model.train'``, ``'thor'``,
``'DynamicLossScaleManager'``); ``name`` the argument as the user spelled it. ``bool`` is
never accepted where a number is asked for (``True`` is an ``int`` to Python, not to
MindSpore's validator).

Example:
    >>> check_int("Model.train", "epoch", 3, minimum=1)
    3
    >>> check_int("Model.train", "epoch", 0, minimum=1)
    Traceback (most recent call last):
    ...
    ValueError: For 'Model.train', the argument 'epoch' must be an int >= 1, but got 0.
    >>> check_number("thor", "damping", float("nan"), minimum=0.0)
    Traceback (most recent call last):
    ...
    ValueError: For 'thor', the argument 'damping' must be a finite number >= 0.0, but got nan.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any

__all__ = [
    "check_bool",
    "check_choice",
    "check_int",
    "check_number",
    "check_positive_int",
    "check_positive_number",
    "check_str",
    "check_type",
    "type_error",
    "value_error",
]


def _described(value: Any) -> str:
    return f"{value!r} of type {type(value).__name__}"


def type_error(owner: str, name: str, allowed: str, value: Any) -> TypeError:
    """The ``TypeError`` for ``value`` of the wrong type (returned, for ``raise``).

    Example:
        >>> str(type_error("Model", "network", "a torch.nn.Module", 3))
        "For 'Model', the argument 'network' must be a torch.nn.Module, but got 3 of type int."
    """
    return TypeError(f"For '{owner}', the argument '{name}' must be {allowed}, but got "
                     f"{_described(value)}.")


def value_error(owner: str, name: str, allowed: str, value: Any) -> ValueError:
    """The ``ValueError`` for ``value`` of the right type but outside ``allowed``.

    Example:
        >>> str(value_error("Model.train", "sink_size", "-1 or an int > 0", 0))
        "For 'Model.train', the argument 'sink_size' must be -1 or an int > 0, but got 0."
    """
    return ValueError(f"For '{owner}', the argument '{name}' must be {allowed}, but got {value!r}.")


def check_type(owner: str, name: str, value: Any, types: type | tuple[type, ...],
               allowed: str, *, allow_none: bool = False) -> Any:
    """Return ``value`` if it is an instance of ``types`` (or None when allowed).

    Example:
        >>> check_type("Model", "loss_fn", None, object, "a module", allow_none=True) is None
        True
    """
    if value is None and allow_none:
        return None
    if not isinstance(value, types):
        raise type_error(owner, name, allowed + (" or None" if allow_none else ""), value)
    return value


def check_bool(owner: str, name: str, value: Any) -> bool:
    """Return ``value`` if it is a bool, else raise TypeError.

    Example:
        >>> check_bool("TimeMonitor", "data_time", True)
        True
    """
    if not isinstance(value, bool):
        raise type_error(owner, name, "a bool", value)
    return value


def check_str(owner: str, name: str, value: Any, *, allow_none: bool = False) -> Any:
    """Return ``value`` if it is a str (or None when allowed), else raise TypeError.

    Example:
        >>> check_str("ModelCheckpoint", "prefix", "net")
        'net'
    """
    return check_type(owner, name, value, str, "a str", allow_none=allow_none)


def check_choice(owner: str, name: str, value: Any, allowed: Iterable[Any]) -> Any:
    """Return ``value`` if it is one of ``allowed``, else raise ValueError listing them.

    Example:
        >>> check_choice("EarlyStopping", "mode", "max", ("auto", "min", "max"))
        'max'
        >>> check_choice("EarlyStopping", "mode", "up", ("auto", "min", "max"))
        Traceback (most recent call last):
        ...
        ValueError: For 'EarlyStopping', the argument 'mode' must be one of 'auto', 'min', 'max', but got 'up'.
    """  # noqa: E501
    options = tuple(allowed)
    try:
        ok = value in options
    except TypeError:  # unhashable / incomparable value
        ok = False
    if not ok:
        listed = ", ".join(repr(o) for o in options)
        raise value_error(owner, name, f"one of {listed}", value)
    return value


def _bound_text(minimum: float | None, maximum: float | None, strict: bool) -> str:
    parts = []
    if minimum is not None:
        parts.append(f"{'>' if strict else '>='} {minimum}")
    if maximum is not None:
        parts.append(f"<= {maximum}")
    return " and ".join(parts)


def check_int(owner: str, name: str, value: Any, *, minimum: int | None = None,
              maximum: int | None = None, allow_none: bool = False) -> Any:
    """Return ``value`` as an int if it is an integer (not a bool) within the bounds.

    Raises:
        TypeError: ``value`` is not an integer (``True``, ``2.0`` and ``"2"`` are not).
        ValueError: ``value`` is outside ``[minimum, maximum]``.

    Example:
        >>> check_int("Model.train", "sink_size", -1, minimum=-1)
        -1
    """
    if value is None and allow_none:
        return None
    bounds = _bound_text(minimum, maximum, strict=False)
    kind = "an int" + (f" {bounds}" if bounds else "") + (" or None" if allow_none else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise type_error(owner, name, kind, value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise value_error(owner, name, kind, value)
    return int(value)


def check_positive_int(owner: str, name: str, value: Any, *, allow_none: bool = False) -> Any:
    """``check_int(..., minimum=1)``.

    Example:
        >>> check_positive_int("DynamicLossScaleManager", "scale_window", 2000)
        2000
    """
    return check_int(owner, name, value, minimum=1, allow_none=allow_none)


def check_number(owner: str, name: str, value: Any, *, minimum: float | None = None,
                 maximum: float | None = None, strict: bool = False, finite: bool = True,
                 allow_none: bool = False) -> Any:
    """Return ``value`` as a float if it is a real number (not a bool) within the bounds.

    Args:
        owner: the public name called.
        name: the argument.
        value: what the user passed.
        minimum: lower bound (inclusive, or exclusive with ``strict``).
        maximum: inclusive upper bound.
        strict: ``minimum`` is exclusive.
        finite: NaN and infinities are refused (the default: a NaN silently disables
            every comparison made with it later).
        allow_none: ``None`` is returned as is.

    Raises:
        TypeError: ``value`` is not a real number.
        ValueError: ``value`` is NaN / infinite (when ``finite``) or out of bounds.

    Example:
        >>> check_number("DynamicLossScaleManager", "scale_factor", 2, minimum=1.0, strict=True)
        2.0
    """
    if value is None and allow_none:
        return None
    bounds = _bound_text(minimum, maximum, strict)
    kind = ("a finite number" if finite else "a number") + (f" {bounds}" if bounds else "")
    kind += " or None" if allow_none else ""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise type_error(owner, name, kind, value)
    v = float(value)
    if math.isnan(v) or (finite and math.isinf(v)):
        raise value_error(owner, name, kind, v)
    low = minimum is not None and (v <= minimum if strict else v < minimum)
    if low or (maximum is not None and v > maximum):
        raise value_error(owner, name, kind, value)
    return v


def check_positive_number(owner: str, name: str, value: Any, *,
                          allow_none: bool = False) -> Any:
    """A finite number > 0.

    Example:
        >>> check_positive_number("thor", "learning_rate", 0.1)
        0.1
    """
    return check_number(owner, name, value, minimum=0.0, strict=True, allow_none=allow_none)
