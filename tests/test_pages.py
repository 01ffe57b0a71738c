"""``lit_amp._pages``: advice over the page-aligned inside of a range; dropping the pages of a
memory-mapped file lowers the RSS and changes no value (they are read again from the file)."""

from __future__ import annotations

import sys

import pytest
import torch

from lit_amp import _pages

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise is Linux's")


def _rss() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS")


@linux
def test_dropping_a_mapped_files_pages_lowers_the_rss_and_keeps_the_values(tmp_path):
    torch.save({"t": torch.arange(16 << 20, dtype=torch.float32)}, tmp_path / "t.pt")  # 64 MiB
    t = torch.load(tmp_path / "t.pt", mmap=True)["t"]
    t.sum()  # every page read
    before = _rss()
    assert _pages.advise(t.data_ptr(), t.numel() * 4, _pages.MADV_DONTNEED)
    assert before - _rss() > 48 << 20
    assert torch.equal(t[-3:], torch.tensor([16777213.0, 16777214.0, 16777215.0]))


def test_only_the_aligned_inside_is_advised(monkeypatch):
    asked = []
    monkeypatch.setattr(_pages, "_madvise", lambda start, n, advice: asked.append((start, n)))
    monkeypatch.setattr(sys, "platform", "linux")
    page = _pages.PAGE
    _pages.advise(3 * page + 5, 4 * page, _pages.MADV_DONTNEED)
    assert asked == [(4 * page, 3 * page)]
    asked.clear()
    assert _pages.advise(page + 1, page, _pages.MADV_DONTNEED) is False and asked == []


def test_elsewhere_nothing_is_advised(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(_pages, "_madvise", lambda *a: pytest.fail("advised off Linux"))
    assert _pages.advise(0, 1 << 30, _pages.MADV_HUGEPAGE, align=_pages.HUGE_PAGE) is False
