"""The THOR seed example (``ConvertModelUtils.convert_to_thor_model``), translated to lit_amp.

MindSpore's example (seeds/000), line for line, with PyTorch conventions: ``Net()`` is the
MNIST-1D CNN with BatchNorm, ``create_dataset()`` the MNIST-1D training loader (generated
offline), ``nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction='mean')`` is
``nn.CrossEntropyLoss()``. Four steps run in one sink (``sink_size=4``, ``frequency=4``): one
second-order step, then three first-order steps reusing its inverses. Run it with
``.venv/bin/python examples/thor_seed.py``.
"""

from __future__ import annotations

import torch
from torch import nn

from lit_amp import FixedLossScaleManager, Model
from lit_amp.callbacks import LossMonitor
from lit_amp.demos import CNN1D, mnist1d_loaders
from lit_amp.thor import ConvertModelUtils, thor


def Net() -> nn.Module:  # noqa: N802 - the seed's name
    return CNN1D(batch_norm=True)


def create_dataset() -> torch.utils.data.DataLoader:
    return mnist1d_loaders(32)[0]


def main() -> Model:
    """Run the seed example; returns the converted Model."""
    torch.manual_seed(0)
    net = Net()
    dataset = create_dataset()
    temp = torch.tensor([4e-4, 1e-4, 1e-5, 1e-5], dtype=torch.float32)
    opt = thor(net, learning_rate=temp, damping=temp, momentum=0.9, loss_scale=128, frequency=4)
    loss = nn.CrossEntropyLoss()
    loss_scale = FixedLossScaleManager(128, drop_overflow_update=False)
    model = Model(
        net,
        loss_fn=loss,
        optimizer=opt,
        loss_scale_manager=loss_scale,
        metrics={"acc"},
        amp_level="O2",
        keep_batchnorm_fp32=False,
    )
    model = ConvertModelUtils.convert_to_thor_model(
        model=model,
        network=net,
        loss_fn=loss,
        optimizer=opt,
        loss_scale_manager=loss_scale,
        metrics={"acc"},
        amp_level="O2",
        keep_batchnorm_fp32=False,
    )
    loss_cb = LossMonitor()
    model.train(1, dataset, callbacks=loss_cb, sink_size=4, dataset_sink_mode=True)
    return model


if __name__ == "__main__":
    m = main()
    o = m.thor_optimizer
    print(
        f"{type(m).__name__}: {o.steps} steps, {o.refreshes} second-order, "
        f"{o.inversions} factor inversions, frequency {o.get_frequency()}"
    )
