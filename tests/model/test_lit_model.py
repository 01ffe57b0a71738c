"""LitModel in anyone's own Lightning Trainer script; the demo's accuracy target."""

from __future__ import annotations

import time

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lit_amp import LitModel, Model
from tests.helpers.data import make_batches, make_net


def _loaders():
    def dl(seed, n):
        xs, ys = zip(*make_batches(n, seed=seed))
        return DataLoader(TensorDataset(torch.cat(xs), torch.cat(ys)), batch_size=16)

    return dl(0, 8), dl(1, 4)


def _trainer(tmp_path, **kw):
    kw.setdefault("max_epochs", 8)
    return L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        **kw,
    )


def test_litmodel_in_a_plain_trainer(tmp_path):
    net = make_net()
    lit = LitModel(
        net,
        nn.CrossEntropyLoss(),
        torch.optim.Adam(net.parameters(), lr=0.05),
        metrics={"acc", "loss"},
    )
    train, val = _loaders()
    trainer = _trainer(tmp_path)
    trainer.fit(lit, train, val)
    assert trainer.global_step == 8 * 8  # one optimizer step per batch
    assert trainer.callback_metrics["val/acc"] > 0.9
    assert "val/eval_loss" in trainer.callback_metrics
    res = trainer.validate(lit, val, verbose=False)[0]
    assert res["val/acc"] == pytest.approx(lit.last_eval_results["metrics"]["acc"])
    preds = trainer.predict(lit, DataLoader(TensorDataset(torch.randn(5, 4)), batch_size=5))
    assert preds[0].shape == (5, 2)


def test_litmodel_resumes_from_a_lightning_checkpoint(tmp_path):
    def run(max_epochs, ckpt_path=None):
        torch.manual_seed(0)
        net = make_net()
        lit = LitModel(
            net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        )
        t = L.Trainer(
            max_epochs=max_epochs,
            accelerator="cpu",
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=str(tmp_path),
        )
        t.fit(
            lit,
            DataLoader(TensorDataset(*map(torch.cat, zip(*make_batches(4)))), batch_size=16),
            ckpt_path=ckpt_path,
        )
        return net, t

    full, _ = run(4)
    _, t2 = run(2)
    ckpt = t2.checkpoint_callback.best_model_path
    resumed, t3 = run(4, ckpt_path=ckpt)
    assert t3.global_step == 16
    for a, b in zip(full.parameters(), resumed.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


def test_litmodel_trains_with_gradient_hooks_callback(tmp_path):
    """A callback that overrides a gradient hook takes Lightning's full path, still correct."""

    class GradSeen(L.Callback):
        n = 0

        def on_after_backward(self, trainer, pl_module):
            GradSeen.n += 1

    net = make_net()
    lit = LitModel(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1))
    train, _ = _loaders()
    _trainer(tmp_path, callbacks=[GradSeen()]).fit(lit, train)
    assert GradSeen.n == 8 * 8


@pytest.mark.slow
def test_demo_reaches_85_percent_on_mnist1d_quickly(tmp_path, monkeypatch):
    """What `make demo` runs: the default experiment of `lit-amp`."""
    pytest.importorskip("mnist1d")
    from lit_amp.cli import main

    monkeypatch.setenv("LIT_AMP_LOG_DIR", str(tmp_path))
    t0 = time.perf_counter()
    acc = main(["task_name=demo"])
    assert acc >= 0.85
    assert time.perf_counter() - t0 < 120
    assert list(tmp_path.rglob("*.ckpt"))


def test_model_trainer_options_are_used(tmp_path):
    net = make_net()
    model = Model(
        net,
        nn.CrossEntropyLoss(),
        torch.optim.SGD(net.parameters(), lr=0.1),
        trainer={"accelerator": "cpu", "default_root_dir": str(tmp_path), "limit_train_batches": 2},
    )
    model.train(3, make_batches(5))
    assert model.trainer.global_step == 6
    assert model.trainer.default_root_dir == str(tmp_path)


# ---------------------------------------------------------------- LR schedulers (issue #48)
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
    train, _ = _loaders()
    trainer = _trainer(tmp_path, max_epochs=2, callbacks=[LearningRateMonitor("epoch")])
    trainer._loggers = [Logged(str(tmp_path))]
    trainer.fit(lit, train)
    assert _lr(lit) == pytest.approx(0.025)
    assert Logged.lrs == [0.1, 0.05]  # what LearningRateMonitor logs is the scheduled LR


def test_step_interval_scheduler_honours_frequency(tmp_path):
    lit = _scheduled(lambda opt: {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.5),
                                  "interval": "step", "frequency": 3})
    train, _ = _loaders()  # 8 batches an epoch
    _trainer(tmp_path, max_epochs=2).fit(lit, train)  # 16 optimizer steps: 5 scheduler steps
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
    train, val = _loaders()
    _trainer(tmp_path, max_epochs=3).fit(lit, train, val)
    assert _lr(lit) == pytest.approx(0.1 * 0.5 ** 2)  # epochs 2 and 3 saw no improvement

    lit = _scheduled(lambda opt: {"scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(opt),
                                  "monitor": "val/missing"}, metrics={"acc"})
    with pytest.raises(RuntimeError, match=r"'val/missing'.*val/acc"):
        _trainer(tmp_path, max_epochs=1).fit(lit, train, val)
    lit = _scheduled(lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt))
    with pytest.raises(ValueError, match="monitor"):
        _trainer(tmp_path, max_epochs=1).fit(lit, train)


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
    train, _ = _loaders()
    trainer = _trainer(tmp_path, max_epochs=1)
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
    trainer.fit(lit, _loaders()[0])  # 8 batches on 2 ranks: 4 steps a rank per epoch
    return {"lr": _lr(lit), "steps": trainer.global_step}


def test_step_scheduler_under_two_process_ddp():
    from tests.helpers.dist import run_distributed

    for res in run_distributed(_scheduler_ddp_worker, world=2, init_group=False):
        assert res == {"lr": pytest.approx(0.1 * 0.5 ** 4), "steps": 8}
