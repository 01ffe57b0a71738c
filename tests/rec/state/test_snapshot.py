"""Snapshots written while training goes on hold the state of the moment they were taken."""

from __future__ import annotations

import gc
import os
import threading
import weakref
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from lit_amp.rec import LazyAdam
from lit_amp.rec.modules.id_embedding import IdEmbedding
from lit_amp.rec.state import snapshot as snapshot_mod
from lit_amp.rec.state.snapshot import SnapshotBroken, Snapshots
from lit_amp.serialization import load_checkpoint
from tests.helpers.pages import CACHE_ADVICE, resident_pages

ROWS, DIM = 3000, 8


class Net(nn.Module):
    def __init__(self, sparse: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(ROWS, DIM, sparse=sparse)
        self.head = nn.Linear(DIM, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids)).sum()


def _step(net: Net, opt: torch.optim.Optimizer, ids: list[int]) -> None:
    opt.zero_grad(set_to_none=True)
    net(torch.tensor(ids)).backward()
    opt.step()


def _state(net: Net, opt: torch.optim.Optimizer) -> dict:
    return {"state_dict": net.state_dict(), "optimizer": opt.state_dict(), "meta": {"step": 1}}


def _clone(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clone(v) for v in obj]
    return obj


def _assert_same(a, b, where="") -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}/{i}")
    else:
        assert a == b, where


def _write_while_training(snap, path, during) -> dict:
    """Write ``snap`` in a thread; once its first chunk of table rows is written, run
    ``during()`` (training steps) before the writer goes on. Returns the file's content."""
    started, go = threading.Event(), threading.Event()
    overlay, as_bytes = snapshot_mod.Protected.overlay, snapshot_mod.as_bytes
    chunks = []

    def counted(self, *args):
        chunks.append(args)
        return overlay(self, *args)

    def paused(t):  # called outside the snapshot's lock, as each piece is written
        if chunks and not started.is_set():
            started.set()
            go.wait(30)
        return as_bytes(t)

    errors = []

    def run():
        try:
            snap.write(path)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
            started.set()

    snapshot_mod.Protected.overlay, snapshot_mod.as_bytes = counted, paused
    try:
        writer = threading.Thread(target=run)
        writer.start()
        assert started.wait(30)
        during()
        go.set()
        writer.join(60)
    finally:
        snapshot_mod.Protected.overlay, snapshot_mod.as_bytes = overlay, as_bytes
    if errors:
        raise errors[0]
    assert len(chunks) > 2  # the rows were written in several chunks, around the steps
    return torch.load(path, weights_only=True)


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(snapshot_mod, "CHUNK_BYTES", 16 * 1024)


@pytest.mark.parametrize("make_opt", [
    lambda p: LazyAdam(p, lr=0.1),
    lambda p: torch.optim.Adagrad(p, lr=0.1),
    lambda p: torch.optim.SparseAdam(list(p)[:1], lr=0.1),
], ids=["LazyAdam", "Adagrad", "SparseAdam"])
def test_the_file_holds_the_state_at_take_while_steps_change_rows(tmp_path, small_chunks,
                                                                 make_opt):
    net = Net()
    opt = make_opt(net.parameters())
    _step(net, opt, [1, 5, 2900])  # the optimizer state exists
    snaps = Snapshots([opt], min_protected_bytes=10_000)
    expected = _clone(_state(net, opt))
    snap = snaps.take(_state(net, opt))
    assert snap.stats.protected == 1  # the table is not copied whole

    def train():  # rows in the part already written and in the part still to write
        for ids in ([1, 2, 3], [2999, 1500, 7], [1, 2998]):
            _step(net, opt, ids)

    got = _write_while_training(snap, tmp_path / "a.ckpt", train)
    _assert_same(expected, got)
    assert snap.stats.cow_rows >= 4  # rows 1500, 2998, 2999 (+ 7 maybe): copied aside
    assert not torch.equal(net.emb.weight.detach(), expected["state_dict"]["emb.weight"])
    snaps.remove()


def test_a_dense_gradient_copies_the_rows_not_yet_written(tmp_path, small_chunks):
    net = Net(sparse=False)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    snaps = Snapshots([opt], min_protected_bytes=10_000)
    expected = _clone(_state(net, opt))
    snap = snaps.take(_state(net, opt))
    got = _write_while_training(snap, tmp_path / "a.ckpt", lambda: _step(net, opt, [1, 2]))
    _assert_same(expected, got)
    assert snap.stats.cow_rows > ROWS // 2  # a dense gradient: every pending row
    snaps.remove()


