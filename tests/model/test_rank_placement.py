"""Datasets as ``Model`` sees them under DDP (``lit_amp.model.rank_placement``): which samples
each rank trains on and which samples an evaluation counts, on 2 CPU processes (gloo).

One run of ``_ddp_coverage_worker.py`` (Lightning's launcher re-runs it for rank 1) covers all
items; every sample's id is its first feature, so the ids the network trained on and the ids
the evaluation counted are what the tests compare.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from torch.utils.data import DistributedSampler

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("_ddp_coverage_worker.py")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("ddp_coverage")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(WORKER), str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((out / f"coverage{r}.json").read_text()) for r in (0, 1)]


def _ok(res: dict, name: str) -> dict:
    value = res[name]
    assert not (isinstance(value, dict) and "error" in value), f"{name}: {value}"
    return value


def _lightning_split(n: int, rank: int, epoch: int = 0, seed: int = 0) -> list[int]:
    """The sample ids Lightning's DistributedSampler gives ``rank`` of 2 in ``epoch``."""
    sampler = DistributedSampler(range(n), num_replicas=2, rank=rank, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


def _once(*parts: list) -> None:
    """The parts together hold every id 0..n-1 exactly once."""
    ids = [i for part in parts for i in part]
    assert sorted(ids) == list(range(len(ids))), Counter(ids)


# ------------------------------------------------------------------ item 16
def test_eval_counts_each_sample_of_a_distributed_sampler_loader_once(ranks):
    # 7 samples, the user's DistributedSampler (it pads rank 1 with sample 0): the loader is used
    # as it is (not split a second time) and the padded repeat is not counted
    for res in ranks:
        assert _ok(res, "16_eval_distributed_sampler") == list(range(7))


def test_sink_mode_trains_a_distributed_sampler_loader_as_is(ranks):
    # sink_size=-1 over the user's own shuffled split: one epoch = this rank's part, once
    parts = [_ok(res, "16_sink_distributed_sampler")["seen"] for res in ranks]
    for rank, part in enumerate(parts):
        assert part == _lightning_split(16, rank, seed=3)
    _once(*parts)


def test_a_rank_aware_sampler_of_the_users_own_is_not_split_again(ranks):
    # non-sink: Lightning would wrap it in its DistributedSampler and train half of each part
    for rank, res in enumerate(ranks):
        assert _ok(res, "16_own_sampler")["seen"] == list(range(rank, 16, 2))


def test_a_sampler_split_for_another_world_size_is_refused(ranks):
    for res in ranks:
        err = res["16_wrong_world"]["error"]
        assert err.startswith("ValueError") and "num_replicas=4" in err and "2 ranks" in err


# ------------------------------------------------------------------ item 17
@pytest.mark.parametrize("name", ["17_plain", "17_sink"])
def test_an_iterable_dataset_is_refused_in_both_modes(ranks, name):
    # lit_amp cannot tell whether each rank's copy already yields only its part: refused in
    # sink and non-sink mode alike, naming the two ways to say which
    for res in ranks:
        err = res[name]["error"]
        assert err.startswith("ValueError"), err
        assert "IterableDataset" in err and "PerRank" in err and "SplitByRank" in err


@pytest.mark.parametrize("name", ["17_split_plain", "17_split_sink"])
def test_split_by_rank_trains_each_sample_of_a_stream_once(ranks, name):
    parts = [_ok(res, name)["seen"] for res in ranks]
    assert parts[0] == [0, 1, 4, 5, 8, 9, 12, 13]
    _once(*parts)


def test_per_rank_uses_a_self_sharding_stream_as_is(ranks):
    for rank, res in enumerate(ranks):
        assert _ok(res, "17_per_rank")["seen"] == list(range(rank, 16, 2))


# ------------------------------------------------------------------ item 19
@pytest.mark.parametrize("name", ["19_validate_bs1", "19_validate_bs2", "19_validate_bs3",
                                  "19_test_bs2"])
def test_lit_model_in_a_plain_ddp_trainer_counts_each_sample_once(ranks, name):
    # Lightning's DistributedSampler pads 7 samples to 8 (rank 1 gets sample 0 again)
    for res in ranks:
        assert _ok(res, name) == list(range(7))


# ------------------------------------------------------------------ item 20
def test_default_sink_size_is_one_pass_of_this_ranks_part(ranks):
    # 16 samples in 8 batches: 4 steps per rank per epoch, the same split as non-sink training
    for rank, res in enumerate(ranks):
        got = _ok(res, "20_loader")
        assert got["seen"] == _lightning_split(16, rank, 0) + _lightning_split(16, rank, 1)
        assert got["batch_num"] == [4, 4] and got["steps"] == [4, 8]
    for epoch in (0, 1):
        _once(*[res["20_loader"]["seen"][8 * epoch:8 * (epoch + 1)] for res in ranks])


def test_default_sink_size_with_a_list_and_an_uneven_last_batch(ranks):
    # batches of 2, 2, 2, 1 samples: 2 steps per rank, each sample once
    parts = [_ok(res, "20_list")["seen"] for res in ranks]
    assert parts == [[0, 1, 4, 5], [2, 3, 6]]
    assert [res["20_list"]["batch_num"] for res in ranks] == [[2], [2]]
    _once(*parts)


def test_default_sink_size_with_an_uneven_loader_trains_what_non_sink_trains(ranks):
    # 7 samples: 4 per rank (the sampler repeats one to keep the ranks in step), as non-sink
    for rank, res in enumerate(ranks):
        sink = _ok(res, "20_loader_uneven")["seen"]
        assert sink == _ok(res, "20_loader_uneven_plain")["seen"] == _lightning_split(7, rank)
    ids = ranks[0]["20_loader_uneven"]["seen"] + ranks[1]["20_loader_uneven"]["seen"]
    assert set(ids) == set(range(7)) and len(ids) == 8


# ------------------------------------------------------------------ refusals (one process)
def _padded_loader(batch_size: int | None = 2, drop_last: bool = False):
    """Rank 1 of 2 over 7 samples: the DistributedSampler repeats sample 0 at its end."""
    from torch.utils.data import DataLoader

    data = list(range(7))
    sampler = DistributedSampler(data, 2, 1, shuffle=False, drop_last=drop_last)
    return DataLoader(data, batch_size=batch_size, sampler=sampler)


def test_an_evaluation_sampler_that_drops_samples_is_refused():
    from lit_amp.model.rank_placement import padding_trim

    with pytest.raises(ValueError, match=r"drop_last=True: it leaves out 1 of the 7 samples"):
        padding_trim(_padded_loader(drop_last=True))


def test_padding_under_a_batch_sampler_of_ones_own_is_refused():
    from torch.utils.data import DataLoader

    from lit_amp.model.rank_placement import padding_trim

    class Pairs:  # a batch sampler that is not torch's BatchSampler
        def __init__(self, sampler):
            self.sampler = sampler

        def __iter__(self):
            it = iter(self.sampler)
            return iter(lambda: [i for _, i in zip(range(2), it)] or None, None)

        def __len__(self):
            return 2

    data = list(range(7))
    loader = DataLoader(data, batch_sampler=Pairs(DistributedSampler(data, 2, 1, False)))
    with pytest.raises(ValueError, match=r"Pairs \(not torch's BatchSampler\)"):
        padding_trim(loader)


def test_a_repeat_that_cannot_be_cut_is_refused():
    import torch

    from lit_amp.model.rank_placement import NO_BATCH, padding_trim

    trim = padding_trim(_padded_loader())  # batches 1, 3 | 5, 0 (the repeat)
    assert trim(torch.tensor([1, 3]), 0).tolist() == [1, 3]
    assert trim({"x": torch.tensor([5, 0])}, 1)["x"].tolist() == [5]
    with pytest.raises(ValueError, match=r"shape \(3,\), not 2 first"):
        trim((torch.tensor([5, 0]), torch.zeros(3)), 1)
    one = padding_trim(_padded_loader(batch_size=None))  # unbatched: the repeat is a step
    assert one(torch.tensor(0), 3) is NO_BATCH


# ------------------------------------------ evaluation order differing per rank (issue #48)
def _shuffled_eval(seed: int | None = None) -> dict:
    """``Model.eval`` over 40 rows in a ``DataLoader(shuffle=True)`` seeded ``seed``."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from lit_amp import Model
    from tests.helpers.data import make_batches, make_net

    x, y = map(torch.cat, zip(*make_batches(5, batch=8)))
    torch.manual_seed(0)
    net = make_net()
    trainer = ({"accelerator": "cpu", "devices": 2, "strategy": "ddp"} if seed is None
               else {"accelerator": "cpu"})
    rank = int(os.environ.get("RANK", "0")) if seed is None else 0
    model = Model(net, nn.CrossEntropyLoss(), metrics={"acc", "loss"}, trainer=trainer)

    def loader(s: int) -> DataLoader:
        return DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True,
                          generator=torch.Generator().manual_seed(s))

    if seed is not None:
        return model.eval(loader(seed))
    out = {"same_seed": model.eval(loader(100))}
    try:
        out["per_rank_seed"] = model.eval(loader(100 + rank))
    except RuntimeError as err:
        out["per_rank_seed"] = str(err)
    return out


def _shuffled_eval_worker(rank: int, world: int) -> dict:
    return _shuffled_eval()


def test_evaluation_in_a_different_order_on_each_rank_is_refused():
    from tests.helpers.dist import run_distributed

    single = _shuffled_eval(seed=100)
    for res in run_distributed(_shuffled_eval_worker, world=2, init_group=False):
        # the same seed on every rank: the result of one process
        assert res["same_seed"]["acc"] == pytest.approx(single["acc"], abs=1e-6)
        assert res["same_seed"]["loss"] == pytest.approx(single["loss"], rel=1e-5)
        # seeds 100 + rank: the ranks iterate different orders, every-other-batch placement
        # would count some rows twice and others never; refused, saying what to do
        msg = res["per_rank_seed"]
        assert isinstance(msg, str), f"evaluated silently: {msg}"
        assert "shuffle=False" in msg and "DistributedSampler" in msg and "seed" in msg
