"""``Model`` under Lightning's DDP on 2 CPU processes (gloo): issue #17, items 1-3, 5 and 7.

Each test runs ``_ddp_worker.py`` as a subprocess (Lightning's launcher re-runs it for rank 1)
and checks what each rank wrote. One 2-process run covers several items, as each costs seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("_ddp_worker.py")


def _run(mode: str, out: Path) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(WORKER), mode, str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((out / f"{mode}{r}.json").read_text()) for r in (0, 1)]


@pytest.fixture(scope="module")
def train_run(tmp_path_factory) -> list[dict]:
    return _run("train", tmp_path_factory.mktemp("ddp_train"))


def test_sink_mode_gives_each_rank_its_own_batches(train_run):
    r0, r1 = train_run
    # a plain list of 10 batches (ids 2i, 2i+1), 2 sinks of 3 steps per rank: every
    # world_size-th batch of one stream, so the ranks never train on the same batch at once
    assert r0["sink_list"] == [0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 0, 1]
    assert r1["sink_list"] == [2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 2, 3]
    # a DataLoader (sequential): the split Lightning's DistributedSampler gives it, shuffled as
    # Lightning shuffles every distributed training loader (non-sink runs get the same)
    ds = TensorDataset(torch.arange(16))
    for rank, res in ((0, r0), (1, r1)):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=0)
        assert res["sink_loader"] == list(sampler)
    assert not set(r0["sink_loader"]) & set(r1["sink_loader"])
    # non-sink, a plain list of 5 batches: every other batch, rank 1 padded with batch 0
    assert r0["plain_list"] == [0, 1, 4, 5, 8, 9]
    assert r1["plain_list"] == [2, 3, 6, 7, 0, 1]


def test_callbacks_count_this_ranks_steps(train_run):
    # 16 batches of a DataLoader on 2 ranks: 8 steps per rank per epoch
    for res in train_run:
        assert res["batch_num"] == [8] * 8
        assert res["cur_steps"] == list(range(1, 9))
    # rank 0 saves every 4 of its 8 steps: epoch 1, steps 4 and 8 (not 16)
    assert train_run[0]["ckpts"] == ["net-1_4.ckpt", "net-1_8.ckpt"]


def test_batchnorm_buffers_and_weights_identical_on_all_ranks(train_run):
    for res in train_run:
        assert res["bn"][0] == res["bn"][1]
        assert res["weights"][0] == res["weights"][1]


@pytest.mark.parametrize("bs", [1, 2])
def test_eval_counts_every_sample_once(train_run, bs):
    # 7 samples on 2 ranks: the result of one process, for every metric and eval_loss
    for res in train_run:
        got, ref, single = res[f"eval_bs{bs}"], res["ref"], res["single"]
        assert got["acc"] == pytest.approx(ref["acc"], abs=1e-6)
        for name in ("precision", "recall"):
            assert got[name] == pytest.approx(single[name])
        loss = ref["loss"] if bs == 1 else ref["loss_bs2"]  # the mean of the batch means
        assert got["loss"] == pytest.approx(loss, rel=1e-5)
        assert res[f"eval_loss_bs{bs}"] == pytest.approx(loss, rel=1e-5)


def test_fit_validation_is_exact_with_uneven_batches(train_run):
    # 7 validation batches: 4 on rank 0, 3 on rank 1; no hang, the final model's numbers
    for res in train_run:
        assert res["fit_eval"]["acc"] == pytest.approx(res["fit_ref"]["acc"], abs=1e-6)
        assert res["fit_eval"]["eval_loss"] == pytest.approx(res["fit_ref"]["loss"], rel=1e-5)


@pytest.mark.slow
def test_layout_with_a_strategy_object_leaves_the_model_usable(tmp_path):
    for res in _run("layout", tmp_path):
        assert res["errors"] == []
        assert res["train_layout"] == res["train_layout_again"] == ["0.bias", "0.weight",
                                                                    "2.bias", "2.weight"]
        assert set(res["eval"]) == {"acc"}


def test_eval_shard_of_a_dataloader_keeps_the_batches_of_one_process():
    from lit_amp.model.rank_placement import RankShard

    dl = DataLoader(TensorDataset(torch.arange(7)), batch_size=2)
    parts = [[b[0].tolist() for b in RankShard(dl, lambda r=r: (r, 2), train=False)]
             for r in (0, 1)]
    assert parts == [[[0, 1], [4, 5]], [[2, 3], [6]]]
    assert [len(RankShard(dl, lambda r=r: (r, 2), train=False)) for r in (0, 1)] == [2, 2]


@pytest.mark.parametrize("strategy", ["ddp_spawn", "ddp_fork"])
def test_strategies_that_start_their_own_processes_are_refused(strategy):
    # their workers train copies: the optimizer state, epoch counter, loss scale, boost and
    # callback state would stay behind in them, and a resumed train would silently restart
    from torch import nn

    from lit_amp import Model
    from tests.helpers.data import make_batches, make_net

    net = make_net()
    before = [p.detach().clone() for p in net.parameters()]
    model = Model(net, nn.CrossEntropyLoss(), torch.optim.Adam(net.parameters(), 0.01),
                  metrics={"acc"},
                  trainer={"accelerator": "cpu", "devices": 2, "strategy": strategy})
    data = make_batches(2)
    for call in (lambda: model.train(1, data), lambda: model.fit(1, data, data),
                 lambda: model.train(1, data, dataset_sink_mode=True, sink_size=1),
                 lambda: model.eval(data)):
        with pytest.raises(ValueError, match=rf"'trainer'.*strategy='{strategy}'.*'ddp'"):
            call()
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    assert model.lit_model.optimizer.state_dict()["state"] == {}


def test_sink_batches_are_drawn_one_step_at_a_time():
    # a sink of 50 steps holds one batch at a time, not the whole sink (bounded memory)
    from torch import nn

    from lit_amp import Model

    produced, in_flight = [0], []

    class Counting:
        def __len__(self):
            return 100

        def __iter__(self):
            for _ in range(100):
                produced[0] += 1
                yield torch.randn(8, 4), torch.randint(0, 2, (8,))

    class Net(nn.Linear):
        def forward(self, x):
            in_flight.append(produced[0] - len(in_flight))  # drawn but not yet trained on
            return super().forward(x)

    net = Net(4, 2)
    Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.1),
          trainer={"accelerator": "cpu"}).train(2, Counting(), dataset_sink_mode=True,
                                                 sink_size=50)
    assert len(in_flight) == 100 and max(in_flight) == 1


def _reference_accumulation() -> list[list[float]]:
    """One process: SGD on the mean loss of the 8 batches (4 per rank) of each window."""
    from torch import nn

    g = torch.Generator().manual_seed(5)
    batches = [(torch.randn(4, 4, generator=g), torch.randint(0, 2, (4,), generator=g))
               for _ in range(16)]
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(net.parameters(), 0.1)
    for w in range(2):
        opt.zero_grad()
        for x, y in batches[8 * w:8 * w + 8]:
            (nn.functional.cross_entropy(net(x), y) / 8).backward()
        opt.step()
    return [p.detach().flatten().tolist() for p in net.parameters()]


def test_gradient_accumulation_reduces_once_per_optimizer_step(tmp_path):
    # Trainer(accumulate_grad_batches=4), 8 micro-steps per rank: the micro-steps before the
    # last of each window keep their gradients local (DDP no_sync / FSDP2
    # set_requires_gradient_sync(False)); 2 all-reduces instead of 8, same weights
    r0, r1 = _run("accum", tmp_path)
    ref = _reference_accumulation()
    for res in (r0, r1):
        assert res["allreduce_calls"] == 2
        for strategy in ("ddp", "fsdp2"):
            for got, want in zip(res[strategy], ref):
                assert got == pytest.approx(want, abs=1e-6), strategy