def test_a_write_outside_an_optimizer_step_abandons_the_file(tmp_path, small_chunks):
    net = Net()
    opt = LazyAdam(net.parameters(), lr=0.1)
    snaps = Snapshots([opt], min_protected_bytes=10_000)
    snap = snaps.take(_state(net, opt))

    def outside():
        with torch.no_grad():
            net.emb.weight[2500].fill_(7.0)  # e.g. a module re-initialising a row itself

    with pytest.raises(SnapshotBroken, match="outside an optimizer step"):
        _write_while_training(snap, tmp_path / "a.ckpt", outside)
    assert os.listdir(tmp_path) == []  # no file, no temp file
    snaps.broken(snap)
    assert snaps.take(_state(net, opt)).stats.protected == 0  # cloned from now on
    snaps.remove()


@pytest.mark.parametrize("table", [True, False], ids=["protected_table", "cloned_param"])
def test_a_non_finite_weight_is_never_written(tmp_path, table):
    net = Net()
    opt = LazyAdam(net.parameters(), lr=0.1)
    snaps = Snapshots([opt], min_protected_bytes=10_000)
    with torch.no_grad():
        (net.emb.weight[2000] if table else net.head.bias).fill_(float("nan"))
    snap = snaps.take(_state(net, opt))
    name = "emb.weight" if table else "head.bias"
    with pytest.raises(RuntimeError, match=f"non-finite value in '{name}'"):
        snap.write(tmp_path / "a.ckpt")
    assert os.listdir(tmp_path) == []
    snaps.remove()


def test_containers_views_and_counters_are_frozen_at_take(tmp_path):
    base = torch.arange(12.0)
    inner = {"step": 3, "t": base}
    payload = {"state_dict": {"w": base.view(3, 4)}, "views": (base[2:5], 4),
               "nested": [inner, torch.ones(0)], "ints": torch.tensor([1, 2])}
    snap = Snapshots([]).take(payload)
    inner["step"] = 99  # an optimizer's counter moving on after the snapshot
    base.add_(100.0)  # small tensors are cloned at take
    snap.write(tmp_path / "a.ckpt")
    got = torch.load(tmp_path / "a.ckpt", weights_only=True)
    assert got["nested"][0]["step"] == 3 and torch.equal(got["nested"][0]["t"], torch.arange(12.0))
    assert torch.equal(got["state_dict"]["w"], torch.arange(12.0).view(3, 4))
    assert torch.equal(got["views"][0], torch.tensor([2.0, 3.0, 4.0])) and got["views"][1] == 4
    got["state_dict"]["w"][0, 0] = -1.0  # one storage, as torch.save keeps views
    assert got["nested"][0]["t"][0] == -1.0


def test_a_written_snapshot_frees_its_clones(tmp_path):
    """The clones a snapshot froze are freed once it is written, not when the next snapshot
    replaces it (at 26 M rows of collision-free ids: 5.3 GB kept alive between checkpoints)."""
    net = Net()
    opt = LazyAdam(net.parameters())
    snaps = Snapshots([opt], min_protected_bytes=1 << 40)  # every tensor is cloned
    snap = snaps.take(_state(net, opt))
    clones = [weakref.ref(t) for t in snap.payload["state_dict"].values()]
    assert clones and all(r() is not None for r in clones)
    snap.write(tmp_path / "a.ckpt")
    gc.collect()
    assert snap.payload is None and all(r() is None for r in clones)
    assert torch.load(tmp_path / "a.ckpt", weights_only=True)["state_dict"].keys() == \
        net.state_dict().keys()
    snaps.remove()


