"""MindSpore-style callbacks in a plain Lightning ``Trainer`` (issue #19.4).

``to_lightning([...])`` drives lit_amp's callbacks from a ``LitModel``'s plain Trainer run;
a raw MindSpore-style callback handed to ``L.Trainer`` is a TypeError naming the way out.
"""

from __future__ import annotations

import re

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
