"""MindSpore's ``BackupAndRestore`` through small simulated runs (semantics §1.4-1.7)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lit_amp.callbacks.backup_and_restore import BackupAndRestore
from lit_amp.callbacks.base import RunContext
from lit_amp.callbacks.lambda_callback import LambdaCallback
from lit_amp.serialization import load_checkpoint
from tests.callbacks._helpers import (
    TrainNet,
    make_net,
    same,
    simulate_train,
    weights,
)


def test_backup_and_restore_resume_after_crash(tmp_path: Any) -> None:
    net, opt = make_net()
    cb = BackupAndRestore(str(tmp_path), save_freq=2)

    def crash(rc: RunContext) -> None:
        cb_params = rc.original_args()
        if cb_params.cur_epoch_num == 3 and cb_params.cur_step_num == 8:
            raise RuntimeError("node failure")

    with pytest.raises(RuntimeError, match="node failure"):
        simulate_train(
            [cb, LambdaCallback(on_train_step_end=crash)], epochs=4, batches=3, net=net, opt=opt
        )
    backup = tmp_path / "backup.ckpt"
    assert backup.is_file()  # train end never ran: the backup survives
    info = load_checkpoint(str(backup))["append_info"]
    assert {k: info[k] for k in ("epoch_num", "step_num", "step_in_epoch")} == {
        "epoch_num": 2, "step_num": 6, "step_in_epoch": 0}

    fresh, fresh_opt = make_net(seed=9)
    cb2 = BackupAndRestore(str(tmp_path), save_freq=2)
    train_net = TrainNet(fresh, fresh_opt)
    assert cb2.restore(train_net) == 2
    restored = weights(fresh)
    assert same(restored, load_checkpoint(str(backup))["network"])
    assert fresh_opt.state_dict()["state"]  # momentum restored too
    # on_train_begin must not load a second time: mark the weights and check they survive
    with torch.no_grad():
        fresh.bias.add_(1.0)
    marked = weights(fresh)
    seen: dict = {}
    run = simulate_train(
        [cb2, LambdaCallback(on_train_begin=lambda rc: seen.update(weights(fresh)))],
        epochs=4,
        batches=3,
        initial_epoch=2,
        net=fresh,
        opt=fresh_opt,
    )
    assert same(seen, marked)
    assert run.epochs_run == [3, 4]
    assert not backup.exists()  # deleted at train end


def test_backup_and_restore_train_begin_loads_and_keep(tmp_path: Any) -> None:
    net, opt = make_net()
    run = simulate_train(
        [BackupAndRestore(str(tmp_path), delete_checkpoint=False)],
        epochs=2,
        batches=2,
        net=net,
        opt=opt,
    )
    assert load_checkpoint(str(tmp_path / "backup.ckpt"))["append_info"]["epoch_num"] == 2
    fresh, fresh_opt = make_net(seed=3)
    seen: dict = {}
    simulate_train(
        [
            BackupAndRestore(str(tmp_path)),
            LambdaCallback(on_train_begin=lambda rc: seen.update(weights(fresh))),
        ],
        epochs=1,
        batches=1,
        net=fresh,
        opt=fresh_opt,
    )
    assert same(seen, run.epoch_weights[2])
    assert BackupAndRestore(str(tmp_path)).restore(TrainNet(*make_net())) == 0


@pytest.mark.parametrize(
    ("kwargs", "exc", "name"),
    [
        ({"save_freq": 0}, ValueError, "save_freq"),
        ({"save_freq": "step"}, ValueError, "save_freq.*'step'"),
        ({"save_freq": 1.5}, TypeError, "save_freq"),
        ({"save_freq": True}, TypeError, "save_freq"),
        ({"delete_checkpoint": 1}, TypeError, "delete_checkpoint"),
        ({"backup_dir": 3}, TypeError, "backup_dir"),
    ],
)
def test_backup_and_restore_bad_arguments(
    tmp_path: Any, kwargs: dict, exc: type, name: str
) -> None:
    kwargs.setdefault("backup_dir", str(tmp_path))
    with pytest.raises(exc, match=name):
        BackupAndRestore(**kwargs)


def _stop_at(epoch: int, step: int) -> LambdaCallback:
    def stop(rc: RunContext) -> None:
        cb = rc.original_args()
        if (cb.cur_epoch_num, (cb.cur_step_num - 1) % cb.batch_num + 1) == (epoch, step):
            rc.request_stop()

    return LambdaCallback(on_train_step_end=stop)


def test_a_stop_mid_epoch_is_not_an_epoch_end(tmp_path: Any) -> None:
    """A stop at epoch 3 step 2 of 4 records 2 epochs done + 2 batches, and keeps the file."""
    net, opt = make_net()
    cb = BackupAndRestore(str(tmp_path))
    run = simulate_train([cb, _stop_at(3, 2)], epochs=5, batches=4, net=net, opt=opt)
    assert run.epochs_run == [1, 2, 3]
    backup = tmp_path / "backup.ckpt"
    assert backup.is_file()  # kept: the run did not reach its last epoch
    state = load_checkpoint(str(backup))
    assert state["append_info"]["epoch_num"] == 2  # epoch 3 is NOT complete
    assert state["append_info"]["step_in_epoch"] == 2
    assert same(state["network"], weights(net))  # the weights at the stop

    fresh, fresh_opt = make_net(seed=9)
    cb2 = BackupAndRestore(str(tmp_path))
    assert cb2.restore(TrainNet(fresh, fresh_opt)) == 2
    batches = [(torch.full((1, 4), float(i)), torch.zeros(1, 2)) for i in range(4)]
    rest = list(cb2.prepare_dataset(batches, False, 2))
    assert [float(b[0][0, 0]) for b in rest] == [2.0, 3.0]  # batches 1-2 are not trained again


@pytest.mark.parametrize("how", ["sink", "ddp", "ddp_list"])
def test_a_stop_mid_epoch_under_ddp_records_the_position_and_in_sink_mode_is_an_epoch_end(
    tmp_path: Any, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Several processes over a DataLoader: the position is recorded as in one process, with
    the number of processes (before: the epoch-2 backup was kept and epoch 3 retrained from
    its start); a mid-epoch backup resumed by another number of processes is refused by
    name. Over a list: the epoch-2 backup stays, a warning says so. Sink: epoch 3 is done."""
    from torch.utils.data import DataLoader, TensorDataset

    cb = BackupAndRestore(str(tmp_path))
    if how == "ddp":
        cb.prepare_dataset(DataLoader(TensorDataset(torch.zeros(4, 4)), batch_size=1))
    elif how == "ddp_list":
        cb.prepare_dataset([torch.zeros(1, 4)] * 4)

    class Ddp(LambdaCallback):
        def on_train_begin(self, run_context: RunContext) -> None:
            run_context.original_args().device_number = 2

    extra = [Ddp()] if how != "sink" else []
    kw = {"sink_size": 2} if how == "sink" else {"batches": 4}

    def stop(rc: RunContext) -> None:
        if rc.original_args().cur_epoch_num == 3:
            rc.request_stop()

    with caplog.at_level("WARNING"):
        simulate_train([*extra, cb, LambdaCallback(on_train_step_end=stop)], epochs=5, **kw)
    info = load_checkpoint(str(tmp_path / "backup.ckpt"))["append_info"]
    if how == "sink":  # the stop came at the end of the sink, which is the whole epoch
        assert info["epoch_num"] == 3 and info["step_in_epoch"] == 0
        assert "again from its start" not in caplog.text
        return
    if how == "ddp_list":
        assert info["epoch_num"] == 2 and info["step_in_epoch"] == 0
        assert "trains epoch 3 again from its start" in caplog.text
        return
    assert info["epoch_num"] == 2 and info["step_in_epoch"] == 1 and info["world_size"] == 2
    assert len(info["rng_ranks"]) == len(info["rng_now_ranks"]) == 1  # no process group here
    cb2 = BackupAndRestore(str(tmp_path))
    cb2.restore(TrainNet(*make_net()))
    cb2.prepare_dataset([(torch.zeros(1, 4), torch.zeros(1, 2))] * 4, False, 2)
    with pytest.raises(RuntimeError, match=r"made mid-epoch by 2 process\(es\); resume it with 2"):
        simulate_train([cb2], epochs=5, batches=4, initial_epoch=2)
