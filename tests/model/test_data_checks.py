"""What ``Model`` accepts as a dataset and a batch (``lit_amp.model.data_checks``)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from lit_amp.model.data_checks import (
    ReIterable,
    as_batch_tuple,
    check_dataset,
    dataset_size,
    for_lightning,
)


def test_check_dataset_returns_the_size_and_refuses_what_cannot_be_trained_on():
    assert check_dataset([(1, 2)] * 3, "train_dataset") == 3
    assert check_dataset(iter([(1, 2)]), "train_dataset", sink=True, sink_size=2) is None
    for bad in (None, "abc", {"x": 1}, 5):
        with pytest.raises(TypeError, match="'train_dataset' must be a torch DataLoader"):
            check_dataset(bad, "train_dataset")
    with pytest.raises(ValueError, match="'valid_dataset' is empty"):
        check_dataset([], "valid_dataset")
    with pytest.raises(ValueError, match="has no length .* sink_size > 0"):
        check_dataset(iter([(1, 2)]), "train_dataset", sink=True, sink_size=-1)
    assert dataset_size(iter([])) is None


def test_a_batch_becomes_the_networks_inputs():
    x, y = torch.zeros(2, 3), torch.ones(2)
    assert as_batch_tuple([x, y], expect_pair=True) == (x, y)
    assert as_batch_tuple({"x": x, "y": y}, expect_pair=True) == (x, y)
    assert as_batch_tuple(x, expect_pair=False) == (x,)
    with pytest.raises(ValueError, match=r"\(data, label\) pair, but a batch with 3 element"):
        as_batch_tuple((x, y, y), expect_pair=True)


def test_lightning_gets_one_iterable_and_dataloaders_unchanged():
    loader = DataLoader(list(range(4)), batch_size=2)
    assert for_lightning(loader) is loader and for_lightning(None) is None
    wrapped = for_lightning([(1, 2), (3, 4)])
    assert isinstance(wrapped, ReIterable) and len(wrapped) == 2
    assert list(wrapped) == list(wrapped) == [(1, 2), (3, 4)]  # re-iterable
