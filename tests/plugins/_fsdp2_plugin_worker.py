"""Worker script for tests/plugins/test_amp_precision_fsdp2.py (2 CPU processes, gloo).

``AmpPrecision("O2")`` with the user's own LightningModule that applies ``fully_shard`` in
``configure_model`` under ``ModelParallelStrategy``: converting after sharding is refused
(it silently stopped learning); converting before ``fully_shard`` trains. Lightning's launcher
re-runs this script for rank 1; each rank writes ``OUT/plugin<rank>.json``.
"""

from __future__ import annotations

import json
import os
import sys

import lightning as L
import torch
import torch.distributed as dist
from torch import nn


class Net(L.LightningModule):
    def __init__(self, convert_first: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(),
                                   nn.Linear(32, 3))
        self.convert_first = convert_first

    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard

        if self.convert_first:
            from lit_amp import auto_mixed_precision

            auto_mixed_precision(self.model, "O2", cache_casts=False)
        mesh = self.device_mesh["data_parallel"]
        fully_shard(self.model[0], mesh=mesh)
        fully_shard(self.model[3], mesh=mesh)
        fully_shard(self.model, mesh=mesh)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.model(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), 0.5)


def _loss(net: Net, x: torch.Tensor, y: torch.Tensor) -> float:
    net.model.eval()
    with torch.no_grad():
        return float(nn.functional.cross_entropy(net.model(x), y))


def main(out: str) -> None:
    from lightning.pytorch.strategies import ModelParallelStrategy

    from lit_amp.plugins.precision.amp import AmpPrecision

    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    res: dict = {}
    for convert_first in (False, True):
        net = Net(convert_first)
        trainer = L.Trainer(accelerator="cpu", devices=2, max_epochs=3, logger=False,
                            strategy=ModelParallelStrategy(data_parallel_size=2,
                                                           tensor_parallel_size=1),
                            plugins=[AmpPrecision("O2")], enable_progress_bar=False,
                            enable_checkpointing=False, enable_model_summary=False)
        key = "first" if convert_first else "after"
        try:
            trainer.fit(net, dl)
            res[key] = {"error": None, "loss": _loss(net, x, y),
                        "bn": str(net.model[1].running_mean.dtype)}
        except ValueError as err:
            res[key] = {"error": str(err)}
    res["initial"] = _loss(Net(False), x, y)
    with open(os.path.join(out, f"plugin{dist.get_rank()}.json"), "w") as f:
        json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
