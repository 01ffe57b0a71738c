"""Model.infer_train_layout / infer_predict_layout: sharded strategies only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from lit_amp import Model
from tests.helpers.dist import run_distributed

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("_layout_worker.py")


def _model(**trainer):
    net = nn.Linear(4, 2)
    return Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.1),
                 trainer=trainer or None)


@pytest.mark.parametrize("strategy", [None, "ddp", "ddp_spawn"])
def test_layout_outside_a_sharded_strategy_raises(strategy):
    kw = {"strategy": strategy} if strategy else {}
    model = _model(**kw)
    data = [(torch.randn(2, 4), torch.tensor([0, 1]))]
    with pytest.raises(RuntimeError, match="need a sharded strategy"):
        model.infer_train_layout(data)
    with pytest.raises(RuntimeError, match="need a sharded strategy"):
        model.infer_predict_layout(torch.randn(2, 4))


def _run_worker(*args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(WORKER), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _dtensor_layouts(rank: int, world: int) -> dict:
    """FSDP2 ``fully_shard`` on a CPU mesh; the Model reads the DTensor layouts."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    fully_shard(net, mesh=init_device_mesh("cpu", (world,)))
    model = Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.1))
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g))]
    return {"train": model.infer_train_layout(data),
            "predict": model.infer_predict_layout(torch.randn(4, 8))}


@pytest.mark.slow
def test_layout_of_fsdp2_dtensor_parameters_on_cpu():
    r0, r1 = run_distributed(_dtensor_layouts, world=2)
    for res, rank in ((r0, 0), (r1, 1)):
        for kind in ("train", "predict"):
            lay = res[kind]
            assert set(lay) == {"0.weight", "0.bias", "2.weight", "2.bias"}
            w = lay["0.weight"]
            assert w["placements"] == ["Shard(dim=0)"] and w["device_mesh"] == [2]
            assert w["global_shape"] == [16, 8] and w["local_shape"] == [8, 8]
            assert w["rank"] == rank
    # 3 output rows split 2 + 1 across the two ranks
    assert r0["train"]["2.weight"]["local_shape"] == [2, 16]
    assert r1["train"]["2.weight"]["local_shape"] == [1, 16]


@pytest.mark.slow
def test_layout_under_model_parallel_strategy_on_cpu(tmp_path):
    # Lightning's launcher re-runs the worker for rank 1; LitModel shards the plain network with
    # FSDP2 over the data-parallel dimension (issue #17), so dim 0 is split over the 2 ranks
    _run_worker("mp", str(tmp_path))
    for r in (0, 1):
        lay = json.loads((tmp_path / f"rank{r}.json").read_text())["train"]
        assert lay["0.weight"]["placements"] == ["Shard(dim=0)"]
        assert lay["0.weight"]["local_shape"] == [8, 8] and lay["0.weight"]["rank"] == r


@pytest.mark.slow
def test_training_under_model_parallel_shards_a_plain_network(tmp_path):
    # a plain network used to train on each rank alone (the copies drifted apart); LitModel now
    # shards it with FSDP2 (issue #17): both ranks end with the same gathered weights
    _run_worker("mp_train", str(tmp_path))
    res = [json.loads((tmp_path / f"train_rank{r}.json").read_text()) for r in (0, 1)]
    for r in res:
        assert r["error"] is None and r["type"] == "FSDPSequential"
    assert res[0]["weights"] == res[1]["weights"]

