"""RecModel tests run torch on one thread: the models are tiny, and on a shared 2-core machine
two OpenMP threads per test process can be 10x slower than one (spin-waiting under load).
``held_full_writes`` holds the background full-snapshot writes of a test until it lets them go."""

from __future__ import annotations

import threading

import pytest
import torch

from lit_amp.rec.serving.full_snapshots import BackgroundFullWriter


@pytest.fixture
def held_full_writes(monkeypatch):
    """Holds every background full snapshot write until ``held_full_writes.set()``."""
    event = threading.Event()
    real = BackgroundFullWriter._write

    def held(snap, path, crc):
        assert event.wait(30)
        return real(snap, path, crc)

    monkeypatch.setattr(BackgroundFullWriter, "_write", staticmethod(held))
    return event


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
