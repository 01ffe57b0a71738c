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


def test_pin_batch_leaves_the_structure():
    if not torch.cuda.is_available():
        pytest.skip("pinning needs an accelerator")
    x = pin_batch({"a": [torch.zeros(2)]})
    assert x["a"][0].is_pinned()
