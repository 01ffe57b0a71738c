"""Embedding tables and their optimizer state on 2 MiB pages (Linux transparent huge pages).

A recommendation model's step reads and writes rows at random all over tables of gigabytes;
on 4 KiB pages nearly every row costs a TLB miss. :func:`huge_empty` allocates a CPU tensor
whose memory the kernel is asked (``madvise(MADV_HUGEPAGE)``) to back with 2 MiB pages before
anything touches it; :func:`collapse` moves memory already written onto huge pages in place
(``MADV_COLLAPSE``, Linux 6.1+), so a loaded tensor needs no second copy. Where that cannot be
done (not Linux, THP set to ``never``, a tensor under :data:`MIN_BYTES`) it is a plain
``torch.empty``: only the speed differs, never the values.
Figures: docs/benchmarks.md ("Huge pages").

Example:
    >>> t = huge_empty(4, 3)
    >>> t.shape, t.dtype
    (torch.Size([4, 3]), torch.float32)
"""

from __future__ import annotations

import torch

from lit_amp._pages import HUGE_PAGE, MADV_COLLAPSE, MADV_HUGEPAGE, advise

__all__ = ["MIN_BYTES", "collapse", "huge_empty", "huge_zeros_like", "huge_page_bytes"]

MIN_BYTES = 64 << 20  #: smaller tensors are allocated as usual


def _advise(t: torch.Tensor, *advice: int) -> bool:
    """Give ``advice`` (huge pages) over the 2 MiB-aligned inside of ``t``'s memory; whether
    the kernel took all of it."""
    nbytes = t.numel() * t.element_size()
    if t.device.type != "cpu" or nbytes < MIN_BYTES:
        return False
    return advise(t.data_ptr(), nbytes, *advice or (MADV_HUGEPAGE,), align=HUGE_PAGE)


def collapse(t: torch.Tensor) -> bool:
    """Move ``t``'s memory (a large CPU tensor, already written) onto huge pages in place;
    whether the kernel did (Linux 6.1+, anonymous memory such as ``torch.load``'s)."""
    return t.is_contiguous() and _advise(t, MADV_HUGEPAGE, MADV_COLLAPSE)


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
