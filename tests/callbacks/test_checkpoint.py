"""MindSpore's ``ModelCheckpoint`` through small simulated runs (semantics §1.4-1.7)."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from torch import nn

from lit_amp.callbacks.base import InternalCallbackParam, RunContext
from lit_amp.callbacks.checkpoint import CheckpointConfig, ModelCheckpoint
from lit_amp.callbacks.lambda_callback import LambdaCallback
from lit_amp.serialization import load_checkpoint
from tests.callbacks._helpers import (
    TrainNet,
    make_net,
    same,
    simulate_train,
    weights,
)


def ckpts(directory: Any) -> set[str]:
    return {f for f in os.listdir(directory) if f.endswith(".ckpt")}


def test_checkpoint_default_saves_every_step_keeps_five(tmp_path: Any) -> None:
    mc = ModelCheckpoint(directory=tmp_path)
    run = simulate_train([mc], epochs=2, batches=3)
    assert ckpts(tmp_path) == {
        f"CKP-{e}_{s}.ckpt" for e, s in [(1, 2), (1, 3), (2, 1), (2, 2), (2, 3)]
    }
    latest = os.path.join(tmp_path, "CKP-2_3.ckpt")
    assert mc.latest_ckpt_file_name == latest
    assert run.cb.latest_ckpt_file == latest
    assert run.cb.last_save_ckpt_step == 6
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp")]


def test_checkpoint_reload_into_fresh_net(tmp_path: Any) -> None:
    net, opt = make_net(0)
    mc = ModelCheckpoint(prefix="net", directory=tmp_path, config=CheckpointConfig(3))
    simulate_train([mc], epochs=2, batches=3, net=net, opt=opt)
    assert ckpts(tmp_path) == {"net-1_3.ckpt", "net-2_3.ckpt"}
    fresh, fresh_opt = make_net(seed=7)
    assert not same(weights(fresh), weights(net))
    load_checkpoint(mc.latest_ckpt_file_name, net=TrainNet(fresh, fresh_opt))
    assert same(weights(fresh), weights(net))
    mom = opt.state_dict()["state"][0]["momentum_buffer"]
    assert torch.equal(fresh_opt.state_dict()["state"][0]["momentum_buffer"], mom)
    # a plain module loads the network part
    plain = nn.Linear(3, 1)
    load_checkpoint(mc.latest_ckpt_file_name, net=plain)
    assert same(weights(plain), weights(net))


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        (2, {"CKP-1_2.ckpt", "CKP-2_1.ckpt", "CKP-2_3.ckpt"}),  # 2, 4, 6; end: 6 already saved
        (4, {"CKP-2_1.ckpt", "CKP-2_3.ckpt"}),  # 4; end forces 6
        (100, {"CKP-2_3.ckpt"}),  # only the final save
    ],
)
def test_checkpoint_steps_and_final_save(tmp_path: Any, steps: int, expected: set[str]) -> None:
    config = CheckpointConfig(save_checkpoint_steps=steps, keep_checkpoint_max=10)
    simulate_train([ModelCheckpoint(directory=tmp_path, config=config)], epochs=2, batches=3)
    assert ckpts(tmp_path) == expected


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        (1, {"CKP-1_4.ckpt", "CKP-2_4.ckpt", "CKP-3_4.ckpt"}),
        (6, {"CKP-2_4.ckpt", "CKP-3_4.ckpt"}),  # cur_step 4, 8 (>= 6: save), 12 (< 14); end: 12
    ],
)
def test_checkpoint_sink_mode(tmp_path: Any, steps: int, expected: set[str]) -> None:
    config = CheckpointConfig(save_checkpoint_steps=steps)
    simulate_train([ModelCheckpoint(directory=tmp_path, config=config)], epochs=3, sink_size=4)
    assert ckpts(tmp_path) == expected


def test_checkpoint_prefix_changes_when_files_exist(tmp_path: Any) -> None:
    (tmp_path / "CKP-1_1.ckpt").write_bytes(b"")
    mc = ModelCheckpoint(directory=tmp_path)
    assert mc.prefix == "CKP_1"
    simulate_train([mc], epochs=1, batches=1)
    assert "CKP_1-1_1.ckpt" in ckpts(tmp_path)
    assert ModelCheckpoint(directory=tmp_path).prefix == "CKP_2"
    assert ModelCheckpoint(prefix="CKPX", directory=tmp_path).prefix == "CKPX"


def test_checkpoint_keep_max_deletes_oldest_only_own_prefix(tmp_path: Any) -> None:
    (tmp_path / "other-1_1.ckpt").write_bytes(b"")
    config = CheckpointConfig(keep_checkpoint_max=2)
    simulate_train([ModelCheckpoint(directory=tmp_path, config=config)], epochs=1, batches=5)
    assert ckpts(tmp_path) == {"other-1_1.ckpt", "CKP-1_4.ckpt", "CKP-1_5.ckpt"}


def test_checkpoint_keep_per_n_minutes(tmp_path: Any) -> None:
    config = CheckpointConfig(keep_checkpoint_max=0, keep_checkpoint_per_n_minutes=1)
    assert config.keep_checkpoint_max == 0
    simulate_train([ModelCheckpoint(directory=tmp_path, config=config)], epochs=1, batches=4)
    # all saves fall in the same minute: the oldest of that minute and the newest remain
    assert ckpts(tmp_path) == {"CKP-1_1.ckpt", "CKP-1_4.ckpt"}


def test_checkpoint_seconds_mode(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import lit_amp.callbacks.checkpoint as ckpt_mod

    clock = {"t": 1000.0}

    class FakeTime:
        @staticmethod
        def time() -> float:
            return clock["t"]

    monkeypatch.setattr(ckpt_mod, "time", FakeTime)
    config = CheckpointConfig(save_checkpoint_steps=0, save_checkpoint_seconds=10)
    assert config.save_checkpoint_seconds == 10

    def tick(rc: RunContext) -> None:
        clock["t"] += 4.0

    simulate_train(
        [
            LambdaCallback(on_train_step_begin=tick),
            ModelCheckpoint(directory=tmp_path, config=config),
        ],
        epochs=1,
        batches=6,
    )
    # t = 1004, 1008, 1012 (>10 s: save), 1016, 1020, 1024 (save); end: step 6 already saved
    assert ckpts(tmp_path) == {"CKP-1_3.ckpt", "CKP-1_6.ckpt"}


def test_checkpoint_append_info(tmp_path: Any) -> None:
    config = CheckpointConfig(
        save_checkpoint_steps=3, append_info=["epoch_num", "step_num", {"lr": 0.1, "tag": "a"}]
    )
    mc = ModelCheckpoint(directory=tmp_path, config=config)
    simulate_train([mc], epochs=2, batches=3)
    info = load_checkpoint(mc.latest_ckpt_file_name)["append_info"]
    assert info == {"epoch_num": 2, "step_num": 6, "lr": 0.1, "tag": "a"}


def test_checkpoint_saved_network(tmp_path: Any) -> None:
    net, opt = make_net()
    config = CheckpointConfig(save_checkpoint_steps=100, saved_network=net)
    mc = ModelCheckpoint(directory=tmp_path, config=config)
    simulate_train([mc], epochs=1, batches=2, net=net, opt=opt)
    state = load_checkpoint(mc.latest_ckpt_file_name)
    # a plain module: a Lightning-shaped dict with only state_dict (its own names) + append_info
    assert "optimizer_states" not in state and state["optimizer"] is None
    assert same(state["state_dict"], weights(net))
    assert same(state["network"], weights(net))


def test_checkpoint_only_rank_zero_writes(tmp_path: Any) -> None:
    mc = ModelCheckpoint(directory=tmp_path)
    run = simulate_train([mc], epochs=1, batches=2, rank=1)
    assert ckpts(tmp_path) == set()
    assert run.cb.last_save_ckpt_step == 2


def test_checkpoint_async_save_snapshots_state(tmp_path: Any) -> None:
    net, opt = make_net()
    config = CheckpointConfig(save_checkpoint_steps=2, async_save=True, keep_checkpoint_max=10)
    mc = ModelCheckpoint(directory=tmp_path, config=config)
    seen: dict[int, dict] = {}

    def record(rc: RunContext) -> None:
        seen[rc.original_args().cur_step_num] = weights(net)

    simulate_train(
        [mc, LambdaCallback(on_train_step_end=record)], epochs=1, batches=4, net=net, opt=opt
    )
    assert ckpts(tmp_path) == {"CKP-1_2.ckpt", "CKP-1_4.ckpt"}
    assert same(load_checkpoint(os.path.join(tmp_path, "CKP-1_2.ckpt"))["network"], seen[2])
    assert same(load_checkpoint(os.path.join(tmp_path, "CKP-1_4.ckpt"))["network"], seen[4])


def test_checkpoint_save_breakpoint(tmp_path: Any) -> None:
    net, opt = make_net()
    mc = ModelCheckpoint(
        prefix="bp", directory=tmp_path, config=CheckpointConfig(exception_save=True)
    )
    assert mc.config.exception_save is True

    def boom(rc: RunContext) -> None:
        if rc.original_args().cur_step_num == 5:
            raise RuntimeError("device lost")

    run_cb: dict = {}

    def keep(rc: RunContext) -> None:
        run_cb["cb"] = rc.original_args()

    with pytest.raises(RuntimeError, match="device lost"):
        simulate_train(
            [LambdaCallback(on_train_begin=keep, on_train_step_end=boom), mc],
            epochs=2,
            batches=3,
            net=net,
            opt=opt,
        )
    path = mc.save_breakpoint(run_cb["cb"])
    assert path == os.path.join(tmp_path, "bp-2_2_breakpoint.ckpt")
    assert same(load_checkpoint(path)["network"], weights(net))
    # breakpoint files don't count as regular checkpoints of the prefix
    assert ModelCheckpoint(prefix="bp", directory=tmp_path).prefix == "bp_1"
    assert mc.save_breakpoint(InternalCallbackParam(run_cb["cb"], rank=1)) is None


@pytest.mark.parametrize(
    ("kwargs", "exc", "name"),
    [
        ({"prefix": "a/b"}, ValueError, "prefix"),
        ({"prefix": 3}, ValueError, "prefix"),
        ({"prefix": ""}, ValueError, "prefix"),
        ({"directory": 3}, TypeError, "directory"),  # mindspore 2.10: TypeError
        ({"config": {"save_checkpoint_steps": 1}}, TypeError, "config"),
    ],
)
def test_model_checkpoint_bad_arguments(tmp_path: Any, kwargs: dict, exc: type, name: str) -> None:
    kwargs.setdefault("directory", tmp_path)
    with pytest.raises(exc, match=name):
        ModelCheckpoint(**kwargs)


def _breakpoint_worker(rank: int, world: int, directory: str) -> list[str]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    fully_shard(net, mesh=init_device_mesh("cpu", (world,)))
    cb = ModelCheckpoint("net", directory)
    path = cb.save_breakpoint({"train_network": net, "rank": rank, "cur_step_num": 3,
                               "batch_num": 4, "cur_epoch_num": 1})
    return [path] + sorted(os.listdir(directory))


def test_breakpoint_under_fsdp2_is_skipped_with_a_warning_instead_of_hanging(tmp_path):
    """Gathering a sharded state needs every rank; a failing rank saves alone -> no file."""
    from tests.helpers.dist import run_distributed

    results = run_distributed(_breakpoint_worker, world=2, args=(str(tmp_path),))
    assert results[0] == [None] and results[1] == [None]


def test_checkpoint_callable_prefix_matches_mindspore(tmp_path: Any) -> None:
    """Issue #48 item 7. Recorded from mindspore 2.10 (Model.train, 2 epochs of 2 batches,
    save_checkpoint_steps=1, keep_checkpoint_max=1): a callable prefix is called with cb_params
    at each step end ((epoch, step) = (1, 1), (1, 2), (2, 3), (2, 4)); the files are
    ``{prefix}.ckpt`` (net_e1.ckpt, net_e2.ckpt: keep_checkpoint_max does not apply); a
    constant prefix rewrites one file; a return value that is not a str without '/' ("a/b",
    3) is a ValueError at the first step end, before any file is written."""
    calls: list[tuple[int, int]] = []

    def prefix(cb: Any) -> str:
        calls.append((cb.cur_epoch_num, cb.cur_step_num))
        return f"net_e{cb.cur_epoch_num}"

    mc = ModelCheckpoint(prefix=prefix, directory=tmp_path / "a",
                         config=CheckpointConfig(save_checkpoint_steps=1, keep_checkpoint_max=1))
    simulate_train([mc], epochs=2, batches=2)
    assert calls == [(1, 1), (1, 2), (2, 3), (2, 4)]
    assert ckpts(tmp_path / "a") == {"net_e1.ckpt", "net_e2.ckpt"}
    assert mc.latest_ckpt_file_name == os.path.join(tmp_path / "a", "net_e2.ckpt")
    assert mc.prefix == "net_e2"
    fixed = ModelCheckpoint(prefix=lambda cb: "fixed", directory=tmp_path / "b")
    simulate_train([fixed], epochs=2, batches=2)
    assert ckpts(tmp_path / "b") == {"fixed.ckpt"}
    for bad in ("a/b", 3):
        mc = ModelCheckpoint(prefix=lambda cb, bad=bad: bad, directory=tmp_path / "c")
        with pytest.raises(ValueError, match="'prefix' for checkpoint file name is callable"):
            simulate_train([mc], epochs=1, batches=2)
        assert ckpts(tmp_path / "c") == set()


def test_checkpoint_callable_prefix_breakpoint(tmp_path: Any) -> None:
    mc = ModelCheckpoint(prefix=lambda cb: f"run{cb.cur_epoch_num}", directory=tmp_path,
                         config=CheckpointConfig(save_checkpoint_steps=100, exception_save=True))
    run = simulate_train([mc], epochs=2, batches=3)
    assert ckpts(tmp_path) == {"run2.ckpt"}  # the save at train end
    path = mc.save_breakpoint(run.cb)
    assert path == os.path.join(tmp_path, "run2-2_3_breakpoint.ckpt")
