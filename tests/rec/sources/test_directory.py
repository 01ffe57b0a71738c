"""DirectorySource: formats, order, sharding, its cursor, late files, deletion, dead letters of
``.npz`` shards (what every source must do is in test_contract.py)."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
import torch

from lit_amp.rec.sources import DirectorySource, SyntheticClickSource, shard_of, write_shard
from tests.rec._helpers import fill_dir


def ids_of(batches) -> list[int]:
    return [i for f, _ in batches for i in f["record_id"].tolist()]


@pytest.mark.parametrize("fmt", ["npz", "pt", "jsonl"])
def test_reads_every_format_in_name_order_batched_across_files(tmp_path, fmt):
    gen = SyntheticClickSource(batch_size=5, seed=0)
    for i in (2, 0, 1):  # written out of order: read in name order
        write_shard(tmp_path, f"part-{i:06d}", gen.columns(i), fmt)
    src = DirectorySource(tmp_path, batch_size=4, max_idle_s=0)
    batches = list(src)
    assert [len(y) for _, y in batches] == [4, 4, 4, 3]
    assert ids_of(batches) == list(range(15))
    f, y = batches[0]
    assert f["dense"].dtype == torch.float32 and f["cat"].dtype == torch.int64
    assert torch.equal(f["dense"], torch.from_numpy(gen.columns(0)["dense"][:4]))


def test_ignores_hidden_temporary_and_foreign_files(tmp_path):
    fill_dir(tmp_path, 1, 3)
    (tmp_path / ".part-000009.npz.tmp").write_bytes(b"half written")
    (tmp_path / "_SUCCESS").write_text("")
    (tmp_path / "notes.txt").write_text("hello")
    assert ids_of(DirectorySource(tmp_path, batch_size=10, max_idle_s=0)) == [0, 1, 2]


def test_cursor_restore_continues_exactly(tmp_path):
    all_ids = fill_dir(tmp_path, 5, 7)
    src = DirectorySource(tmp_path, batch_size=5, max_idle_s=0)
    it = iter(src)
    first = [next(it) for _ in range(3)]  # 15 records: files 0, 1 done, file 2 partial
    state = src.state_dict()
    assert state["done"] == {"part-000000.npz", "part-000001.npz"}
    assert state["partial"] == {"part-000002.npz": 1}
    it.close()
    again = DirectorySource(tmp_path, batch_size=5, max_idle_s=0)
    plain = {"done": sorted(state["done"]), "partial": state["partial"]}
    again.load_state_dict(json.loads(json.dumps(plain)))  # a JSON-ed cursor works too
    rest = list(again)
    assert ids_of(first) + ids_of(rest) == all_ids


def test_cursor_is_the_position_of_the_last_batch_yielded(tmp_path):
    fill_dir(tmp_path, 2, 4)
    src = DirectorySource(tmp_path, batch_size=4, max_idle_s=0)
    it = iter(src)
    next(it)
    state = src.state_dict()
    assert (state["done"], state["partial"]) == ({"part-000000.npz"}, {})
    assert "part-000000.npz" in state["sigs"]  # its identity, for a restart
    next(it)
    assert src.state_dict()["done"] == {"part-000000.npz", "part-000001.npz"}


def test_sharding_is_disjoint_complete_and_stable(tmp_path):
    all_ids = fill_dir(tmp_path, 12, 3)
    parts = [
        ids_of(DirectorySource(tmp_path, batch_size=3, max_idle_s=0, rank=r, world_size=3))
        for r in range(3)
    ]
    assert sorted(sum(parts, [])) == sorted(all_ids)
    assert all(parts) and sum(len(p) for p in parts) == len(all_ids)
    # a file's shard depends on its name only, not on what else is in the folder
    names = sorted(os.listdir(tmp_path))
    for r, ids in enumerate(parts):
        mine = [n for n in names if n.endswith(".npz") and shard_of(n, 3) == r]
        assert len(ids) == 3 * len(mine)


def test_sharding_by_dataloader_worker(tmp_path):
    all_ids = fill_dir(tmp_path, 6, 4)
    src = DirectorySource(tmp_path, batch_size=4, max_idle_s=0)
    loader = torch.utils.data.DataLoader(src, batch_size=None, num_workers=2)
    got = [i for f, _ in loader for i in f["record_id"].tolist()]
    assert sorted(got) == all_ids  # each file read once, by one of the two workers


def test_late_file_with_a_smaller_name_is_still_read(tmp_path):
    fill_dir(tmp_path, 1, 4, start=5)
    src = DirectorySource(tmp_path, batch_size=4, max_idle_s=0.5, poll_interval=0.02)
    it = iter(src)
    first = next(it)
    fill_dir(tmp_path, 1, 4, start=1)  # lands after part-000005 was read
    rest = list(it)
    assert sorted(ids_of([first, *rest])) == list(range(4, 8)) + list(range(20, 24))


def test_drop_last_leaves_the_records_in_the_cursor(tmp_path):
    fill_dir(tmp_path, 1, 5)
    src = DirectorySource(tmp_path, batch_size=4, max_idle_s=0, drop_last=True)
    assert [len(y) for _, y in src] == [4]
    assert src.state_dict()["partial"] == {"part-000000.npz": 4}


def test_linger_yields_a_partial_batch_while_waiting(tmp_path):
    fill_dir(tmp_path, 1, 3)
    src = DirectorySource(tmp_path, batch_size=100, linger_s=0.1, poll_interval=0.02)
    it = iter(src)
    t0 = time.monotonic()
    f, y = next(it)
    assert len(y) == 3 and 0.05 < time.monotonic() - t0 < 3
    it.close()


def test_idle_hook_ends_iteration(tmp_path):
    src = DirectorySource(tmp_path / "not-yet", batch_size=4, poll_interval=0.01)
    calls = []
    src.bind_idle(lambda: calls.append(1) or len(calls) >= 3)
    assert list(src) == []
    assert len(calls) == 3


def test_malformed_records_are_dead_lettered_with_their_position(tmp_path):
    good = json.dumps({"id": 1, "label": 0, "dense": [1.0] * 13, "cat": [3] * 26})
    lines = [
        good,
        "{not json",
        json.dumps({"id": 2, "label": 7, "dense": [1.0] * 13, "cat": [3] * 26}),
        json.dumps({"id": 3, "label": 1, "dense": [1.0] * 12, "cat": [3] * 26}),
        "",
        json.dumps({"id": 4, "label": 1, "dense": [None] * 13, "cat": ["a1b2"] * 26}),
    ]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    cols = SyntheticClickSource(batch_size=4, seed=1).columns(0)
    cols["label"][1] = 5.0
    cols["dense"][2, 0] = np.nan
    write_shard(tmp_path, "b", cols, "npz")
    (tmp_path / "c.npz").write_bytes(b"this is not a zip file")
    src = DirectorySource(tmp_path, batch_size=10, max_idle_s=0)
    got = ids_of(src)
    assert got == [1, 4, 0, 3]  # valid records of a.jsonl, then of b.npz
    assert src.malformed == 6
    dead = [json.loads(x) for x in (tmp_path / "_dead_letter.jsonl").read_text().splitlines()]
    assert [d["position"] for d in dead] == [
        {"file": "a.jsonl", "row": 1},
        {"file": "a.jsonl", "row": 2},
        {"file": "a.jsonl", "row": 3},
        {"file": "b.npz", "row": 1},
        {"file": "b.npz", "row": 2},
        {"file": "c.npz", "row": None},
    ]
    assert dead[0]["record"] == "{not json" and "label" in dead[1]["error"]
    assert src.state_dict()["done"] == {"a.jsonl", "b.npz", "c.npz"}


def test_a_shard_with_a_flipped_byte_is_dead_lettered_whole_and_its_neighbours_trained(
        tmp_path):
    """A bit flipped on disk in a shard's array bytes: the zip checksum refuses the file (one
    dead letter), never trained with the wrong value."""
    gen = SyntheticClickSource(batch_size=4, seed=1)
    for i in range(3):
        write_shard(tmp_path, f"part-{i}", gen.columns(i))
    path = tmp_path / "part-1.npz"
    data = bytearray(path.read_bytes())
    data[190] ^= 0x04  # an id of the first member (its array starts at byte 184)
    path.write_bytes(bytes(data))
    src = DirectorySource(tmp_path, batch_size=4, max_idle_s=0)
    assert ids_of(src) == [0, 1, 2, 3, 8, 9, 10, 11]
    dead = [json.loads(x) for x in (tmp_path / "_dead_letter.jsonl").read_text().splitlines()]
    assert [d["position"] for d in dead] == [{"file": "part-1.npz", "row": None}]
    assert "CRC" in dead[0]["error"] and src.malformed == 1


def test_restored_cursor_does_not_dead_letter_consumed_rows_again(tmp_path):
    cols = SyntheticClickSource(batch_size=6, seed=1).columns(0)
    cols["label"][1] = 5.0
    cols["label"][4] = 5.0
    write_shard(tmp_path, "b", cols, "npz")
    src = DirectorySource(tmp_path, batch_size=2, max_idle_s=0)
    src.load_state_dict({"done": [], "partial": {"b.npz": 3}})
    assert ids_of(src) == [3, 5]
    assert src.malformed == 1  # row 4 only


def test_bad_arguments():
    with pytest.raises(ValueError, match="'batch_size' must be a positive int"):
        DirectorySource(".", batch_size=0)
    with pytest.raises(ValueError, match="'suffixes' must be a non-empty subset"):
        DirectorySource(".", suffixes=("csv",))
    with pytest.raises(ValueError, match="'max_idle_s'"):
        DirectorySource(".", max_idle_s=-1)
    with pytest.raises(TypeError, match="'state' must be a dict"):
        DirectorySource(".").load_state_dict([1])
    with pytest.raises(ValueError, match="'fmt' must be one of"):
        write_shard(".", "x", {}, "csv")
    with pytest.raises(ValueError, match="must be a file stem"):
        write_shard(".", ".hidden", {}, "npz")


def test_merge_state_dicts_for_a_new_world_size():
    merged = DirectorySource.merge_state_dicts(
        [{"done": ["a", "c"], "partial": {"d": 3}}, {"done": ["b"], "partial": {"c": 9}}]
    )
    assert merged == {"done": ["a", "b", "c"], "partial": {"d": 3}}


def test_checkpointed_deletes_only_consumed_files_it_would_read(tmp_path):
    fill_dir(tmp_path, 3, 4)
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / ".part-9.npz.tmp").write_text("x")
    src = DirectorySource(tmp_path, batch_size=4, max_idle_s=0.0, delete_consumed=True)
    it = iter(src)
    next(it)  # part-000000 consumed
    state = src.state_dict()
    assert sorted(state["done"]) == ["part-000000.npz"]
    # a tampered cursor: names with a path, hidden files, other suffixes, missing files
    state = {"done": [*state["done"], "../x.npz", ".part-9.npz.tmp", "notes.txt", "gone.npz"]}
    src.checkpointed(state)
    assert src.wait_cleanup(10)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".part-9.npz.tmp",
        "notes.txt",
        "part-000001.npz",
        "part-000002.npz",
    ]
    assert src.files_deleted == 1
    assert [len(label) for _, label in it] == [4, 4]  # the rest still reads
    # off by default: nothing is deleted
    keep = DirectorySource(tmp_path, batch_size=4, max_idle_s=0.0)
    keep.checkpointed({"done": ["part-000001.npz"]})
    assert keep.wait_cleanup(10)
    assert (tmp_path / "part-000001.npz").exists()
    with pytest.raises(TypeError, match="'delete_consumed' must be a bool"):
        DirectorySource(tmp_path, delete_consumed="yes")


def test_a_consumed_name_replaced_while_the_trainer_is_down_is_read_again(tmp_path) -> None:
    """The cursor stores each consumed file's identity (inode, size, mtime), not only its name
    (#18.12): after a restart, a new file under a consumed name is trained, an untouched one is
    not trained twice."""
    fill_dir(tmp_path, 2, 4)
    first = DirectorySource(tmp_path, batch_size=4, max_idle_s=0)
    assert len(list(first)) == 2
    state = first.state_dict()
    # while "down": part-1 is replaced by a new file of another size under the same name
    gen = SyntheticClickSource(batch_size=6, seed=9)
    (tmp_path / "part-000001.npz").unlink()
    write_shard(tmp_path, "part-000001", gen.columns(0))
    again = DirectorySource(tmp_path, batch_size=6, max_idle_s=0)
    again.load_state_dict(state)
    batches = list(again)
    assert [len(y) for _, y in batches] == [6]  # only the new file
