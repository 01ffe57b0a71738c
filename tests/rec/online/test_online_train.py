"""RecModel.online_train: MindSpore Rec's argument rules, callback semantics, stop conditions,
validation on a held-out window."""

from __future__ import annotations

import lightning as L
import pytest

from lit_amp.rec import RecModel, ValidationOptions
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
        ({"validation": ValidationOptions(2)}, ValueError, "needs 'metrics'"),
        ({"stop": {"max_steps": 3}}, TypeError, "'stop' must be a StopOptions or None"),
        ({"checkpoint": "ckpt"}, TypeError, "'checkpoint' must be a CheckpointOptions"),
        ({"callbacks": [object()]}, TypeError, "callbacks\\[0\\]"),
    ],
)
def test_online_train_arguments_are_validated(kwargs, exc, match):
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
