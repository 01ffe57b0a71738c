"""MindSpore's ``TimeMonitor`` through small simulated runs (semantics §1.4-1.7)."""

from __future__ import annotations

import re
import time

import pytest

from lit_amp.callbacks.base import InternalCallbackParam, RunContext
from lit_amp.callbacks.loss_monitor import LossMonitor
from lit_amp.callbacks.time_monitor import TimeMonitor
from tests.callbacks._helpers import (
    simulate_eval,
    simulate_train,
)

TIME_RE = r"Train epoch time: \d+\.\d{3} ms, per step time: \d+\.\d{3} ms"


def test_time_monitor_train_lines(capsys: pytest.CaptureFixture) -> None:
    simulate_train([TimeMonitor()], epochs=2, batches=3)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert all(re.fullmatch(TIME_RE, line) for line in lines)


def test_time_monitor_per_step_is_epoch_over_batch_num(capsys: pytest.CaptureFixture) -> None:
    simulate_train([TimeMonitor()], epochs=1, batches=4)
    line = capsys.readouterr().out.strip()
    epoch_ms, step_ms = (float(v) for v in re.findall(r"(\d+\.\d{3}) ms", line))
    assert step_ms == pytest.approx(epoch_ms / 4, abs=1e-3)


def test_time_monitor_data_time_measures_host_fetch(capsys: pytest.CaptureFixture) -> None:
    tm = TimeMonitor(data_time=True)
    rc = RunContext(InternalCallbackParam(mode="train", batch_num=3, dataset_sink_mode=False))
    tm.on_train_epoch_begin(rc)
    for _ in range(3):
        time.sleep(0.02)  # fetching the batch
        tm.on_train_step_begin(rc)
        tm.on_train_step_end(rc)
    tm.on_train_epoch_end(rc)
    line = capsys.readouterr().out.strip()
    # MindSpore 2.10 prints "... per step time: Y ms (data time: Z ms)"
    m = re.fullmatch(TIME_RE + r" \(data time: (\d+\.\d{3}) ms\)", line)
    assert m is not None, line
    assert 15.0 <= float(m.group(1)) < 200.0


def test_time_monitor_eval_and_fit_eval(capsys: pytest.CaptureFixture) -> None:
    simulate_eval([TimeMonitor()], batches=2)
    simulate_train([TimeMonitor(), LossMonitor(0)], epochs=1, batches=2, fit_eval_batches=2)
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"Eval epoch time: .* ms, per step time: .* ms", lines[0])
    # during fit only TimeMonitor (of the built-ins) sees the eval hooks: Eval line, then Train
    assert lines[1].startswith("Eval epoch time:")
    assert re.fullmatch(TIME_RE, lines[2])
    # the train clock was not restarted by the evaluation inside the epoch
    train_ms = float(re.findall(r"(\d+\.\d{3}) ms", lines[2])[0])
    eval_ms = float(re.findall(r"(\d+\.\d{3}) ms", lines[1])[0])
    assert train_ms > eval_ms


def test_time_monitor_needs_a_step_count() -> None:
    tm = TimeMonitor()
    rc = RunContext({"mode": "train", "batch_num": 0})
    tm.on_train_epoch_begin(rc)
    with pytest.raises(ValueError, match="data_size"):
        tm.on_train_epoch_end(rc)
    tm = TimeMonitor(data_size=5)
    tm.on_train_epoch_begin(rc)
    tm.on_train_epoch_end(rc)


@pytest.mark.parametrize(
    ("kwargs", "exc", "name"),
    [
        ({"data_size": 0}, ValueError, "data_size"),
        ({"data_size": 2.0}, TypeError, "data_size"),
        ({"data_time": 1}, TypeError, "data_time"),
    ],
)
def test_time_monitor_bad_arguments(kwargs: dict, exc: type, name: str) -> None:
    with pytest.raises(exc, match=name):
        TimeMonitor(**kwargs)
