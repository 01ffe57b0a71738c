"""RecModel tests run torch on one thread: the models are tiny, and on a shared 2-core machine
two OpenMP threads per test process can be 10x slower than one (spin-waiting under load)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
