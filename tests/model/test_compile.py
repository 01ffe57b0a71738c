"""``torch.compile(lit_model)`` then ``Trainer.fit`` -- Lightning's documented way of compiling.

Before issue #48 item 20 it failed with a 290-line ``InternalTorchDynamoError`` raised from
``LitModel.training_step``'s ``self.log``; now the Trainer call compiles the network and runs
the step code eagerly (``lit_amp.model._lightning.compile_network_instead``). The run is the
user's: real MNIST-1D samples, a small MLP, ``Trainer(max_epochs=1)``, TorchInductor (which
needs a C compiler on the CPU).
"""

from __future__ import annotations

import shutil

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lit_amp.demos import MLP
from lit_amp.demos.data import mnist1d_arrays
from lit_amp.model import LitModel

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")),
    reason="TorchInductor on the CPU compiles C++: no C compiler on this machine",
)]


def _loaders() -> tuple[DataLoader, DataLoader]:
    d = mnist1d_arrays(42)
    x, y = torch.as_tensor(d["x"][:256]).float(), torch.as_tensor(d["y"][:256]).long()
    xv, yv = torch.as_tensor(d["x_test"][:128]).float(), torch.as_tensor(d["y_test"][:128]).long()
    return (DataLoader(TensorDataset(x, y), batch_size=32),
            DataLoader(TensorDataset(xv, yv), batch_size=64))


def _fit(compiled: bool) -> tuple[LitModel, list[float]]:
    torch.manual_seed(0)
    net = MLP(40, 32, 10)
    lit = LitModel(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
                   metrics={"acc", "loss"})
    losses: list[float] = []

    class Losses(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            losses.append(float(outputs["loss"]))

    model = torch.compile(lit) if compiled else lit
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", logger=False, callbacks=[Losses()],
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    train, valid = _loaders()
    trainer.fit(model, train, valid)
    return lit, losses


def test_torch_compile_of_a_lit_model_trains_like_the_uncompiled_one():
    torch._dynamo.reset()
    eager, eager_losses = _fit(compiled=False)
    lit, losses = _fit(compiled=True)
    # the network ran compiled (nn.Module.compile's form), the steps did not
    assert lit.network._compiled_call_impl is not None
    assert lit._compiler_ctx is None
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1
    assert len(losses) == 8 and losses[-1] < losses[0]  # it learns
    assert losses == pytest.approx(eager_losses, rel=1e-4, abs=1e-5)
    for (name, p), (_, q) in zip(lit.network.state_dict().items(),
                                 eager.network.state_dict().items()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)
    # the checkpoint's keys are the uncompiled model's (no "_orig_mod." prefix)
    assert list(lit.state_dict()) == list(eager.state_dict())
    assert lit.last_eval_results["metrics"]["acc"] == pytest.approx(
        eager.last_eval_results["metrics"]["acc"])
