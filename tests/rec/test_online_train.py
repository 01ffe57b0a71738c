"""RecModel.online_train: MindSpore Rec's argument rules, callback semantics, stop conditions,
validation on a held-out window."""

from __future__ import annotations

import os
import signal
import threading
import time

import lightning as L
import pytest
import torch

from lit_amp.rec import RecModel
from lit_amp.rec.sources import SyntheticClickSource
from tests.rec._helpers import Recorder, make_model


def stream(n_batches: int | None = None, bs: int = 16, **kw):
    return SyntheticClickSource(
        batch_size=bs, num_records=None if n_batches is None else n_batches * bs, **kw
    )


# ------------------------------------------------------------------ MindSpore Rec's checks
def test_sink_size_negative_is_rejected_like_mindspore():
    with pytest.raises(ValueError, match="The input value must be int and must > 0"):
        make_model().online_train(stream(2), dataset_sink_mode=True, sink_size=-1)


def test_sink_size_not_one_is_rejected_like_mindspore():
    with pytest.raises(ValueError, match="The sink_size parameter only support value of 1"):
        make_model().online_train(stream(2), dataset_sink_mode=True, sink_size=100)


def test_sink_mode_not_bool_is_rejected_like_mindspore():
    with pytest.raises(TypeError, match="The input value must be a bool, but got str"):
        make_model().online_train(stream(2), dataset_sink_mode="valid")


