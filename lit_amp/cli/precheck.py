"""Checks of a composed config that need no torch: refused within a second of the start.

``lit-amp data.batch_size=-1`` or ``lit-amp mode=eval ckpt_path=/nonexistent`` used to import
torch and Lightning (5-10 s) before torch's own message said what was wrong. :func:`check_config`
refuses such values first, from the config alone: ``epochs``, ``sink_size``,
``valid_frequency``, the data node's sizes (``data.batch_size`` ...) and ``ckpt_path`` (it must
name a non-empty torch checkpoint file, :func:`check_checkpoint_file`). ``lit-amp`` runs it
before importing torch (:mod:`lit_amp.cli.app`), and :func:`lit_amp.cli.build.build` again, so
that a job of a ``-m`` sweep records the same message. Imports no torch.

Example:
    >>> check_config({"mode": "train", "epochs": 2, "sink_size": -1, "valid_frequency": 1,
    ...               "ckpt_path": None, "data": {"batch_size": 32}})
    >>> check_config({"epochs": 2, "data": {"batch_size": 0}})
    Traceback (most recent call last):
    ...
    lit_amp.cli.schema.ConfigError: lit-amp: 'data.batch_size' must be an int >= 1, but got 0.
"""

from __future__ import annotations

import os
import zipfile
from typing import Any

from lit_amp.cli.schema import ConfigError

__all__ = ["check_checkpoint_file", "check_config"]

#: keys of the data node that count something: the least value each may take
_DATA_COUNTS: dict[str, int] = {"batch_size": 1, "num_train": 1, "num_valid": 1,
                                "num_workers": 0}
_MISSING = object()


def _get(node: Any, key: str) -> Any:
    """``node[key]`` as a plain value, or ``_MISSING`` (absent, or an unresolvable
    interpolation: whatever reads it later reports it)."""
    try:
        value = node.get(key, _MISSING) if hasattr(node, "get") else _MISSING
    except Exception:  # noqa: BLE001 - an interpolation that does not resolve here
        return _MISSING
    if type(value).__name__ == "ListConfig":
        return list(value)
    if hasattr(value, "name") and hasattr(value, "value") and not isinstance(value, str):
        return value.name  # an Enum of the schema (mode)
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_checkpoint_file(path: str) -> None:
    """Refuse a ``ckpt_path`` that cannot be a torch checkpoint, without reading it whole.

    ``torch.save`` writes a zip archive holding ``<name>/data.pkl`` (or, in its legacy format,
    a pickle, whose first byte is ``0x80``). What is checked: the path exists, is a file, is
    not empty, and is such a zip archive (complete: its central directory is read) or such a
    pickle. A file that passes may still fail ``torch.load``; that message comes from
    :func:`lit_amp.cli.checkpoint.read_checkpoint`.

    Args:
        path: the ``ckpt_path`` given.

    Raises:
        ConfigError: naming the file and what is wrong with it.
    """
    where = f"lit-amp: ckpt_path={path!r}"
    if not os.path.exists(path):
        raise ConfigError(f"{where} does not exist: give the .ckpt file a run wrote "
                          "(runs/<task>/<run>/checkpoints/*.ckpt).")
    if os.path.isdir(path):
        raise ConfigError(f"{where} is a directory, not a checkpoint file: give one of the "
                          ".ckpt files in it.")
    if not os.path.isfile(path):
        raise ConfigError(f"{where} is not a regular file.")
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(4)
        if size == 0:
            raise ConfigError(f"{where} is empty (0 bytes), not a checkpoint: the write that "
                              "made it did not finish; use another checkpoint.")
        if head.startswith(b"PK"):
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
            if not any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
                raise ConfigError(f"{where} is a zip archive but not a torch checkpoint "
                                  "(it holds no data.pkl).")
            return
    except zipfile.BadZipFile:
        raise ConfigError(f"{where} is truncated or damaged ({size} bytes; its zip directory "
                          "is unreadable), not a complete checkpoint: use another "
                          "checkpoint.") from None
    except OSError as exc:
        raise ConfigError(f"{where} cannot be read: {exc.strerror or exc}.") from None
    if not head.startswith(b"\x80"):
        raise ConfigError(f"{where} is not a checkpoint: it is neither a torch.save zip "
                          f"archive nor a pickle (it starts with {head!r}); give a .ckpt file "
                          "of lit_amp or Lightning.")


def check_config(cfg: Any) -> None:
    """Refuse values of a composed config that are wrong whatever torch would say.

    Args:
        cfg: the composed config (a ``DictConfig`` or a dict).

    Raises:
        ConfigError: ``epochs`` < 1; ``sink_size`` neither -1 nor >= 1; ``valid_frequency``
            neither null, an int >= 1 nor a list of them; ``data.batch_size`` (also
            ``num_train``, ``num_valid``) not an int >= 1, ``data.num_workers`` not an
            int >= 0; ``mode=eval`` without ``ckpt_path``; a ``ckpt_path`` (train or eval)
            that is not a checkpoint file (:func:`check_checkpoint_file`).
    """
    epochs = _get(cfg, "epochs")
    if _is_int(epochs) and epochs < 1:
        raise ConfigError(f"lit-amp: 'epochs' must be >= 1, but got {epochs}.")
    sink = _get(cfg, "sink_size")
    if _is_int(sink) and (sink == 0 or sink < -1):
        raise ConfigError(f"lit-amp: 'sink_size' must be -1 or >= 1, but got {sink}.")
    vf = _get(cfg, "valid_frequency")
    ok = vf is _MISSING or vf is None or (_is_int(vf) and vf >= 1) or (
        isinstance(vf, list) and all(_is_int(e) and e >= 1 for e in vf)
    )
    if not ok:
        raise ConfigError(
            "lit-amp: 'valid_frequency' must be null, an int >= 1 or a list of epochs, but got "
            f"{vf!r}."
        )
    data = _get(cfg, "data")
    if data is not _MISSING and data is not None:
        for key, least in _DATA_COUNTS.items():
            value = _get(data, key)
            if value is _MISSING or value is None:
                continue
            if not _is_int(value) or value < least:
                raise ConfigError(
                    f"lit-amp: 'data.{key}' must be an int >= {least}, but got {value!r}.")
    mode = _get(cfg, "mode")
    if mode not in ("train", "eval"):
        return
    path = _get(cfg, "ckpt_path")
    if mode == "eval" and not path:
        raise ConfigError("lit-amp: mode=eval needs a checkpoint: ckpt_path=<file.ckpt>.")
    if path and path is not _MISSING:
        check_checkpoint_file(str(path))
