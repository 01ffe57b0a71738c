"""Embedding tables and their optimizer state on 2 MiB pages (Linux transparent huge pages).

A recommendation model's step reads and writes rows at random all over tables of gigabytes;
on 4 KiB pages nearly every row costs a TLB miss. :func:`huge_empty` allocates a CPU tensor
whose memory the kernel is asked (``madvise(MADV_HUGEPAGE)``) to back with 2 MiB pages before
anything touches it. Where that cannot be done (not Linux, THP set to ``never``, a tensor under
:data:`MIN_BYTES`) it is a plain ``torch.empty``: only the speed differs, never the values.
Figures: docs/benchmarks.md ("Huge pages").

Example:
    >>> t = huge_empty(4, 3)
    >>> t.shape, t.dtype
    (torch.Size([4, 3]), torch.float32)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import torch

__all__ = ["MIN_BYTES", "huge_empty", "huge_zeros_like", "huge_page_bytes"]

MIN_BYTES = 64 << 20  #: smaller tensors are allocated as usual
_PAGE = 2 << 20
_MADV_HUGEPAGE = 14
_libc: ctypes.CDLL | None = None


def _madvise(start: int, length: int) -> bool:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), _MADV_HUGEPAGE) == 0


def _advise(t: torch.Tensor) -> None:
    """Ask for huge pages over the 2 MiB-aligned inside of ``t``'s (untouched) memory."""
    nbytes = t.numel() * t.element_size()
    if not sys.platform.startswith("linux") or t.device.type != "cpu" or nbytes < MIN_BYTES:
        return
    ptr = t.data_ptr()
    start, end = -(-ptr // _PAGE) * _PAGE, (ptr + nbytes) // _PAGE * _PAGE
    try:
        _madvise(start, end - start)  # refused (THP off, old kernel): 4 KiB pages, as before
    except OSError:  # no libc to load
        pass


def huge_empty(*size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``torch.empty(*size, dtype=dtype)`` on the CPU, on 2 MiB pages where the OS allows."""
    t = torch.empty(*size, dtype=dtype)
    _advise(t)
    return t


def huge_zeros_like(t: torch.Tensor) -> torch.Tensor:
    """``torch.zeros_like(t)``, on 2 MiB pages where the OS allows (a large, contiguous CPU
    tensor)."""
    if (t.device.type != "cpu" or not t.is_contiguous()
            or t.numel() * t.element_size() < MIN_BYTES):
        return torch.zeros_like(t, memory_format=torch.preserve_format)
    return huge_empty(*t.shape, dtype=t.dtype).zero_()


def huge_page_bytes(t: torch.Tensor) -> int:
    """How many bytes of ``t``'s memory mappings the kernel backs with huge pages now (Linux's
    ``AnonHugePages`` of ``/proc/self/smaps``; 0 elsewhere)."""
    lo = t.data_ptr()
    hi = lo + t.numel() * t.element_size()
    total, inside = 0, False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(maxsplit=1)[0]
                if "-" in head and not head.endswith(":"):
                    a, b = (int(x, 16) for x in head.split("-"))
                    inside = a < hi and b > lo
                elif inside and head == "AnonHugePages:":
                    total += int(line.split()[1]) * 1024
    except OSError:
        return 0
    return total
