"""What the page cache holds of a file (Linux ``mincore``), for tests of written files that
must not stay cached."""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from pathlib import Path

import pytest

#: the tests need posix_fadvise and mincore: Linux
CACHE_ADVICE = pytest.mark.skipif(
    not hasattr(os, "posix_fadvise") or not sys.platform.startswith("linux"),
    reason="posix_fadvise / mincore: Linux")


def resident_pages(path: Path) -> tuple[int, int]:
    """``(pages of path in the page cache, pages)``: ``mincore`` over a fresh mapping (one
    that touches no page)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = path.stat().st_size
    pages = -(-size // mmap.PAGESIZE)
    vec = (ctypes.c_ubyte * pages)()
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        try:
            assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(v & 1 for v in vec), pages
