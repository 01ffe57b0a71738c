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


# ------------------------------------------------------------------ vector halving (#17 item 8)
_SHAPES = [(7, 5), (1,), (13,), (3, 2, 2), (1, 1), (9,)]


def _deltas(rank: int, local_size: int) -> list[torch.Tensor]:
    # ranks of one block hold the same (block-averaged) deltas, as under AdaSum's comm hook
    g = torch.Generator().manual_seed(7 + rank // local_size)
    return [torch.randn(s, generator=g) for s in _SHAPES]


def _halving_worker(rank: int, world: int, local_sizes: tuple[int, ...]) -> list[dict]:
    from lit_amp.boost import adasum as mod

    torch.set_num_threads(1)
    results = []
    for local_size in local_sizes:  # one spawn for several block sizes
        ts = _deltas(rank, local_size)
        flat = torch.cat([t.reshape(-1) for t in ts])
        layout = mod._Layout([t.shape for t in ts], flat.device)
        bufs = [torch.full((3,), float(rank)), torch.arange(2.0) * rank]
        mod.TRAFFIC["bytes_sent"] = 0
        new, new_mean = mod._exchange(flat.clone(), layout, None, local_size, bufs)
        halving_bytes = mod.TRAFFIC["bytes_sent"]
        # the halving itself, also where _exchange prefers the all-gather (2 ranks)
        halved = mod._Halving(layout, None, local_size, mod.EPS).run(flat.clone())
        mod.TRAFFIC["bytes_sent"] = 0
        ref, ref_mean = mod._allgather_exchange(flat.clone(), layout, None, local_size, bufs)
        public = [t.clone() for t in ts]
        adasum_allreduce_(public, local_size=local_size)
        results.append({
            "new": new, "ref": ref, "halved": halved, "new_mean": new_mean,
            "ref_mean": ref_mean, "public": torch.cat([t.reshape(-1) for t in public]),
            "bytes": (halving_bytes, mod.TRAFFIC["bytes_sent"]), "n": flat.numel(),
        })
    return results


def _close(x: torch.Tensor, ref: torch.Tensor) -> None:
    """float32 sums in another order: within 1e-6 of the vector's norm."""
    assert (x - ref).norm() <= 1e-6 * ref.norm(), ((x - ref).norm(), ref.norm())
    torch.testing.assert_close(x, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "world,local_sizes",
    [
        (2, (1,)),
        (3, (1,)),  # the odd rank is carried up, then sends its halves to ranks 0 and 1
        # local_size 2: blocks; ranks 0 and 2 combine, ranks 1 and 3 only receive the result
        (4, (1, 2)),
        # a cut-short subtree (ranks 4-6) that is itself cut short, and 3 blocks of 2
        pytest.param(7, (1,), marks=pytest.mark.slow),
        pytest.param(6, (2,), marks=pytest.mark.slow),
    ],
)
def test_halving_exchange_matches_the_allgather_reference(world, local_sizes):
    from tests.helpers.dist import run_distributed

    out = run_distributed(_halving_worker, world=world, args=(local_sizes,))
    for i, local_size in enumerate(local_sizes):
        # the reference, computed without communication from every block's deltas
        blocks = [_deltas(r, local_size) for r in range(0, world, local_size)]
        expected = torch.cat([t.reshape(-1) for t in adasum_reduce(blocks)])
        rows = [per_rank[i] for per_rank in out]
        for r in rows:
            torch.testing.assert_close(r["ref"], expected, rtol=1e-6, atol=1e-7)
            _close(r["new"], r["ref"])
            _close(r["halved"], r["ref"])
            _close(r["public"], r["ref"])
            torch.testing.assert_close(r["new_mean"], r["ref_mean"], rtol=1e-6, atol=1e-7)
            # every rank ends with the same bits (weights stay identical across ranks)
            for key in ("halved", "new", "new_mean"):
                assert torch.equal(r[key], rows[0][key]), key
        if local_size == 1 and world == 4:
            # sent per rank: ~2N floats (halving + final gather), not (world-1) x N
            new_b, old_b = rows[0]["bytes"]
            n = rows[0]["n"]
            assert old_b >= 3 * n * 4 and new_b <= 2.5 * n * 4 + 200, (new_b, old_b)


def _bn_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))


def _three_rank_training(rank: int, world: int) -> dict:
    """AdaSum (transport="auto") as Lightning attaches it, on 3 ranks: DDP's sync switched
    off, each rank steps on its own batches, deltas combined by vector halving, BatchNorm
    statistics averaged; 3 steps."""
    from types import SimpleNamespace

    from lit_amp.boost import AdaSum
    from tests.helpers.data import make_batches

    torch.set_num_threads(1)
    net = _bn_net()
    ddp = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9)
    algo = AdaSum()
    algo.attach(net, [opt], trainer=SimpleNamespace(strategy=SimpleNamespace(model=ddp)))
    for x, y in make_batches(3, seed=rank):
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    used, steps = algo.transport_used, algo.hooks.steps
    algo.detach()
    return {"weights": [p.detach().clone() for p in net.parameters()],
            "bn": [net[1].running_mean.clone(), net[1].running_var.clone()],
            "transport": used, "steps": steps}


def test_adasum_callback_on_three_ranks_uses_vector_halving():
    from tests.helpers.data import make_batches
    from tests.helpers.dist import run_distributed

    out = run_distributed(_three_rank_training, world=3)
    assert [r["transport"] for r in out] == ["process_group"] * 3
    assert [r["steps"] for r in out] == [3, 3, 3]
    # the same without communication: 3 replicas with their own momentum, w = w_old - AdaSum
    nets = [_bn_net() for _ in range(3)]
    opts = [torch.optim.SGD(n.parameters(), lr=0.2, momentum=0.9) for n in nets]
    data = [make_batches(3, seed=r) for r in range(3)]
    for step in range(3):
        olds, deltas = [], []
        for net, opt, batches in zip(nets, opts, data):
            x, y = batches[step]
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            olds.append([p.detach().clone() for p in net.parameters()])
            opt.step()
            deltas.append([o - p.detach() for o, p in zip(olds[-1], net.parameters())])
        combined = adasum_reduce(deltas)
        mean = [torch.stack([n[1].running_mean for n in nets]).mean(0),
                torch.stack([n[1].running_var for n in nets]).mean(0)]
        with torch.no_grad():
            for net in nets:
                for p, o, c in zip(net.parameters(), olds[0], combined):
                    p.copy_(o - c)
                net[1].running_mean.copy_(mean[0])
                net[1].running_var.copy_(mean[1])
    for r in out:
        for got, want in zip(r["weights"], nets[0].parameters()):
            torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)
        for got, want in zip(r["bn"], (nets[0][1].running_mean, nets[0][1].running_var)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # weights and BatchNorm statistics identical on every rank, bit for bit
    for r in out[1:]:
        for a, b in zip(r["weights"] + r["bn"], out[0]["weights"] + out[0]["bn"]):
            assert torch.equal(a, b)
