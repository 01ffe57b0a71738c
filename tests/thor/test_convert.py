"""THOR with Model / ConvertModelUtils, the seed example, and a user's Lightning script."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lit_amp import DynamicLossScaleManager, Model
from lit_amp.thor.convert import ConvertModelUtils, ThorModel
from lit_amp.thor.optimizer import THOR, thor

ROOT = Path(__file__).resolve().parents[2]


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))


def _data(n_batches: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g))
        for _ in range(n_batches)
    ]


def _loader() -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(_data(10), batch_size=None)


def _record_steps(opt: THOR) -> list[bool]:
    """Record, for every optimizer step, whether it was a second-order step."""
    seen: list[bool] = []
    step = opt.step

    def wrapped(*a, **k):
        seen.append(opt.is_second_order_step)
        return step(*a, **k)

    opt.step = wrapped
    return seen


def _convert(net, opt, **kw):
    loss = nn.CrossEntropyLoss()
    model = Model(net, loss, opt, metrics={"acc"}, **kw)
    return ConvertModelUtils.convert_to_thor_model(model, net, loss, opt, metrics={"acc"}, **kw)


@pytest.mark.parametrize(("sink", "epochs", "steps"), [(False, 2, 10), (True, 2, 8)])
def test_alternation_in_sink_and_non_sink_mode(sink, epochs, steps):
    net = _net()
    opt = thor(net, 0.05, 0.03, 0.9, frequency=3)
    model = _convert(net, opt)
    assert isinstance(model, ThorModel) and model.frequency == 3
    seen = _record_steps(opt)
    kw = {"dataset_sink_mode": True, "sink_size": 4} if sink else {}
    model.train(epochs, _data(), **kw)
    assert seen == [k % 3 == 0 for k in range(steps)]
    assert opt.refreshes == len(range(0, steps, 3))
    assert all(torch.isfinite(p).all() for p in net.parameters())


def test_lit_amp_thor_re_exports_the_model_side():
    import lit_amp.thor

    assert lit_amp.thor.ConvertModelUtils is ConvertModelUtils
    assert lit_amp.thor.ThorModel is ThorModel


def test_non_thor_optimizer_returns_the_model_unchanged():
    net = _net()
    opt = torch.optim.SGD(net.parameters(), 0.1)
    model = Model(net, nn.CrossEntropyLoss(), opt)
    assert ConvertModelUtils.convert_to_thor_model(model, net, optimizer=opt) is model
    assert ConvertModelUtils.convert_to_thor_model(model, net) is model


def test_fit_with_validation_set_raises():
    net = _net()
    model = _convert(net, thor(net, 0.05, 0.03, 0.9, frequency=2))
    with pytest.raises(ValueError, match="Evaluation in training is currently not supported"):
        model.fit(1, _data(), _data(2))
    model.fit(1, _data())  # without one it trains
    assert model.thor_optimizer.steps == 5
    assert set(model.eval(_data(2))) == {"acc"}


def test_dynamic_loss_scale_is_wired_to_g():
    """THOR (loss_scale=1) under a dynamic loss scaler trains exactly as without scaling."""
    n1, n2 = _net(), _net()
    o1 = thor(n1, 0.05, 0.03, 0.9, frequency=2)
    o2 = thor(n2, 0.05, 0.03, 0.9, frequency=2)
    m1 = _convert(n1, o1)
    m2 = _convert(n2, o2, loss_scale_manager=DynamicLossScaleManager(2.0**12, 2, 1000))
    m1.train(1, _data())
    m2.train(1, _data())
    assert m2.lit_model.loss_scale.scale == 2.0**12
    for a, b in zip(n1.parameters(), n2.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_seed_example_runs_as_written():
    spec = importlib.util.spec_from_file_location("thor_seed", ROOT / "examples" / "thor_seed.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # the seed's create_dataset() is the user's; MNIST-1D-shaped data without generating it
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(
        torch.randn(128, 40, generator=g), torch.randint(0, 10, (128,), generator=g)
    )
    mod.create_dataset = lambda: torch.utils.data.DataLoader(data, batch_size=32)
    model = mod.main()
    opt = model.thor_optimizer
    assert isinstance(model, ThorModel)
    assert (opt.steps, opt.refreshes, opt.get_frequency()) == (4, 1, 4)
    assert opt.inversions == 2 * len(opt.layers) == 8  # 3 Conv1d + the Linear head
    assert model.lit_model.amp_level == "O2" and model.lit_model.loss_scale.scale == 128.0
    assert all(lf.A.dtype == torch.float32 for lf in opt.layers)
    assert all(torch.isfinite(p).all() for p in model.predict_network.parameters())


class _UserModule(L.LightningModule):
    def __init__(self, frequency: int = 3, **thor_kw):
        super().__init__()
        self.net = _net()
        self.frequency = frequency
        self.thor_kw = thor_kw

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        self.opt = thor(self.net, 0.05, 0.03, 0.9, frequency=self.frequency, **self.thor_kw)
        return self.opt


def _trainer(**kw) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        max_steps=7,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kw,
    )


def test_users_lightning_module_and_checkpoint(tmp_path):
    module = _UserModule()
    trainer = _trainer()
    trainer.fit(module, _loader())
    opt = module.opt
    assert (opt.steps, opt.refreshes) == (7, 3)
    path = tmp_path / "last.ckpt"
    trainer.save_checkpoint(path)
    ckpt = torch.load(path, weights_only=False)
    resumed = thor(_net(), 0.05, 0.03, 0.9, frequency=3)
    resumed.load_state_dict(ckpt["optimizer_states"][0])
    assert resumed.steps == 7 and not resumed.is_second_order_step
    for a, b in zip(resumed.layers, opt.layers):
        assert torch.equal(a.G_inv, b.G_inv)


def test_under_amp_precision_plugin_factors_stay_fp32():
    from lit_amp import AmpPrecision

    plugin = AmpPrecision("O2", dtype=torch.bfloat16)
    module = _UserModule()
    _trainer(plugins=[plugin]).fit(module, _loader())
    opt = module.opt
    assert opt.refreshes == 3
    for lf in opt.layers:
        assert lf.A.dtype == lf.G.dtype == lf.A_inv.dtype == torch.float32
        assert torch.isfinite(lf.G_inv).all()
    assert all(
        p.dtype == torch.float32 and torch.isfinite(p).all() for p in module.net.parameters()
    )


def test_under_amp_precision_with_dynamic_loss_scaling():
    from lit_amp import AmpPrecision

    plugin = AmpPrecision(
        "O2", dtype=torch.bfloat16, loss_scale_manager=DynamicLossScaleManager(2.0**10, 2, 1000)
    )
    module = _UserModule(grad_scale=lambda: plugin.loss_scale)
    _trainer(plugins=[plugin]).fit(module, _loader())
    ref = _UserModule(grad_scale=None)
    _trainer(plugins=[AmpPrecision("O2", dtype=torch.bfloat16)]).fit(ref, _loader())
    # G divided by the scale the backward ran with: the same preconditioner as unscaled
    for a, b in zip(module.opt.layers, ref.opt.layers):
        torch.testing.assert_close(a.G, b.G, rtol=5e-2, atol=1e-4)