@CACHE_ADVICE
def test_a_written_snapshot_leaves_the_page_cache(tmp_path):
    """A checkpoint of gigabytes is written for a restart: once on disk, its pages are not
    kept in the page cache, where they would crowd out the memory training allocates."""
    net = Net()
    opt = LazyAdam(net.parameters())
    _step(net, opt, [1, 2])
    snaps = Snapshots([opt])
    snaps.take(_state(net, opt)).write(tmp_path / "a.ckpt")
    resident, pages = resident_pages(tmp_path / "a.ckpt")
    assert pages > 1 and resident < max(1, pages // 20), (resident, pages)
    snaps.remove()


def test_take_refuses_while_the_previous_snapshot_is_not_written():
    net = Net()
    opt = LazyAdam(net.parameters())
    snaps = Snapshots([opt], min_protected_bytes=10_000)
    first = snaps.take(_state(net, opt))
    with pytest.raises(RuntimeError, match="still being written"):
        snaps.take(_state(net, opt))
    first.release()
    snaps.take(_state(net, opt)).release()
    snaps.remove()


def test_only_the_tables_the_file_holds_are_followed(tmp_path, small_chunks):
    net = Net()
    opt = LazyAdam(net.parameters(), lr=0.1)
    _step(net, opt, [1, 2])
    snaps = Snapshots([opt], min_protected_bytes=10_000)
    expected = _clone({"state_dict": net.state_dict()})
    snap = snaps.take({"state_dict": net.state_dict()})  # no optimizer state in this file
    got = _write_while_training(snap, tmp_path / "a.ckpt",
                                lambda: _step(net, opt, [2999, 2998]))
    _assert_same(expected, got)
    assert snap.stats.protected == 1 and snap.stats.cow_bytes == 2 * DIM * 4  # weight rows only
    snaps.remove()


def _id_table() -> tuple[IdEmbedding, LazyAdam, Any]:
    """A full collision-free table (6,000 keys were offered to 4,000 rows) and its stepper."""
    torch.manual_seed(0)
    emb = IdEmbedding(4000, 8, num_features=2, sparse=True)
    opt = LazyAdam(emb.parameters(), lr=0.1)
    emb.attach(opt)  # a reused row's moments are zeroed before the next step
    g = torch.Generator().manual_seed(1)

    def step(n: int = 1, high: int = 3000) -> None:
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            emb(torch.randint(0, high, (256, 2), generator=g)).sum().backward()
            opt.step()

    step(40)
    assert int(emb.evictions) > 0
    return emb, opt, step


def test_an_id_embedding_is_copied_on_write_through_new_ids_and_evictions(tmp_path,
                                                                         small_chunks):
    emb, opt, step = _id_table()
    snaps = Snapshots([opt], network=emb, min_protected_bytes=10_000)
    payload = {"state_dict": emb.state_dict(), "optimizer": opt.state_dict()}
    expected = _clone(payload)
    snap = snaps.take(payload)
    # the table, its moments and its id map are not cloned (only the scalars are)
    assert snap.stats.protected == 2
    assert sum(c.nbytes() for c in snap._clones.values()) < 1000
    evictions = int(emb.evictions)
    # while the file is written: new ids take evicted rows (fresh weights, zeroed moments,
    # a new key in the id map), lookups count, and steps change rows
    got = _write_while_training(snap, tmp_path / "a.ckpt", lambda: step(10, high=10**6))
    assert int(emb.evictions) > evictions
    _assert_same(expected, got)
    assert snap.stats.cow_rows > 0
    snaps.remove()


def test_an_unannounced_write_to_an_id_map_abandons_the_file(tmp_path, small_chunks):
    emb, opt, step = _id_table()
    snaps = Snapshots([opt], network=emb, min_protected_bytes=10_000)
    snap = snaps.take({"state_dict": emb.state_dict(), "optimizer": opt.state_dict()})

    def outside():
        step()  # announced writes and a step are fine
        emb.row_count[3] += 1  # not announced: the snapshot cannot know what it was

    with pytest.raises(SnapshotBroken, match="outside an optimizer step"):
        _write_while_training(snap, tmp_path / "a.ckpt", outside)
    assert os.listdir(tmp_path) == []
    snaps.remove()


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads Linux's /proc")
def test_copy_on_write_bookkeeping_costs_memory_only_while_a_snapshot_is_written(tmp_path):
    """A table's map of rows copied aside (4 bytes a row: 104 MB at 26 M rows, two per
    IdEmbedding, one set per checkpoint writer and full-snapshot writer) is resident only
    where rows were copied, and only until the write is over (the margin: other allocations
    of the test process)."""
    rows = 32 << 20  # 128 MB of weights: an eager map would be 128 MB more
    emb = nn.Embedding(rows, 1, sparse=True)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)
    gc.collect()
    before = _rss_mb()
    snaps = Snapshots([opt])
    snap = snaps.take({"state_dict": emb.state_dict()})
    assert snap.stats.protected == 1
    assert _rss_mb() - before < 32
    emb(torch.arange(0, rows, rows // 64)).sum().backward()
    opt.step()  # 64 rows copied aside: 64 pages of the map at most
    assert _rss_mb() - before < 32
    snap.write(tmp_path / "a.ckpt")
    assert snap.stats.cow_rows == 64
    got = torch.load(tmp_path / "a.ckpt", weights_only=True)["state_dict"]["weight"]
    assert not torch.equal(got, emb.weight.detach())
    del got
    gc.collect()
    assert _rss_mb() - before < 32
    snaps.remove()


# ---------------------------------------------------------------------- row increments
def _chain_model() -> tuple[Net, LazyAdam, Snapshots]:
    net = Net()
    opt = LazyAdam(net.parameters(), lr=0.1)
    _step(net, opt, [0])  # the moments exist
    return net, opt, Snapshots([opt], min_protected_bytes=10_000, track_rows=True)


def _ckpt(net: Net, opt: torch.optim.Optimizer) -> dict:
    return {"state_dict": net.state_dict(), "optimizer_states": [opt.state_dict()]}


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(
    st.lists(st.lists(st.integers(0, ROWS - 1), min_size=1, max_size=6), max_size=3),
    st.booleans(), st.lists(st.integers(0, ROWS - 1), max_size=4), st.booleans()),
    min_size=1, max_size=6))
