"""Worker script for tests/model/test_data.py: which samples each rank trains on
and which samples an evaluation counts, under Lightning's DDP on 2 CPU processes (issue #28,
items 16, 17, 19 and 20).

A script, because Lightning's launcher re-runs it (same argv) for rank 1. Every sample's first
feature (and its label) is its id, so the network records the ids it trained on and the
``Ids`` metric returns the ids an evaluation counted (gathered over the ranks, as a user reads
them). Each scenario records its result or its error, so one run reports every item.

Usage: ``python _ddp_coverage_worker.py OUT`` -> ``OUT/coverage<rank>.json``.
"""

from __future__ import annotations

import os
import sys

import torch
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, TensorDataset

from tests.helpers.dist import write_rank_result  # noqa: E402

TRAINER = {"accelerator": "cpu", "devices": 2, "strategy": "ddp"}
RANK = int(os.environ.get("LOCAL_RANK", 0))  # rank 1 is this script re-run by Lightning


class Recorder(nn.Module):
    """``Linear(2, 1)`` recording the sample ids (``x[:, 0]``) it trains on."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(2, 1)
        self.seen: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.seen.extend(int(v) for v in x[:, 0].tolist())
        return self.lin(x * 1e-3)


class Ids(torchmetrics.Metric):
    """The ids (labels) of the samples an evaluation counted, over all ranks, sorted."""

    def __init__(self) -> None:
        super().__init__()
        self.add_state("ids", default=[], dist_reduce_fx="cat")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        self.ids.append(target.detach().flatten().float())

    def compute(self) -> torch.Tensor:
        from torchmetrics.utilities import dim_zero_cat

        return dim_zero_cat(self.ids).sort().values


def _data(n: int) -> TensorDataset:
    x = torch.zeros(n, 2)
    x[:, 0] = torch.arange(n, dtype=torch.float32)
    return TensorDataset(x, x[:, :1].clone())


class Stream(IterableDataset):
    """An IterableDataset of ``n`` samples; ``shard=True``: each rank's copy yields its own."""

    def __init__(self, n: int, *, shard: bool = False) -> None:
        self.n, self.shard = n, shard

    def _ids(self) -> range:
        return range(RANK, self.n, 2) if self.shard else range(self.n)

    def __iter__(self):
        ds = _data(self.n)
        for i in self._ids():
            yield ds[i]

    def __len__(self) -> int:
        return len(self._ids())


class RankSampler(torch.utils.data.Sampler):
    """A rank-aware sampler of the user's own (not a DistributedSampler): ids rank::world."""

    def __init__(self, n: int, num_replicas: int, rank: int) -> None:
        self.n, self.num_replicas, self.rank = n, num_replicas, rank

    def __iter__(self):
        return iter(range(self.rank, self.n, self.num_replicas))

    def __len__(self) -> int:
        return len(range(self.rank, self.n, self.num_replicas))


def _model(net: nn.Module, **kw):
    from lit_amp import Model

    return Model(net, nn.MSELoss(), torch.optim.SGD(net.parameters(), 0.01),
                 trainer=dict(TRAINER), **kw)


def _steps_callback():
    from lit_amp.callbacks import Callback

    class Steps(Callback):
        def __init__(self) -> None:
            self.batch_num: list[int] = []
            self.steps: list[int] = []

        def on_train_epoch_end(self, run_context):
            p = run_context.original_args()
            self.batch_num.append(p.batch_num)
            self.steps.append(p.cur_step_num)

    return Steps()


def _record(res: dict, name: str, fn) -> None:
    try:
        res[name] = fn()
    except Exception as err:  # noqa: BLE001 - reported to the test
        res[name] = {"error": f"{type(err).__name__}: {err}"}


def _train(data, epochs: int = 1, **kw) -> dict:
    net = Recorder()
    steps = _steps_callback()
    _model(net).train(epochs, data, callbacks=[steps], **kw)
    return {"seen": net.seen, "batch_num": steps.batch_num, "steps": steps.steps}


