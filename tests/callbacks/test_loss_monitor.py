"""MindSpore's ``LossMonitor`` through small simulated runs (semantics §1.4-1.7)."""

from __future__ import annotations

import re
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

    # mindspore 2.10's message, word for word (issue #48 item 7)
    msg = ("In epoch: 2 step: 2, loss is NAN or INF, training process cannot continue, "
           "terminating training.")
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
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


def _nan_on_one_rank_worker(rank: int, world: int) -> tuple[list[int], str]:
    """Rank 1's loss is NaN at step 2 only; both ranks must stop at that same step."""
    from lit_amp.callbacks.base import RunContext

    lm = LossMonitor(0)
    steps_done = []
    for step in range(1, 4):
        loss = float("nan") if (rank, step) == (1, 2) else 0.5
        rc = RunContext({"cur_epoch_num": 1, "cur_step_num": step, "batch_num": 3,
                         "net_outputs": torch.tensor(loss), "rank": rank})
        try:
            lm.on_train_step_end(rc)
        except ValueError as exc:
            return steps_done, str(exc)
        steps_done.append(step)
    return steps_done, ""


def test_loss_monitor_nan_on_one_rank_stops_every_rank_together() -> None:
    from tests.helpers.dist import run_distributed

    (done0, msg0), (done1, msg1) = run_distributed(_nan_on_one_rank_worker, world=2)
    assert done0 == done1 == [1]  # both stopped at step 2, neither went on alone
    assert "rank(s) [1]" in msg0 and "rank(s) [1]" in msg1
    assert msg0.startswith("In epoch: 1 step: 2, loss is NAN or INF")
    assert "(this rank's: 0.5)" in msg0  # rank 0's own loss was finite
    assert "(this rank's: nan)" in msg1


class _NanOnRank1(torch.nn.Module):
    """Cross-entropy whose 3rd value on rank 1 is NaN (one bad batch on one rank)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.ce = torch.nn.CrossEntropyLoss()

    def forward(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        self.calls += 1
        loss = self.ce(out, y)
        if dist.is_initialized() and dist.get_rank() == 1 and self.calls == 3:
            loss = loss * float("nan")
        return loss


def _ddp_model_worker(rank: int, world: int) -> str:
    from datetime import timedelta

    from lightning.pytorch.strategies import DDPStrategy

    from lit_amp import Model
    from tests.helpers.data import make_batches, make_net

    torch.manual_seed(0)
    net = make_net()
    # a short collective timeout: a rank left waiting fails the test instead of hanging it
    strategy = DDPStrategy(timeout=timedelta(seconds=20))
    model = Model(net, _NanOnRank1(), torch.optim.SGD(net.parameters(), 0.1),
                  trainer={"accelerator": "cpu", "devices": 2, "strategy": strategy,
                           "logger": False, "enable_checkpointing": False})
    try:
        model.train(3, make_batches(8), callbacks=[LossMonitor(0)])
    except ValueError as exc:
        return str(exc)
    return "trained on"


def test_loss_monitor_under_lightning_ddp_stops_both_ranks_at_the_bad_step() -> None:
    from tests.helpers.dist import run_distributed

    messages = run_distributed(_ddp_model_worker, world=2, init_group=False)
    assert all("In epoch: 1 step: 3, loss is NAN or INF" in m and "rank(s) [1]" in m
               for m in messages)
