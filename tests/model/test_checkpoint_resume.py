"""Nothing trained is lost: checkpoint reload, BackupAndRestore resume, SIGTERM, exceptions."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from torch import nn

from lit_amp import Model, load_checkpoint, load_param_into_net
from lit_amp.callbacks import (
    BackupAndRestore,
    Callback,
    CheckpointConfig,
    ModelCheckpoint,
    OnRequestExit,
)
from tests.helpers.data import make_batches, make_net


def _model(seed=0):
    torch.manual_seed(seed)
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    return Model(net, nn.CrossEntropyLoss(), opt, metrics={"acc"}), net, opt


def _equal_weights(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_model_checkpoint_files_reload_into_a_new_model(tmp_path):
    model, net, _ = _model()
    ckpt = ModelCheckpoint(
        prefix="net",
        directory=str(tmp_path),
        config=CheckpointConfig(save_checkpoint_steps=3, keep_checkpoint_max=2),
    )
    model.train(3, make_batches(3), callbacks=[ckpt])
    files = sorted(p.name for p in tmp_path.glob("*.ckpt"))
    assert files == ["net-2_3.ckpt", "net-3_3.ckpt"]  # keep_checkpoint_max=2, oldest deleted
    model2, net2, opt2 = _model(seed=1)
    assert not _equal_weights(net, net2)
    state = load_checkpoint(str(tmp_path / "net-3_3.ckpt"))
    load_param_into_net(net2, state)
    assert _equal_weights(net, net2)
    opt2.load_state_dict(state["optimizer"])  # optimizer state travels in the file too
    x = make_batches(1, seed=9)[0][0]
    assert torch.equal(model.predict(x), model2.predict(x))


def test_sink_mode_checkpoints_by_steps(tmp_path):
    model, _, _ = _model()
    ckpt = ModelCheckpoint(
        prefix="s",
        directory=str(tmp_path),
        config=CheckpointConfig(save_checkpoint_steps=4, keep_checkpoint_max=10),
    )
    model.train(4, make_batches(3), callbacks=[ckpt], dataset_sink_mode=True, sink_size=2)
    # cur_step_num goes 2, 4, 6, 8: saves at 4 and 8 (step in epoch = 2)
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == ["s-2_2.ckpt", "s-4_2.ckpt"]


class Crash(Callback):
    def __init__(self, at_epoch):
        self.at_epoch = at_epoch

    def on_train_epoch_begin(self, run_context):
        if run_context.original_args().cur_epoch_num == self.at_epoch:
            raise RuntimeError("simulated crash")


def test_backup_and_restore_resumes_the_exact_run(tmp_path):
    data = make_batches(4)
    ref, ref_net, _ = _model()
    ref.train(4, data)

    model, net, _ = _model()
    backup = BackupAndRestore(str(tmp_path / "bk"))
    with pytest.raises(RuntimeError, match="simulated crash"):
        model.train(4, data, callbacks=[backup, Crash(at_epoch=3)])
    assert (tmp_path / "bk" / "backup.ckpt").exists()

    # a fresh process: new objects, same backup dir
    model2, net2, _ = _model(seed=5)
    seen = []

    class Epochs(Callback):
        def on_train_epoch_begin(self, rc):
            seen.append(rc.original_args().cur_epoch_num)

    model2.train(4, data, callbacks=[BackupAndRestore(str(tmp_path / "bk")), Epochs()])
    assert seen == [3, 4]  # resumed after epoch 2
    assert _equal_weights(ref_net, net2)  # bit for bit the uninterrupted run
    assert not (tmp_path / "bk" / "backup.ckpt").exists()  # delete_checkpoint=True at the end


def test_exception_save_writes_a_breakpoint_checkpoint(tmp_path):
    model, _, _ = _model()
    ckpt = ModelCheckpoint(
        prefix="bp",
        directory=str(tmp_path),
        config=CheckpointConfig(save_checkpoint_steps=100, exception_save=True),
    )

    class Boom(Callback):
        def on_train_step_end(self, rc):
            if rc.original_args().cur_step_num == 5:
                raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        model.train(3, make_batches(3), callbacks=[ckpt, Boom()])
    assert [p.name for p in tmp_path.glob("*breakpoint.ckpt")] == ["bp-2_2_breakpoint.ckpt"]


def test_sigterm_stops_cleanly_saves_and_resumes(tmp_path):
    model, net, _ = _model()
    exit_cb = OnRequestExit(directory=str(tmp_path), file_name="Net")
    steps = []

    class Kill(Callback):
        def on_train_step_end(self, rc):
            steps.append(rc.original_args().cur_step_num)
            if rc.original_args().cur_step_num == 4:
                os.kill(os.getpid(), signal.SIGTERM)

    prev = signal.getsignal(signal.SIGTERM)
    model.train(10, make_batches(3), callbacks=[Kill(), exit_cb])
    assert steps == [1, 2, 3, 4]  # stopped right after the signalled step
    saved = tmp_path / "Net_train.ckpt"
    assert saved.exists()
    assert signal.getsignal(signal.SIGTERM) is prev  # the previous handler is back
    # a new run with the same callback starts from the saved weights
    model2, net2, _ = _model(seed=3)
    loaded = {}

    class Peek(Callback):
        def on_train_epoch_begin(self, rc):
            loaded.setdefault("w", {k: v.clone() for k, v in net2.state_dict().items()})

    model2.train(1, make_batches(1), callbacks=[OnRequestExit(directory=str(tmp_path)), Peek()])
    assert all(torch.equal(loaded["w"][k], v) for k, v in net.state_dict().items())
