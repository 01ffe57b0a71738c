"""MindSpore's ``LambdaCallback`` through small simulated runs (semantics §1.4-1.7)."""

from __future__ import annotations

import pytest

from lit_amp.callbacks.base import EVAL_HOOKS, TRAIN_HOOKS, RunContext
from lit_amp.callbacks.lambda_callback import LambdaCallback
from tests.callbacks._helpers import (
    simulate_eval,
    simulate_train,
)


def test_lambda_callback_hook_order() -> None:
    calls: list[str] = []
    names = [*TRAIN_HOOKS, *EVAL_HOOKS]
    cb = LambdaCallback(**{n: (lambda rc, n=n: calls.append(n)) for n in names})
    simulate_train([cb], epochs=2, batches=1)
    simulate_eval([cb], batches=1)
    step = ["on_train_step_begin", "on_train_step_end"]
    epoch = ["on_train_epoch_begin", *step, "on_train_epoch_end"]
    ev = ["on_eval_begin", "on_eval_epoch_begin", "on_eval_step_begin", "on_eval_step_end"]
    assert calls == [
        "on_train_begin",
        *epoch,
        *epoch,
        "on_train_end",
        *ev,
        "on_eval_epoch_end",
        "on_eval_end",
    ]
    # unset hooks do nothing
    simulate_train([LambdaCallback()], epochs=1, batches=1)


def test_lambda_callback_receives_run_context_and_can_stop() -> None:
    def stop(rc: RunContext) -> None:
        if rc.original_args().cur_step_num == 2:
            rc.request_stop()

    run = simulate_train([LambdaCallback(on_train_step_end=stop)], epochs=3, batches=3)
    assert run.epochs_run == [1] and len(run.losses) == 2


def test_lambda_callback_bad_argument() -> None:
    with pytest.raises(TypeError, match="on_train_end"):
        LambdaCallback(on_train_end=1)
