"""The online-training loop (``lit_amp.rec.online.loop``): MindSpore Rec's callback semantics on
Lightning's hooks, in and outside sink mode, and the records trained in stream order."""

from __future__ import annotations

import lightning as L

from lit_amp.rec import RecModel
from tests.rec._helpers import Recorder, make_model, synthetic_stream


def test_cpu_sink_mode_falls_back_to_one_epoch_over_the_stream():
    rec = Recorder()
    # dataset_sink_mode=True, the default
    s = make_model().online_train(synthetic_stream(3), callbacks=rec)
    assert s.stop_reason == "source_exhausted" and s.steps == 3
    assert rec.hooks() == [
        "on_train_begin",
        "on_train_epoch_begin",
        *["on_train_step_begin", "on_train_step_end"] * 3,
        "on_train_epoch_end",
        "on_train_end",
    ]
    assert [e[1:] for e in rec.events if e[0] == "on_train_step_end"] == [(1, 1), (1, 2), (1, 3)]


def test_sink_mode_each_batch_is_one_epoch(monkeypatch):
    monkeypatch.setattr(RecModel, "_sink_supported", lambda self: True)
    rec = Recorder()
    seen = {}

    def grab(rc):
        cb = rc.original_args()
        seen.update(batch_num=cb.batch_num, sink=cb.dataset_sink_mode)

    rec.on_step = grab
    make_model().online_train(synthetic_stream(3), callbacks=rec)
    one = ["on_train_epoch_begin", "on_train_step_begin", "on_train_step_end", "on_train_epoch_end"]
    assert rec.hooks() == ["on_train_begin", *one * 3, "on_train_end"]
    ends = [e[1:] for e in rec.events if e[0] == "on_train_epoch_end"]
    assert ends == [(1, 1), (2, 2), (3, 3)]
    assert seen == {"batch_num": 1, "sink": True}


def test_lightning_callbacks_mix_in():
    class Count(L.Callback):
        n = 0

        def on_train_batch_end(self, *args):
            Count.n += 1

    make_model().online_train(synthetic_stream(4), callbacks=[Count(), Recorder()])
    assert Count.n == 4


def test_records_trained_in_stream_order():
    rec = Recorder()
    make_model().online_train(synthetic_stream(4, bs=8), callbacks=rec)
    assert sum(rec.ids, []) == list(range(32))


def test_the_objects_alive_at_the_start_are_frozen_for_the_loop_and_handed_back():
    # a full collector pass walks every object Lightning and torch made (0.16 s): the loop
    # freezes them (gc.freeze) so that no pass stalls a step or a checkpoint, and unfreezes
    import gc

    import pytest

    counts = []
    rec = Recorder()
    rec.on_step = lambda rc: counts.append(gc.get_freeze_count())
    make_model().online_train(synthetic_stream(3), callbacks=rec)
    assert len(counts) == 3 and min(counts) > 10_000  # Lightning's and torch's objects
    assert gc.get_freeze_count() == 0  # handed back

    # a loop that fails hands them back too
    def fail(rc):
        raise ValueError("a callback fails")

    rec = Recorder()
    rec.on_step = fail
    with pytest.raises(ValueError, match="a callback fails"):
        make_model().online_train(synthetic_stream(3), callbacks=rec)
    assert gc.get_freeze_count() == 0

    # the process's own freeze is left as it was
    gc.freeze()
    try:
        mine = gc.get_freeze_count()
        counts.clear()
        rec = Recorder()
        rec.on_step = lambda rc: counts.append(gc.get_freeze_count())
        make_model().online_train(synthetic_stream(2), callbacks=rec)
        # nothing more frozen, nothing unfrozen (a frozen object may still be freed)
        assert max(counts) <= mine and gc.get_freeze_count() > mine * 0.9
    finally:
        gc.unfreeze()
