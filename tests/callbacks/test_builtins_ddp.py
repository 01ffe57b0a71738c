"""EarlyStopping / ReduceLROnPlateau average the monitored value over processes (gloo, 2 CPUs)."""

from __future__ import annotations

import os
import socket
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lit_amp.callbacks._callback import RunContext
from lit_amp.callbacks.early_stopping import EarlyStopping
from lit_amp.callbacks.reduce_lr_on_plateau import ReduceLROnPlateau


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, out: Any) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        es = EarlyStopping(monitor="acc", patience=1)
        opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=1.0)
        rl = ReduceLROnPlateau(monitor="acc", factor=0.5, patience=1, min_delta=0)
        # rank 0 sees 0.2 then 0.9; rank 1 sees 0.8 then 0.0: means 0.5 then 0.45 (no improvement)
        values = [[0.2, 0.9], [0.8, 0.0]][rank]
        stops = []
        for epoch, v in enumerate(values, start=1):
            rc = RunContext(
                {"cur_epoch_num": epoch, "eval_results": {"acc": v}, "optimizer": opt, "rank": rank}
            )
            es.on_train_epoch_end(rc)
            rl.on_train_epoch_end(rc)
            stops.append(rc.get_stop_requested())
        out.put((rank, es.best, stops, opt.param_groups[0]["lr"]))
        dist.barrier()  # neither rank tears gloo down while the other still talks
    finally:
        dist.destroy_process_group()


def test_monitor_is_averaged_over_processes() -> None:
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.spawn(_worker, args=(2, _free_port(), out), nprocs=2, join=True)
    results = sorted(out.get() for _ in range(2))
    for _rank, best, stops, lr in results:
        assert abs(best - 0.5) < 1e-12  # the mean, identical on both ranks
        assert stops == [False, True]  # both ranks stop together
        assert lr == 0.5
