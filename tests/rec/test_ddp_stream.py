"""DDP over a stream (2 CPU processes, gloo): ranks whose shards hold different numbers of
batches still step the same number of times and finish, without the known hang; consumed files
are deleted per shard once a checkpoint covers them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lit_amp.rec.publish import list_checkpoints
from lit_amp.rec.sources import SyntheticClickSource, shard_of, write_shard

pytestmark = pytest.mark.slow  # two trainer processes: ~10-30 s on a shared 2-core machine

WORKER = str(Path(__file__).with_name("_online_worker.py"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _uneven_files(directory: Path, per_shard: tuple[int, int], per_file: int) -> dict[int, list]:
    """Files whose names put ``per_shard[r]`` of them in rank r's shard; returns names by rank."""
    gen = SyntheticClickSource(batch_size=per_file, seed=0)
    names: dict[int, list[str]] = {0: [], 1: []}
    i = 0
    while any(len(names[r]) < per_shard[r] for r in (0, 1)):
        name = f"part-{i:06d}"
        r = shard_of(f"{name}.npz", 2)
        if len(names[r]) < per_shard[r]:
            write_shard(directory, name, gen.columns(i), "npz")
            names[r].append(f"{name}.npz")
        i += 1
    return names


def test_ddp_on_an_uneven_stream_finishes_with_equal_steps(tmp_path):
    data, ckpt, log = tmp_path / "data", tmp_path / "ckpt", tmp_path / "trained.log"
    names = _uneven_files(data, per_shard=(5, 2), per_file=10)
    port = _free_port()
    procs = []
    for rank in (0, 1):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "LOCAL_RANK": str(rank),
            "NODE_RANK": "0",
            "WORLD_SIZE": "2",
            "OMP_NUM_THREADS": "1",
        }
        cmd = [
            sys.executable,
            WORKER,
            "--data",
            str(data),
            "--ckpt",
            str(ckpt),
            "--log",
            str(log),
            "--batch",
            "10",
            "--ckpt-every",
            "1",
            "--max-idle",
            "0.5",
            "--ddp",
            "2",
            "--delete-consumed",
        ]
        procs.append(
            subprocess.Popen(
                cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        )
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=150)  # a hang fails here
            outs.append((p.returncode, out.decode(), err.decode()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rc, out, err in outs:
        assert rc == 0, (out + err)[-4000:]
    summaries = [json.loads(out.split("SUMMARY ", 1)[1].splitlines()[0]) for _, out, _ in outs]
    # every rank stepped twice: the short shard (2 files) bounds both
    assert [s["steps"] for s in summaries] == [2, 2]
    assert summaries[0]["stop_reason"] == "peer_stopped"
    assert summaries[1]["stop_reason"] == "source_exhausted"
    logs = [(tmp_path / f"trained.log.rank{r}").read_text().splitlines() for r in (0, 1)]
    assert [len(x) for x in logs] == [2, 2]
    # the checkpoint holds both ranks' cursors: rank 0's 3 untrained files stay unconsumed
    state = torch.load(list_checkpoints(ckpt)[-1], weights_only=False)
    cursors = state["online"]["cursors"]
    assert state["online"]["world_size"] == 2 and state["online"]["step"] == 2
    assert cursors[0]["done"] == sorted(names[0])[:2]
    assert cursors[1]["done"] == sorted(names[1])
    # delete_consumed under DDP: each rank deleted the files of its shard that the final
    # checkpoint counts as consumed; rank 0's untrained files are all still there
    left = sorted(p.name for p in data.iterdir() if p.name.startswith("part-"))
    assert left == sorted(names[0])[2:]
