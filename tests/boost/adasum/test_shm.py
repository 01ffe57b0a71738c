"""AdaSum's shared-memory exchange across 2 CPU processes: right rows on every call, the same
weights as through gloo, a clear error when a rank stays away, nothing left in /dev/shm."""

from __future__ import annotations

import glob
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from lit_amp.boost.adasum.callback import AdaSum
from lit_amp.boost.adasum.hooks import AdaSumHooks
from lit_amp.boost.adasum.shm import SHM_DIR, ShmAllGather, shm_supported

WORLD = 2

pytestmark = pytest.mark.skipif(not shm_supported()[0], reason=shm_supported()[1])


def _init(rank: int, init_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)


def _train(channel: ShmAllGather | None, rank: int, steps: int) -> torch.Tensor:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    bufs = [b for b in net.buffers() if b.is_floating_point()]
    hooks = AdaSumHooks([opt], buffers=bufs, channel=channel)
    g = torch.Generator().manual_seed(10 + rank)  # each rank its own batches
    for _ in range(steps):
        x, y = torch.randn(16, 5, generator=g), torch.randint(0, 3, (16,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    hooks.channel = None  # the caller owns the channel
    hooks.remove()
    return torch.cat([t.detach().reshape(-1) for t in [*net.parameters(), *bufs]])


def _not_shared(rank: int) -> dict:
    import lit_amp.boost.adasum.shm as shm_mod

    real = torch.from_file

    def private(path, *a, **k):  # rank 1 maps a file of its own, as in another container
        if rank == 1:
            path = f"{path}.private"
            t = real(path, *a, **k)
            os.unlink(path)
            return t
        return real(path, *a, **k)

    res = {}
    shm_mod.torch.from_file = private
    try:
        with pytest.raises(RuntimeError, match="do not see one shared file"):
            ShmAllGather(8)
        opt = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
        res["auto_channel"] = AdaSum()._channel([opt], [])
        with pytest.raises(ValueError, match="transport='shm' cannot be used"):
            AdaSum(transport="shm")._channel([opt], [])
    finally:
        shm_mod.torch.from_file = real
    return res


def _worker(rank: int, init_file: str, out: str) -> None:
    _init(rank, init_file)
    res: dict = {}
    try:
        assert ShmAllGather.usable() == (True, "")
        ch = ShmAllGather(1000, timeout_s=1.0)
        res["files_after_setup"] = glob.glob(os.path.join(SHM_DIR, "lit_amp_adasum_*"))
        # many calls, uneven arrival (one rank sleeps on alternate calls): always the rows of
        # this very call, never a neighbour's
        bad = 0
        for k in range(200):
            if k % 2 == rank:
                time.sleep(0.001)
            m = 10 + (k % 7)
            rows = ch.all_gather(torch.full((m,), float(100 * k + rank)))
            expect = torch.stack([torch.full((m,), float(100 * k + r)) for r in range(WORLD)])
            bad += int(not torch.equal(rows, expect))
        res["bad_calls"] = bad
        with pytest.raises(ValueError, match="capacity"):
            ch.all_gather(torch.zeros(1001))
        # the same AdaSum training through gloo and through shared memory: identical bits
        dist.barrier()
        res["via_gloo"] = _train(None, rank, 6)
        res["via_shm"] = _train(ch, rank, 6)
        # a rank that stays away: the other one gets a RuntimeError naming it, after timeout_s
        dist.barrier()
        if rank == 0:
            t = time.monotonic()
            with pytest.raises(RuntimeError, match=r"rank\(s\) \[1\]") as exc:
                ch.all_gather(torch.zeros(4))
            res["timeout_s"] = time.monotonic() - t
            res["timeout_msg"] = str(exc.value)
        dist.barrier()
        ch.close()
        # ranks that do not see one file (containers with private /dev/shm): every rank gets
        # the same RuntimeError, and AdaSum("auto") falls back to the process group
        res["not_shared"] = _not_shared(rank)
        torch.save(res, os.path.join(out, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_shared_memory_exchange_two_processes(tmp_path):
    before = set(glob.glob(os.path.join(SHM_DIR, "lit_amp_adasum_*")))
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD))
    # the file is unlinked once both ranks have mapped it
    assert set(r0["files_after_setup"]) <= before
    assert set(glob.glob(os.path.join(SHM_DIR, "lit_amp_adasum_*"))) <= before
    assert r0["bad_calls"] == r1["bad_calls"] == 0
    # same weights and BN statistics on both ranks, and the same as the gloo exchange's
    torch.testing.assert_close(r0["via_shm"], r1["via_shm"], rtol=0, atol=0)
    torch.testing.assert_close(r0["via_shm"], r0["via_gloo"], rtol=0, atol=0)
    # and training moved them (the comparison is not between two untouched copies)
    assert r0["via_shm"].numel() > 0
    assert 1.0 <= r0["timeout_s"] < 10.0
    assert "did a rank stop" in r0["timeout_msg"]
    assert r0["not_shared"]["auto_channel"] is None and r1["not_shared"]["auto_channel"] is None


def _dying_peer_worker(rank: int, init_file: str, out: str) -> None:
    _init(rank, init_file)
    ch = ShmAllGather(16, timeout_s=120.0)
    if rank == 1:
        os._exit(0)  # dies without ever exchanging (a crash, an OOM kill, ...)
    t = time.monotonic()
    try:
        ch.all_gather(torch.zeros(4))
        msg = "no error"
    except RuntimeError as exc:
        msg = str(exc)
    torch.save({"msg": msg, "waited_s": time.monotonic() - t}, os.path.join(out, "rank0.pt"))
    os._exit(0)  # no gloo teardown with a dead peer


def test_a_rank_that_dies_is_noticed_within_seconds_not_at_the_timeout(tmp_path):
    mp.spawn(_dying_peer_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD)
    r0 = torch.load(tmp_path / "rank0.pt")
    assert "rank(s) [1]" in r0["msg"] and "exited" in r0["msg"]
    assert r0["waited_s"] < 15.0  # gloo would notice the closed socket; 120 s is the timeout


def test_transport_argument_is_checked():
    with pytest.raises(ValueError, match="'transport' must be one of"):
        AdaSum(transport="tcp")
    assert AdaSum().transport == "auto"
