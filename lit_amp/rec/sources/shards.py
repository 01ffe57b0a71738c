"""The files of a watched folder: which shard a name is in, writing one, parsing one.

Producers write a file under a hidden name and rename it into the folder (:func:`write_shard`
does), so a reader never sees half a file. A file belongs to shard ``crc32(name) %
num_shards`` (:func:`shard_of`), stable as the folder grows. :func:`parse_shard` reads one
opened file of any :data:`FORMATS` into validated columns (JSON lines parsed in chunks, with
a stop check between them), for :class:`~lit_amp.rec.sources.directory.DirectorySource`.
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Callable
from typing import IO, Any

import numpy as np
import torch

from lit_amp._io import atomic_write
from lit_amp.rec.sources.npz import read_npz
from lit_amp.rec.sources.schema import ClickSchema, Columns

__all__ = ["FORMATS", "parse_shard", "shard_of", "write_shard"]

#: the file formats (and suffixes) a watched folder holds
FORMATS = ("jsonl", "npz", "pt")
_CHUNK = 4096  # JSON lines parsed between two stop checks (~0.1 s of parsing)


def shard_of(name: str, num_shards: int) -> int:
    """The shard a file belongs to: ``crc32(name) % num_shards`` (stable as the folder grows).

    The CRC is of the name's bytes on disk (UTF-8, or the raw bytes of a name that is not
    valid UTF-8, which ``os.listdir`` gives as a str with lone surrogates), so every name has
    a shard.

    Example:
        >>> shard_of("part-000001.npz", 1)
        0
    """
    return zlib.crc32(name.encode("utf-8", "surrogateescape")) % num_shards


def write_shard(
    directory: str | os.PathLike,
    name: str,
    columns: Columns,
    fmt: str = "npz",
    *,
    schema: ClickSchema | None = None,
    fsync: bool = False,
) -> str:
    """Write one file for a :class:`DirectorySource` atomically (:func:`lit_amp._io.atomic_write`).

    Args:
        directory: the watched folder (created if missing).
        name: the file stem, e.g. ``"part-000042"`` (the suffix is added).
        columns: ``{"id", "label", "dense", "cat"}`` arrays (e.g. from
            :meth:`SyntheticClickSource.columns`).
        fmt: ``"npz"``, ``"pt"`` or ``"jsonl"``.
        schema: for ``"jsonl"`` (default :class:`ClickSchema`).
        fsync: flush the data (and the folder) to disk before returning (survives a power
            cut).

    Returns:
        The final path.

    Raises:
        ValueError: ``fmt`` is not one of the formats, or ``name`` is hidden or has a '/'.

    Example:
        >>> import tempfile
        >>> from lit_amp.rec.sources import SyntheticClickSource
        >>> d = tempfile.mkdtemp()
        >>> os.path.basename(write_shard(d, "part-0", SyntheticClickSource(4).columns(0)))
        'part-0.npz'
    """
    if fmt not in FORMATS:
        raise ValueError(
            f"For 'write_shard', the argument 'fmt' must be one of {list(FORMATS)}, but got "
            f"{fmt!r}."
        )
    if not name or name[0] in "._" or "/" in name or os.sep in name:
        raise ValueError(
            "For 'write_shard', the argument 'name' must be a file stem that does not start with "
            f"'.' or '_' and has no '/', but got {name!r}."
        )
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    final = os.path.join(directory, f"{name}.{fmt}")

    def write(f: IO[bytes]) -> None:
        if fmt == "npz":
            np.savez(f, **{k: np.asarray(v) for k, v in columns.items()})
        elif fmt == "pt":
            torch.save({k: torch.as_tensor(np.asarray(v)) for k, v in columns.items()}, f)
        else:
            f.write((schema or ClickSchema()).to_json_lines(columns))

    atomic_write(final, write, fsync=fsync)
    return final


def parse_shard(f: IO[bytes], name: str, schema: Any, max_bytes: int, poll_interval: float,
                stop: Callable[[], bool]) -> tuple[Columns, np.ndarray, list, int] | None:
    """``(columns, valid row numbers, bad rows, rows in the file)`` of the open file ``f``
    named ``name`` (its suffix says the format); None when ``stop()`` said stop while JSON
    lines were parsed.

    Raises:
        Exception: a corrupt file (the caller dead-letters it).
    """
    if name.endswith(".jsonl"):
        lines = f.read().splitlines()
        parsed = _parse_lines(schema, lines, poll_interval, stop)
        if parsed is None:
            return None
        cols, index, bad = parsed
        return cols, index, bad, len(lines)
    if name.endswith(".npz"):
        arrays = read_npz(f.fileno(), getattr(schema, "shard_arrays", None), max_bytes=max_bytes)
    else:
        arrays = torch.load(f, map_location="cpu", weights_only=True)
        if not isinstance(arrays, dict):
            raise ValueError(f"a .pt shard must hold a dict, got {type(arrays).__name__}")
    return schema.check_columns(arrays)


def _parse_lines(schema: Any, lines: list[bytes], poll_interval: float,
                 stop: Callable[[], bool]) -> Any:
    """``schema.parse_json_lines(lines)``, ``_CHUNK`` lines at a time, calling ``stop`` every
``poll_interval`` seconds; None if it said stop."""
    if len(lines) <= _CHUNK:
        return schema.parse_json_lines(lines)
    parts, indexes, bad = [], [], []
    checked = time.monotonic()
    for first in range(0, len(lines), _CHUNK):
        if time.monotonic() - checked >= poll_interval:
            if stop():
                return None
            checked = time.monotonic()
        cols, index, chunk_bad = schema.parse_json_lines(lines[first:first + _CHUNK])
        if len(index) or not parts:  # a chunk of bad rows only adds no columns
            parts.append(cols)
            indexes.append(np.asarray(index, dtype=np.int64) + first)
        bad.extend((row + first, why, raw) for row, why, raw in chunk_bad)
    if len(parts) > 1 and not len(indexes[0]):  # the first chunk had no valid row
        parts, indexes = parts[1:], indexes[1:]
    return schema.concat(parts), np.concatenate(indexes), bad
