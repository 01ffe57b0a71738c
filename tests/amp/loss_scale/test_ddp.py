"""LossScaleController under torch.distributed: 2 CPU processes, gloo (tests/helpers/dist.py).

An overflow on one rank only must skip the step on both ranks and move both scales alike.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from lit_amp.amp.loss_scale.controller import LossScaleController
from lit_amp.amp.loss_scale.managers import DynamicLossScaleManager
from tests.helpers.dist import run_distributed

WORLD = 2
STEPS = 8
# (step, rank) pairs at which that rank's gradients become non-finite
PLAIN_BAD = {(1, 1), (4, 0), (5, 1)}
DDP_BAD = {(2, 0), (6, 1)}


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))


def _data(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(16, 6, generator=g), torch.randint(0, 2, (16,), generator=g)


def _run(net, opt, ctl, rank, bad):
    record = []
    for step in range(STEPS):
        opt.zero_grad()
        x, y = _data(rank, step)
        loss = nn.functional.cross_entropy(net(x), y)
        if (step, rank) in bad:
            loss = loss * float("nan")  # only this rank's gradients become NaN
        before = [p.detach().clone() for p in net.parameters()]
        ctl.scale_loss(loss).backward()  # (DDP all-reduces the gradients in here)
        ctl.unscale_(opt)
        overflow = ctl.found_overflow([opt])
        if not ctl.should_skip(overflow):
            opt.step()
        ctl.update(overflow)
        unchanged = all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
        record.append((overflow, ctl.last_scale_used, ctl.scale, unchanged))
    return record


def _worker(rank: int, world: int) -> dict:
    torch.set_num_threads(1)  # two processes on a small shared machine
    # (the gloo group is set up and torn down by run_distributed)
    # 1) plain per-rank models, no gradient all-reduce: only the flag all-reduce syncs ranks
    net = _net()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    ctl = LossScaleController(DynamicLossScaleManager(2**8, 2, 2))
    plain = _run(net, opt, ctl, rank, PLAIN_BAD)
    plain_skipped = ctl.skipped_steps

    # 2) a DDP-wrapped model (gradients averaged during backward)
    ddp = nn.parallel.DistributedDataParallel(_net())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    ctl = LossScaleController(DynamicLossScaleManager(2**8, 2, 2))
    wrapped = _run(ddp, opt, ctl, rank, DDP_BAD)
    params = [p.detach().clone() for p in ddp.parameters()]
    return {
        "plain": plain,
        "plain_skipped": plain_skipped,
        "ddp": wrapped,
        "ddp_skipped": ctl.skipped_steps,
        "ddp_params": params,
        "state": ctl.state_dict(),
    }


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_overflow_on_one_rank_skips_on_all_ranks():
    r0, r1 = run_distributed(_worker, world=WORLD)

    for bad, key in ((PLAIN_BAD, "plain"), (DDP_BAD, "ddp")):
        bad_steps = {s for s, _ in bad}
        for rec in (r0[key], r1[key]):
            assert [o for o, *_ in rec] == [s in bad_steps for s in range(STEPS)]
            # a skipped step leaves the parameters untouched on EVERY rank
            assert [u for *_, u in rec] == [s in bad_steps for s in range(STEPS)]
        # both ranks follow the same scale trajectory
        assert [r[1:3] for r in r0[key]] == [r[1:3] for r in r1[key]]
    assert r0["plain_skipped"] == r1["plain_skipped"] == len({s for s, _ in PLAIN_BAD})
    assert r0["ddp_skipped"] == r1["ddp_skipped"] == len({s for s, _ in DDP_BAD})
    assert all(torch.equal(a, b) for a, b in zip(r0["ddp_params"], r1["ddp_params"]))
    assert all(torch.isfinite(p).all() for p in r0["ddp_params"])
    assert r0["state"] == r1["state"]
    for bad, key in ((PLAIN_BAD, "plain"), (DDP_BAD, "ddp")):
        assert [r[2] for r in r0[key]] == _expected_scales({s for s, _ in bad})


def _expected_scales(bad_steps: set[int], ls: float = 2.0**8, window: int = 2) -> list[float]:
    """Spec §2.6 device-side rule (factor 2)."""
    cur, last, out = 1, 0, []
    for step in range(STEPS):
        overflow = step in bad_steps
        ls_ovf = max(ls / 2, 1.0) if overflow else ls
        inc = cur - last >= window
        if overflow or inc:
            last = cur
        ls = ls_ovf * 2 if inc and not overflow else ls_ovf
        cur += 1
        out.append(ls)
    return out
