"""The built-in callbacks' monitors (``lit_amp.callbacks._utils``): EarlyStopping and
ReduceLROnPlateau average the monitored value over processes (gloo, 2 CPUs)."""

from __future__ import annotations

import torch

from lit_amp.callbacks.base import RunContext
from lit_amp.callbacks.early_stopping import EarlyStopping
from lit_amp.callbacks.reduce_lr_on_plateau import ReduceLROnPlateau
from tests.helpers.dist import run_distributed


def _worker(rank: int, world: int) -> tuple[float, list[bool], float]:
    es = EarlyStopping(monitor="acc", patience=1)
    opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=1.0)
    rl = ReduceLROnPlateau(monitor="acc", factor=0.5, patience=1, min_delta=0)
    # rank 0 sees 0.2 then 0.9; rank 1 sees 0.8 then 0.0: means 0.5 then 0.45 (no improvement)
    values = [[0.2, 0.9], [0.8, 0.0]][rank]
    stops = []
    for epoch, v in enumerate(values, start=1):
        rc = RunContext(
            {"cur_epoch_num": epoch, "eval_results": {"acc": v}, "optimizer": opt, "rank": rank}
        )
        es.on_train_epoch_end(rc)
        rl.on_train_epoch_end(rc)
        stops.append(rc.get_stop_requested())
    return es.best, stops, opt.param_groups[0]["lr"]


def test_monitor_is_averaged_over_processes() -> None:
    for best, stops, lr in run_distributed(_worker, world=2):
        assert abs(best - 0.5) < 1e-12  # the mean, identical on both ranks
        assert stops == [False, True]  # both ranks stop together
        assert lr == 0.5
