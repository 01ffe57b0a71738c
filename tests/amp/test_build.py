"""build_train_network (docs/semantics.md §2.4) and MindSpore's documented example, in torch."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from lit_amp.amp.build import (
    TrainOneStepWithLossScaleCell,
    WithLossCellAmp,
    build_train_network,
)
from lit_amp.amp.cells import TrainOneStepCell, WithLossCell
from lit_amp.amp.convert import auto_mixed_precision
from lit_amp.amp.loss_scale.managers import DynamicLossScaleManager, FixedLossScaleManager

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


class LeNet5(nn.Module):
    """MindSpore's docs LeNet5 (docs/mindspore/code/lenet.py), in torch."""

    def __init__(self, num_class: int = 10, num_channel: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(num_channel, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_class)
        self.relu = nn.ReLU()
        self.max_pool2d = nn.MaxPool2d(kernel_size=2, stride=2)
        self.flatten = nn.Flatten()

    def forward(self, x):
        x = self.max_pool2d(self.relu(self.conv1(x)))
        x = self.max_pool2d(self.relu(self.conv2(x)))
        x = self.flatten(x)
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return self.fc3(x)


def bn_net() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))


def batch(n: int = 8):
    return torch.randn(n, 8), torch.randint(0, 3, (n,))


def test_seed_example_runs_as_written():
    # >>> network = LeNet5()
    # >>> net_loss = nn.SoftmaxCrossEntropyWithLogits(reduction="mean")
    # >>> net_opt = nn.Momentum(network.trainable_params(), learning_rate=0.01, momentum=0.9)
    # >>> amp_level="O3"
    # >>> net = amp.build_train_network(network, net_opt, net_loss, amp_level)
    network = LeNet5()
    net_loss = nn.CrossEntropyLoss(reduction="mean")
    net_opt = torch.optim.SGD(
        [p for p in network.parameters() if p.requires_grad], lr=0.01, momentum=0.9
    )
    amp_level = "O3"
    net = build_train_network(network, net_opt, net_loss, amp_level)
    assert isinstance(net, TrainOneStepCell) and not isinstance(net, TrainOneStepWithLossScaleCell)
    assert net.amp_config.level == "O3" and net.amp_config.dtype == BF16  # CPU default
    w0 = network.conv1.weight.detach().clone()
    x, y = torch.randn(4, 1, 32, 32), torch.tensor([0, 3, 5, 9])
    losses = [net(x, y) for _ in range(5)]
    assert all(loss.dtype == F32 and loss.dim() == 0 for loss in losses)
    assert losses[-1] < losses[0]
    assert not torch.equal(w0, network.conv1.weight)
    assert network.conv1.weight.dtype == F32


@pytest.mark.parametrize(
    "level, keep_bn, cast, lsm, mechanism",
    [
        ("O0", False, F32, None, "none"),
        ("O1", False, F32, None, "O1"),
        ("O2", True, BF16, None, "O2"),  # bf16: no loss scaling by default
        ("O3", False, BF16, None, "O3"),
    ],
)
def test_level_table_cpu(level, keep_bn, cast, lsm, mechanism):
    net = bn_net()
    step = build_train_network(net, torch.optim.SGD(net.parameters(), lr=0.1),
                               nn.CrossEntropyLoss(), level)
    cfg = step.amp_config
    assert (cfg.keep_batchnorm_fp32, cfg.cast_model_type, cfg.loss_scale_manager) == (
        keep_bn, cast, lsm)
    assert cfg.mechanism == mechanism
    assert isinstance(step.network, WithLossCellAmp if mechanism != "none" else WithLossCell)
    assert step(*batch()).dtype == F32


def test_o2_float16_defaults_to_dynamic_loss_scaling():
    net = bn_net()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fp16 on CPU
        step = build_train_network(net, torch.optim.SGD(net.parameters(), lr=0.1),
                                   nn.CrossEntropyLoss(), "O2", dtype=F16)
        assert isinstance(step, TrainOneStepWithLossScaleCell)
        assert isinstance(step.amp_config.loss_scale_manager, DynamicLossScaleManager)
        loss, overflow, scale = step(*batch())
    # 2**24 * loss overflows float16 gradients: the first step is skipped and the scale halves
    assert loss.dtype == F32 and overflow.dtype == torch.bool and scale.dtype == F32
    assert bool(overflow) and float(scale) == 2.0**24
    assert step.controller.scale == 2.0**23 and step.controller.skipped_steps == 1


