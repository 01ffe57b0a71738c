"""Row increments: the checkpoint format of ``online_train``'s ``full_every_n_checkpoints``,
and the reader of its chains (torch only: :func:`lit_amp.serialization.load_checkpoint` uses it).

A row increment holds the whole checkpoint dict, except that some big row tensors (a table,
its optimizer moments) hold only the rows changed since the previous checkpoint; its
:data:`ROWS_KEY` says which: ``{"prev": <the previous file's name, same folder>, "prev_id":
<its CHAIN_KEY>, "tensors": [[<keys leading to the tensor>, <row indices>], ...]}``. Every file
of a chain has its own random :data:`CHAIN_KEY`, so a file of that name written by another run
is refused. The writer is :meth:`lit_amp.rec.state.snapshot.Snapshots.take` (``prev=``).
:func:`resolve_rows` reads the full checkpoint into memory and writes the increments' rows
into it, read memory-mapped a part at a time: a resume holds the state about once.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from typing import Any

import torch

from lit_amp._pages import MADV_DONTNEED, advise

__all__ = ["ROWS_KEY", "CHAIN_KEY", "resolve_rows"]

#: the key of a row increment's description (see the module docstring)
ROWS_KEY = "lit_amp_rows"
#: the key of a checkpoint's random id, which the next increment of its chain names
CHAIN_KEY = "lit_amp_chain_id"
#: the bytes of an increment's rows written at a time (their file pages then dropped)
_ROWS_PART_BYTES = 64 << 20


def resolve_rows(path: str, read: Callable[[str, bool], dict]) -> dict:
    """The whole state of the row increment at ``path``: its chain back to the full
    checkpoint (the increments memory-mapped), the full checkpoint read into memory, then every
    increment's rows written into it in order. ``read(path, mmap)`` reads one file (raising
    ``ValueError`` when it cannot).

    Raises:
        ValueError: a link of the chain is missing, unreadable or does not fit.
    """
    chain = [(path, read(path, True))]
    while ROWS_KEY in chain[-1][1]:
        at, inc = chain[-1]
        prev = inc[ROWS_KEY].get("prev") if isinstance(inc[ROWS_KEY], dict) else None
        if not isinstance(prev, str) or os.path.basename(prev) != prev or len(chain) > 100_000:
            raise ValueError(f"load_checkpoint: {at!r} is a row increment without a valid "
                             f"predecessor ({prev!r}).")
        before = os.path.join(os.path.dirname(at), prev)
        if not os.path.isfile(before):
            raise ValueError(
                f"load_checkpoint: {at!r} holds only the rows changed since {prev!r}, which is "
                "missing: the chain back to its full checkpoint is broken, so this checkpoint "
                "cannot be loaded (an older full checkpoint, or its increments, can).")
        state = read(before, True)
        if state.get(CHAIN_KEY) is None or state.get(CHAIN_KEY) != inc[ROWS_KEY].get("prev_id"):
            raise ValueError(
                f"load_checkpoint: {at!r} holds only the rows changed since {prev!r}, but that "
                "file is not the one it follows (another run wrote it): the chain is broken.")
        chain.append((before, state))
    at, _ = chain.pop()
    whole = read(at, False)  # in memory: its rows are written in place
    while chain:
        at, inc = chain.pop()
        entries = inc.pop(ROWS_KEY).get("tensors")
        if not isinstance(entries, list) or not all(
                isinstance(e, (list, tuple)) and len(e) == 2 and isinstance(e[0], (list, tuple))
                and e[0] for e in entries):
            raise ValueError(f"load_checkpoint: {at!r} is a row increment whose "
                             "'lit_amp_rows' has no valid list of [keys, rows] entries.")
        applied = [_apply_rows(at, whole, inc, list(keys), rows) for keys, rows in entries]
        # the increment's other tensors, copied out of the file's mapping
        whole = _copied(inc, {id(t) for t in applied})
        del inc
    return whole


def _apply_rows(at: str, whole: dict, inc: dict, keys: list, rows: Any) -> torch.Tensor:
    """Write the rows ``inc`` holds at ``keys`` into the previous whole state's tensor, put
    that tensor into ``inc`` and return it. ``inc``'s values are read a part at a time, each
    part's pages of the file mapping dropped once written."""
    try:
        full, part, box = whole, inc, inc
        for k in keys:
            full, box, part = full[k], part, part[k]
        ok = (isinstance(full, torch.Tensor) and isinstance(part, torch.Tensor)
              and isinstance(rows, torch.Tensor) and rows.dim() == 1 and full.dim() >= 1
              and part.shape == (len(rows), *full.shape[1:]) and part.dtype == full.dtype
              and (len(rows) == 0 or 0 <= int(rows.min()) <= int(rows.max()) < len(full)))
    except (KeyError, IndexError, TypeError):
        ok = False
    if not ok:
        raise ValueError(f"load_checkpoint: the rows {at!r} holds at {keys!r} do not fit the "
                         "tensor of its predecessor: the chain is broken.")
    row_bytes = max(1, part[:1].numel() * part.element_size())
    step = max(1, _ROWS_PART_BYTES // row_bytes)
    for i in range(0, len(rows), step):
        values = part[i:i + step]
        full[rows[i:i + step].long()] = values
        _drop_pages(values)
    _drop_pages(rows)
    box[keys[-1]] = full
    return full


def _drop_pages(t: torch.Tensor) -> None:
    """Drop the pages under ``t``, a contiguous part of a tensor memory-mapped from a file
    (read again from the file if touched): what a resume has read leaves its RSS."""
    if t.is_contiguous():
        advise(t.data_ptr(), t.numel() * t.element_size(), MADV_DONTNEED)


def _copied(obj: Any, keep: set[int]) -> Any:
    """``obj`` (a checkpoint dict read memory-mapped) with every tensor copied into memory,
    but those whose id is in ``keep``; each copied tensor's file pages dropped."""
    if isinstance(obj, torch.Tensor):
        if id(obj) in keep:
            return obj
        out = obj.clone()
        _drop_pages(obj)
        return out
    if isinstance(obj, dict):
        out = copy.copy(obj)  # its type and attributes (a state dict's ``_metadata``) kept
        for k, v in obj.items():
            out[k] = _copied(v, keep)
        return out
    if isinstance(obj, list):
        return [_copied(v, keep) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_copied(v, keep) for v in obj)
    return obj
