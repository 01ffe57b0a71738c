"""MindSpore's ``scale_sense=<update cell>`` usage, as a loss-scale manager (issue #16 item 6).

MindSpore documents ``TrainOneStepWithLossScaleCell(net, opt, scale_sense=update_cell)`` with
``nn.DynamicLossScaleUpdateCell(...)`` or ``manager.get_update_cell()``: the cell then updates
the scale after every step. :class:`UpdateCellManager` makes such a cell a manager that
``LossScaleController`` drives with the same rule.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_amp.amp.cells import UpdateCellManager
from lit_amp.amp.loss_scale.controller import LossScaleController
from lit_amp.amp.loss_scale.managers import (
    DynamicLossScaleManager,
    DynamicLossScaleUpdateCell,
    FixedLossScaleUpdateCell,
)


def _train(controller: LossScaleController, losses: list[float]) -> list[tuple]:
    """Real SGD steps on nn.Linear; a loss of inf makes the step overflow."""
    torch.manual_seed(0)
    net = nn.Linear(3, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    out = []
    for factor in losses:
        opt.zero_grad()
        loss = net(torch.ones(4, 3)).pow(2).mean() * factor
        before = net.weight.detach().clone()
        _, ovf, used = controller.step(opt, loss)
        out.append((bool(ovf), float(used), controller.scale,
                    not torch.equal(before, net.weight.detach())))
    return out


def test_dynamic_update_cell_as_scale_sense_follows_mindspore_rule() -> None:
    cell = DynamicLossScaleUpdateCell(2.0**10, 2, 2)
    steps = _train(LossScaleController(UpdateCellManager(cell)), [1.0, 1.0, float("inf"), 1.0])
    # (overflow, scale used, scale after, weights updated)
    assert steps == [
        (False, 1024.0, 1024.0, True),
        (False, 1024.0, 2048.0, True),  # window 2 reached: grow
        (True, 2048.0, 1024.0, False),  # overflow: skip the step, halve
        (False, 1024.0, 1024.0, True),
    ]
    assert int(cell.cur_iter) == 5  # the user's cell itself advanced


def test_manager_get_update_cell_as_scale_sense() -> None:
    cell = DynamicLossScaleManager(init_loss_scale=64.0, scale_window=1).get_update_cell()
    steps = _train(LossScaleController(UpdateCellManager(cell)), [1.0, 1.0])
    assert [s[2] for s in steps] == [128.0, 256.0]


def test_fixed_update_cell_skips_overflow_and_keeps_scale() -> None:
    steps = _train(LossScaleController(UpdateCellManager(FixedLossScaleUpdateCell(8.0))),
                   [float("inf"), 1.0])
    assert steps == [(True, 8.0, 8.0, False), (False, 8.0, 8.0, True)]


def test_update_cell_manager_refuses_non_cell() -> None:
    with pytest.raises(TypeError, match="update_cell"):
        UpdateCellManager(2.0)


def _cell(scale_sense):
    from lit_amp.amp.build import TrainOneStepWithLossScaleCell
    from lit_amp.amp.cells import WithLossCell

    torch.manual_seed(0)
    net = nn.Linear(3, 1)
    return net, TrainOneStepWithLossScaleCell(
        WithLossCell(net, nn.MSELoss()), torch.optim.SGD(net.parameters(), lr=0.01), scale_sense)


def test_train_one_step_cell_takes_an_update_cell_as_scale_sense() -> None:
    cell_scale = DynamicLossScaleUpdateCell(2.0**10, 2, 1)
    net, cell = _cell(cell_scale)
    x, y = torch.ones(4, 3), torch.ones(4, 1)
    _, ovf, used = cell(x, y)
    assert (bool(ovf), float(used), cell.controller.scale) == (False, 1024.0, 2048.0)
    before = net.weight.detach().clone()
    _, ovf, used = cell(x, y * float("inf"))  # overflow: step skipped, scale halved
    assert bool(ovf) and torch.equal(before, net.weight.detach())
    assert cell.controller.scale == 1024.0


def test_set_sense_scale_sets_the_next_steps_scale() -> None:
    _, cell = _cell(DynamicLossScaleManager(init_loss_scale=2.0**10).get_update_cell())
    cell.set_sense_scale(torch.tensor([4.0]))
    _, _, used = cell(torch.ones(4, 3), torch.ones(4, 1))
    assert float(used) == 4.0
    with pytest.raises(ValueError, match="'sens'"):
        cell.set_sense_scale(-1.0)
    with pytest.raises(TypeError, match="'sens'"):
        cell.set_sense_scale("big")