def test_kwargs_override_the_level():
    net = bn_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    # O2 with keep_batchnorm_fp32=False computes BatchNorm in the low dtype too
    step = build_train_network(net, opt, nn.CrossEntropyLoss(), "O2", keep_batchnorm_fp32=False)
    assert step.amp_config.mechanism == "O3"
    seen = []
    net[1].register_forward_pre_hook(lambda m, a: seen.append(m.weight.dtype))
    step(*batch())
    assert seen == [BF16]
    # cast_model_type=float32 turns O2 off
    net2 = bn_net()
    step2 = build_train_network(net2, torch.optim.SGD(net2.parameters(), lr=0.1),
                                nn.CrossEntropyLoss(), "O2", cast_model_type=F32)
    assert step2.amp_config.mechanism == "none" and not net2[0]._forward_pre_hooks
    # a fixed scale that does not drop overflows: scaled, unscaled, never skipped, loss only
    net3 = bn_net()
    opt3 = torch.optim.SGD(net3.parameters(), lr=0.1)
    step3 = build_train_network(net3, opt3, nn.CrossEntropyLoss(), "O3",
                                loss_scale_manager=FixedLossScaleManager(128.0, False))
    out = step3(*batch())
    assert torch.is_tensor(out) and out.dim() == 0
    # an explicit None disables O2's default manager
    net4 = bn_net()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step4 = build_train_network(net4, torch.optim.SGD(net4.parameters(), lr=0.1),
                                    nn.CrossEntropyLoss(), "O2", cast_model_type=F16,
                                    loss_scale_manager=None)
    assert step4.amp_config.loss_scale_manager is None and step4.amp_config.dtype == F16


def test_fixed_manager_with_update_cell_returns_triple():
    net = bn_net()
    step = build_train_network(net, torch.optim.SGD(net.parameters(), lr=0.1),
                               nn.CrossEntropyLoss(), "O2",
                               loss_scale_manager=FixedLossScaleManager(64.0))
    loss, overflow, scale = step(*batch())
    assert not bool(overflow) and float(scale) == 64.0
    state = step.checkpoint_state()
    assert state["lit_amp_loss_scale"]["scale"] == 64.0


def test_gradients_equal_to_unscaled_training():
    torch.manual_seed(0)
    a, b = bn_net(), bn_net()
    b.load_state_dict(a.state_dict())
    sa = build_train_network(a, torch.optim.SGD(a.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                             "O2", loss_scale_manager=DynamicLossScaleManager(2.0**10))
    sb = build_train_network(b, torch.optim.SGD(b.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                             "O2")
    x, y = batch()
    sa(x, y)
    sb(x, y)
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb)


def test_loss_in_fp32_for_o2_and_o3():
    for level in ("O2", "O3"):
        seen: list = []

        def loss_fn(out, label, seen=seen):
            seen.append((out.dtype, label.dtype))
            return nn.functional.mse_loss(out, label)

        net = nn.Sequential(nn.Linear(8, 3))
        step = build_train_network(net, torch.optim.SGD(net.parameters(), lr=0.1), loss_fn, level)
        step(torch.randn(4, 8), torch.randn(4, 3).to(BF16))
        assert seen == [(F32, F32)]


def test_network_computing_its_own_loss():
    net = nn.Sequential(nn.Linear(8, 1))

    class WithLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, x, y):
            return (self.net(x) - y).pow(2).mean()

    step = build_train_network(WithLoss(), torch.optim.SGD(net.parameters(), lr=0.1), None, "O3")
    assert step(torch.randn(4, 8), torch.randn(4, 1)).dtype == F32


