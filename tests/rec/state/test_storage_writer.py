"""A ``torch.save`` file written storage by storage (``lit_amp.rec.state.storage_writer``)
reads back with ``torch.load``; writers that do not match torch.save's storages are refused."""

from __future__ import annotations

import io

import pytest
import torch

from lit_amp.rec.state.storage_writer import as_bytes, save_by_storage, storage_order


def test_the_file_holds_the_bytes_each_writer_wrote():
    payload = {"a": torch.arange(6.0), "b": [torch.ones(2, 2, dtype=torch.int64)], "n": 3}
    later = {"a": torch.arange(6.0) * 10, "b": torch.full((2, 2), 5, dtype=torch.int64)}
    order = storage_order(payload)
    assert [s.nbytes() for s in order] == [24, 32]
    writers = [(24, lambda f: f.write(as_bytes(later["a"]))),
               (32, lambda f: f.write(as_bytes(later["b"])))]
    f = io.BytesIO()
    save_by_storage(f, payload, writers)
    f.seek(0)
    back = torch.load(f, weights_only=True)
    assert torch.equal(back["a"], later["a"]) and torch.equal(back["b"][0], later["b"])
    assert back["n"] == 3


@pytest.mark.parametrize("writers", [[(24, lambda f: f.write(b"\0" * 24))],
                                     [(8, lambda f: f.write(b"\0" * 8))]])
def test_writers_that_do_not_match_the_storages_are_refused(writers):
    with pytest.raises(RuntimeError):
        save_by_storage(io.BytesIO(), {"a": torch.zeros(6), "b": torch.zeros(2)}, writers)
