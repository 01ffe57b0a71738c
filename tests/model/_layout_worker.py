"""Worker script for tests/model/test_layout.py (run as a subprocess; writes JSON per rank).

A script, because Lightning's launcher re-runs it for rank 1 (the FSDP2 layout test runs in
``tests.helpers.dist.run_distributed`` instead).

Modes:
    mp OUT        - ``Model(trainer={"strategy": ModelParallelStrategy(...)})`` on 2 CPU
                    processes (Lightning's launcher re-runs this script for rank 1).
    mp_train OUT  - ``Model.train`` under that strategy with a plain network: lit_amp shards it
                    with FSDP2 (issue #17), so the ranks train one model.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from tests.helpers.dist import write_rank_result  # noqa: E402


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def _data() -> list:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g))]


def _mp_model():
    """A Model on 2 CPU processes under ModelParallelStrategy (plain network, no plan)."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    from lit_amp import Model

    net = _net()
    strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
    return Model(
        net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.1),
        trainer={"accelerator": "cpu", "devices": 2, "strategy": strategy},
    )


def _mp(out: str) -> None:
    write_rank_result(out, "rank", {"train": _mp_model().infer_train_layout(_data())})


def _mp_train(out: str) -> None:
    """Model.train under ModelParallelStrategy with a plain network: sharded, trained as one."""
    model = _mp_model()
    try:
        model.train(1, _data(), dataset_sink_mode=False)
        full = [p.full_tensor().flatten().tolist() for p in model.train_network.parameters()]
        res = {"error": None, "weights": full, "type": type(model.predict_network).__name__}
    except ValueError as err:
        res = {"error": str(err)}
    write_rank_result(out, "train_rank", res)


if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[2]
    if mode == "mp_train":
        _mp_train(out)
    else:
        _mp(out)