def _eval(data) -> list[float]:
    net = Recorder()
    got = _model(net, metrics={"ids": Ids()}).eval(data)
    return got["ids"].tolist()


def _already_sharded(res: dict) -> None:
    """Item 16: loaders that already give each rank its part (used as is, never re-split)."""
    ds7, ds16 = _data(7), _data(16)
    _record(res, "16_eval_distributed_sampler", lambda: _eval(
        DataLoader(ds7, batch_size=2, sampler=DistributedSampler(ds7, 2, RANK, shuffle=False))))
    _record(res, "16_sink_distributed_sampler", lambda: _train(
        DataLoader(ds16, batch_size=2, sampler=DistributedSampler(ds16, 2, RANK, seed=3)),
        dataset_sink_mode=True))
    _record(res, "16_own_sampler", lambda: _train(
        DataLoader(ds16, batch_size=2, sampler=RankSampler(16, 2, RANK))))
    _record(res, "16_wrong_world", lambda: _eval(
        DataLoader(ds7, batch_size=2, sampler=DistributedSampler(ds7, 4, RANK))))


def _iterable(res: dict) -> None:
    """Item 17: an IterableDataset under DDP, with and without sink mode."""
    from lit_amp.model import rank_placement as lit_data

    _record(res, "17_plain", lambda: _train(DataLoader(Stream(16), batch_size=2)))
    _record(res, "17_sink", lambda: _train(DataLoader(Stream(16), batch_size=2),
                                           dataset_sink_mode=True, sink_size=4))
    _record(res, "17_split_plain", lambda: _train(
        lit_data.SplitByRank(DataLoader(Stream(16), batch_size=2))))
    _record(res, "17_split_sink", lambda: _train(
        lit_data.SplitByRank(DataLoader(Stream(16), batch_size=2)), dataset_sink_mode=True))
    _record(res, "17_per_rank", lambda: _train(
        lit_data.PerRank(DataLoader(Stream(16, shard=True), batch_size=2))))


def _lit_model_in_a_plain_trainer(res: dict) -> None:
    """Item 19: LitModel evaluated by a plain ``L.Trainer(strategy="ddp")`` (its sampler pads)."""
    import lightning as L

    from lit_amp import LitModel

    def run(bs: int, stage: str) -> list[float]:
        net = Recorder()
        lit = LitModel(net, nn.MSELoss(), metrics={"ids": Ids()})
        trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False,
                            enable_progress_bar=False, enable_model_summary=False,
                            enable_checkpointing=False)
        getattr(trainer, stage)(lit, DataLoader(_data(7), batch_size=bs), verbose=False)
        return lit.last_eval_results["metrics"]["ids"].tolist()

    for bs in (1, 2, 3):
        _record(res, f"19_validate_bs{bs}", lambda bs=bs: run(bs, "validate"))
    _record(res, "19_test_bs2", lambda: run(2, "test"))


def _default_sink_size(res: dict) -> None:
    """Item 20: sink_size=-1: one epoch is one pass of this rank's part."""
    ds7, ds16 = _data(7), _data(16)
    _record(res, "20_loader", lambda: _train(DataLoader(ds16, batch_size=2), epochs=2,
                                             dataset_sink_mode=True))
    x, y = ds7.tensors
    batches = [(x[i:i + 2], y[i:i + 2]) for i in range(0, 7, 2)]  # 2, 2, 2, 1 samples
    _record(res, "20_list", lambda: _train(batches, dataset_sink_mode=True))
    _record(res, "20_loader_uneven", lambda: _train(DataLoader(ds7, batch_size=2),
                                                    dataset_sink_mode=True))
    _record(res, "20_loader_uneven_plain", lambda: _train(DataLoader(ds7, batch_size=2)))


def main(out: str) -> None:
    res: dict = {}
    _default_sink_size(res)  # the first Trainer starts rank 1
    _already_sharded(res)
    _iterable(res)
    _lit_model_in_a_plain_trainer(res)
    write_rank_result(out, "coverage", res)


if __name__ == "__main__":
    main(sys.argv[1])
