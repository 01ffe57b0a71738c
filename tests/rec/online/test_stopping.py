"""RecModel.online_train stop conditions (StopOptions, request_stop, the stream ending)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from lit_amp.rec import StopOptions
from lit_amp.rec.sources import SyntheticClickSource
from tests.rec._helpers import Recorder, make_model


def stream(n_batches: int | None = None, bs: int = 16, **kw):
    return SyntheticClickSource(
        batch_size=bs, num_records=None if n_batches is None else n_batches * bs, **kw
    )


# ------------------------------------------------------------------ stop conditions
def test_stop_max_steps():
    s = make_model().online_train(stream(), stop=StopOptions(max_steps=4))
    assert (s.steps, s.records, s.stop_reason) == (4, 64, "max_steps")


def test_stop_max_time():
    t0 = time.monotonic()
    s = make_model().online_train(stream(rate=2000), stop=StopOptions(max_time=0.6))
    assert s.stop_reason == "max_time"
    assert 0.5 < time.monotonic() - t0 < 10
    assert s.steps > 0


def test_stop_event_from_another_thread_while_the_stream_is_idle():
    ev = threading.Event()
    threading.Timer(0.5, ev.set).start()
    # 1 record per second: the source is waiting when the event is set
    s = make_model().online_train(stream(rate=1.0, bs=1), stop=StopOptions(stop_event=ev))
    assert s.stop_reason == "stop_event"


def test_stop_file(tmp_path):
    stop = tmp_path / "STOP"

    def touch(rc):
        if rc.original_args().cur_step_num == 3:
            stop.write_text("")

    s = make_model().online_train(
        stream(), callbacks=Recorder(touch), stop=StopOptions(stop_file=stop)
    )
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
