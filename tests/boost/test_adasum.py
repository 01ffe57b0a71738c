"""AdaSum: the pairwise combination by hand, and across 2 CPU processes (gloo) with DDP."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from lit_amp.boost.adasum import (
    EPS,
    AdaSumHooks,
    adasum_allreduce_,
    adasum_combine,
    adasum_reduce,
    noop_comm_hook,
)

WORLD = 2


def test_combination_of_two_deltas_by_hand():
    a = torch.tensor([3.0, 0.0, 0.0])
    b = torch.tensor([1.0, 2.0, 0.0])
    # a·b = 3, |a|² = 9, |b|² = 5 -> (1 - 3/18) a + (1 - 3/10) b = (5/6) a + 0.7 b
    torch.testing.assert_close(adasum_combine(a, b), torch.tensor([3.2, 1.4, 0.0]))
    # symmetric; identical deltas are averaged (kept); orthogonal ones are summed
    torch.testing.assert_close(adasum_combine(a, b), adasum_combine(b, a))
    torch.testing.assert_close(adasum_combine(a, a), a)
    torch.testing.assert_close(
        adasum_combine(a, torch.tensor([0.0, 0.0, 4.0])), torch.tensor([3.0, 0.0, 4.0])
    )
    # opposite deltas: (1 + 1/2) a + (1 + 1/2)(-a) = 0
    torch.testing.assert_close(adasum_combine(a, -a), torch.zeros(3))
    # zero deltas stay zero (eps guards the division)
    torch.testing.assert_close(adasum_combine(torch.zeros(2), torch.zeros(2)), torch.zeros(2))
    assert EPS == 1e-12
    with pytest.raises(ValueError, match="same shape"):
        adasum_combine(torch.zeros(2), torch.zeros(3))


def test_reduce_is_per_tensor_and_recursive_doubling():
    r = [
        [torch.tensor([1.0, 0.0]), torch.tensor([2.0])],
        [torch.tensor([0.0, 1.0]), torch.tensor([4.0])],
        [torch.tensor([1.0, 1.0]), torch.tensor([6.0])],
    ]
    out = adasum_reduce(r)
    pair = adasum_combine(r[0][0], r[1][0])  # (0,1) first, then with rank 2
    torch.testing.assert_close(out[0], adasum_combine(pair, r[2][0]))
    torch.testing.assert_close(out[1], torch.tensor([4.0]))  # single elements: averaged


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def _batch(rank: int):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(8, 3, generator=g), torch.randn(8, 2, generator=g)


def _lightning_o2(rank: int, level: str = "O2") -> dict:
    """LitModel + AutoBoost(level) under Lightning DDP (processes launched by the test)."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from lit_amp import LitModel
    from lit_amp.boost import AutoBoost
    from lit_amp.demos import ResNet1D

    torch.manual_seed(0)
    net = ResNet1D(channels=4, blocks=(2, 2, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    lit = LitModel(net, nn.CrossEntropyLoss(), opt, metrics={"acc"})
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 40, generator=g), torch.randint(0, 10, (64,), generator=g))
    boost = AutoBoost(level, {"grad_freeze": {"param_groups": 4}})
    seen = {}

    class Spy(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            seen["ddp"] = trainer.strategy.model
            seen["class_during_fit"] = type(trainer.strategy.model).__name__
            seen["ddp_find_unused"] = trainer.strategy.model.find_unused_parameters
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=WORLD,
        strategy="ddp",
        callbacks=[boost, Spy()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(lit, DataLoader(data, batch_size=8))
    ddp_kwargs = trainer.strategy._ddp_kwargs
    return {
        "weights": torch.cat([p.detach().reshape(-1) for p in net.parameters()]),
        "bn_stats": torch.cat([b.detach().reshape(-1).float() for n, b in net.named_buffers()
                               if n.endswith(("running_mean", "running_var"))]),
        "ddp_class": (seen["class_during_fit"], type(seen["ddp"]).__name__),
        "adasum_steps": getattr(boost.get_algorithm("adasum"), "steps", None),
        "ddp_find_unused": seen["ddp_find_unused"],
        "transport": getattr(boost.get_algorithm("adasum"), "transport_used", None),
        "freeze_position": boost.get_algorithm("grad_freeze").position,
        "find_unused": ddp_kwargs.get("find_unused_parameters"),
        "removed_bn": len(boost.get_algorithm("less_bn").removed_bn),
    }


def _worker(rank: int, init_file: str, out: str, port: int) -> None:
    torch.set_num_threads(1)  # see conftest.py
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(WORLD),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        NODE_RANK="0",
    )
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        results = {}
        # 1) adasum_allreduce_ on raw tensors
        t = [
            torch.tensor([1.0, 0.0]) if rank == 0 else torch.tensor([0.0, 1.0]),
            torch.tensor([float(rank)]),
        ]
        adasum_allreduce_(t)
        results["raw"] = [x.clone() for x in t]
        # 2) DDP with the no-op comm hook + AdaSum optimizer hooks: each rank steps on its
        #    own gradient, then both apply the AdaSum of the two deltas
        ddp = nn.parallel.DistributedDataParallel(_net())
        ddp.register_comm_hook(None, noop_comm_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
        hooks = AdaSumHooks([opt])
        x, y = _batch(rank)
        nn.functional.mse_loss(ddp(x), y).backward()
        results["grads"] = [p.grad.clone() for p in ddp.parameters()]
        opt.step()
        results["after"] = [p.detach().clone() for p in ddp.parameters()]
        results["steps"] = hooks.steps
        hooks.remove()
        # 3) the same through Lightning: LitModel + AutoBoost("O2") with the "ddp" strategy
        results["lightning"] = _lightning_o2(rank)
        results["lightning_o1"] = _lightning_o2(rank, "O1")
        torch.save(results, os.path.join(out, f"rank{rank}.pt"))
        dist.barrier()  # neither rank tears gloo down while the other still talks
    finally:
        dist.destroy_process_group()


def test_two_processes_gloo(tmp_path):
    port = _free_port()
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path), port), nprocs=WORLD, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD))
    # raw tensors: orthogonal -> summed; a single element -> averaged
    for r in (r0, r1):
        torch.testing.assert_close(r["raw"][0], torch.tensor([1.0, 1.0]))
        torch.testing.assert_close(r["raw"][1], torch.tensor([0.5]))
    # DDP did not average: each rank kept its own gradient (the local batches differ)
    ref = _net()
    for rank, r in ((0, r0), (1, r1)):
        ref.zero_grad()
        x, y = _batch(rank)
        nn.functional.mse_loss(ref(x), y).backward()
        for g, p in zip(r["grads"], ref.parameters()):
            torch.testing.assert_close(g, p.grad)
    # both ranks end with w0 - AdaSum(lr*g0, lr*g1), computed tensor by tensor
    start = list(_net().parameters())
    for i, w in enumerate(start):
        d0, d1 = 0.5 * r0["grads"][i], 0.5 * r1["grads"][i]
        expected = w.detach() - adasum_combine(d0, d1)
        torch.testing.assert_close(r0["after"][i], expected)
        torch.testing.assert_close(r1["after"][i], expected)
    assert r0["steps"] == r1["steps"] == 1
    # Lightning O2: AdaSum active (4 steps of 8 samples per rank), weights identical on both
    # ranks, BN layers removed
    l0, l1 = r0["lightning"], r1["lightning"]
    torch.testing.assert_close(l0["weights"], l1["weights"], rtol=0, atol=0)
    # DDP's gradient sync was off (no buffer broadcast either): BatchNorm running statistics,
    # computed from different batches on each rank, are averaged in AdaSum's own exchange
    assert l0["bn_stats"].numel() > 0
    torch.testing.assert_close(l0["bn_stats"], l1["bn_stats"], rtol=0, atol=0)
    # ... by a DDP subclass during fit, restored afterwards
    assert l0["ddp_class"] == ("AdaSumDistributedDataParallel", "DistributedDataParallel")
    assert l0["adasum_steps"] == l1["adasum_steps"] == 4
    # both ranks on this host with gloo: the deltas travelled through shared memory
    assert l0["transport"] == l1["transport"] == "shm"
    assert l0["freeze_position"] == l1["freeze_position"] == 4
    assert l0["removed_bn"] == 6
    # with DDP's gradient sync off, GradientFreeze does not need DDP's unused-parameter search
    assert l0["find_unused"] is not True and l0["ddp_find_unused"] is False
    # O1 (GradientFreeze without AdaSum) under DDP: switched to find_unused_parameters, and
    # DDP's averaging keeps the ranks identical
    o0, o1 = r0["lightning_o1"], r1["lightning_o1"]
    assert o0["find_unused"] is True and o0["ddp_find_unused"] is True
    assert o0["ddp_class"] == ("DistributedDataParallel", "DistributedDataParallel")
    assert o0["freeze_position"] == 4
    torch.testing.assert_close(o0["weights"], o1["weights"])


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
