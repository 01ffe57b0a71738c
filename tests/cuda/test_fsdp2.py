"""``Model(..., trainer={"strategy": "fsdp2", "devices": 1})`` on one device (NCCL on CUDA).

World size 1: lit_amp shards the network with FSDP2 itself (``DTensor`` parameters) over a
process group of one (``nccl`` on CUDA, ``gloo`` on the CPU); training and ``eval`` give the
same loss and accuracy as the same run without FSDP2, and ``predict`` the same outputs. The
process group and the environment variables the strategy sets are removed afterwards, so the
tests that follow in this process run without ``torch.distributed``.
"""

from __future__ import annotations

import os

import lightning as L
import pytest
import torch
import torch.distributed as dist
from torch import nn

from lit_amp import Model
from tests.helpers.data import make_batches, make_net

pytestmark = pytest.mark.cuda


@pytest.fixture
def own_process_group():
    """Destroy the process group this test starts and restore the environment."""
    was = dist.is_available() and dist.is_initialized()
    env = dict(os.environ)
    yield
    if not was and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    for key in set(os.environ) - set(env):
        del os.environ[key]
    os.environ.update(env)


class _Probe(L.Callback):
    def __init__(self) -> None:
        self.seen: dict = {}

    def on_train_start(self, trainer, pl_module) -> None:
        p = next(pl_module.network.parameters())
        self.seen = {"backend": str(dist.get_backend()) if dist.is_initialized() else None,
                     "world": trainer.world_size, "param": type(p).__name__,
                     "device": p.device.type, "strategy": type(trainer.strategy).__name__}


def _run(trainer: dict):
    torch.manual_seed(0)
    net = make_net(hidden=32)
    model = Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1,
                                                              momentum=0.9),
                  metrics={"acc", "loss"}, trainer=trainer)
    probe = _Probe()
    model.train(3, make_batches(5), callbacks=[probe])
    valid = make_batches(4, seed=7)
    res = model.eval(valid)
    with torch.no_grad():
        pred = model.predict(valid[0][0]).float()
    if hasattr(pred, "full_tensor"):
        pred = pred.full_tensor()
    return res, pred.cpu(), probe.seen


def test_fsdp2_on_one_device_trains_as_without(device, on_cuda, accelerator, exact_fp32,
                                               own_process_group):
    plain_res, plain_pred, plain = _run(accelerator)
    res, pred, seen = _run({**accelerator, "strategy": "fsdp2"})
    assert plain["strategy"] == "SingleDeviceStrategy" and plain["param"] == "Parameter"
    assert seen["strategy"] == "FSDP2Strategy" and seen["world"] == 1
    assert seen["param"] == "DTensor" and seen["device"] == device.type  # sharded by lit_amp
    assert seen["backend"] == ("nccl" if on_cuda else "gloo"), seen
    assert res["acc"] == plain_res["acc"] and res["acc"] > 0.8, (res, plain_res)
    assert res["loss"] == pytest.approx(plain_res["loss"], rel=1e-5), (res, plain_res)
    d = (pred - plain_pred).abs().max().item()
    assert d <= 1e-5, f"FSDP2 predictions differ from the unsharded run's by {d:.3g}"
