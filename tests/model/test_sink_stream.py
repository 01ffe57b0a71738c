"""Sink mode's stream of batches (``lit_amp.model.sink_stream``): sinks carry the position over,
draw lazily, split by rank, and pin batches when asked (Model's sink tests: test_model.py)."""

from __future__ import annotations

import pytest
import torch

from lit_amp.model.sink_stream import SinkStream, pin_batch


def test_sinks_continue_one_stream_across_passes():
    s = SinkStream([(i, i) for i in range(5)], sink_size=2)
    assert len(s) == 1
    assert [[b[0] for b in sink] for _ in range(4) for sink in s] == [[0, 1], [2, 3], [4, 0],
                                                                      [1, 2]]
    assert s.batches_consumed == 8


def test_a_sink_draws_its_batches_one_at_a_time():
    drawn = []

    class Source:
        def __iter__(self):
            for i in range(10):
                drawn.append(i)
                yield (torch.full((3,), i), torch.zeros(3))

    sink = next(iter(SinkStream(Source(), sink_size=4)))
    assert sink[-1][0][0] == 0 and drawn == [0]  # the first batch, fetched for callbacks
    it = iter(sink)
    next(it), next(it)
    assert drawn == [0, 1] and sink[-1][0][0] == 1 and sink.samples == 6
    with pytest.raises(IndexError):
        sink[0]


def test_each_rank_streams_every_world_th_batch():
    parts = [[b for sink in SinkStream(list(range(6)), 3, rank=r, world_size=2) for b in sink]
             for r in (0, 1)]
    assert parts == [[0, 2, 4], [1, 3, 5]]
    with pytest.raises(ValueError, match="'sink_size' must be > 0"):
        SinkStream([1], 0)


def test_pin_batch_pins_every_cpu_tensor_and_leaves_the_structure(monkeypatch):
    if torch.cuda.is_available():  # the real pinning
        assert pin_batch({"a": [torch.zeros(2)]})["a"][0].is_pinned()
    pinned = []  # this CPU build cannot pin: record the calls instead
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: pinned.append(t) or t.clone())
    batch = {"a": [torch.zeros(2)], "b": (torch.ones(1), 3)}
    out = pin_batch(batch)
    assert isinstance(out["a"], list) and isinstance(out["b"], tuple) and out["b"][1] == 3
    assert [t.shape for t in pinned] == [(2,), (1,)]
    assert out["a"][0] is not batch["a"][0] and torch.equal(out["b"][0], batch["b"][0])
