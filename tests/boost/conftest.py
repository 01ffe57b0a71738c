"""Boost tests run their tiny networks single-threaded, without expected-warning noise.

On a shared 2-core machine, two intra-op threads per tiny conv wait on each other (a 4-channel
conv took ~16 ms with 2 threads under load, well under 1 ms with 1).
"""

from __future__ import annotations

import warnings

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread_quiet():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*no `val_dataloader`.*")
        warnings.filterwarnings("ignore", ".*Full backward hook is firing.*")
        yield
    torch.set_num_threads(before)
