"""MindSpore's ``History`` through small simulated runs (semantics §1.4-1.7)."""

from __future__ import annotations

import pytest
import torch

from lit_amp.callbacks.history import History
from tests.callbacks._helpers import (
    simulate_train,
)


def test_history_records_net_output_and_metrics() -> None:
    h = History()
    run = simulate_train(
        [h], epochs=3, batches=2, eval_results=lambda e: {"acc": e / 10, "eval_loss": 1.0}
    )
    assert h.epoch == {"epoch": [1, 2, 3]}
    last = [loss for e, s, loss in run.step_end_losses if s == 2]
    assert h.history["net_output"] == pytest.approx(last)
    assert h.history["acc"] == [0.1, 0.2, 0.3]
    assert "eval_loss" not in h.history
    # a tuple output records its first element; a new run starts afresh
    simulate_train(
        [h],
        epochs=1,
        batches=1,
        outputs=lambda e, s, loss: (
            torch.tensor([1.0, 3.0]),
            torch.tensor(False),
            torch.tensor(8.0),
        ),
    )
    assert h.epoch == {"epoch": [1]} and h.history == {"net_output": [2.0]}


def test_history_not_called_by_fit_eval() -> None:
    h = History()
    simulate_train([h], epochs=2, batches=1, fit_eval_batches=2)
    assert h.epoch == {"epoch": [1, 2]}
