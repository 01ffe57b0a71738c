"""MindSpore's ``OnRequestExit`` through small simulated runs (semantics §1.4-1.7)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

import pytest

from lit_amp.callbacks.base import InternalCallbackParam, RunContext
from lit_amp.callbacks.lambda_callback import LambdaCallback
from lit_amp.callbacks.on_request_exit import OnRequestExit
from lit_amp.serialization import load_checkpoint
from tests.callbacks._helpers import (
    make_net,
    same,
    simulate_eval,
    simulate_train,
    weights,
)


def test_on_request_exit_sigterm_stops_and_saves(tmp_path: Any) -> None:
    net, opt = make_net()
    original = signal.getsignal(signal.SIGTERM)
    cb = OnRequestExit(file_name="LeNet", directory=str(tmp_path))

    def send(rc: RunContext) -> None:
        if rc.original_args().cur_step_num == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    run = simulate_train(
        [LambdaCallback(on_train_step_end=send), cb], epochs=3, batches=4, net=net, opt=opt
    )
    assert run.epochs_run == [1] and len(run.losses) == 2  # stopped after the signalled step
    assert signal.getsignal(signal.SIGTERM) == original  # handler restored
    path = tmp_path / "LeNet_train.ckpt"
    assert path.is_file()
    assert same(load_checkpoint(str(path))["network"], weights(net))

    # the next run resumes from that checkpoint at train begin
    fresh, fresh_opt = make_net(seed=5)
    loaded: dict = {}

    def grab(rc: RunContext) -> None:
        loaded.update(weights(fresh))

    cb2 = OnRequestExit(file_name="LeNet", directory=str(tmp_path))
    run2 = simulate_train(
        [cb2, LambdaCallback(on_train_begin=grab)], epochs=1, batches=1, net=fresh, opt=fresh_opt
    )
    assert same(loaded, run.epoch_weights[1])
    assert run2.epochs_run == [1] and cb2.exit is False


def test_on_request_exit_without_signal_saves_nothing(tmp_path: Any) -> None:
    run = simulate_train([OnRequestExit(directory=str(tmp_path))], epochs=2, batches=2)
    assert run.epochs_run == [1, 2] and not os.listdir(tmp_path)


def test_on_request_exit_eval(tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    net, _ = make_net()
    cb = OnRequestExit(directory=str(tmp_path), sig=signal.SIGUSR1)

    def send(rc: RunContext) -> None:
        os.kill(os.getpid(), signal.SIGUSR1)

    with caplog.at_level(logging.INFO, logger="lit_amp.callbacks.on_request_exit"):
        rc = simulate_eval([LambdaCallback(on_eval_step_end=send), cb], batches=3, net=net)
    assert rc.get_stop_requested() and rc.original_args().cur_step_num == 1
    assert (tmp_path / "Net_eval.ckpt").is_file()
    assert caplog.text.count("MINDIR") == 1


def test_on_request_exit_off_main_thread_warns(caplog: pytest.LogCaptureFixture) -> None:
    cb = OnRequestExit(save_ckpt=False, save_mindir=False)
    rc = RunContext(InternalCallbackParam(mode="train"))
    with caplog.at_level(logging.WARNING):
        t = threading.Thread(target=cb.on_train_begin, args=(rc,))
        t.start()
        t.join()
    assert "main thread" in caplog.text
    cb.on_train_end(rc)


@pytest.mark.parametrize(
    ("kwargs", "exc", "name"),
    [
        ({"sig": signal.SIGKILL}, ValueError, "sig.*SIGKILL"),
        ({"sig": signal.SIGSTOP}, ValueError, "sig.*SIGSTOP"),
        ({"sig": 10_000}, ValueError, "sig"),
        ({"sig": "SIGTERM"}, TypeError, "sig"),
        ({"save_ckpt": 1}, TypeError, "save_ckpt"),
        ({"save_mindir": "no"}, TypeError, "save_mindir"),
        ({"file_name": 3}, TypeError, "file_name"),
        ({"directory": 3}, TypeError, "directory"),
    ],
)
def test_on_request_exit_bad_arguments(tmp_path: Any, kwargs: dict, exc: type, name: str) -> None:
    kwargs.setdefault("directory", str(tmp_path))
    with pytest.raises(exc, match=name):
        OnRequestExit(**kwargs)


def test_on_request_exit_leaves_resuming_to_backup_and_restore(tmp_path: Any) -> None:
    """An older ``Net_train.ckpt`` must not replace the newer backup BackupAndRestore restored."""
    import torch
    from torch import nn

    from lit_amp import Model, save_checkpoint
    from lit_amp.callbacks.backup_and_restore import BackupAndRestore
    from tests.helpers.data import make_batches
    from tests.helpers.data import make_net as mlp

    def model(seed: int) -> Model:
        torch.manual_seed(seed)
        net = mlp()
        return Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.1),
                     trainer={"logger": False, "enable_checkpointing": False})

    old, new = model(1), model(2)  # an old SIGTERM checkpoint, a newer epoch-2 backup
    save_checkpoint(old.lit_model, str(tmp_path / "exit" / "Net_train"))
    save_checkpoint(new.lit_model, str(tmp_path / "bk" / "backup"), {"epoch_num": 2})
    resumed = model(3)
    seen: dict = {}
    resumed.train(3, make_batches(2), callbacks=[
        OnRequestExit(directory=str(tmp_path / "exit")),
        BackupAndRestore(str(tmp_path / "bk")),
        LambdaCallback(on_train_begin=lambda rc: seen.update(
            {k: v.clone() for k, v in resumed.predict_network.state_dict().items()})),
    ])
    expected = new.predict_network.state_dict()
    assert seen and all(torch.equal(seen[k], expected[k]) for k in expected)


def _agree_worker(rank: int, world: int, directory: str) -> list[bool]:
    cb = OnRequestExit(directory=directory)
    rc = RunContext(InternalCallbackParam(device_number=world, rank=rank))
    seen = []
    for step in range(3):  # the signal reaches rank 1 only, before step 2's end
        cb.exit = cb.exit or (rank == 1 and step == 1)
        cb.on_train_step_end(rc)
        seen.append(rc.get_stop_requested())
    return seen


def test_under_ddp_a_signal_at_one_rank_stops_every_rank_after_the_same_step(
    tmp_path: Any,
) -> None:
    """#18: the ranks all-reduce the flag at each step end (before: rank 0 went on training
    and waited forever at the next collective that rank 1 never joined)."""
    from tests.helpers.dist import run_distributed

    assert run_distributed(_agree_worker, args=(str(tmp_path),)) == [[False, True, True]] * 2
