"""Advice to the kernel about the pages under a tensor (Linux ``madvise``), and tensors whose
pages cost memory only once written: the one home of both.

:func:`advise` gives advice over the page-aligned inside of a memory range: 2 MiB pages for the
embedding tables (:mod:`lit_amp.rec.huge_pages`), or dropping the pages of a memory-mapped file
once they are read (a row increment applied by :func:`lit_amp.serialization.load_checkpoint`).
Off Linux, or where libc cannot be loaded, nothing is advised and it returns False: only the
memory or the speed differs, never a value.

Example:
    >>> import torch
    >>> advise(torch.ones(4).data_ptr(), 16, MADV_HUGEPAGE, align=HUGE_PAGE)  # under a page
    False
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import sys

import torch

__all__ = ["HUGE_PAGE", "MADV_COLLAPSE", "MADV_DONTNEED", "MADV_HUGEPAGE", "PAGE", "advise",
           "zeroed"]

PAGE = 4096
HUGE_PAGE = 2 << 20
MADV_DONTNEED = 4  #: drop the pages (a file mapping's are read again from the file if touched)
MADV_HUGEPAGE = 14  #: back the range with 2 MiB pages
MADV_COLLAPSE = 25  #: move memory already written onto 2 MiB pages now (Linux 6.1+)
_libc: ctypes.CDLL | None = None


def _madvise(start: int, length: int, advice: int) -> bool:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), advice) == 0


def advise(ptr: int, nbytes: int, *advice: int, align: int = PAGE) -> bool:
    """Give each of ``advice`` over the ``align``-aligned inside of ``[ptr, ptr + nbytes)``;
    whether the kernel took all of it (False when that inside is empty)."""
    start, end = -(-ptr // align) * align, (ptr + nbytes) // align * align
    if not sys.platform.startswith("linux") or end <= start:
        return False
    try:
        # refused (THP off, an old kernel, a file mapping for COLLAPSE): as before the advice
        return all(_madvise(start, end - start, a) for a in advice)
    except OSError:  # no libc to load
        return False


def zeroed(rows: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """A zeroed map of ``rows`` rows that costs memory only where it is written.

    An anonymous mapping starts as zero pages that become resident one 4 KiB page at a time
    as they are written (``torch.zeros`` writes every page; numpy's zeroed arrays ask for
    2 MiB huge pages, so one written row makes 2 MiB resident). A checkpoint snapshot takes one
    (a slot map) in O(1) and frees it when its write is over: a table of 26 M rows keeps no
    104 MB map while no snapshot is written, and no checkpoint stalls to clear one. The bitmaps
    of changed rows (``torch.bool``) start the same way; the first marking of a fresh one
    faults in its pages (~21 ms at 26 M rows when rows are spread over the whole table).

    Example:
        >>> m = zeroed(5, torch.bool)
        >>> m[3] = True
        >>> m.tolist()
        [False, False, False, True, False]
    """
    if rows == 0:
        return torch.zeros(0, dtype=dtype)
    buf = mmap.mmap(-1, rows * dtype.itemsize)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return torch.frombuffer(buf, dtype=dtype)
