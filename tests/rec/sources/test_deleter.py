"""Consumed files deleted in the background: the training loop does not wait for unlinks,
nothing is deleted that was not read, and a run's end waits for the deletions."""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from lit_amp.rec.sources import DirectorySource, SyntheticClickSource, write_shard
from lit_amp.rec.sources.deleter import Deleter
from tests.rec._helpers import fill_dir
from tests.rec.sources.contract import ids_of


def test_checkpointed_returns_before_slow_unlinks_and_wait_cleanup_sees_them_done(
    tmp_path, monkeypatch
):
    fill_dir(tmp_path, 12, 4)
    src = DirectorySource(tmp_path, batch_size=4, max_idle_s=0.0, delete_consumed=True)
    assert len(list(src)) == 12
    real_remove = os.remove

    def slow_remove(path, *a, **k):  # a disk busy writing back a multi-GB checkpoint
        time.sleep(0.05)
        real_remove(path, *a, **k)

    monkeypatch.setattr(os, "remove", slow_remove)
    t0 = time.monotonic()
    src.checkpointed(src.state_dict())
    assert time.monotonic() - t0 < 0.05  # 12 unlinks x 50 ms would be 0.6 s
    assert src.wait_cleanup(10)
    assert src.files_deleted == 12
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_consumed_name_holding_a_new_file_is_kept_and_read(tmp_path):
    ids = fill_dir(tmp_path, 2, 4)
    src = DirectorySource(tmp_path, batch_size=4, max_idle_s=0.3, poll_interval=0.01,
                          delete_consumed=True)
    it = iter(src)
    first = ids_of([next(it), next(it)])
    state = src.state_dict()
    # the producer reuses a consumed name before the checkpoint covering it is durable
    new = SyntheticClickSource(batch_size=4, seed=1).columns(0)
    new["id"] = np.arange(1000, 1004, dtype=np.int64)
    time.sleep(0.01)  # another mtime
    write_shard(tmp_path, "part-000000", new)
    src.checkpointed(state)
    assert src.wait_cleanup(10)
    assert (tmp_path / "part-000000.npz").exists()  # not the file that was read: kept
    assert not (tmp_path / "part-000001.npz").exists()
    assert src.files_deleted == 1
    assert ids_of(it) == new["id"].tolist()  # ... and read as a new file
    assert first == ids


def test_wait_times_out_while_an_unlink_hangs_and_a_failure_is_counted_not_raised(
    tmp_path, monkeypatch, caplog
):
    (tmp_path / "a.npz").write_text("x")
    (tmp_path / "b.npz").mkdir()  # os.remove fails on a folder
    gate = threading.Event()
    real_remove = os.remove

    def gated_remove(path, *a, **k):
        gate.wait(10)
        real_remove(path, *a, **k)

    monkeypatch.setattr(os, "remove", gated_remove)
    deleter = Deleter(tmp_path, "test")
    deleter.submit([("a.npz", None), ("b.npz", None)])
    assert not deleter.wait(0.05)
    gate.set()
    assert deleter.wait(10)
    assert (deleter.deleted, deleter.failed) == (1, 1)
    assert "could not delete consumed b.npz" in caplog.text
    assert deleter.take_gone() == {"a.npz"} and deleter.take_gone() == set()


def test_a_file_deleted_while_the_folder_is_listed_is_not_taken_for_a_new_one(
    tmp_path, caplog
):
    """The deletion runs in another thread: a consumed file deleted just after the listing
    saw it is still consumed (before: it was taken for a new file, read again and logged as
    vanished)."""
    ids = fill_dir(tmp_path, 3, 4)
    src = DirectorySource(tmp_path, batch_size=4, max_idle_s=0.0, delete_consumed=True)
    it = iter(src)
    next(it), next(it)
    state = src.state_dict()
    listed = src._list

    def list_then_delete():
        names = listed()  # the listing sees part-000000 and part-000001 ...
        src.checkpointed(state)  # ... which are deleted right after it
        assert src.wait_cleanup(10)
        return names

    src._list = list_then_delete
    done, new = src._new_files(state["done"], set(), 0, 1)
    assert sorted(done) == ["part-000000.npz", "part-000001.npz"]
    assert new == ["part-000002.npz"]
    src._list = listed
    assert ids_of(it) == ids[8:] and "vanished" not in caplog.text
