"""StopOnSignal: a signal stops training at the next step boundary, never inside a write."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
import torch
from torch import nn

from lit_amp import Model, serialization
from lit_amp.callbacks import BackupAndRestore, Callback
from lit_amp.callbacks.on_request_exit import StopOnSignal
from tests.helpers.data import make_batches, make_net

SIG = signal.SIGUSR1


def _model(seed: int = 0) -> tuple[Model, nn.Module]:
    torch.manual_seed(seed)
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    return Model(net, nn.CrossEntropyLoss(), opt), net


class _HalfWrittenSignal:
    """A file proxy that sends ``SIG`` to this process after the first bytes of the first
    backup written through it, then writes the rest: the signal lands mid-file."""

    def __init__(self, f: Any, state: dict) -> None:
        self.f, self.state = f, state

    def write(self, data: Any) -> int:
        n = self.f.write(data)
        if not self.state["sent"]:
            self.state["sent"] = True
            os.kill(os.getpid(), SIG)  # the handler runs here, with the file half written
            self.state["received_mid_write"] = self.state["stop"].received == SIG
        return n

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)


def test_a_signal_during_a_backup_write_leaves_a_whole_file_and_the_run_resumes_exactly(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The handler only records the signal while the epoch-1 backup is half written; the write
    finishes, the run stops after the next step and the loop writes that position, and a new
    process resumes from it to the same weights as a run never interrupted."""
    data = make_batches(4)
    ref, ref_net = _model()
    ref.train(3, data)

    stop = StopOnSignal((SIG,))
    state = {"sent": False, "stop": stop}
    real = serialization.atomic_write
    monkeypatch.setattr(serialization, "atomic_write", lambda path, write, **kw: real(
        path, lambda f: write(_HalfWrittenSignal(f, state)), **kw))
    steps: list[int] = []

    class Steps(Callback):
        def on_train_step_end(self, rc: Any) -> None:
            steps.append(rc.original_args().cur_epoch_num)

    model, _ = _model()
    backup_dir = tmp_path / "bk"
    model.train(3, data, callbacks=[stop, BackupAndRestore(str(backup_dir)), Steps()])
    assert state["received_mid_write"]  # the signal arrived in the middle of the write
    assert steps == [1, 1, 1, 1, 2] and stop.stopped_early  # stopped after epoch 2's 1st step
    assert [p.name for p in backup_dir.iterdir()] == ["backup.ckpt"]  # no temp file left
    info = serialization.load_checkpoint(str(backup_dir / "backup.ckpt"))["append_info"]
    assert (info["epoch_num"], info["step_in_epoch"]) == (1, 1)  # the whole file, the position

    monkeypatch.setattr(serialization, "atomic_write", real)
    resumed, net = _model(seed=7)
    resumed.train(3, data, callbacks=[BackupAndRestore(str(backup_dir))])
    assert all(torch.equal(a, b) for a, b in zip(ref_net.state_dict().values(),
                                                  net.state_dict().values()))


def test_a_signal_in_the_last_step_is_not_an_early_stop() -> None:
    """A run that trained every step is complete even if a signal came during its last one."""
    data = make_batches(3)
    stop = StopOnSignal((SIG,))

    class SignalAt(Callback):
        def __init__(self, step: int) -> None:
            self.step = step

        def on_train_step_begin(self, rc: Any) -> None:  # cur_step_num: this step's number
            if rc.original_args().cur_step_num == self.step:
                os.kill(os.getpid(), SIG)

    _model()[0].train(2, data, callbacks=[stop, SignalAt(6)])
    assert stop.received == SIG and not stop.stopped_early
    before = signal.getsignal(SIG)
    _model()[0].train(2, data, callbacks=[stop, SignalAt(2)])
    assert stop.stopped_early  # stopped after step 2 of 6
    assert signal.getsignal(SIG) is before  # the previous handler is back


@pytest.mark.parametrize("signals, error", [
    (signal.SIGTERM, TypeError), ([], ValueError), ([signal.SIGKILL], ValueError),
    (["15"], TypeError),
])
def test_bad_signals_are_refused_naming_the_argument(signals: Any, error: type) -> None:
    with pytest.raises(error, match="'signals'"):
        StopOnSignal(signals)
