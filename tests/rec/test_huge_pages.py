"""Embedding tables and LazyAdam's moments on 2 MiB pages: where the kernel allows, large
tables are backed by huge pages; the values are exactly those of ordinary allocations."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from lit_amp import _pages
from lit_amp.rec import LazyAdam, WideDeep, huge_pages
from lit_amp.rec.huge_pages import huge_empty, huge_page_bytes

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
needs_thp = pytest.mark.skipif(
    not THP.exists() or "[never]" in THP.read_text(),
    reason="the kernel gives no transparent huge pages here (only the speed would differ)")

VOCAB = 40_000  # 26 x 40,000 rows x 17 floats: a 67 MB table, over huge_pages.MIN_BYTES


def _batch(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"dense": torch.rand(64, 13, generator=g),
            "cat": torch.randint(0, 10**6, (64, 26), generator=g)}


def _train(steps: int = 3) -> tuple[WideDeep, LazyAdam]:
    torch.manual_seed(0)
    net = WideDeep(vocab_size=VOCAB, embed_dim=16, hidden=(8,), sparse=True)
    opt = LazyAdam(net.parameters(), 1e-2)
    for i in range(steps):
        opt.zero_grad()
        net(_batch(i)).sum().backward()
        opt.step()
    return net, opt


def _advised(t: torch.Tensor) -> bool:
    """Whether every mapping under the 2 MiB-aligned inside of ``t`` carries MADV_HUGEPAGE
    (``hg`` in smaps' VmFlags)."""
    page = 2 << 20
    lo = -(-t.data_ptr() // page) * page
    hi = (t.data_ptr() + t.numel() * t.element_size()) // page * page
    flags, inside = [], False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(maxsplit=1)[0]
        if "-" in head and not head.endswith(":"):
            a, b = (int(x, 16) for x in head.split("-"))
            inside = a < hi and b > lo
        elif inside and head == "VmFlags:":
            flags.append("hg" in line.split())
    return bool(flags) and all(flags)


@needs_thp
def test_the_table_and_the_moments_are_on_huge_pages():
    net, opt = _train()
    w = net.embedding.weight
    size = w.numel() * w.element_size()
    assert size >= huge_pages.MIN_BYTES
    state = opt.state[w]
    tables = (w, state["exp_avg"], state["exp_avg_sq"])
    assert all(_advised(t) for t in tables)  # lit_amp asked for huge pages
    if any(huge_page_bytes(t) < size - 4 * 2**20 for t in tables):
        # the kernel had no free 2 MiB pages when they were touched (fragmented memory)
        if not all(huge_pages.collapse(t) for t in tables):
            pytest.skip("the kernel has no free 2 MiB pages now (memory is fragmented)")
    for t in tables:
        assert huge_page_bytes(t) >= size - 4 * 2**20  # all but the unaligned ends
    plain = torch.zeros_like(w)  # torch's own allocation: 4 KiB pages (THP is "madvise")
    if "[always]" not in THP.read_text():
        assert huge_page_bytes(plain) < size // 2
    # a resumed optimizer's moments (allocated by the loader) are moved onto huge pages, in
    # place where the kernel can (MADV_COLLAPSE): no second copy of them is made
    again = LazyAdam(net.parameters(), 1e-2)
    loaded = copy.deepcopy(opt.state_dict())
    held = loaded["state"][0]["exp_avg"].data_ptr()
    again.load_state_dict(loaded)
    moved = again.state[w]["exp_avg"]
    assert _advised(moved) and torch.equal(moved, state["exp_avg"])
    if huge_pages.collapse(moved):  # Linux 6.1+, with free 2 MiB pages
        assert moved.data_ptr() == held
        assert huge_page_bytes(moved) >= size - 4 * 2**20


@needs_thp
def test_a_tensor_loaded_from_a_file_is_collapsed_in_place(tmp_path):
    """What a resume reads (torch.load's memory) goes onto huge pages without a copy."""
    torch.save({"t": torch.randn(huge_pages.MIN_BYTES // 4 + 1000)}, tmp_path / "t.pt")
    t = torch.load(tmp_path / "t.pt")["t"]
    before = t.clone()
    if not huge_pages.collapse(t):
        pytest.skip("this kernel cannot collapse memory in place (MADV_COLLAPSE: Linux 6.1+)")
    assert huge_page_bytes(t) >= t.numel() * 4 - 4 * 2**20
    assert torch.equal(t, before)


def test_huge_pages_change_no_value(monkeypatch):
    """Trained with and without the advice, weights and moments are bit for bit the same."""
    net, opt = _train()
    monkeypatch.setattr(huge_pages, "_advise", lambda t, *advice: False)
    net2, opt2 = _train()
    for a, b in zip(net.state_dict().values(), net2.state_dict().values()):
        assert torch.equal(a, b)
    w, w2 = net.embedding.weight, net2.embedding.weight
    assert torch.equal(opt.state[w]["exp_avg_sq"], opt2.state[w2]["exp_avg_sq"])


def test_small_tensors_are_allocated_as_usual(monkeypatch):
    asked = []
    monkeypatch.setattr(_pages, "_madvise", lambda start, length, advice: asked.append(length))
    t = huge_empty(1000, 17)
    assert t.shape == (1000, 17) and t.dtype == torch.float32 and not asked
    big = huge_empty(huge_pages.MIN_BYTES // 4)
    assert len(asked) == 1 and asked[0] % (2 << 20) == 0
    assert big.data_ptr() <= big.data_ptr() + asked[0] <= big.data_ptr() + big.numel() * 4
