"""Advice to the kernel about the pages under a tensor (Linux ``madvise``): the one home of it.

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
import sys

__all__ = ["HUGE_PAGE", "MADV_COLLAPSE", "MADV_DONTNEED", "MADV_HUGEPAGE", "PAGE", "advise"]

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
