"""The option groups of RecModel.online_train: every field checked when the group is built."""

from __future__ import annotations

import datetime
import math
import os
import signal
import threading

import pytest

from lit_amp.rec import CheckpointOptions, PublishOptions, StopOptions, ValidationOptions


@pytest.mark.parametrize(
    ("build", "exc", "field"),
    [
        (lambda: StopOptions(max_steps=0), ValueError, "max_steps"),
        (lambda: StopOptions(max_steps=1.5), TypeError, "max_steps"),
        (lambda: StopOptions(max_steps=True), TypeError, "max_steps"),
        (lambda: StopOptions(max_time=-1), ValueError, "max_time"),
        (lambda: StopOptions(max_time=math.nan), ValueError, "max_time"),
        (lambda: StopOptions(max_time=math.inf), ValueError, "max_time"),
        (lambda: StopOptions(max_time="1h"), TypeError, "max_time"),
        (lambda: StopOptions(stop_event=object()), TypeError, "stop_event"),
        (lambda: StopOptions(stop_file=3), TypeError, "stop_file"),
        (lambda: StopOptions(stop_signals=signal.SIGTERM), TypeError, "stop_signals"),
        (lambda: StopOptions(stop_signals=(99999,)), ValueError, "stop_signals"),
        (lambda: StopOptions(stop_signals=(signal.SIGKILL,)), ValueError, "stop_signals"),
        (lambda: CheckpointOptions(None), TypeError, "ckpt_dir"),
        (lambda: CheckpointOptions("c", ckpt_every_n_steps=0), ValueError, "ckpt_every_n_steps"),
        (lambda: CheckpointOptions("c", ckpt_every_n_seconds=math.nan), ValueError,
         "ckpt_every_n_seconds"),
        (lambda: CheckpointOptions("c", ckpt_every_n_seconds=0), ValueError,
         "ckpt_every_n_seconds"),
        (lambda: CheckpointOptions("c", keep_checkpoint_max=0), ValueError,
         "keep_checkpoint_max"),
        (lambda: CheckpointOptions("c", resume="yes"), TypeError, "resume"),
        (lambda: PublishOptions(None), TypeError, "publish_dir"),
        (lambda: PublishOptions("p", publish_every_n_steps=-2), ValueError,
         "publish_every_n_steps"),
        (lambda: PublishOptions("p", publish_every_n_seconds=math.nan), ValueError,
         "publish_every_n_seconds"),
        (lambda: PublishOptions("p", keep_published_max=0), ValueError, "keep_published_max"),
        (lambda: PublishOptions("p", publish_hook=3), TypeError, "publish_hook"),
        (lambda: ValidationOptions(0), ValueError, "valid_every_n_steps"),
        (lambda: ValidationOptions(None), TypeError, "valid_every_n_steps"),
        (lambda: ValidationOptions(2, valid_dataset=42), TypeError, "valid_dataset"),
        (lambda: ValidationOptions(2, valid_window=0), ValueError, "valid_window"),
    ],
)
def test_every_field_is_checked_and_named(build, exc, field):
    with pytest.raises(exc, match=f"the argument '{field}' must be"):
        build()


def test_values_are_normalised(tmp_path):
    ev = threading.Event()
    stop = StopOptions(max_steps=3, max_time=datetime.timedelta(seconds=90), stop_event=ev,
                       stop_file=tmp_path / "STOP", stop_signals=[signal.SIGTERM])
    assert stop.max_time == 90.0 and stop.stop_signals == (signal.SIGTERM,)
    assert stop.stop_file == os.path.abspath(tmp_path / "STOP")
    assert StopOptions(stop_signals=None).stop_signals == ()
    ck = CheckpointOptions("rel", ckpt_every_n_seconds=datetime.timedelta(minutes=1))
    assert ck.ckpt_dir == os.path.abspath("rel") and ck.ckpt_every_n_seconds == 60.0


def test_groups_are_frozen():
    with pytest.raises(AttributeError):
        StopOptions().max_steps = 3