def test_o0_keeps_a_network_converted_beforehand():
    net = auto_mixed_precision(bn_net(), "O3", BF16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_train_network(net, torch.optim.SGD(net.parameters(), lr=0.1),
                            nn.CrossEntropyLoss(), "O0")
    assert net._amp_level == "O3"
    with pytest.warns(UserWarning, match="already been converted"):
        build_train_network(net, torch.optim.SGD(net.parameters(), lr=0.1),
                            nn.CrossEntropyLoss(), "O2")


def test_auto_level():
    net = bn_net()
    step = build_train_network(net, torch.optim.SGD(net.parameters(), lr=0.1),
                               nn.CrossEntropyLoss(), "auto")
    assert step.amp_config.requested_level == "auto"
    assert step.amp_config.level in ("O0", "O2")


def _args(**over):
    net = bn_net()
    args = {"network": net, "optimizer": torch.optim.SGD(net.parameters(), lr=0.1),
            "loss_fn": nn.CrossEntropyLoss(), "level": "O2"}
    args.update(over)
    return args


@pytest.mark.parametrize(
    "over, exc, match",
    [
        ({"network": "net"}, TypeError, "'network' must be a torch.nn.Module"),
        ({"optimizer": object()}, TypeError, "'optimizer' must be a torch.optim.Optimizer"),
        ({"loss_fn": 3}, TypeError, "'loss_fn' must be None"),
        ({"level": "O5"}, ValueError, "'level' must be one of"),
        ({"level": 2}, TypeError, "'level' must be a str"),
        ({"boost_level": "O3"}, ValueError, "'boost_level' must be one of"),
        ({"boost_level": 1}, TypeError, "'boost_level' must be a str"),
        ({"acc_level": "O1"}, ValueError, "unsupported arg 'acc_level'"),
        ({"cast_model_type": torch.float64}, ValueError, "'cast_model_type' must be"),
        ({"keep_batchnorm_fp32": 1}, TypeError, "'keep_batchnorm_fp32' must be a bool"),
        ({"loss_scale_manager": 128.0}, TypeError, "'loss_scale_manager' must be None or"),
        ({"dtype": torch.float32}, ValueError, "'dtype' must be torch.float16"),
    ],
)
def test_errors(over, exc, match):
    with pytest.raises(exc, match=match):
        build_train_network(**_args(**over))


def test_boost_level_warns():
    with pytest.warns(UserWarning, match="boost_level"):
        build_train_network(**_args(boost_level="O1"))


def test_scale_sense_validation():
    net = WithLossCell(bn_net(), nn.CrossEntropyLoss())
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with pytest.raises(TypeError, match="'scale_sense' must be"):
        TrainOneStepWithLossScaleCell(net, opt, "big")
    with pytest.raises(ValueError, match=r"shape \(\) or \(1,\)"):
        TrainOneStepWithLossScaleCell(net, opt, torch.ones(2, 2))
    cell = TrainOneStepWithLossScaleCell(net, opt, torch.tensor(8.0))
    _, overflow, scale = cell(*batch())
    assert float(scale) == 8.0 and not bool(overflow)


class _FunctionalLinear(nn.Module):
    """A layer O1 reaches only through its white-listed function (``F.linear``)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight)


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
@pytest.mark.parametrize("make_net", [lambda: nn.Linear(3, 2), _FunctionalLinear])
def test_float64_input_into_a_float32_network_is_cast(level: str, make_net) -> None:
    """Issue #48 item 7. Recorded from mindspore 2.10 (PyNative, CPU): build_train_network(
    nn.Dense(3, 2), Momentum, MSELoss, level="O3") (and "O1") trains on a float64 input and
    label (the input is cast to the low dtype like a float32 one; parameters stay float32);
    at O0 the float64 input is an error (MindSpore's MatMul: TypeError)."""
    torch.manual_seed(0)
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    step = build_train_network(net, opt, nn.MSELoss(), level=level, dtype=BF16)
    before = [p.detach().clone() for p in net.parameters()]
    x = torch.ones(4, 3, dtype=torch.float64)
    loss = step(x, torch.ones(4, 2, dtype=torch.float64))
    loss = loss[0] if isinstance(loss, tuple) else loss
    assert torch.isfinite(loss).all()
    assert all(p.dtype == F32 for p in net.parameters())
    assert any(not torch.equal(a, p) for a, p in zip(before, net.parameters()))


def test_float64_network_under_o3_stays_float64() -> None:
    net = nn.Linear(3, 2).double()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    step = build_train_network(net, opt, nn.MSELoss(), level="O3", dtype=BF16)
    loss = step(torch.ones(4, 3, dtype=torch.float64), torch.ones(4, 2, dtype=torch.float64))
    assert loss.dtype == torch.float64
