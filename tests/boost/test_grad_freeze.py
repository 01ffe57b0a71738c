"""GradientFreeze: grouping, schedule statistics, skipped backward work, resume position."""

from __future__ import annotations

import lightning as L
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lit_amp import LitModel
from lit_amp.boost import AutoBoost, GradientFreeze
from lit_amp.boost.grad_freeze import freeze_schedule, split_parameter_groups, train_sets
from lit_amp.demos import ResNet1D


def _deep(n: int = 12) -> nn.Sequential:
    return nn.Sequential(*[nn.Linear(6, 6) for _ in range(n)])


def test_grouping_hand_example():
    net = nn.Sequential(
        nn.Conv1d(1, 2, 3),
        nn.BatchNorm1d(2),
        nn.Conv1d(2, 2, 3),
        nn.Conv1d(2, 2, 3, bias=False),
        nn.Conv1d(2, 2, 3, bias=False),
        nn.Conv1d(2, 2, 3, bias=False),
        nn.Conv1d(2, 2, 3, bias=False),
    )
    named = list(net.named_parameters())
    groups = split_parameter_groups(named, {id(p) for p in net[1].parameters()})
    names = {id(p): n for n, p in named}
    # conv0.w, conv0.b, bn.w, bn.b | conv2.w, conv2.b, conv3.w | conv4.w, conv5.w, conv6.w
    assert [[names[id(p)] for p in g] for g in groups] == [
        ["0.weight", "0.bias", "1.weight", "1.bias"],
        ["2.weight", "2.bias", "3.weight"],
        ["4.weight", "5.weight", "6.weight"],
    ]
    sets = train_sets(groups, 3)
    assert [len(s) for s in sets] == [10, 6, 3]  # suffixes
    assert [len(s) for s in train_sets(groups, 5)] == [10] * 5  # stride 0: nothing freezes


def test_schedule_statistics_fixed_seed():
    n, p = 10, 0.7
    s = freeze_schedule(n, freeze_type=1, freeze_p=p, total_steps=20000, seed=123)
    assert len(s) == int(20000 * 1.01) and s[0] == 0
    assert abs((s != 0).mean() - p) < 1e-3  # documented meaning: 70 % of steps freeze
    counts = np.bincount(s[s != 0], minlength=n)[1:]
    expected = np.arange(n - 1, 0, -1) / np.arange(1, n).sum()  # P(k) ∝ N - k
    np.testing.assert_allclose(counts / counts.sum(), expected, atol=0.01)
    np.testing.assert_array_equal(s, freeze_schedule(n, 1, p, 20000, seed=123))
    assert not np.array_equal(s, freeze_schedule(n, 1, p, 20000, seed=124))
    # the slot pattern keeps the frozen fraction close to p at every prefix
    running = np.cumsum(s != 0) / np.arange(1, len(s) + 1)
    assert abs(running[99] - p) < 0.02


def test_schedule_continuous_and_edges():
    assert freeze_schedule(5, 0, 0.8, 10).tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]
    assert freeze_schedule(3, 0, 0.5, 6).tolist() == [0, 0, 1, 2, 0, 0]
    assert freeze_schedule(4, 1, 0.0, 50).tolist() == [0] * 50
    assert freeze_schedule(1, 1, 0.9, 50).tolist() == [0] * 50
    s = freeze_schedule(4, 1, 1.0, 50)
    assert s[0] == 0 and (s[1:] != 0).all()
    with pytest.raises(ValueError, match="freeze_type"):
        freeze_schedule(4, 2)
    with pytest.raises(ValueError, match="GradientFreeze: 'freeze_p' must be in \\[0, 1\\]"):
        GradientFreeze(freeze_p=1.2)
    with pytest.raises(TypeError, match="'param_groups' must be an int"):
        GradientFreeze(param_groups=2.0)


