"""Serving weights and resume checkpoints written by ``RecModel.online_train``.

Two kinds of files, on two cadences:

- **published weights** (``publish_dir``): ``model-{step:012d}.pt`` holding
  ``{"network": state_dict, "step", "records", "published_at", "format"}``, and ``LATEST``, a
  one-line text file naming the newest one. Both are written with
  :func:`lit_amp._io.atomic_write` (a hidden temp file renamed into place), so a reader never
  sees a partial file: a server polls ``LATEST`` and
  loads what it names (:func:`load_published`).
- **checkpoints** (``ckpt_dir``): ``online-{step:012d}.ckpt`` (lit_amp checkpoint format)
  holding the network, the optimizer, the loss-scale state and, under ``"online"``, the
  stream cursor(s) and counters — one file, so they are restored together.
"""

from __future__ import annotations

import logging
import os
import re
import time
from typing import Any

import torch

from lit_amp._io import atomic_write
from lit_amp.serialization import load_checkpoint

__all__ = [
    "PUBLISH_FORMAT",
    "publish_weights",
    "load_published",
    "latest_published",
    "list_checkpoints",
    "latest_checkpoint",
    "plain_state",
    "prune_checkpoints",
]

log = logging.getLogger(__name__)

PUBLISH_FORMAT = "lit_amp.rec/1"
_PUBLISHED = re.compile(r"^model-(\d+)\.pt$")
_CKPT = re.compile(r"^online-(\d+)\.ckpt$")


def publish_weights(
    network: torch.nn.Module,
    publish_dir: str | os.PathLike,
    step: int,
    *,
    records: int = 0,
    keep: int = 3,
    extra: dict[str, Any] | None = None,
) -> str:
    """Export ``network``'s weights atomically as ``model-{step}.pt`` and point ``LATEST`` at it.

    Args:
        network: the module to export (its ``state_dict``, copied to CPU).
        publish_dir: the folder (created if missing).
        step: the training step the weights come from.
        records: records trained so far (stored in the file).
        keep: how many published files to keep (older ones are deleted).
        extra: more values to store in the file.

    Returns:
        The path of the new file.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> p = publish_weights(torch.nn.Linear(2, 1), d, step=7)
        >>> os.path.basename(p), load_published(d)["step"]
        ('model-000000000007.pt', 7)
    """
    directory = os.fspath(publish_dir)
    os.makedirs(directory, exist_ok=True)
    payload = {
        "network": {k: v.detach().to("cpu", copy=True) for k, v in network.state_dict().items()},
        "step": int(step),
        "records": int(records),
        "published_at": time.time(),
        "format": PUBLISH_FORMAT,
        **(extra or {}),
    }
    name = f"model-{int(step):012d}.pt"
    path = os.path.join(directory, name)
    atomic_write(path, lambda f: torch.save(payload, f))
    atomic_write(os.path.join(directory, "LATEST"), lambda f: f.write((name + "\n").encode()))
    published = sorted(n for n in os.listdir(directory) if _PUBLISHED.match(n))
    for old in published[: max(0, len(published) - keep)]:
        if old != name:
            try:
                os.remove(os.path.join(directory, old))
            except OSError as exc:
                log.warning("Could not remove the old published file %s: %s", old, exc)
    return path


def latest_published(publish_dir: str | os.PathLike) -> str | None:
    """The path ``LATEST`` names, or None when nothing was published yet.

    Example:
        >>> import tempfile
        >>> latest_published(tempfile.mkdtemp()) is None
        True
    """
    directory = os.fspath(publish_dir)
    try:
        with open(os.path.join(directory, "LATEST")) as f:
            name = f.read().strip()
    except FileNotFoundError:
        return None
    return os.path.join(directory, name) if name else None


def load_published(
    publish_dir: str | os.PathLike, network: torch.nn.Module | None = None
) -> dict[str, Any]:
    """Load the newest published weights (what ``LATEST`` names), optionally into ``network``.

    Args:
        publish_dir: the folder :func:`publish_weights` writes.
        network: a module to load the weights into, or None.

    Returns:
        The published dict (``"network"``, ``"step"``, ``"records"``, ``"published_at"``).

    Raises:
        ValueError: nothing was published in ``publish_dir``, or the file ``LATEST`` names
            cannot be read (missing, truncated, not a published-weights file).

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> _ = publish_weights(torch.nn.Linear(2, 1), d, step=3, records=300)
        >>> serving = torch.nn.Linear(2, 1)
        >>> load_published(d, serving)["records"]
        300
    """
    path = latest_published(publish_dir)
    if path is None:
        raise ValueError(
            f"load_published: no published weights in {os.fspath(publish_dir)!r} (no LATEST)."
        )
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle.UnpicklingError, a truncated zip, a missing file...
        raise ValueError(
            f"load_published: the published weights {path!r} cannot be read "
            f"({type(exc).__name__}: {exc})."
        ) from exc
    if not isinstance(payload, dict) or "network" not in payload:
        raise ValueError(f"load_published: {path!r} does not hold published weights.")
    if network is not None:
        network.load_state_dict(payload["network"])
    return payload


def list_checkpoints(ckpt_dir: str | os.PathLike) -> list[str]:
    """The ``online-*.ckpt`` files of ``ckpt_dir``, oldest first.

    Example:
        >>> list_checkpoints("/nonexistent")
        []
    """
    directory = os.fspath(ckpt_dir)
    try:
        names = sorted(n for n in os.listdir(directory) if _CKPT.match(n))
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
    """Delete all but the newest ``keep`` online checkpoints.

    Example:
        >>> prune_checkpoints("/nonexistent", keep=2)
    """
    files = list_checkpoints(ckpt_dir)
    for path in files[: max(0, len(files) - keep)]:
        try:
            os.remove(path)
        except OSError as exc:
            log.warning("Could not remove the old checkpoint %s: %s", path, exc)
