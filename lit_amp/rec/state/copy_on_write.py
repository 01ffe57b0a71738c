"""Copy-on-write of big row tensors: the rows a snapshot's writer has not written yet are
copied aside before a step (or an announced write) changes them.

A :class:`Protected` group is a parameter and its same-shaped optimizer state: the live
tensors plus, per tensor, a :class:`RowStore` of rows copied aside and a map row -> slot.
The writer reads each chunk of live rows, then overlays the rows copied aside
(:meth:`Protected.overlay`): the file holds every row as of the snapshot.
"""

from __future__ import annotations

import torch

from lit_amp._pages import zeroed

__all__ = ["Protected", "RowStore", "tensor_versions", "whole_rows"]

#: rows per block of the store of rows copied aside
_BLOCK_ROWS = 1 << 16


def whole_rows(t: torch.Tensor) -> bool:
    """A dense CPU tensor of rows that is its whole storage (row ``r`` = bytes of row ``r``)."""
    return (
        type(t) in (torch.Tensor, torch.nn.Parameter)
        and t.layout == torch.strided
        and t.device.type == "cpu"
        and t.dim() == 2
        and t.is_contiguous()
        and t.storage_offset() == 0
        and t.untyped_storage().nbytes() == t.numel() * t.element_size()
    )


class RowStore:
    """Rows copied aside, in fixed-size blocks (appending never copies what is stored)."""

    def __init__(self, like: torch.Tensor) -> None:
        self.width, self.dtype = like.shape[1], like.dtype
        self.blocks: list[torch.Tensor] = []
        self.n = 0

    def append(self, rows: torch.Tensor) -> None:
        done = 0
        while done < len(rows):
            at = self.n % _BLOCK_ROWS
            if at == 0:
                self.blocks.append(torch.empty(_BLOCK_ROWS, self.width, dtype=self.dtype))
            k = min(_BLOCK_ROWS - at, len(rows) - done)
            self.blocks[-1][at:at + k] = rows[done:done + k]
            done += k
            self.n += k

    def gather(self, slots: torch.Tensor) -> torch.Tensor:
        out = torch.empty(len(slots), self.width, dtype=self.dtype)
        block = torch.div(slots, _BLOCK_ROWS, rounding_mode="floor")
        for b in torch.unique(block).tolist():
            sel = (block == b).nonzero().squeeze(1)
            out[sel] = self.blocks[b][slots[sel] - b * _BLOCK_ROWS]
        return out


class Protected:
    """A row-structured parameter and its same-shaped optimizer state, copied on write."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = tensors  # detached live tensors (they share the version counters)
        self.rows = tensors[0].shape[0]
        self.row_bytes = sum(t.shape[1] * t.element_size() for t in tensors)
        self.slot = zeroed(self.rows)  # row -> 1 + index into the stores, 0: not copied
        self.stores = [RowStore(t) for t in tensors]
        self.done = [0] * len(tensors)  # rows [0, done[i]) of tensors[i] are written
        # a row increment: the rows written (sorted), and their bitmap; None: every row
        self.index: torch.Tensor | None = None
        self.member: torch.Tensor | None = None

    def keep(self, which: list[bool]) -> None:
        """Follow only the tensors marked in ``which`` (those a snapshot writes)."""
        self.tensors = [t for t, k in zip(self.tensors, which) if k]
        self.row_bytes = sum(t.shape[1] * t.element_size() for t in self.tensors)
        self.stores = [RowStore(t) for t in self.tensors]
        self.done = [0] * len(self.tensors)

    def copy_aside(self, rows: torch.Tensor) -> int:
        """Copy the ``rows`` not written yet (and not copied before); returns how many."""
        rows = rows[rows >= min(self.done)]
        if self.member is not None:
            rows = rows[self.member[rows]]
        rows = rows[self.slot[rows] == 0]
        k = len(rows)
        if k:
            n = self.stores[0].n
            self.slot[rows] = torch.arange(n + 1, n + k + 1, dtype=self.slot.dtype)
            for t, store in zip(self.tensors, self.stores):
                store.append(t.index_select(0, rows))
        return k

    def overlay(self, i: int, rows: slice | torch.Tensor, buf: torch.Tensor) -> None:
        """Make ``buf`` (the ``rows`` of tensor ``i``: a range, or increasing row numbers
        after the last written, copied from the live tensor since the snapshot) the rows as
        they were at the snapshot, and mark them written (under the lock). A step that changed
        one of them during the copy had it copied aside first: it is not written yet."""
        slots = self.slot[rows]
        hit = slots.nonzero().squeeze(1)
        if len(hit):
            buf[hit] = self.stores[i].gather(slots[hit].long() - 1)
        self.done[i] = rows.stop if isinstance(rows, slice) else int(rows[-1]) + 1

    def release(self) -> None:
        """Free the rows copied aside and the slot map."""
        self.slot = zeroed(0)
        self.stores = [RowStore(t) for t in self.tensors]
        self.done = [self.rows] * len(self.tensors)
        self.member = None



def tensor_versions(tensors: list[torch.Tensor]) -> tuple[tuple[int, int], ...]:
    """Where each tensor's data is and how often it was written: any change but a step's."""
    return tuple((t.untyped_storage().data_ptr(), t._version) for t in tensors)
