"""The files of a watched folder (``lit_amp.rec.sources.shards``): written atomically under
their final name, parsed back to the same columns in every format, sharded by name."""

from __future__ import annotations

import os

import numpy as np
import pytest

from lit_amp.rec.sources import SyntheticClickSource
from lit_amp.rec.sources.schema import ClickSchema
from lit_amp.rec.sources.shards import FORMATS, parse_shard, shard_of, write_shard


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_written_shard_parses_back_to_its_columns(tmp_path, fmt):
    cols = SyntheticClickSource(batch_size=6, seed=1).columns(0)
    path = write_shard(tmp_path, "part-000001", cols, fmt)
    assert os.listdir(tmp_path) == [f"part-000001.{fmt}"]
    with open(path, "rb") as f:
        back, index, bad, n_total = parse_shard(f, os.path.basename(path), ClickSchema(),
                                                1 << 20, 1.0, lambda: False)
    assert bad == [] and n_total == 6 and list(index) == list(range(6))
    for key in ("label", "dense", "cat"):
        np.testing.assert_allclose(np.asarray(back[key]), np.asarray(cols[key]), rtol=1e-6)


def test_parsing_json_lines_stops_between_chunks_when_told(tmp_path, monkeypatch):
    monkeypatch.setattr("lit_amp.rec.sources.shards._CHUNK", 2)
    cols = SyntheticClickSource(batch_size=7, seed=1).columns(0)
    path = write_shard(tmp_path, "part-0", cols, "jsonl")
    with open(path, "rb") as f:
        assert parse_shard(f, "part-0.jsonl", ClickSchema(), 1 << 20, 0.0, lambda: True) is None


@pytest.mark.parametrize("name,fmt", [(".hidden", "npz"), ("_tmp", "npz"), ("a/b", "npz"),
                                      ("", "npz"), ("part", "csv")])
def test_write_shard_refuses_hidden_names_and_unknown_formats(tmp_path, name, fmt):
    with pytest.raises(ValueError, match="write_shard"):
        write_shard(tmp_path, name, SyntheticClickSource(batch_size=2).columns(0), fmt)


def test_a_name_keeps_its_shard_as_the_folder_grows():
    names = [f"part-{i:06d}.npz" for i in range(64)] + ["caf\udce9.npz"]
    shards = [shard_of(n, 4) for n in names]
    assert shards == [shard_of(n, 4) for n in names] and set(shards) == {0, 1, 2, 3}
