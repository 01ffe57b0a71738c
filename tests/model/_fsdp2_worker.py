"""Worker script for tests/model/test_sharding.py: ``Model``/``LitModel`` under FSDP2 on 2 CPUs.

A script, because Lightning's launcher re-runs it (same argv) for rank 1. Each rank writes
``OUT/<mode><rank>.json``; checkpoints go to ``OUT/ck`` (rank 0 writes them).

Modes:
    main OUT  - the same fp32 training under 'ddp' and 'fsdp2' (eval loss, gathered weights),
                a second train call, ModelCheckpoint + Trainer.save_checkpoint files, an
                overflow injected into rank 1's gradient shard, fully_shard applied by the user
                after building the optimizer, bf16 O2 with BatchNorm, LitModel in a plain
                Trainer(strategy=ModelParallelStrategy(...)), BackupAndRestore resuming a
                new Model under 'ddp' and 'fsdp2' (same weights as an uninterrupted run).
"""

from __future__ import annotations

import os
import sys

import lightning as L
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

CPU2 = {"accelerator": "cpu", "devices": 2}


from tests.helpers.dist import write_rank_result  # noqa: E402


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 32),
                         nn.ReLU(), nn.Linear(32, 3))


def _loader(n: int = 64, seed: int = 0, bs: int = 8) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return DataLoader(TensorDataset(x, y), batch_size=bs)


def _full(net: nn.Module) -> dict:
    """The network's full (gathered) state, as lists; a collective under FSDP2."""
    from torch.distributed.tensor import DTensor

    out = {}
    for k, v in net.state_dict().items():
        if isinstance(v, DTensor):
            v = v.full_tensor()
        out[k] = v.detach().float().flatten().tolist()
    return out


def _model(net: nn.Module, strategy: str, sgd: bool = False, **kw):
    from lit_amp import Model

    trainer = {**CPU2, "strategy": strategy, **kw.pop("trainer", {})}
    opt = (torch.optim.SGD(net.parameters(), 0.1, momentum=0.9) if sgd
           else torch.optim.Adam(net.parameters(), 1e-2))
    return Model(net, nn.CrossEntropyLoss(), opt, metrics={"loss", "acc"}, trainer=trainer, **kw)


def _compare(res: dict, out: str) -> None:
    """Item 6: fp32, same data: DDP and FSDP2 agree; second call; checkpoints."""
    from lit_amp.callbacks import CheckpointConfig, ModelCheckpoint

    for strategy in ("ddp", "fsdp2"):
        net = _net()
        model = _model(net, strategy, sgd=True, trainer={"gradient_clip_val": 0.05})
        cbs = []
        if strategy == "fsdp2":
            cbs = [ModelCheckpoint("fs", os.path.join(out, "ck"),
                                   CheckpointConfig(save_checkpoint_steps=4))]
        model.train(1, _loader(), callbacks=cbs)  # 4 steps per rank: the checkpoint at step 4
        first = model.eval(_loader(seed=1))["loss"]
        first_weights = _full(net)
        model.train(2, _loader(seed=2), initial_epoch=1)  # a second call on the same model
        if strategy == "fsdp2":  # Lightning's own checkpoint of that fit (every rank calls)
            model.trainer.save_checkpoint(os.path.join(out, "ck", "trainer.ckpt"))
        res[strategy] = {"eval_first": first, "eval": model.eval(_loader(seed=1))["loss"],
                         "weights": _full(net), "first_weights": first_weights,
                         "predict": model.predict(torch.ones(2, 8)).flatten().tolist(),
                         "sharded": type(net).__name__}
        if strategy == "fsdp2":
            res["opt_is_user_opt"] = model.lit_model.optimizer is model._optimizer
            res["local_numel"] = sum(p.to_local().numel() for p in net.parameters())
            res["numel"] = sum(p.numel() for p in net.parameters())


def _overflow(res: dict) -> None:
    """An inf in rank 1's gradient shard at step 2 skips that step on both ranks."""
    from lit_amp.amp.loss_scale.managers import DynamicLossScaleManager

    class Poison(L.Callback):
        def __init__(self) -> None:
            self.n = 0

        def on_after_backward(self, trainer, pl_module):
            self.n += 1
            if self.n == 2 and dist.get_rank() == 1:
                p = pl_module.network[0].weight
                p.grad.to_local().view(-1)[0] = float("inf")

    net = _net()
    model = _model(net, "fsdp2", loss_scale_manager=DynamicLossScaleManager(2.0 ** 10))
    model.train(1, _loader(n=32), callbacks=[Poison()])
    ctl = model.lit_model.loss_scale
    res["overflow"] = {"skipped": ctl.skipped_steps, "steps": ctl.steps, "scale": ctl.scale,
                       "finite": all(bool(torch.isfinite(p.full_tensor()).all())
                                     for p in net.parameters())}


