"""LitModel's train step piece by piece (``lit_amp.model.train_step``): the public seam a runner
such as the sink's CUDA graph drives makes the same step as ``train_one_step``, and the model
says which of its settings forbid a captured step.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn

from lit_amp import FixedLossScaleManager, LitModel
from lit_amp.model.data_checks import for_lightning
from tests.helpers.data import make_batches, make_net
from tests.helpers.trainer import quiet_trainer


def _lit(**kw) -> LitModel:
    torch.manual_seed(0)
    net = make_net()
    return LitModel(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1), **kw)


def _fit(lit: LitModel, tmp_path, callbacks=(), **kw) -> L.Trainer:
    trainer = quiet_trainer(tmp_path, max_epochs=1, callbacks=list(callbacks), **kw)
    trainer.fit(lit, for_lightning(make_batches(4)))
    return trainer


def _by_pieces(lit: LitModel, *, update: bool = False):
    """``train_one_step`` restated through the public seam (what a graph runner records)."""

    def step(batch):
        raw = lit.optimizers().optimizer
        raw.zero_grad(set_to_none=True)
        loss = lit.loss_of(batch)
        lit.train_backward(loss)
        lit.clip_gradients_(raw)
        lit.train_optimizer_step(raw.step if update else None)
        return {"loss": loss.detach()}

    return step


@pytest.mark.parametrize("update", [False, True], ids=["step", "update"])
def test_the_pieces_make_the_same_step_as_train_one_step(tmp_path, update):
    ref = _lit()
    ref_trainer = _fit(ref, tmp_path, gradient_clip_val=0.05)
    lit = _lit()
    lit.train_one_step = _by_pieces(lit, update=update)  # the instance's, not the class's
    trainer = _fit(lit, tmp_path, gradient_clip_val=0.05)
    assert lit.fast_path
    assert trainer.global_step == ref_trainer.global_step == 4  # Lightning counted each update
    for a, b in zip(ref.network.parameters(), lit.network.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_an_update_off_the_fast_path_is_refused(tmp_path):
    class GradientHook(L.Callback):
        def on_before_backward(self, trainer, pl_module, loss):
            pass

    lit = _lit()
    seen = []

    def step(batch):
        with pytest.raises(RuntimeError, match="needs the fast path"):
            lit.train_optimizer_step(lambda: None)
        seen.append(lit.fast_path)
        return {"loss": lit.loss_of(batch).detach()}

    lit.train_one_step = step
    _fit(lit, tmp_path, callbacks=[GradientHook()])
    assert seen == [False] * 4


def test_capture_blockers_name_the_models_own_settings():
    assert _lit().capture_blockers() == []
    assert "not applied yet" in _lit(amp_level="O2").capture_blockers()[0]
    scaled = _lit(amp_level="O2", loss_scale_manager=FixedLossScaleManager(8.0))
    scaled.apply_amp("cpu")
    assert any("loss scaling is on" in r for r in scaled.capture_blockers())
    lit = _lit()
    lit.grad_accumulation_steps = 3
    assert lit.capture_blockers() == [
        "gradient accumulation over 3 batches steps every 3th batch: "
        "accumulate_grad_batches / grad_accumulation_step must be 1"]

    class Own(LitModel):
        def train_one_step(self, batch):
            return super().train_one_step(batch)

    net = make_net()
    own = Own(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1))
    assert own.capture_blockers() == [
        "Own overrides train_one_step (the captured step would not be yours)"]


def test_train_step_settings_change_with_what_a_captured_step_bakes_in():
    lit = _lit()
    before = lit.train_step_settings
    lit.grad_accumulation_steps = 2
    assert lit.train_step_settings != before
    lit.grad_accumulation_steps = 1
    assert lit.train_step_settings == before
