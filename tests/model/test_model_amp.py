"""Model/LitModel with amp_level and loss scaling: dtypes used, steps skipped, state kept."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_amp import DynamicLossScaleManager, FixedLossScaleManager, Model, load_checkpoint
from lit_amp.callbacks import BackupAndRestore, Callback, CheckpointConfig, ModelCheckpoint
from tests.helpers.data import make_batches


def _net():
    return nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))


class Outputs(Callback):
    def __init__(self):
        self.outs = []

    def on_train_step_end(self, rc):
        self.outs.append(rc.original_args().net_outputs)


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
def test_levels_compute_low_keep_fp32_params_and_loss(level):
    torch.manual_seed(0)
    net = _net()
    seen = {}

    def rec(name):
        def hook(mod, inp, out):
            seen.setdefault(name, out.dtype)

        return hook

    net[0].register_forward_hook(rec("linear"))
    net[1].register_forward_pre_hook(lambda m, a: seen.setdefault("bn_in", a[0].dtype) and None)
    out_cb = Outputs()
    model = Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
                  metrics={"acc"}, amp_level=level)
    model.train(2, make_batches(4), callbacks=[out_cb])
    assert model.lit_model.amp_config.dtype == torch.bfloat16  # CPU default
    assert seen["linear"] == torch.bfloat16  # white-listed Linear computes low at every level
    assert all(p.dtype == torch.float32 for p in net.parameters())  # storage stays fp32
    loss = out_cb.outs[-1]
    assert torch.is_tensor(loss) and loss.dtype == torch.float32  # bf16: no scaling by default
    assert model.predict(torch.randn(3, 4)).dtype == torch.float32  # output cast back
    assert model.eval(make_batches(4, seed=2))["acc"] > 0.7


def test_dynamic_loss_scaling_trajectory_and_outputs():
    net = _net()
    out_cb = Outputs()
    model = Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
                  amp_level="O2",
                  loss_scale_manager=DynamicLossScaleManager(init_loss_scale=2.0**10,
                                                             scale_window=3))
    model.train(2, make_batches(4), callbacks=[out_cb])
    scales = [float(o[2]) for o in out_cb.outs]
    overflows = [bool(o[1]) for o in out_cb.outs]
    assert overflows == [False] * 8
    # the scale used at each step: grows x2 after every 3 good steps (docs/semantics.md §2.6)
    assert scales == [1024.0] * 3 + [2048.0] * 3 + [4096.0] * 2
    assert all(o[0].dtype == torch.float32 for o in out_cb.outs)  # the loss is unscaled fp32


def test_overflow_skips_the_whole_step_and_shrinks_the_scale():
    torch.manual_seed(0)
    net = _net()
    poison = {"step": None, "i": 0}

    def inject(grad):
        poison["i"] += 1
        return grad * float("inf") if poison["i"] == 3 else grad

    net[3].weight.register_hook(inject)
    snapshots = []

    class Snap(Callback):
        def on_train_step_begin(self, rc):
            snapshots.append({k: v.clone() for k, v in net.state_dict().items()})

    out_cb = Outputs()
    model = Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1,
                                                              momentum=0.9),
                  amp_level="O2",
                  loss_scale_manager=DynamicLossScaleManager(init_loss_scale=2.0**8))
    model.train(1, make_batches(5), callbacks=[Snap(), out_cb])
    overflow = [bool(o[1]) for o in out_cb.outs]
    assert overflow == [False, False, True, False, False]
    scales = [float(o[2]) for o in out_cb.outs]
    assert scales == [256.0, 256.0, 256.0, 128.0, 128.0]
    # the overflowing step changed no parameter
    after_skip = snapshots[3]
    for k, v in snapshots[2].items():
        if k.endswith("num_batches_tracked") or "running" in k:
            continue  # BatchNorm statistics come from the forward pass, as in MindSpore
        assert torch.equal(v, after_skip[k]), k
    assert all(torch.isfinite(p).all() for p in net.parameters())
    assert model.lit_model.loss_scale.skipped_steps == 1


def test_fixed_no_drop_scales_and_never_skips():
    net = _net()
    out_cb = Outputs()
    model = Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
                  amp_level="O2",
                  loss_scale_manager=FixedLossScaleManager(128.0, drop_overflow_update=False))
    model.train(1, make_batches(3), callbacks=[out_cb])
    assert [float(o[2]) for o in out_cb.outs] == [128.0] * 3


def test_sink_mode_reports_last_step_outputs_with_scaling():
    net = _net()
    out_cb = Outputs()
    model = Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
                  amp_level="O2",
                  loss_scale_manager=DynamicLossScaleManager(init_loss_scale=4.0, scale_window=2))
    model.train(2, make_batches(3), callbacks=[out_cb], dataset_sink_mode=True, sink_size=3)
    # one report per sink: the scale used by its last step (steps 3 and 6; x2 every 2 steps)
    assert [float(o[2]) for o in out_cb.outs] == [8.0, 16.0]


def test_loss_scale_state_travels_with_checkpoints_and_backups(tmp_path):
    def build():
        torch.manual_seed(0)
        net = _net()
        return Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
                     amp_level="O2",
                     loss_scale_manager=DynamicLossScaleManager(init_loss_scale=4.0,
                                                                scale_window=2)), net

    model, _ = build()
    ckpt = ModelCheckpoint("ls", str(tmp_path / "ck"), CheckpointConfig(save_checkpoint_steps=4))
    model.train(2, make_batches(4), callbacks=[ckpt, BackupAndRestore(str(tmp_path / "bk"),
                                                                      delete_checkpoint=False)])
    state = load_checkpoint(ckpt.latest_ckpt_file_name)
    live = model.lit_model.loss_scale
    assert state["loss_scale"] == live.state_dict()
    assert live.scale == 4.0 * 2**4  # 8 good steps, window 2
    # resuming from the backup continues the trajectory instead of restarting at 4.0
    model2, _ = build()
    out_cb = Outputs()
    model2.train(3, make_batches(4), callbacks=[BackupAndRestore(str(tmp_path / "bk")), out_cb])
    assert [float(o[2]) for o in out_cb.outs] == [64.0, 64.0, 128.0, 128.0]


def test_loss_scale_and_skipped_steps_reach_the_logger(tmp_path):
    import lightning as L

    from lit_amp import LitModel

    net = _net()
    poison = {"i": 0}

    def inject(grad):
        poison["i"] += 1
        return grad * float("inf") if poison["i"] == 2 else grad

    net[3].weight.register_hook(inject)
    lit = LitModel(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
                   amp_level="O2", loss_scale_manager=DynamicLossScaleManager(init_loss_scale=64.0))
    logger = L.pytorch.loggers.CSVLogger(str(tmp_path))
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", logger=logger, log_every_n_steps=1,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    xs, ys = zip(*make_batches(4))
    trainer.fit(lit, torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.cat(xs), torch.cat(ys)), batch_size=16))
    assert float(trainer.callback_metrics["train/skipped_steps"]) == 1.0
    assert float(trainer.callback_metrics["train/loss_scale"]) == 32.0
    text = (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").read_text()
    assert "loss_scale" in text.splitlines()[0] and "skipped_steps" in text.splitlines()[0]
