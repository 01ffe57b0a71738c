"""#48 items 14-15: odd entries in a DirectorySource folder: symbolic links (never followed,
skipped once, never a crash) and file names that are not valid UTF-8 (read, sharded and
checkpointed like any other name)."""

from __future__ import annotations

import json
import os
import pickle
import zlib

import numpy as np
import pytest

from lit_amp.rec import StopOptions
from lit_amp.rec.sources import DirectorySource, SyntheticClickSource, shard_of, write_shard
from tests.rec._helpers import make_model

BAD_NAME = os.fsdecode(b"part-\xff\xfe.jsonl")  # not UTF-8: a lone surrogate in the str


def _cols(first: int, n: int):
    cols = SyntheticClickSource(batch_size=n, seed=0).columns(0)
    cols["id"] = np.arange(first, first + n, dtype=np.int64)
    return cols


def _dead(directory) -> list[dict]:
    path = os.path.join(directory, "_dead_letter.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(x) for x in f.read().splitlines()]


def _ids(batches) -> list[int]:
    return sorted(i for f, _ in batches for i in f["record_id"].tolist())


def test_online_train_skips_symlinks_and_trains_the_good_file_beside_them(tmp_path):
    """A symlink loop crashed ``online_train`` (``OSError: [Errno 40]``) and the good file
    beside it was never trained; a symlink to a file outside the folder was followed and its
    lines were copied into the dead-letter file. Now no symlink is followed: each is
    dead-lettered once (its name, never its target's content) and the good file is trained."""
    data, outside = tmp_path / "data", tmp_path / "outside"
    data.mkdir()
    outside.mkdir()
    secret = outside / "secret.jsonl"
    secret.write_text("password=hunter2\n" * 3)
    os.symlink("loop.jsonl", data / "loop.jsonl")  # a loop onto itself
    os.symlink(data / "b.jsonl", data / "a.jsonl")  # a two-link loop
    os.symlink(data / "a.jsonl", data / "b.jsonl")
    os.symlink(secret, data / "leak.jsonl")  # leaves the folder
    write_shard(outside, "part-9", _cols(900, 4), "jsonl")
    os.symlink(outside / "part-9.jsonl", data / "part-9.jsonl")  # a valid file, outside
    write_shard(data, "part-0", _cols(0, 8), "jsonl")
    src = DirectorySource(data, batch_size=4, max_idle_s=0.2, poll_interval=0.01)
    summary = make_model().online_train(
        src, dataset_sink_mode=False, stop=StopOptions(max_steps=50)
    )
    assert summary.records == 8  # part-0 alone: no link is followed
    assert summary.stop_reason == "idle_timeout"
    dead = _dead(data)
    skipped = sorted(d["position"]["file"] for d in dead)
    assert skipped == ["a.jsonl", "b.jsonl", "leak.jsonl", "loop.jsonl", "part-9.jsonl"]
    assert all(d["position"]["row"] is None and "symbolic link" in d["error"] for d in dead)
    assert "hunter2" not in (data / "_dead_letter.jsonl").read_text()
    assert src.malformed == 5


def test_a_symlink_is_skipped_once_across_passes_and_a_link_swapped_in_is_not_read(tmp_path):
    """Every listing sees the links again: each is dead-lettered once per source object. A
    file replaced by a link between the listing and the read is not followed either."""
    write_shard(tmp_path, "part-1", _cols(10, 3), "jsonl")
    os.symlink("nowhere.jsonl", tmp_path / "dangling.jsonl")
    src = DirectorySource(tmp_path, batch_size=4, max_idle_s=0.05, poll_interval=0.01)
    assert _ids(src) == [10, 11, 12]
    assert _ids(src) == []  # a second pass: nothing new, the link not dead-lettered again
    assert [d["position"]["file"] for d in _dead(tmp_path)] == ["dangling.jsonl"]

    # the race: part-2 is listed as a regular file, then swapped for a link before the read
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    write_shard(outside, "x", _cols(500, 2), "jsonl")
    write_shard(tmp_path, "part-2", _cols(20, 2), "jsonl")
    real_read = DirectorySource._read

    def swap_then_read(self, name, start):
        if name == "part-2.jsonl":
            os.unlink(tmp_path / name)
            os.symlink(outside / "x.jsonl", tmp_path / name)
        return real_read(self, name, start)

    src2 = DirectorySource(tmp_path, batch_size=4, max_idle_s=0.05, poll_interval=0.01)
    src2.load_state_dict(src.state_dict())
    DirectorySource._read = swap_then_read
    try:
        got = _ids(src2)
    finally:
        DirectorySource._read = real_read
    assert got == []  # the link's target (500, 501) is not read
    assert not any("500" in json.dumps(d) for d in _dead(tmp_path))


def test_a_non_utf8_file_name_is_read_and_its_cursor_survives_a_checkpoint(tmp_path):
    """One process handled a file name that is not valid UTF-8; the cursor holding it must
    pickle (a checkpoint) and restore."""
    raw = os.path.join(os.fsencode(tmp_path), os.fsencode(BAD_NAME))
    with open(raw, "wb") as f:
        f.write(_jsonl(_cols(0, 3)))
    src = DirectorySource(tmp_path, batch_size=2, max_idle_s=0.05, poll_interval=0.01)
    assert _ids(src) == [0, 1, 2]
    state = pickle.loads(pickle.dumps(src.state_dict()))
    assert BAD_NAME in state["done"]
    again = DirectorySource(tmp_path, batch_size=2, max_idle_s=0.05, poll_interval=0.01)
    again.load_state_dict(state)
    assert _ids(again) == []


@pytest.mark.parametrize("world", [2, 3, 8])
def test_shard_of_takes_any_file_name_and_agrees_with_utf8_for_valid_ones(world):
    """``shard_of`` hashed ``name.encode()``: a name that is not valid UTF-8 (a lone surrogate
    from ``os.listdir``) raised ``UnicodeEncodeError`` on every DDP rank. It hashes the name's
    bytes on disk now; valid names keep their shard."""
    assert shard_of(BAD_NAME, world) == zlib.crc32(b"part-\xff\xfe.jsonl") % world
    for name in ("part-000001.npz", "donn\u00e9es-\u00e9.jsonl", "x.pt"):
        assert shard_of(name, world) == zlib.crc32(name.encode()) % world


def test_each_rank_reads_its_share_of_a_folder_with_a_non_utf8_name(tmp_path):
    """Two readers sharded as ranks of 2 (what DDP does) over a folder with a name that is
    not valid UTF-8: no ``UnicodeEncodeError``, every record read once."""
    with open(os.path.join(os.fsencode(tmp_path), os.fsencode(BAD_NAME)), "wb") as f:
        f.write(_jsonl(_cols(0, 3)))
    for i in range(1, 5):
        write_shard(tmp_path, f"part-{i}", _cols(10 * i, 2), "jsonl")
    got = []
    for r in (0, 1):
        got += _ids(DirectorySource(tmp_path, batch_size=4, max_idle_s=0.05, poll_interval=0.01,
                                    rank=r, world_size=2))
    assert sorted(got) == [0, 1, 2, 10, 11, 20, 21, 30, 31, 40, 41]


def _jsonl(cols) -> bytes:
    from lit_amp.rec.sources.schema import ClickSchema

    return ClickSchema().to_json_lines(cols)
