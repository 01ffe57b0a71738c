"""Copy-on-write of row tensors (``lit_amp.rec.state.copy_on_write``): the rows copied aside
before a change are the rows the writer puts back, whatever was written meanwhile."""

from __future__ import annotations

import torch

from lit_amp.rec.state.copy_on_write import Protected, RowStore


def test_a_row_store_gives_back_the_rows_appended_across_blocks(monkeypatch):
    monkeypatch.setattr("lit_amp.rec.state.copy_on_write._BLOCK_ROWS", 4)
    rows = torch.arange(30.0).reshape(10, 3)
    store = RowStore(rows)
    store.append(rows[:3])
    store.append(rows[3:])
    slots = torch.tensor([9, 0, 4, 5])
    assert torch.equal(store.gather(slots), rows[slots])


def test_rows_copied_aside_are_overlaid_as_they_were_and_written_rows_are_not_copied():
    weight, moment = torch.zeros(8, 2), torch.ones(8, 2)
    group = Protected([weight, moment])
    group.overlay(0, slice(0, 2), weight[0:2].clone())  # rows 0-1 of both are written
    group.overlay(1, slice(0, 2), moment[0:2].clone())
    assert group.copy_aside(torch.tensor([1, 5, 6])) == 2  # row 1 is written: not copied
    weight[5] += 7.0  # a step changes rows 5 and 6 after they were copied aside
    moment[6] -= 3.0
    buf = weight[4:8].clone()
    group.overlay(0, slice(4, 8), buf)
    assert torch.equal(buf, torch.zeros(4, 2))
    buf = moment[4:8].clone()
    group.overlay(1, slice(4, 8), buf)
    assert torch.equal(buf, torch.ones(4, 2))
    assert group.copy_aside(torch.tensor([5, 6])) == 0  # copied once
