"""Full snapshots written in the background (``DeltaPublisher(background=True)``,
``lit_amp.rec.serving.full_snapshots``): training goes on during the write, the file holds the
weights of its version, readers never see a version whose chain is not on disk, and a torn or
failed full snapshot costs a reader nothing but the replay of more deltas."""

from __future__ import annotations

import os

import pytest
import torch

from lit_amp.rec.serving.full_snapshots import streamable
from lit_amp.rec.serving.reader import latest_published, load_published
from lit_amp.rec.serving.writer import DeltaPublisher
from tests.rec._helpers import sparse_table, touch_rows

ROWS = 100_000  # 3.2 MB of fp32 rows of width 8: copied on write, not cloned


def _table(seed: int = 0):
    return sparse_table(ROWS, seed)


def _publisher(emb, opt, d, **kw) -> DeltaPublisher:
    pub = DeltaPublisher(emb, d, background=True, **kw)
    pub.attach(opt)
    return pub


def _first_full_on_disk(d, held_full_writes, **kw):
    """A table, its optimizer and a background publisher whose first full snapshot is written."""
    emb, opt = _table()
    pub = _publisher(emb, opt, d, **kw)
    held_full_writes.set()
    pub.publish(step=1)
    pub.close()
    return emb, opt, pub


def _full(d, version: int) -> torch.Tensor:
    return torch.load(os.path.join(d, f"full-{version:012d}.pt"), weights_only=True)[
        "network"]["weight"]


def test_the_first_full_snapshot_is_written_while_training_goes_on(tmp_path, held_full_writes):
    emb, opt = _table()
    pub = _publisher(emb, opt, tmp_path)
    at_publish = emb.weight.detach().clone()
    pub.publish(step=1)
    assert pub.last_kind == "full"
    for step in range(2, 5):  # training goes on while the full snapshot waits to be written
        touch_rows(emb, opt, torch.randint(0, ROWS, (500,)))
        pub.publish(step=step)
        assert pub.last_kind == "delta"
        assert latest_published(tmp_path) is None  # no full snapshot on disk yet
    held_full_writes.set()
    pub.close()
    assert torch.equal(_full(tmp_path, 1), at_publish)  # the weights of its version
    assert os.path.basename(latest_published(tmp_path)) == "delta-000000000004.pt"
    payload = load_published(tmp_path)
    assert payload["version"] == 4 and payload["refused"] is None
    assert torch.equal(payload["network"]["weight"], emb.weight)


def test_a_compaction_keeps_the_chain_and_readers_fresh_during_its_write(
        tmp_path, held_full_writes):
    emb, opt, pub = _first_full_on_disk(tmp_path, held_full_writes, full_every_n_publishes=3)
    states = {}
    held_full_writes.clear()
    for v in range(2, 6):  # full 3 is due at version 4 and written while 5 is published
        touch_rows(emb, opt, [v, 1000 + v])
        pub.publish(step=v)
        states[v] = emb.weight.detach().clone()
        pub.poll(wait=True)  # the delta, written by a thread, is on disk
        payload = load_published(tmp_path)
        assert payload["version"] == v and torch.equal(payload["network"]["weight"], states[v])
    names = sorted(os.listdir(tmp_path))
    assert "delta-000000000004.pt" in names and "full-000000000004.pt" not in names
    held_full_writes.set()
    pub.close()
    assert torch.equal(_full(tmp_path, 4), states[4])
    # a reader polling from version 5 goes on with deltas; a new reader starts at full 4
    assert load_published(tmp_path, since=payload) is payload
    loaded = load_published(tmp_path)
    assert loaded["full"] == 4 and torch.equal(loaded["network"]["weight"], states[5])


def test_a_torn_or_unchecked_full_snapshot_falls_back_to_the_older_one(tmp_path, held_full_writes):
    emb, opt = _table()
    pub = _publisher(emb, opt, tmp_path, full_every_n_publishes=2)
    held_full_writes.set()
    for v in range(1, 5):  # full 1, delta 2, delta+full 3 (same chain), delta 4
        touch_rows(emb, opt, [v])
        pub.publish(step=v)
        pub.close()
    assert {"full-000000000003.pt", "full-000000000003.pt.crc", "delta-000000000003.pt"} <= \
        set(os.listdir(tmp_path))
    os.remove(tmp_path / "full-000000000003.pt.crc")
    payload = load_published(tmp_path)
    assert payload["full"] == 1 and payload["version"] == 4 and payload["refused"] is None
    assert torch.equal(payload["network"]["weight"], emb.weight)
    (tmp_path / "full-000000000003.pt.crc").write_text("12345\n")  # not its checksum
    assert load_published(tmp_path)["full"] == 1


def test_a_failed_background_write_is_raised_and_the_next_publish_retries(tmp_path,
                                                                          monkeypatch):
    emb, opt = _table()
    pub = _publisher(emb, opt, tmp_path)

    def disk_full(path, fill):
        raise OSError("disk full")

    monkeypatch.setattr("lit_amp.rec.serving.full_snapshots.atomic_write", disk_full)
    pub.publish(step=1)
    pub._writer.pending[0].exception()  # the write has failed
    monkeypatch.undo()
    touch_rows(emb, opt, [3])
    with pytest.raises(OSError, match="disk full"):
        pub.publish(step=2)
    assert latest_published(tmp_path) is None
    touch_rows(emb, opt, [4])
    pub.publish(step=3)  # version 2 (the failed publish wrote none): another full snapshot
    pub.close()
    payload = load_published(tmp_path)
    assert payload["full"] == payload["version"] == 2 and payload["step"] == 3
    assert torch.equal(payload["network"]["weight"], emb.weight)


def test_latest_waits_for_a_version_whose_only_file_is_a_pending_full(tmp_path, held_full_writes):
    emb, opt, pub = _first_full_on_disk(tmp_path, held_full_writes, max_delta_fraction=0.01)
    held_full_writes.clear()
    touch_rows(emb, opt, torch.arange(5000))  # 5 % of the rows: a full snapshot, no delta
    pub.publish(step=2)
    touch_rows(emb, opt, [7])
    pub.publish(step=3)  # a delta on version 2, which is not on disk yet
    assert os.path.basename(latest_published(tmp_path)) == "full-000000000001.pt"
    held_full_writes.set()
    pub.close()
    payload = load_published(tmp_path)
    assert payload["version"] == 3 and payload["refused"] is None
    assert torch.equal(payload["network"]["weight"], emb.weight)


def test_a_shared_storage_is_written_by_the_loop(tmp_path):
    a = torch.zeros(4, 2)
    assert streamable({"a": a}) and not streamable({"a": a, "b": a[1:]})
    tied = torch.nn.Module()
    tied.x = torch.nn.Linear(2, 2)
    tied.register_buffer("y", tied.x.weight.detach())  # the same storage twice
    pub = DeltaPublisher(tied, tmp_path, background=True)
    pub.publish(step=1)
    assert pub._writer is None and os.path.exists(tmp_path / "full-000000000001.pt")
    assert load_published(tmp_path)["version"] == 1
