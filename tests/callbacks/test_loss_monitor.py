"""MindSpore's ``LossMonitor`` driven through small simulated runs (spec §1.4-1.7)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from lit_amp.callbacks.loss_monitor import LossMonitor
from tests.callbacks._helpers import (
    simulate_train,
)


def test_loss_monitor_prints_every_n_steps_exact_format(capsys: pytest.CaptureFixture) -> None:
    run = simulate_train([LossMonitor(per_print_times=2)], epochs=2, batches=3)
    lines = capsys.readouterr().out.splitlines()
    # global steps 2, 4, 6 -> (epoch 1, step 2), (epoch 2, step 1), (epoch 2, step 3)
    expected = [
        f"epoch: {e} step: {s}, loss is {loss}"
        for e, s, loss in [run.step_end_losses[i] for i in (1, 3, 5)]
    ]
    assert lines == expected
    assert [(e, s) for e, s, _ in [run.step_end_losses[i] for i in (1, 3, 5)]] == [
        (1, 2),
        (2, 1),
        (2, 3),
    ]


def test_loss_monitor_zero_never_prints_and_other_ranks_are_silent(
    capsys: pytest.CaptureFixture,
) -> None:
    simulate_train([LossMonitor(0)], epochs=1, batches=3)
    simulate_train([LossMonitor(1)], epochs=1, batches=3, rank=1)
    assert capsys.readouterr().out == ""


def test_loss_monitor_tuple_outputs_print_the_loss_float(capsys: pytest.CaptureFixture) -> None:
    run = simulate_train(
        [LossMonitor()],
        epochs=1,
        batches=2,
        outputs=lambda e, s, loss: (loss, torch.tensor(False), torch.tensor(1024.0)),
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"epoch: 1 step: {s}, loss is {loss}" for _, s, loss in run.step_end_losses]


@pytest.mark.parametrize(
    "make_out",
    [
        lambda loss: torch.tensor(float("nan")),
        lambda loss: torch.tensor(float("inf")),
        # under loss scaling MindSpore skips the check; lit_amp does not
        lambda loss: (torch.tensor(float("nan")), torch.tensor(True), torch.tensor(2.0**24)),
    ],
)
def test_loss_monitor_stops_on_invalid_loss(make_out: Callable) -> None:
    def outputs(e: int, s: int, loss: torch.Tensor) -> Any:
        return make_out(loss) if (e, s) == (2, 2) else loss

    with pytest.raises(ValueError, match=r"epoch: 2 step: 2\. Invalid loss (nan|inf)"):
        simulate_train([LossMonitor()], epochs=3, batches=3, outputs=outputs)


def test_loss_monitor_prints_fit_metrics(capsys: pytest.CaptureFixture) -> None:
    simulate_train(
        [LossMonitor(per_print_times=0)],
        epochs=2,
        batches=1,
        eval_results=lambda e: {"acc": 0.5 * e, "eval_loss": 1.0},
    )
    assert capsys.readouterr().out.splitlines() == [
        "Eval result: epoch 1, metrics: {'acc': 0.5}",
        "Eval result: epoch 2, metrics: {'acc': 1.0}",
    ]


def test_loss_monitor_sink_mode_prints_once_per_sink(capsys: pytest.CaptureFixture) -> None:
    run = simulate_train([LossMonitor(per_print_times=3)], epochs=3, sink_size=4)
    lines = capsys.readouterr().out.splitlines()
    # cur_step_num 4, 8, 12: each is >= 3 steps after the last print
    assert lines == [f"epoch: {e} step: 4, loss is {loss}" for e, _, loss in run.step_end_losses]
    assert len(lines) == 3


def test_loss_monitor_new_run_restarts_counter(capsys: pytest.CaptureFixture) -> None:
    lm = LossMonitor(per_print_times=2)
    simulate_train([lm], epochs=1, batches=4)
    simulate_train([lm], epochs=1, batches=4)
    assert len(capsys.readouterr().out.splitlines()) == 4


@pytest.mark.parametrize(
    ("value", "exc"), [(-1, ValueError), (1.5, TypeError), (True, TypeError), ("2", TypeError)]
)
def test_loss_monitor_bad_argument(value: Any, exc: type) -> None:
    with pytest.raises(exc, match="per_print_times"):
        LossMonitor(value)