def _user_sharded(res: dict) -> None:
    """fully_shard by the user after building the optimizer: a clear error, not silence."""
    from torch.distributed.fsdp import fully_shard

    from lit_amp import Model

    net = _net()
    opt = torch.optim.SGD(net.parameters(), 0.1)
    fully_shard(net)
    model = Model(net, nn.CrossEntropyLoss(), opt, trainer={**CPU2, "strategy": "fsdp2"})
    try:
        model.train(1, _loader(n=16))
        res["user_sharded"] = None
    except ValueError as err:
        res["user_sharded"] = str(err)


def _bf16(res: dict) -> None:
    """O2 in bf16 under FSDP2: it trains, BatchNorm's buffers stay float32."""
    net = _net()
    seen = []
    net[3].register_forward_hook(lambda m, i, o: seen.append(str(o.dtype)))
    model = _model(net, "fsdp2", amp_level="O2")
    before = model.eval(_loader(seed=1))["loss"]
    model.train(3, _loader(n=128))
    bn = net[1]
    res["bf16"] = {"before": before, "after": model.eval(_loader(seed=1))["loss"],
                   "bn_dtypes": [str(bn.running_mean.dtype), str(bn.running_var.dtype)],
                   "param_dtype": str(net[0].weight.dtype), "compute": sorted(set(seen))}


def _plain_trainer(res: dict) -> None:
    """LitModel in the user's own Trainer(strategy=ModelParallelStrategy(...))."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    from lit_amp import LitModel

    net = _net()
    lit = LitModel(net, nn.CrossEntropyLoss(), torch.optim.Adam(net.parameters(), 1e-2),
                   metrics={"loss"})
    strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
    trainer = L.Trainer(strategy=strategy, max_epochs=2, logger=False, enable_progress_bar=False,
                        enable_checkpointing=False, enable_model_summary=False, **CPU2)
    trainer.validate(lit, _loader(seed=1), verbose=False)
    before = lit.last_eval_results["eval_loss"]
    trainer = L.Trainer(strategy=ModelParallelStrategy(data_parallel_size=2,
                                                       tensor_parallel_size=1),
                        max_epochs=2, logger=False, enable_progress_bar=False,
                        enable_checkpointing=False, enable_model_summary=False, **CPU2)
    trainer.fit(lit, _loader(n=128), _loader(seed=1))
    res["plain"] = {"before": before, "after": lit.last_eval_results["eval_loss"],
                    "sharded": type(net).__name__}


def _backup(res: dict, out: str) -> None:
    """BackupAndRestore under DDP and FSDP2: 2 epochs, then a new Model resumes to 4 from the
    backup; the same weights as 4 uninterrupted epochs."""
    from lit_amp.callbacks import BackupAndRestore, LambdaCallback

    for strategy in ("ddp", "fsdp2"):
        backup = os.path.join(out, f"backup_{strategy}")
        ref = _net()
        _model(ref, strategy, sgd=True).train(4, _loader(n=128))
        first = _net()
        _model(first, strategy, sgd=True).train(
            2, _loader(n=128), callbacks=[BackupAndRestore(backup, delete_checkpoint=False)])
        resumed = _net(seed=5)  # other initial weights: all must come from the backup
        epochs: list[int] = []
        log_epoch = LambdaCallback(on_train_epoch_end=lambda rc, seen=epochs: seen.append(
            rc.original_args().cur_epoch_num))
        _model(resumed, strategy, sgd=True).train(
            4, _loader(n=128),
            callbacks=[BackupAndRestore(backup, delete_checkpoint=False), log_epoch])
        res[f"backup_{strategy}"] = {"ref": _full(ref), "resumed": _full(resumed),
                                     "after2": _full(first), "epochs": epochs}


def _sink(res: dict) -> None:
    """Sink mode: FSDP2 learns what DDP learns (each rank its own lazily drawn batches)."""
    for strategy in ("ddp", "fsdp2"):
        net = _net()
        model = _model(net, strategy, sgd=True)
        model.train(2, _loader(n=128), dataset_sink_mode=True, sink_size=4)
        res[f"sink_{strategy}"] = {"eval": model.eval(_loader(seed=1))["loss"],
                                   "weights": _full(net)}


def _main(out: str) -> None:
    res: dict = {"errors": []}
    for part in (_compare, _overflow, _user_sharded, _bf16, _plain_trainer, _backup, _sink):
        try:
            part(res, out) if part in (_compare, _backup) else part(res)
        except Exception as err:  # noqa: BLE001 - reported to the test
            import traceback

            res["errors"].append(f"{part.__name__}: {type(err).__name__}: {err}"[:600])
            traceback.print_exc()
    write_rank_result(out, "main", res)


if __name__ == "__main__":
    mode, out_dir = sys.argv[1], sys.argv[2]
    {"main": _main}[mode](out_dir)
