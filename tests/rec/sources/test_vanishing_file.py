"""#28 item 11: a file that vanishes before it is read, and comes back, is read.

A producer that deletes and rewrites a file under the same name (a rename race, rsync
``--delay-updates``) must not lose it: the vanished name is not counted as consumed.
"""

from __future__ import annotations

import numpy as np

from lit_amp.rec.sources import DirectorySource, write_shard


def ids_of(batches) -> list[int]:
    return [i for f, _ in batches for i in f["record_id"].tolist()]


def _cols(first: int, n: int):
    return {
        "id": np.arange(first, first + n, dtype=np.int64),
        "label": np.zeros(n, dtype=np.float32),
        "dense": np.ones((n, 13), dtype=np.float32),
        "cat": np.ones((n, 26), dtype=np.int64),
    }


def _vanish_before_reading(monkeypatch, tmp_path, name: str, comeback):
    """Delete ``name`` just before the source first opens it, then call ``comeback()``."""
    original = DirectorySource._read
    state = {"done": False}

    def racing_read(self, fname, start):
        if fname == name and not state["done"]:
            state["done"] = True
            (tmp_path / name).unlink()
            out = original(self, fname, start)  # FileNotFoundError inside
            comeback()
            return out
        return original(self, fname, start)

    monkeypatch.setattr(DirectorySource, "_read", racing_read)


def test_a_file_rewritten_under_the_same_name_after_vanishing_is_read(tmp_path, monkeypatch):
    for k in range(3):
        write_shard(tmp_path, f"part-{k}", _cols(10 * k, 5))
    _vanish_before_reading(
        monkeypatch, tmp_path, "part-1.npz", lambda: write_shard(tmp_path, "part-1", _cols(100, 5))
    )
    src = DirectorySource(tmp_path, batch_size=5, max_idle_s=0.3, poll_interval=0.01)
    assert sorted(ids_of(src)) == [0, 1, 2, 3, 4, 20, 21, 22, 23, 24, 100, 101, 102, 103, 104]
    assert "part-1.npz" in src.state_dict()["done"]


def test_a_vanished_file_is_not_consumed_and_is_read_after_a_restart(tmp_path, monkeypatch):
    for k in range(3):
        write_shard(tmp_path, f"part-{k}", _cols(10 * k, 5))
    _vanish_before_reading(monkeypatch, tmp_path, "part-1.npz", lambda: None)
    src = DirectorySource(tmp_path, batch_size=5, max_idle_s=0.1, poll_interval=0.01)
    assert ids_of(src) == [0, 1, 2, 3, 4, 20, 21, 22, 23, 24]
    state = src.state_dict()
    assert "part-1.npz" not in state["done"] and "part-1.npz" not in state["partial"]
    write_shard(tmp_path, "part-1", _cols(100, 5))  # the producer writes it again
    again = DirectorySource(tmp_path, batch_size=5, max_idle_s=0.1, poll_interval=0.01)
    again.load_state_dict(state)
    assert ids_of(again) == [100, 101, 102, 103, 104]
