"""LitModel's LR schedulers under manual optimization (``lit_amp.model.lr_schedulers``): stepped
as Lightning's automatic optimization steps them (issue #48), in one process and under DDP.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn

from lit_amp import LitModel
from tests.helpers.data import make_loaders, make_net
from tests.helpers.trainer import quiet_trainer


class _Scheduled(LitModel):
    """A LitModel whose ``configure_optimizers`` adds the LR scheduler config it was given."""

    def __init__(self, *args, sched=None, **kw) -> None:
        super().__init__(*args, **kw)
        self.sched = sched  # optimizer -> the ``lr_scheduler`` entry

    def configure_optimizers(self):
        return {"optimizer": self.optimizer, "lr_scheduler": self.sched(self.optimizer)}


def _scheduled(sched, lr: float = 0.1, **kw) -> _Scheduled:
    torch.manual_seed(0)
    net = make_net()
    return _Scheduled(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=lr),
                      sched=sched, **kw)


def _lr(lit: LitModel) -> float:
    return lit.optimizer.param_groups[0]["lr"]


def test_epoch_interval_scheduler_steps_each_epoch(tmp_path):
    from lightning.pytorch.callbacks import LearningRateMonitor
    from lightning.pytorch.loggers import CSVLogger

    class Logged(CSVLogger):
        lrs: list[float] = []

        def log_metrics(self, metrics, step=None):
            if "lr-SGD" in metrics:
                Logged.lrs.append(metrics["lr-SGD"])

    lit = _scheduled(lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1, 0.5))
    train, _ = make_loaders()
    trainer = quiet_trainer(tmp_path, max_epochs=2, callbacks=[LearningRateMonitor("epoch")])
    trainer._loggers = [Logged(str(tmp_path))]
    trainer.fit(lit, train)
    assert _lr(lit) == pytest.approx(0.025)
    assert Logged.lrs == [0.1, 0.05]  # what LearningRateMonitor logs is the scheduled LR


def test_step_interval_scheduler_honours_frequency(tmp_path):
    lit = _scheduled(lambda opt: {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.5),
                                  "interval": "step", "frequency": 3})
    train, _ = make_loaders()  # 8 batches an epoch
    quiet_trainer(tmp_path, max_epochs=2).fit(lit, train)  # 16 optimizer steps: 5 scheduler steps
    assert _lr(lit) == pytest.approx(0.1 * 0.5 ** 5)


def test_reduce_on_plateau_reads_the_monitored_metric(tmp_path):
    class Flat(_Scheduled):
        def on_validation_epoch_end(self):
            super().on_validation_epoch_end()
            self.log("val/flat", 1.0)  # never improves

    torch.manual_seed(0)
    net = make_net()
    lit = Flat(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
               metrics={"acc"},
               sched=lambda opt: {"scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(
                   opt, factor=0.5, patience=0), "monitor": "val/flat"})
    train, val = make_loaders()
    quiet_trainer(tmp_path, max_epochs=3).fit(lit, train, val)
    assert _lr(lit) == pytest.approx(0.1 * 0.5 ** 2)  # epochs 2 and 3 saw no improvement

    lit = _scheduled(lambda opt: {"scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(opt),
                                  "monitor": "val/missing"}, metrics={"acc"})
    with pytest.raises(RuntimeError, match=r"'val/missing'.*val/acc"):
        quiet_trainer(tmp_path, max_epochs=1).fit(lit, train, val)
    lit = _scheduled(lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt))
    with pytest.raises(ValueError, match="monitor"):
        quiet_trainer(tmp_path, max_epochs=1).fit(lit, train)


def test_overflow_skipped_step_does_not_advance_the_step_schedule(tmp_path):
    from lit_amp import DynamicLossScaleManager

    class Spiky(_Scheduled):
        def loss_of(self, batch):
            loss = super().loss_of(batch)
            # the second step of each epoch overflows: its optimizer step is skipped
            return loss * float("inf") if self.trainer.fit_loop.epoch_loop.batch_idx == 1 else loss

    torch.manual_seed(0)
    net = make_net()
    lit = Spiky(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
                loss_scale_manager=DynamicLossScaleManager(2.0 ** 4),
                sched=lambda opt: {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.5),
                                   "interval": "step"})
    train, _ = make_loaders()
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(lit, train)
    assert lit.loss_scale.skipped_steps == 1
    assert _lr(lit) == pytest.approx(0.1 * 0.5 ** 7)  # 8 batches, 7 real steps


def _scheduler_ddp_worker(rank: int, world: int) -> dict:
    from datetime import timedelta

    from lightning.pytorch.strategies import DDPStrategy

    lit = _scheduled(lambda opt: {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.5),
                                  "interval": "step", "frequency": 2})
    trainer = L.Trainer(accelerator="cpu", devices=world, logger=False, max_epochs=2,
                        strategy=DDPStrategy(timeout=timedelta(seconds=30)),
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(lit, make_loaders()[0])  # 8 batches on 2 ranks: 4 steps a rank per epoch
    return {"lr": _lr(lit), "steps": trainer.global_step}


def test_step_scheduler_under_two_process_ddp():
    from tests.helpers.dist import run_distributed

    for res in run_distributed(_scheduler_ddp_worker, world=2, init_group=False):
        assert res == {"lr": pytest.approx(0.1 * 0.5 ** 4), "steps": 8}
