"""#18 items 12-13 (folder side): reused names, unreadable files retried, special files
skipped, dead-letter entries bounded (the idle clock of every source: test_contract.py)."""

from __future__ import annotations

import builtins
import json
import os
import threading

import numpy as np

import lit_amp.rec.sources.directory as directory_mod
from lit_amp.rec.sources import DirectorySource, SyntheticClickSource, write_shard
from tests.faults._servers import line, record


def ids_of(batches) -> list[int]:
    return [i for f, _ in batches for i in f["record_id"].tolist()]


def _cols(first: int, n: int):
    cols = SyntheticClickSource(batch_size=n, seed=0).columns(0)
    cols["id"] = np.arange(first, first + n, dtype=np.int64)
    return cols


def test_a_new_file_reusing_a_deleted_consumed_name_is_read(tmp_path):
    write_shard(tmp_path, "part-0", _cols(0, 5))
    src = DirectorySource(tmp_path, batch_size=5, max_idle_s=0.3, poll_interval=0.01,
                          delete_consumed=True)
    it = iter(src)
    assert next(it)[0]["record_id"].tolist() == [0, 1, 2, 3, 4]
    src.checkpointed(src.state_dict())  # a durable checkpoint: part-0 is deleted
    assert src.wait_cleanup(10)
    assert not (tmp_path / "part-0.npz").exists()
    write_shard(tmp_path, "part-0", _cols(100, 5))  # the producer reuses the name
    assert ids_of(it) == [100, 101, 102, 103, 104]


def test_a_file_failing_with_permission_denied_is_retried_not_consumed(tmp_path, monkeypatch):
    (tmp_path / "part-0.jsonl").write_bytes(b"".join(line(record(i)) for i in range(4)))
    fails = {"left": 2}

    def flaky_open(path, *a, **k):
        if str(path).endswith("part-0.jsonl") and fails["left"]:
            fails["left"] -= 1
            raise PermissionError(13, "Permission denied", str(path))
        return builtins.open(path, *a, **k)

    monkeypatch.setattr(directory_mod, "open", flaky_open, raising=False)
    src = DirectorySource(tmp_path, batch_size=10, max_idle_s=0, poll_interval=0.01)
    assert ids_of(src) == [0, 1, 2, 3]
    assert src.malformed == 0


def test_a_file_that_stays_unreadable_is_dead_lettered_after_retries(tmp_path, monkeypatch):
    (tmp_path / "part-0.jsonl").write_bytes(line(record(0)))
    (tmp_path / "part-1.jsonl").write_bytes(line(record(1)))

    def denied(path, *a, **k):
        if str(path).endswith("part-0.jsonl"):
            raise PermissionError(13, "Permission denied", str(path))
        return builtins.open(path, *a, **k)

    monkeypatch.setattr(directory_mod, "open", denied, raising=False)
    src = DirectorySource(tmp_path, batch_size=10, max_idle_s=0, poll_interval=0.01)
    assert ids_of(src) == [1]
    dead = [json.loads(x) for x in (tmp_path / "_dead_letter.jsonl").read_text().splitlines()]
    assert len(dead) == 1 and "attempts" in dead[0]["error"]
    assert "part-0.jsonl" in src.state_dict()["done"]


def test_a_fifo_in_the_folder_is_skipped_with_a_dead_letter_entry(tmp_path):
    os.mkfifo(tmp_path / "part-0.jsonl")
    (tmp_path / "part-1.jsonl").write_bytes(line(record(7)))
    src = DirectorySource(tmp_path, batch_size=10, max_idle_s=0)
    out = []
    t = threading.Thread(target=lambda: out.append(ids_of(src)), daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():  # unblock the reader so the test process can end
        fd = os.open(tmp_path / "part-0.jsonl", os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    assert out == [[7]], "the reader hung on the FIFO"
    dead = [json.loads(x) for x in (tmp_path / "_dead_letter.jsonl").read_text().splitlines()]
    assert dead[0]["position"] == {"file": "part-0.jsonl", "row": None}
    assert "regular" in dead[0]["error"]


def test_dead_letter_entries_are_bounded_in_size(tmp_path):
    huge_dense = json.dumps({"id": 1, "label": 0, "dense": [1] * 200_000, "cat": [1] * 26})
    control = "\x01" * 100_000
    (tmp_path / "part-0.jsonl").write_text(huge_dense + "\n" + control + "\n")
    src = DirectorySource(tmp_path, batch_size=10, max_idle_s=0)
    assert ids_of(src) == []
    lines = (tmp_path / "_dead_letter.jsonl").read_text().splitlines()
    assert len(lines) == 2
    assert all(len(x) < 16_384 for x in lines), [len(x) for x in lines]


def test_a_consumed_file_replaced_under_the_same_name_is_read_again(tmp_path):
    write_shard(tmp_path, "part-0", _cols(0, 5))
    src = DirectorySource(tmp_path, batch_size=5, max_idle_s=0.3, poll_interval=0.01)
    it = iter(src)
    assert next(it)[0]["record_id"].tolist() == [0, 1, 2, 3, 4]
    write_shard(tmp_path, "part-0", _cols(200, 5))  # os.replace: a new file, same name
    assert ids_of(it) == [200, 201, 202, 203, 204]
