"""The callback protocol: ``RunContext``, ``InternalCallbackParam``, ``Callback`` and
``CallbackList`` (MindSpore's ``CallbackManager``)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from lit_amp.callbacks.base import Callback, CallbackList, InternalCallbackParam, RunContext
from lit_amp.callbacks.loss_monitor import LossMonitor
from lit_amp.callbacks.time_monitor import TimeMonitor


class Recorder(Callback):
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def __enter__(self) -> Recorder:
        self.log.append(f"enter {self.name}")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.log.append(f"exit {self.name}")

    def on_train_step_end(self, run_context: RunContext) -> None:
        self.log.append(f"step {self.name}")


class Legacy(Callback):
    def step_end(self, run_context: RunContext) -> None:
        run_context.original_args().legacy_calls += 1


def test_internal_callback_param_is_a_dict_with_attributes() -> None:
    cb = InternalCallbackParam(cur_step_num=3)
    cb.batch_num = 5
    assert cb["batch_num"] == 5 and cb.cur_step_num == 3
    with pytest.raises(AttributeError):
        _ = cb.missing


def test_run_context_stop_flag_and_args() -> None:
    rc = RunContext({"cur_epoch_num": 2})
    assert isinstance(rc.original_args(), InternalCallbackParam)
    assert rc.original_args().cur_epoch_num == 2
    assert rc.get_stop_requested() is False
    rc.request_stop()
    assert rc.get_stop_requested() is True


def test_run_context_needs_a_dict() -> None:
    with pytest.raises(TypeError):
        RunContext([1, 2])


def test_legacy_hooks_back_the_new_ones() -> None:
    rc = RunContext(InternalCallbackParam(legacy_calls=0))
    cb = Legacy()
    cb.on_train_step_end(rc)
    cb.on_eval_step_end(rc)
    assert rc.original_args().legacy_calls == 2


def test_callback_list_enters_calls_in_order_and_exits_in_reverse() -> None:
    log: list[str] = []
    cbl = CallbackList([Recorder("a", log), Recorder("b", log)])
    cbl.enter()
    cbl.enter()  # idempotent
    cbl.call("on_train_step_end", RunContext({}))
    cbl.exit()
    cbl.exit()
    assert log == ["enter a", "enter b", "step a", "step b", "exit b", "exit a"]


def test_callback_list_accepts_none_one_or_a_sequence() -> None:
    assert len(CallbackList(None)) == 0
    assert len(CallbackList(LossMonitor())) == 1
    assert len(CallbackList((LossMonitor(), TimeMonitor()))) == 2


@pytest.mark.parametrize("bad", ["cb", 3, [LossMonitor(), object()]])
def test_callback_list_rejects_non_callbacks(bad: Any) -> None:
    with pytest.raises(TypeError, match="callbacks"):
        CallbackList(bad)


def test_eval_during_fit_calls_custom_callbacks_and_time_monitor_only() -> None:
    custom, tm = Legacy(), TimeMonitor()
    sub = CallbackList([LossMonitor(), custom, tm]).subset_for_eval_during_fit()
    assert list(sub) == [custom, tm]


def test_legacy_methods_warn_in_train_and_raise_in_fit(caplog: pytest.LogCaptureFixture) -> None:
    cbl = CallbackList([Legacy(), LossMonitor()])
    with caplog.at_level(logging.WARNING, logger="lit_amp.callbacks.base"):
        cbl.check_legacy_methods(raise_error=False)
    assert "Legacy defines the legacy method(s) ['step_end']" in caplog.text
    with pytest.raises(ValueError, match="legacy method"):
        cbl.check_legacy_methods(raise_error=True)
