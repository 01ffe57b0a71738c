"""``RecModel`` (``lit_amp.rec.rec_model``): the constructor and ``online_train``'s argument rules,
MindSpore Rec's checks of the sink arguments."""

from __future__ import annotations

import pytest

from lit_amp.rec import ValidationOptions
from tests.rec._helpers import make_model, synthetic_stream


def test_sink_size_negative_is_rejected_like_mindspore():
    with pytest.raises(ValueError, match="The input value must be int and must > 0"):
        make_model().online_train(synthetic_stream(2), dataset_sink_mode=True, sink_size=-1)


def test_sink_size_not_one_is_rejected_like_mindspore():
    with pytest.raises(ValueError, match="The sink_size parameter only support value of 1"):
        make_model().online_train(synthetic_stream(2), dataset_sink_mode=True, sink_size=100)


def test_sink_mode_not_bool_is_rejected_like_mindspore():
    with pytest.raises(TypeError, match="The input value must be a bool, but got str"):
        make_model().online_train(synthetic_stream(2), dataset_sink_mode="valid")


def test_sink_size_is_ignored_outside_sink_mode():
    s = make_model().online_train(synthetic_stream(2), dataset_sink_mode=False, sink_size=100)
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
        make_model().online_train(synthetic_stream(2), **kwargs)


def test_train_dataset_must_be_iterable():
    with pytest.raises(TypeError, match="'train_dataset' must be an iterable"):
        make_model().online_train(42)


def test_constructor_is_models():
    with pytest.raises(ValueError, match="allowed keys"):
        make_model(bogus=1)
    assert repr(make_model()).startswith("RecModel(")
