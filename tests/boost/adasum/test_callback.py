"""The AdaSum callback across processes: vector halving on 3 ranks as Lightning attaches it,
and LitModel + AutoBoost("O2"/"O1") under Lightning DDP on 2 ranks."""

from __future__ import annotations

import torch
from torch import nn

from lit_amp.boost.adasum.maths import adasum_reduce
from tests.helpers.data import make_batches
from tests.helpers.dist import run_distributed

WORLD = 2


def _bn_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))


def _three_rank_training(rank: int, world: int) -> dict:
    """AdaSum (transport="auto") as Lightning attaches it, on 3 ranks: DDP's sync switched
    off, each rank steps on its own batches, deltas combined by vector halving, BatchNorm
    statistics averaged; 3 steps."""
    from types import SimpleNamespace

    from lit_amp.boost import AdaSum

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


def _lightning_worker(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    return {"lightning": _lightning_o2(rank), "lightning_o1": _lightning_o2(rank, "O1")}


def test_lightning_ddp_o2_and_o1():
    r0, r1 = run_distributed(_lightning_worker, world=WORLD)
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
