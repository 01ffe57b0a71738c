"""AmpFSDPPrecision under Lightning's FSDPStrategy, 2 CPU processes (gloo).

Run as a script (Lightning's launcher re-runs it for rank 1):
``python tests/plugins/precision/_fsdp_worker.py <out_dir> <level> [litmodel]`` (a
LightningModule with ``AmpFSDPPrecision``; or ``LitModel(amp_level=level)``, which must be
refused). Each rank writes ``<out_dir>/rank<r>.json``: the dtypes each layer computed with, the
parameter storage dtype, the full (gathered) weights and the losses;
``tests/plugins/precision/test_fsdp.py`` checks them.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import FSDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lit_amp.plugins.precision.fsdp import AmpFSDPPrecision

BF16 = torch.bfloat16


class CPUFSDPStrategy(FSDPStrategy):
    """Lightning's FSDPStrategy, allowed onto CPU for this test (no GPU on CI).

    Lightning refuses ``FSDPStrategy`` itself with a CPU accelerator (an exact-type check, not
    applied to subclasses), and hands torch's FSDP ``device_id=None`` on CPU, which torch
    rejects without an accelerator; given ``device_id=cpu`` torch's FSDP runs on gloo. Everything
    else - wrapping, the precision plugin's hooks, state-dict gathering - is Lightning's own.
    """

    def _setup_model(self, model: nn.Module) -> nn.Module:
        import torch.distributed.fsdp as fsdp

        original = fsdp.FullyShardedDataParallel

        class OnCPU(original):
            def __init__(self, module: nn.Module, *args, device_id=None, **kwargs) -> None:
                super().__init__(module, *args, device_id=torch.device("cpu"), **kwargs)

        fsdp.FullyShardedDataParallel = OnCPU
        try:
            return super()._setup_model(model)
        finally:
            fsdp.FullyShardedDataParallel = original


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.norm = _SeenLayerNorm(32)
        self.fc2 = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.norm(self.fc1(x))))


class _SeenLayerNorm(nn.LayerNorm):
    """A LayerNorm recording the dtype its own forward computes with (O2 casts an island's
    input inside the forward, after any hook)."""

    seen: list[str] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _SeenLayerNorm.seen.append(str(x.dtype))
        return super().forward(x)


class LM(pl.LightningModule):
    def __init__(self, out: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = Net()
        self.out = out
        self.seen: dict[str, list[str]] = {}
        self.losses: list[float] = []
        for name in ("fc1", "norm", "fc2"):
            getattr(self.net, name).register_forward_hook(self._record(name))

    def _record(self, name: str):
        def hook(m: nn.Module, args: tuple, out: torch.Tensor) -> None:
            self.seen.setdefault(name, []).append(str(out.dtype))

        return hook

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self.net(x)
        loss = nn.functional.cross_entropy(out, y)
        self.losses.append(float(loss.detach()))
        self.seen.setdefault("output", []).append(str(out.dtype))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.2)

    def on_train_end(self) -> None:
        storage = sorted({str(p.dtype) for p in self.parameters()})
        # the full (unsharded) weights on every rank. (Lightning's full state dict, gathered to
        # rank 0, segfaults inside torch's FSDP on CPU even without lit_amp: not used here.)
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        with FSDP.summon_full_params(self.trainer.strategy.model, writeback=False):
            state = {k: v.detach().clone() for k, v in self.net.named_parameters()}
        full = {k: v.float().flatten().tolist() for k, v in state.items()}
        info = {
            "rank": self.global_rank,
            "world": self.trainer.world_size,
            "seen": {k: sorted(set(v)) for k, v in self.seen.items()},
            "norm_computes_in": sorted(set(_SeenLayerNorm.seen)),
            "storage": storage,
            "weights": full,
            "full_dtypes": sorted({str(v.dtype) for v in state.values()}),
            "losses": self.losses,
        }
        with open(os.path.join(self.out, f"rank{self.global_rank}.json"), "w") as f:
            json.dump(info, f)


def main_litmodel(out: str, level: str) -> None:
    """``LitModel(amp_level=level)`` (lit_amp's own train cell) under the FSDP strategy: refused
    with a ValueError at the first training step (``lit_amp.model._lightning``'s
    ``check_training_strategy``)."""
    from lit_amp import LitModel

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = Net()
    lit = LitModel(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.2),
                   amp_level=level)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    y = (x[:, :3].argmax(1)).long()
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=CPUFSDPStrategy(), max_epochs=3,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(lit, DataLoader(TensorDataset(x, y), batch_size=16, shuffle=False))


def main(out: str, level: str) -> None:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    y = (x[:, :3].argmax(1)).long()  # learnable
    data = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=False)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=CPUFSDPStrategy(),
        plugins=[AmpFSDPPrecision(level, dtype=BF16)],
        max_epochs=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(LM(out), data)
    import torch.distributed as dist

    if dist.is_initialized():  # both ranks tear gloo down together (see tests/model/_layout_worker)
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    (main_litmodel if sys.argv[3:] == ["litmodel"] else main)(sys.argv[1], sys.argv[2])