def test_sink_size_is_ignored_outside_sink_mode():
    s = make_model().online_train(stream(2), dataset_sink_mode=False, sink_size=100)
    assert s.steps == 2


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"max_steps": 0}, ValueError, "'max_steps' must be > 0"),
        ({"max_steps": 1.5}, TypeError, "'max_steps' must be an int"),
        ({"max_time": -1}, ValueError, "'max_time' must be > 0"),
        ({"stop_event": object()}, TypeError, "'stop_event' must have is_set"),
        ({"stop_signals": (signal.SIGKILL,)}, ValueError, "SIGKILL"),
        ({"valid_every_n_steps": 2}, ValueError, "needs 'metrics'"),
        ({"ckpt_every_n_steps": 2}, ValueError, "need 'ckpt_dir'"),
        ({"publish_every_n_seconds": 2}, ValueError, "need 'publish_dir'"),
        ({"resume": "yes"}, TypeError, "'resume' must be a bool"),
        ({"publish_hook": 3}, TypeError, "'publish_hook' must be callable"),
        ({"callbacks": [object()]}, TypeError, "callbacks\\[0\\]"),
    ],
)
def test_online_options_are_validated(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        make_model().online_train(stream(2), **kwargs)


def test_train_dataset_must_be_iterable():
    with pytest.raises(TypeError, match="'train_dataset' must be an iterable"):
        make_model().online_train(42)


def test_constructor_is_models():
    with pytest.raises(ValueError, match="allowed keys"):
        make_model(bogus=1)
    assert repr(make_model()).startswith("RecModel(")


# ------------------------------------------------------------------ callback semantics
def test_cpu_sink_mode_falls_back_to_one_epoch_over_the_stream():
    rec = Recorder()
    s = make_model().online_train(stream(3), callbacks=rec)  # dataset_sink_mode=True default
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
    make_model().online_train(stream(3), callbacks=rec)
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

    make_model().online_train(stream(4), callbacks=[Count(), Recorder()])
    assert Count.n == 4


def test_records_trained_in_stream_order():
    rec = Recorder()
    make_model().online_train(stream(4, bs=8), callbacks=rec)
    assert sum(rec.ids, []) == list(range(32))


# ------------------------------------------------------------------ stop conditions
def test_stop_max_steps():
    s = make_model().online_train(stream(), max_steps=4)
    assert (s.steps, s.records, s.stop_reason) == (4, 64, "max_steps")


def test_stop_max_time():
    t0 = time.monotonic()
    s = make_model().online_train(stream(rate=2000), max_time=0.6)
    assert s.stop_reason == "max_time"
    assert 0.5 < time.monotonic() - t0 < 10
    assert s.steps > 0


def test_stop_event_from_another_thread_while_the_stream_is_idle():
    ev = threading.Event()
    threading.Timer(0.5, ev.set).start()
    # 1 record per second: the source is waiting when the event is set
    s = make_model().online_train(stream(rate=1.0, bs=1), stop_event=ev)
    assert s.stop_reason == "stop_event"


def test_stop_file(tmp_path):
    stop = tmp_path / "STOP"

    def touch(rc):
        if rc.original_args().cur_step_num == 3:
            stop.write_text("")

    s = make_model().online_train(stream(), callbacks=Recorder(touch), stop_file=stop)
    assert (s.steps, s.stop_reason) == (3, "stop_file")


def test_stop_sigterm_finishes_the_step_and_restores_the_handler():
    before = signal.getsignal(signal.SIGTERM)

    def kill(rc):
        if rc.original_args().cur_step_num == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    s = make_model().online_train(stream(), callbacks=Recorder(kill))
    assert (s.steps, s.stop_reason) == (2, "signal:SIGTERM")
    assert signal.getsignal(signal.SIGTERM) is before


def test_stop_request_stop_from_a_callback():
    rec = Recorder(lambda rc: rc.request_stop() if rc.original_args().cur_step_num == 5 else None)
    s = make_model().online_train(stream(), callbacks=rec)
    assert (s.steps, s.stop_reason) == (5, "request_stop")
    assert rec.hooks()[-2:] == ["on_train_epoch_end", "on_train_end"]


def test_stop_source_ending():
    s = make_model().online_train(stream(3))
    assert (s.steps, s.stop_reason) == (3, "source_exhausted")


def test_plain_iterable_of_batches_is_accepted():
    batches = list(stream(3))
    s = make_model().online_train(batches, dataset_sink_mode=False)
    assert (s.steps, s.stop_reason) == (3, "source_exhausted")


def test_exception_in_a_callback_propagates_and_restores_signals():
    before = signal.getsignal(signal.SIGTERM)

    def boom(rc):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        make_model().online_train(stream(), callbacks=Recorder(boom))
    assert signal.getsignal(signal.SIGTERM) is before


# ------------------------------------------------------------------ validation
def test_validation_on_held_out_window_is_test_then_train():
    model = make_model(metrics={"auc", "loss"})
    rec = Recorder()
    evaluated: list[list[int]] = []
    orig = model.lit_model.eval_step

    def spy(batch):
        evaluated.append(batch[0]["record_id"].tolist())
        return orig(batch)

    model.lit_model.eval_step = spy
    s = model.online_train(stream(6, bs=8), callbacks=rec, valid_every_n_steps=2, valid_window=1)
    assert s.steps == 6
    trained = rec.ids
    # after steps 2 and 4 the next batch (3rd, 5th) is evaluated, then trained
    assert evaluated == [trained[2], trained[4]]
    assert sum(trained, []) == list(range(48))  # nothing withheld from training
    hooks = rec.hooks()
    assert hooks.count("on_eval_begin") == 2 and hooks.count("on_eval_step_end") == 2
    # non-sink: eval_results visible at the (single) epoch end
    assert set(rec.metrics_seen[-1]) == {"auc", "loss", "eval_loss"}


def test_validation_results_at_epoch_end_in_sink_mode(monkeypatch):
    monkeypatch.setattr(RecModel, "_sink_supported", lambda self: True)
    model = make_model(metrics={"auc"})
    rec = Recorder()
    valid = list(stream(2, bs=32, seed=9))
    model.online_train(stream(4), callbacks=rec, valid_dataset=valid, valid_every_n_steps=2)
    seen = rec.metrics_seen
    assert seen[0] is None and seen[2] is None
    assert set(seen[1]) == {"auc", "eval_loss"} and set(seen[3]) == {"auc", "eval_loss"}
    assert 0.0 <= seen[1]["auc"] <= 1.0


def test_model_still_trains_in_train_mode_after_validation():
    model = make_model(metrics={"auc"})
    model.online_train(stream(4), valid_every_n_steps=1)
    assert model.lit_model.network.training


def test_training_reduces_the_loss_on_the_synthetic_stream():
    model = make_model()
    losses = []
    model.online_train(
        stream(150, bs=128, seed=3),
        callbacks=Recorder(lambda rc: losses.append(float(rc.original_args().net_outputs))),
    )
    assert sum(losses[-20:]) / 20 < sum(losses[:20]) / 20
    assert torch.isfinite(torch.tensor(losses)).all()