def test_a_chain_of_row_increments_reads_back_the_state_of_every_take(tmp_path_factory, plan):
    """Each round: steps, maybe a write outside a step, a take (a row increment of the
    previous file, or whole), more steps before and while it is written. Every file, read
    through its chain, holds the state of its take; an increment holds only changed rows."""
    tmp = tmp_path_factory.mktemp("chain")
    net, opt, snaps = _chain_model()
    prev, expected, before = None, {}, []
    for n, (steps, outside, during, whole) in enumerate(plan):
        for ids in steps:
            _step(net, opt, ids)
        if outside:
            with torch.no_grad():
                net.emb.weight[7] += 1.0  # not a step: the next file writes the table whole
        snap = snaps.take(_ckpt(net, opt), prev=None if whole else prev)
        name = f"{n}.ckpt"
        expected[name] = _clone(_ckpt(net, opt))
        assert snap.increment == (prev is not None and not whole and not outside)
        increment = snap.increment
        if during:
            _step(net, opt, during)  # before the write: copied aside (if in the file)
        snap.write(tmp / name)
        if increment:
            (_, rows), *_ = torch.load(tmp / name, weights_only=True)["lit_amp_rows"]["tensors"]
            changed = {i for ids in steps for i in ids} | set(before)
            assert set(rows.tolist()) == changed  # exactly the rows the steps touched
        before, prev = during, name
    for name, want in expected.items():
        got = load_checkpoint(str(tmp / name))
        _assert_same(want["state_dict"], got["state_dict"], name)
        _assert_same(want["optimizer_states"], got["optimizer_states"], name)
        assert "lit_amp_rows" not in got
    snaps.remove()


def _whole_then_increment(tmp_path) -> None:
    """``a.ckpt`` whole, then ``b.ckpt``: its row increment."""
    net, opt, snaps = _chain_model()
    snaps.take(_ckpt(net, opt)).write(tmp_path / "a.ckpt")
    _step(net, opt, [3, 4])
    snaps.take(_ckpt(net, opt), prev="a.ckpt").write(tmp_path / "b.ckpt")
    snaps.remove()


def test_a_row_increment_without_its_predecessor_is_refused(tmp_path):
    _whole_then_increment(tmp_path)
    os.remove(tmp_path / "a.ckpt")
    with pytest.raises(ValueError, match="'a.ckpt', which is missing: the chain"):
        load_checkpoint(str(tmp_path / "b.ckpt"))


def test_a_row_increment_after_a_file_of_another_run_of_that_name_is_refused(tmp_path):
    """A run resumed from an older checkpoint writes a whole file under the name a stale
    increment of the previous run follows: reading that increment must not mix the two."""
    _whole_then_increment(tmp_path)
    net2, opt2, snaps2 = _chain_model()
    snaps2.take(_ckpt(net2, opt2)).write(tmp_path / "a.ckpt")  # the resumed run's whole file
    with pytest.raises(ValueError, match="not the one it follows"):
        load_checkpoint(str(tmp_path / "b.ckpt"))
    snaps2.remove()


def test_a_row_increment_whose_predecessor_does_not_fit_is_refused(tmp_path):
    _whole_then_increment(tmp_path)
    chain_id = torch.load(tmp_path / "a.ckpt", weights_only=True)["lit_amp_chain_id"]
    torch.save({"state_dict": {"emb.weight": torch.zeros(2, DIM)},
                "lit_amp_chain_id": chain_id}, tmp_path / "a.ckpt")
    with pytest.raises(ValueError, match="do not fit the tensor of its predecessor"):
        load_checkpoint(str(tmp_path / "b.ckpt"))


def test_optimizer_state_replaced_between_takes_is_written_whole(tmp_path):
    """Not a step: a moment swapped for another tensor (as a load_state_dict that copies
    does) makes the next take write its table whole, holding the new values."""
    net, opt, snaps = _chain_model()
    snaps.take(_ckpt(net, opt)).write(tmp_path / "a.ckpt")
    _step(net, opt, [3])
    moment = opt.state[net.emb.weight]["exp_avg"].clone()
    moment[5] = 7.0
    opt.state[net.emb.weight]["exp_avg"] = moment
    snap = snaps.take(_ckpt(net, opt), prev="a.ckpt")
    assert not snap.increment
    snap.write(tmp_path / "b.ckpt")
    got = load_checkpoint(str(tmp_path / "b.ckpt"))["optimizer_states"][0]["state"][0]
    assert torch.equal(got["exp_avg"], moment)
    snaps.remove()
