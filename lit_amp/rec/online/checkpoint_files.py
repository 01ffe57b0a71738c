"""The folder of ``online_train``'s cursor checkpoints: listing, resuming, pruning.

``online-{step:012d}.ckpt`` (the lit_amp checkpoint format) holds the network, the optimizer,
the loss-scale state and, under ``"online"``, the stream cursor(s) and counters, so they are
restored together; ``online-{step:012d}-rows.ckpt`` is a row increment, which needs every file
back to the whole checkpoint before it (:mod:`lit_amp.serialization` reads the chain).
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

from lit_amp._io import prune_newest
from lit_amp.serialization import load_checkpoint

__all__ = ["list_checkpoints", "latest_checkpoint", "plain_state", "prune_checkpoints"]

log = logging.getLogger(__name__)

_CKPT = re.compile(r"^online-(\d+)(-rows)?\.ckpt$")


def list_checkpoints(ckpt_dir: str | os.PathLike) -> list[str]:
    """The ``online-*.ckpt`` files of ``ckpt_dir``, oldest first.

    Example:
        >>> list_checkpoints("/nonexistent")
        []
    """
    directory = os.fspath(ckpt_dir)
    try:
        names = sorted((n for n in os.listdir(directory) if _CKPT.match(n)),
                       key=lambda n: int(_CKPT.match(n).group(1)))
    except FileNotFoundError:
        return []
    return [os.path.join(directory, n) for n in names]


def latest_checkpoint(ckpt_dir: str | os.PathLike) -> tuple[str, dict] | None:
    """The newest readable online checkpoint as ``(path, state)``, or None when there is none.

    A file that cannot be read is skipped with a warning (the previous one is used).

    Raises:
        RuntimeError: checkpoints exist but none can be read (starting over silently would
            retrain the whole stream).

    Example:
        >>> import tempfile
        >>> latest_checkpoint(tempfile.mkdtemp()) is None
        True
    """
    files = list_checkpoints(ckpt_dir)
    errors = []
    for path in reversed(files):
        try:
            state = load_checkpoint(path)  # weights_only: tensors and plain containers
        except Exception as exc:
            log.warning("Skipping the unreadable checkpoint %s: %s", path, exc)
            errors.append(f"{os.path.basename(path)}: {exc}")
            continue
        if "online" in state:
            return path, state
        log.warning("Skipping %s: it has no 'online' section.", path)
        errors.append(f"{os.path.basename(path)}: no 'online' section")
    if files:
        raise RuntimeError(
            f"online_train: none of the {len(files)} checkpoint(s) in {os.fspath(ckpt_dir)!r} "
            f"can be resumed from ({'; '.join(errors)[:2000]}); move them away to start over, "
            "or pass resume=False."
        )
    return None


def plain_state(obj: Any) -> Any:
    """``obj`` with sets as sorted lists and tuples as lists: loadable with ``weights_only``.

    Example:
        >>> plain_state({"done": frozenset({"b", "a"}), "partial": {"c": 3}})
        {'done': ['a', 'b'], 'partial': {'c': 3}}
    """
    if isinstance(obj, dict):
        return {k: plain_state(v) for k, v in obj.items()}
    if isinstance(obj, (set, frozenset)):
        return sorted(plain_state(v) for v in obj)
    if isinstance(obj, (list, tuple)):
        return [plain_state(v) for v in obj]
    return obj


def prune_checkpoints(ckpt_dir: str | os.PathLike, keep: int) -> None:
    """Delete all but the newest ``keep`` online checkpoints and the chains they need (a row
    increment ``online-{step}-rows.ckpt`` needs every file back to the whole checkpoint
    before it).

    Example:
        >>> prune_checkpoints("/nonexistent", keep=2)
    """
    prune_newest(ckpt_dir, _CKPT, keep, key=lambda n: int(_CKPT.match(n).group(1)),
                 needs_previous=lambda n: bool(_CKPT.match(n).group(2)))
