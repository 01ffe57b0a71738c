"""``Model(boost_level="O1"/"O2")`` on the device: it trains, and what each level turns on acts.

O1 is LessBN + GradientFreeze, O2 adds AdaSum. On a ResNet1D: LessBN removed the blocks' first
BatchNorms and put a ``CommonHeadLastFN`` head on; GradientFreeze froze the first layers exactly
on the steps its schedule says (their gradient stays None); AdaSum is built and, in one process,
combines nothing, so O2 trains as O1 does.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lit_amp import Model
from lit_amp.boost import CommonHeadLastFN
from lit_amp.boost.adasum.callback import AdaSum
from lit_amp.callbacks import Callback
from lit_amp.demos import ResNet1D

pytestmark = pytest.mark.cuda


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*Full backward hook is firing.*")
        yield


def _loader(n: int = 96, batch: int = 16, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 40, generator=g)
    y = (x[:, :20].sum(1) > 0).long() + 2 * (x[:, 20:].sum(1) > 0).long()
    return DataLoader(TensorDataset(x, y), batch_size=batch)


class _Steps(Callback):
    """Per step: the loss, its device, and whether the first conv got a gradient."""

    def __init__(self, net: nn.Module) -> None:
        self.net = net
        self.losses: list[float] = []
        self.devices: set[str] = set()
        self.frozen: list[bool] = []

    def on_train_step_end(self, run_context) -> None:
        out = run_context.original_args().net_outputs
        self.losses.append(float(out))
        self.devices.add(out.device.type)
        self.frozen.append(self.net.conv1.weight.grad is None)


def _run(level: str, trainer: dict):
    torch.manual_seed(0)
    net = ResNet1D(channels=4, blocks=(2, 2, 2), num_classes=4)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    model = Model(net, nn.CrossEntropyLoss(), opt, metrics={"acc"}, boost_level=level,
                  boost_config_dict={"grad_freeze": {"param_groups": 4}}, trainer=trainer)
    steps = _Steps(net)
    model.train(4, _loader(), callbacks=[steps])
    return model, net, steps


def test_boost_o1_and_o2_on_the_device(device, accelerator):
    runs = {level: _run(level, accelerator) for level in ("O1", "O2")}
    for level, (model, net, steps) in runs.items():
        boost = model.lit_model.boost
        names = [type(a).__name__ for a in boost.algorithms]
        assert names == ["LessBN", "GradientFreeze"] + (["AdaSum"] if level == "O2" else [])
        assert steps.devices == {device.type}, level  # trained on the device
        # LessBN: the blocks' first BatchNorm removed, the head replaced (and trained)
        assert boost.get_algorithm("less_bn").removed_bn == [f"layers.{i}.bn1" for i in range(6)]
        assert isinstance(net.fc, CommonHeadLastFN) and net.fc.multiplier.item() != 1.0
        # GradientFreeze: frozen exactly on the steps of its schedule, and some were
        gf = boost.get_algorithm("grad_freeze")
        assert gf.position == len(steps.losses) == 24
        assert steps.frozen == [int(k) != 0 for k in gf.schedule[:24]], level
        assert 0 < sum(steps.frozen) < 24
        assert all(p.requires_grad for p in net.parameters())  # restored after training
        assert sum(steps.losses[-6:]) < 0.9 * sum(steps.losses[:6]), (level, steps.losses)
        assert all(torch.isfinite(p).all() for p in net.parameters())
        assert model.eval(_loader())["acc"] > 0.35  # 4 classes: chance is 0.25
    assert isinstance(runs["O2"][0].lit_model.boost.get_algorithm("adasum"), AdaSum)
    # one process: AdaSum has nothing to combine, so O2 trains as O1
    d = max(abs(a - b) for a, b in zip(runs["O1"][2].losses, runs["O2"][2].losses))
    assert d <= 1e-3, f"O2's losses differ from O1's by {d:.3g} on one device"
