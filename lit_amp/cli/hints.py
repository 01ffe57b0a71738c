"""Advice for a misspelled group or key on ``lit-amp``'s command line.

Hydra answers ``lit-amp amps=O2`` with eight lines of advice to add the typo. Within
:func:`unknown_key_hints` such a failure (in a ``-m`` sweep too) is one line naming the closest
groups and keys of the config being composed, the config groups of ``conf/`` and the template
keys ``lit-amp`` rewrites (difflib), and the command exits with 1. With ``HYDRA_FULL_ERROR=1``
the line heads Hydra's message instead. Imports no torch and no Lightning.

Example:
    >>> closest("amps", ["amp", "boost", "epochs"])
    ['amp']
    >>> hint("optimizer.lrr", ["optimizer.lr", "optimizer.weight_decay"])
    "lit-amp: no group/key 'optimizer.lrr'; did you mean 'optimizer.lr'?"
"""

from __future__ import annotations

import contextlib
import difflib
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from lit_amp.cli.schema import CONF_DIR

__all__ = ["closest", "hint", "names_near", "unknown_key_hints"]

#: how many names a hint offers at most
MAX_SUGGESTIONS = 3
#: how many names a hint lists when none is close
MAX_LISTED = 12


def closest(name: str, candidates: Sequence[str]) -> list[str]:
    """The candidates closest to ``name`` (difflib's ratio, best first), at most three.

    Example:
        >>> closest("optimzer", ["optimizer", "online", "model"])
        ['optimizer']
    """
    unique = list(dict.fromkeys(candidates))
    leaf = name.rpartition(".")[2]
    leaves: dict[str, list[str]] = {}
    for c in unique:  # names at one level differ in their last part only
        leaves.setdefault(c.rpartition(".")[2], []).append(c)
    scored = sorted(((difflib.SequenceMatcher(None, leaf, k).ratio(), k) for k in leaves),
                    key=lambda t: -t[0])
    best = scored[0][0] if scored else 0.0
    found = [k for r, k in scored if r >= 0.6 and r >= best - 0.1][:MAX_SUGGESTIONS]
    if not found:  # a case slip or a cut-off name: 'AMP', 'optim'
        low = leaf.lower()
        found = [k for k in leaves if k.lower() == low or (len(low) >= 3 and (
            k.lower().startswith(low) or low.startswith(k.lower())))][:MAX_SUGGESTIONS]
    return [c for k in found for c in leaves[k]][:MAX_SUGGESTIONS]


def hint(key: str, candidates: Sequence[str]) -> str:
    """The one line for an unknown ``key``: the closest candidates, or the names there are.

    Args:
        key: the key as typed (``amps``, ``optimizer.lrr``).
        candidates: full names of the groups and keys at the same level.

    Returns:
        ``lit-amp: no group/key '<key>'; did you mean '<name>'?`` (or the names to choose from).
    """
    found = closest(key, candidates)
    if len(found) == 1:
        return f"lit-amp: no group/key '{key}'; did you mean '{found[0]}'?"
    if found:
        return (f"lit-amp: no group/key '{key}'; did you mean one of "
                f"{', '.join(repr(f) for f in found)}?")
    listed = sorted(dict.fromkeys(candidates))
    more = f", ... ({len(listed)} in all)" if len(listed) > MAX_LISTED else ""
    where = key.rpartition(".")[0]
    level = f"under '{where}'" if where else "at the top level"
    names = ", ".join(listed[:MAX_LISTED])
    return f"lit-amp: no group/key '{key}'; {level} there are: {names}{more}"


def _groups() -> list[str]:
    """The config groups of ``conf/`` (``amp``, ``hydra/launcher``, ...)."""
    out = []
    for path in sorted(CONF_DIR.rglob("*")):
        if path.is_dir() and not path.name.startswith(("_", ".")):
            out.append(path.relative_to(CONF_DIR).as_posix())
    return out


def _keys(node: Any) -> list[str]:
    from omegaconf import DictConfig

    if not isinstance(node, DictConfig):
        return []
    try:
        return [str(k) for k in node.keys()]
    except Exception:  # noqa: BLE001 - a node that cannot list its keys offers none
        return []


def names_near(cfg: Any, key: str) -> tuple[str, list[str]] | None:
    """The first missing part of ``key`` in ``cfg`` and the full names beside it.

    Args:
        cfg: the config being composed (a DictConfig).
        key: a dotted key (``optimizer.lrr``, ``trainer.foo.bar``).

    Returns:
        ``(missing, candidates)``: the dotted prefix of ``key`` up to its first part that
        ``cfg`` lacks, and the names at that level (at the top: keys and config groups;
        the template keys lit-amp rewrites are included); None when ``cfg`` has ``key``.
    """
    from lit_amp.cli.aliases import ALIASES

    parts = key.split(".")
    node = cfg
    for depth, part in enumerate(parts):
        keys = _keys(node)
        if part in keys:
            if depth == len(parts) - 1:
                return None
            try:
                node = node._get_node(part)  # no interpolation is resolved
            except Exception:  # noqa: BLE001
                node = None
            continue
        prefix = ".".join(parts[:depth])
        full = [f"{prefix}.{k}" if prefix else k for k in keys]
        if not prefix:
            full += [g for g in _groups() if not g.startswith("hydra")]
        full += [a for a in ALIASES if not a.endswith(".") and a.rpartition(".")[0] == prefix]
        return ".".join(parts[: depth + 1]), full
    return None


def _hinted(exc: Exception, key: str, cfg: Any) -> Exception:
    near = names_near(cfg, key)
    if near is None:
        return exc
    return type(exc)(f"{hint(*near)}\n{exc}")


@contextlib.contextmanager
def unknown_key_hints() -> Iterator[None]:
    """Within the block, Hydra's "Could not override" / "Could not delete" failures are one line.

    Hydra's ``ConfigLoaderImpl._apply_overrides_to_config`` is wrapped for the block only
    (each override is applied alone, so the failing one is known with the config it failed
    on); where this Hydra has no such method, nothing changes.
    """
    try:
        from hydra._internal.config_loader_impl import ConfigLoaderImpl
        from hydra.errors import ConfigCompositionException
    except ImportError:  # pragma: no cover - another Hydra layout
        yield
        return
    original = ConfigLoaderImpl.__dict__.get("_apply_overrides_to_config")
    if not isinstance(original, staticmethod):  # pragma: no cover - another Hydra layout
        yield
        return
    apply = original.__func__

    def with_hints(overrides: list, cfg: Any) -> None:
        for override in overrides:
            try:
                apply([override], cfg)
            except ConfigCompositionException as exc:
                text = str(exc)
                unknown = text.startswith("Could not override") or (
                    text.startswith("Could not delete") and text.endswith("does not exist."))
                if not unknown or override.is_add() or override.is_force_add():
                    raise
                new = _hinted(exc, str(override.key_or_group), cfg)
                if new is exc:
                    raise
                if os.environ.get("HYDRA_FULL_ERROR") == "1":
                    raise new from exc.__cause__
                print(str(new).partition("\n")[0], file=sys.stderr, flush=True)
                raise SystemExit(1) from None

    ConfigLoaderImpl._apply_overrides_to_config = staticmethod(with_hints)
    try:
        yield
    finally:
        ConfigLoaderImpl._apply_overrides_to_config = original
