"""MindSpore-style callbacks in a plain Lightning ``Trainer`` (issue #19.4).

``to_lightning([...])`` drives lit_amp's callbacks from a ``LitModel``'s plain Trainer run;
a raw MindSpore-style callback handed to ``L.Trainer`` is a TypeError naming the way out.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lit_amp import LitModel
from lit_amp.callbacks import Callback, EarlyStopping, History, LossMonitor, to_lightning
from tests.helpers.data import make_batches, make_net


def _loader(n_batches: int, seed: int = 0) -> DataLoader:
    xs, ys = zip(*make_batches(n_batches, seed=seed))
    return DataLoader(TensorDataset(torch.cat(xs), torch.cat(ys)), batch_size=16)


def _trainer(tmp_path, callbacks, **kw) -> L.Trainer:
    kw.setdefault("max_epochs", 3)
    return L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False,
                     default_root_dir=str(tmp_path), callbacks=callbacks, **kw)


def _lit() -> LitModel:
    torch.manual_seed(0)
    net = make_net()
    return LitModel(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.5),
                    metrics={"acc"})


class Recorder(Callback):
    def __init__(self):
        self.seen: list[tuple] = []

    def on_train_step_end(self, run_context):
        cb = run_context.original_args()
        self.seen.append(("step", cb.cur_epoch_num, cb.cur_step_num, cb.batch_num))

    def on_eval_end(self, run_context):
        self.seen.append(("eval", dict(run_context.original_args().metrics)))

    def on_train_epoch_end(self, run_context):
        cb = run_context.original_args()
        self.seen.append(("epoch", cb.cur_epoch_num, dict(cb.get("eval_results") or {})))


@pytest.mark.parametrize("fn", ["fit", "validate", "predict"])
def test_a_raw_mindspore_callback_in_a_lightning_trainer_is_a_type_error(tmp_path, fn):
    trainer = _trainer(tmp_path, [LossMonitor()])
    with pytest.raises(TypeError, match=r"LossMonitor is a MindSpore-style.*to_lightning"):
        getattr(trainer, fn)(_lit(), _loader(2))


def test_builtins_work_in_a_plain_trainer(tmp_path, capsys):
    history = History()
    es = EarlyStopping(monitor="acc", patience=0, min_delta=2.0)  # no epoch improves by 2
    trainer = _trainer(tmp_path, [to_lightning([LossMonitor(2), history, es])], max_epochs=5)
    trainer.fit(_lit(), _loader(4), _loader(2, seed=1))
    out = capsys.readouterr().out
    steps = re.findall(r"epoch: (\d+) step: (\d+), loss is ([0-9.]+)", out)
    assert [(int(e), int(s)) for e, s, _ in steps[:4]] == [(1, 2), (1, 4), (2, 2), (2, 4)]
    # the first epoch sets the best value, the second fails to improve it: stop after epoch 2
    assert trainer.current_epoch == 2
    assert history.epoch == {"epoch": [1, 2]}
    assert len(history.history["acc"]) == 2 and 0.0 <= history.history["acc"][0] <= 1.0


def test_custom_callback_sees_mindspore_parameters_and_fit_evaluation(tmp_path):
    rec = Recorder()
    trainer = _trainer(tmp_path, [to_lightning(rec)], max_epochs=2, num_sanity_val_steps=2)
    lit = _lit()
    trainer.fit(lit, _loader(3), _loader(2, seed=1))
    steps = [s for s in rec.seen if s[0] == "step"]
    assert steps == [("step", e, s, 3) for e in (1, 2) for s in range(3 * e - 2, 3 * e + 1)]
    evals = [s for s in rec.seen if s[0] == "eval"]
    assert len(evals) == 2  # one per epoch; Lightning's sanity check is not shown
    epochs = [s for s in rec.seen if s[0] == "epoch"]
    assert [e[1] for e in epochs] == [1, 2]
    assert set(epochs[-1][2]) == {"acc", "eval_loss"}  # MindSpore's bare names
    assert epochs[-1][2]["acc"] == pytest.approx(lit.last_eval_results["metrics"]["acc"])


def test_validate_is_mindspore_eval(tmp_path):
    rec = Recorder()
    lit = _lit()
    _trainer(tmp_path, [to_lightning([rec])]).validate(lit, _loader(2), verbose=False)
    assert rec.seen == [("eval", {"acc": lit.last_eval_results["metrics"]["acc"]})]


def test_to_lightning_refuses_what_is_not_a_mindspore_callback():
    with pytest.raises(TypeError, match=r"callbacks\[1\].*Lightning callback Timer"):
        to_lightning([History(), L.pytorch.callbacks.Timer()])
    with pytest.raises(TypeError, match="'callbacks' must be"):
        to_lightning("LossMonitor")


# ---------------------------------------------------------------- a user's own LightningModule
class PlainModule(L.LightningModule):
    """A LightningModule as users write them: its own names in ``self.log``, a returned loss."""

    def __init__(self, lr: float = 0.5) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = make_net()
        self.lr = lr
        self.losses: list[float] = []  # every training_step's loss, as computed

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.losses.append(float(loss.detach()))
        self.log("train_loss", loss)
        self.log("epoch_loss", loss, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self.log("val_acc", (logits.argmax(1) == y).float().mean())
        self.log("val_loss", nn.functional.cross_entropy(logits, y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), self.lr)


def test_early_stopping_and_history_see_the_names_a_plain_module_logs(tmp_path):
    history = History()
    # no epoch improves val_acc by 2: the first sets the best, the second stops training
    es = EarlyStopping(monitor="val_acc", patience=0, min_delta=2.0)
    module = PlainModule()
    trainer = _trainer(tmp_path, [to_lightning([history, es])], max_epochs=5)
    trainer.fit(module, _loader(4), _loader(2, seed=1))
    assert trainer.current_epoch == 2 and es.stopped_epoch == 2
    assert history.epoch == {"epoch": [1, 2]}
    # the values the module logged, under its names
    logged = float(trainer.callback_metrics["val_acc"])
    assert history.history["val_acc"][-1] == pytest.approx(logged)
    assert es.best == pytest.approx(history.history["val_acc"][0])
    assert set(history.history) >= {"val_acc", "val_loss", "train_loss", "net_output"}
    # what training_step logged on_epoch: each epoch's own mean (4 batches of 16 each)
    losses = module.losses
    assert history.history["epoch_loss"] == pytest.approx(
        [sum(losses[:4]) / 4, sum(losses[4:8]) / 4], rel=1e-5)
    assert history.history["train_loss"] == pytest.approx([losses[3], losses[7]], rel=1e-5)
    # net_output: the loss of each epoch's last step, as training_step returned it
    assert history.history["net_output"] == pytest.approx([module.losses[3], module.losses[7]])


def test_loss_monitor_prints_the_loss_training_step_returned(tmp_path, capsys):
    # Lightning hands callbacks loss / accumulate_grad_batches; LossMonitor must print the loss
    module = PlainModule()
    trainer = _trainer(tmp_path, [to_lightning(LossMonitor(1))], max_epochs=1,
                       accumulate_grad_batches=2, num_sanity_val_steps=0)
    trainer.fit(module, _loader(4))
    steps = re.findall(r"epoch: (\d+) step: (\d+), loss is ([0-9.]+)", capsys.readouterr().out)
    assert [(int(e), int(s)) for e, s, _ in steps] == [(1, 1), (1, 2), (1, 3), (1, 4)]
    assert [float(v) for *_, v in steps] == pytest.approx(module.losses, rel=1e-5)


def test_reduce_lr_on_plateau_on_a_plain_modules_metric(tmp_path):
    from lit_amp.callbacks import ReduceLROnPlateau

    rl = ReduceLROnPlateau(monitor="val_loss", mode="min", factor=0.5, patience=0, min_delta=2.0)
    rec = Recorder()
    module = PlainModule(lr=0.4)
    trainer = _trainer(tmp_path, [to_lightning([rec, rl])], max_epochs=2)
    trainer.fit(module, _loader(2), _loader(2, seed=1))
    # epoch 1 sets the best val_loss, epoch 2 does not beat it by 2: the lr halves once
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.2)
    steps = [s for s in rec.seen if s[0] == "step"]
    assert steps == [("step", e, s, 2) for e in (1, 2) for s in range(2 * e - 1, 2 * e + 1)]
    assert {"val_acc", "val_loss"} <= set(rec.seen[-1][2])


def test_validate_of_a_plain_module_gives_its_logged_metrics(tmp_path):
    rec = Recorder()
    module = PlainModule()
    out = _trainer(tmp_path, [to_lightning(rec)]).validate(module, _loader(2), verbose=False)
    assert rec.seen == [("eval", pytest.approx(out[0]))]
    assert set(out[0]) == {"val_acc", "val_loss"}


@pytest.mark.slow
def test_plain_module_under_two_process_ddp(tmp_path):
    """Ranks log different val_acc (no sync_dist): EarlyStopping decides on their mean, both
    ranks stop after the same epoch, and LossMonitor prints rank 0's losses as computed."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("_adapter_ddp_worker.py")),
                           str(tmp_path)], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["epoch"] == r1["epoch"] == 2 and r0["stopped_epoch"] == r1["stopped_epoch"] == 2
    assert r0["val_acc"][0] != r1["val_acc"][0]  # each rank's own value, as it logged it
    mean = (r0["val_acc"][0] + r1["val_acc"][0]) / 2
    assert r0["best"] == pytest.approx(mean) and r1["best"] == pytest.approx(mean)
    # 8 batches over 2 ranks: 4 steps per rank and epoch; rank 0 prints its own losses
    printed = re.findall(r"epoch: (\d+) step: (\d+), loss is ([0-9.]+)", proc.stdout)
    assert [(int(e), int(s)) for e, s, _ in printed] == [(e, s) for e in (1, 2)
                                                         for s in (1, 2, 3, 4)]
    assert [float(v) for *_, v in printed] == pytest.approx(r0["losses"], rel=1e-5)
    for r in (r0, r1):
        assert r["net_output"] == pytest.approx([r["losses"][3], r["losses"][7]], rel=1e-6)


def test_a_resumed_plain_run_goes_on_counting_epochs(tmp_path):
    module = PlainModule()
    first = _trainer(tmp_path, [], max_epochs=2)
    first.fit(module, _loader(3))
    first.save_checkpoint(tmp_path / "two.ckpt")
    rec = Recorder()
    _trainer(tmp_path, [to_lightning(rec)], max_epochs=3).fit(
        PlainModule(), _loader(3), ckpt_path=tmp_path / "two.ckpt")
    steps = [s for s in rec.seen if s[0] == "step"]
    assert [s[1] for s in steps] == [3, 3, 3] and [s[3] for s in steps] == [3, 3, 3]