def test_frozen_prefix_skips_backward_work():
    torch.manual_seed(0)
    net = _deep(12)  # 12 linear layers -> 6 groups of 2 layers (4 params each)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    gf = GradientFreeze(param_groups=6, freeze_type=0, freeze_p=1.0)  # schedule 1,2,3,4,5,1,...
    gf.attach(net, [opt])
    fired: list[int] = []
    for i, layer in enumerate(net):
        layer.register_full_backward_hook(lambda m, gi, go, i=i: fired.append(i))
    grads_seen: list[int] = []
    for i, layer in enumerate(net):
        layer.weight.register_post_accumulate_grad_hook(lambda p, i=i: grads_seen.append(i))
    x = torch.randn(4, 6)
    for k in (1, 2, 3):
        assert gf.current_index == k
        fired.clear()
        grads_seen.clear()
        before = [p.detach().clone() for p in net.parameters()]
        opt.zero_grad(set_to_none=True)
        net(x).sum().backward()
        # the first 2k layers (k groups) never run backward: no module hook, no weight grad
        assert sorted(fired) == list(range(2 * k, 12))
        assert sorted(grads_seen) == list(range(2 * k, 12))
        opt.step()
        after = list(net.parameters())
        frozen = 4 * k
        assert all(torch.equal(b, a) for b, a in zip(before[:frozen], after[:frozen]))
        assert not torch.equal(before[-1], after[-1])
    assert gf.position == 3
    gf.detach()
    assert all(p.requires_grad for p in net.parameters())


def test_frozen_params_do_not_step_even_with_stale_grads():
    torch.manual_seed(0)
    net = _deep(4)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    gf = GradientFreeze(param_groups=2, freeze_type=0, freeze_p=1.0)
    gf.attach(net, [opt])
    for p in net.parameters():
        p.grad = torch.ones_like(p)  # stale gradients left by the user (no zero_grad)
    first = net[0].weight.detach().clone()
    net(torch.randn(2, 6)).sum().backward()
    opt.step()
    assert torch.equal(first, net[0].weight)
    gf.detach()


def test_no_freeze_when_too_few_groups(caplog):
    net = _deep(2)
    gf = GradientFreeze(param_groups=10)
    gf.attach(net, [torch.optim.SGD(net.parameters(), lr=0.1)])
    assert "fewer than param_groups=10" in caplog.text
    gf.detach()


def _fit(boost: AutoBoost, epochs: int, ckpt_in=None, ckpt_out=None, record=None):
    torch.manual_seed(0)
    net = ResNet1D(channels=4, blocks=(2, 2, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    lit = LitModel(net, nn.CrossEntropyLoss(), opt)

    class Record(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            record.append(boost.get_algorithm("grad_freeze")._current)

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(96, 40, generator=g), torch.randint(0, 10, (96,), generator=g))
    trainer = L.Trainer(
        max_epochs=epochs,
        callbacks=[boost, Record()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(lit, DataLoader(data, batch_size=16), ckpt_path=ckpt_in)
    if ckpt_out is not None:
        trainer.save_checkpoint(ckpt_out)
    return boost, lit


def test_resume_keeps_schedule_position(tmp_path):
    cfg = {"grad_freeze": {"param_groups": 4, "freeze_p": 0.5, "seed": 7}}
    full: list[int] = []
    ab_full, _ = _fit(AutoBoost("O1", cfg), 2, record=full)
    assert ab_full.get_algorithm("grad_freeze").position == 12
    first: list[int] = []
    ckpt = tmp_path / "half.ckpt"
    _fit(AutoBoost("O1", cfg), 1, ckpt_out=str(ckpt), record=first)
    second: list[int] = []
    ab2, lit2 = _fit(AutoBoost("O1", cfg), 2, ckpt_in=str(ckpt), record=second)
    assert ab2.get_algorithm("grad_freeze").position == 12
    assert first + second == full  # the resumed run continues the same freeze sequence
    assert any(i > 0 for i in full) and 0 in full
    # after fit, nothing stays frozen
    assert all(p.requires_grad for p in lit2.network.parameters())
