"""GroupLossScaleManager: marker gradients, per-group unscaling and updates, LitModel use."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lit_amp import LitModel
from lit_amp.amp.loss_scale.controller import LossScaleController
from lit_amp.boost import AutoBoost, GroupLossScaleManager


class _Net(nn.Module):
    def __init__(self, manager: GroupLossScaleManager) -> None:
        super().__init__()
        self.fc1 = nn.Linear(3, 4)
        self.fc2 = nn.Linear(4, 2)
        self.amp = manager

    def forward(self, x):
        x = self.amp(x, 0, 1)
        x = self.amp(torch.tanh(self.fc1(x)), 1, 2)
        return self.amp(self.fc2(x), 2, 3)


def _groups(net: _Net) -> list:
    return [list(net.fc1.parameters()), list(net.fc2.parameters())]


def test_markers_scale_each_group_and_hooks_unscale():
    m = GroupLossScaleManager([8.0, 2.0], [])
    net = _Net(m)
    ref = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    ref[0].load_state_dict(net.fc1.state_dict())
    ref[2].load_state_dict(net.fc2.state_dict())
    m.loss_scale_groups = _groups(net)
    assert m.get_loss_scale() == 1.0
    m.get_update_cell()  # installs the per-group unscaling hooks
    assert m.loss_scales == [8.0, 2.0]
    x = torch.randn(5, 3, requires_grad=True)
    seen = {}
    net.fc2.register_full_backward_hook(lambda mod, gi, go: seen.update(out=go[0].clone()))
    net(x).sum().backward()
    # the gradient entering group 2 carries s_2 = 2; param grads come out unscaled
    torch.testing.assert_close(seen["out"], torch.full((5, 2), 2.0))
    xr = x.detach().clone().requires_grad_(True)
    ref(xr).sum().backward()
    torch.testing.assert_close(net.fc1.weight.grad, ref[0].weight.grad)
    torch.testing.assert_close(net.fc2.weight.grad, ref[2].weight.grad)
    torch.testing.assert_close(x.grad, xr.grad)  # the input gradient is unscaled too


def test_per_group_update_rule():
    m = GroupLossScaleManager(16.0, [])
    net = _Net(m)
    m.loss_scale_groups = _groups(net)
    cell = m.get_update_cell()
    for p in net.parameters():
        p.grad = torch.zeros_like(p)
    cell(torch.tensor(1.0), torch.tensor(False))
    grow = 16.0 * 2 ** (1 / 1000)
    assert m.loss_scales == pytest.approx([grow, grow])
    net.fc2.weight.grad[0, 0] = float("inf")  # only group 2 overflowed
    cell(torch.tensor(1.0), torch.tensor(True))
    assert m.loss_scales == pytest.approx([grow * 2 ** (1 / 1000), grow / math.sqrt(2)])


def test_controller_skips_and_saves_scales():
    m = GroupLossScaleManager(4.0, [])
    net = _Net(m)
    m.loss_scale_groups = _groups(net)
    ctl = LossScaleController(m)
    assert ctl.scale == 1.0
    state = ctl.state_dict()
    m.dynamic_loss_scale[1] = 99.0
    ctl.load_state_dict(state)
    assert m.loss_scales == [4.0, 4.0]
    with pytest.raises(ValueError, match="must be finite and >= 1"):
        GroupLossScaleManager(0.5, [])
    with pytest.raises(TypeError, match="list of lists"):
        GroupLossScaleManager(2.0, [1, 2])


def test_the_boost_flag_requires_a_group_manager():
    """``loss_scale_group`` needs a GroupLossScaleManager (MindSpore: TypeError); training with
    one is the boost contract's (test_contract.py)."""
    net = nn.Linear(3, 2)
    lit = LitModel(net, nn.MSELoss(), torch.optim.SGD(net.parameters(), lr=0.1))
    boost = AutoBoost("O0", {"boost": {"mode": "manual", "loss_scale_group": True}})
    assert [a.name for a in boost.algorithms] == ["loss_scale_group"]
    trainer = L.Trainer(callbacks=[boost], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu", max_epochs=1)
    with pytest.raises(TypeError, match="GroupLossScaleManager, but got NoneType"):
        trainer.fit(lit, DataLoader(TensorDataset(torch.randn(8, 3), torch.randn(8, 2)),
                                    batch_size=4))
