"""``ckpt_path=``: strict loading of lit_amp and Lightning checkpoints, and resumed training."""

from __future__ import annotations

import json

import lightning as L
import pytest
import torch
from torch import nn

from lit_amp import LitModel
from lit_amp.cli import main
from lit_amp.cli.schema import ConfigError
from lit_amp.demos import CNN1D, synthetic_loaders

DATA = ["data=synthetic", "data.num_train=200", "data.num_valid=100",
        "trainer.enable_progress_bar=false", "callbacks=minimal", "logger=none"]


def _lightning_ckpt(tmp_path, epochs=3):
    """A LitModel trained by Lightning's Trainer, saved by Lightning; returns (path, its acc)."""
    train, valid = synthetic_loaders(num_train=200, num_valid=100, batch_size=100, seed=0)
    torch.manual_seed(0)
    net = CNN1D()
    lit = LitModel(net, nn.CrossEntropyLoss(), torch.optim.Adam(net.parameters(), 1e-2),
                   metrics={"acc"})
    trainer = L.Trainer(max_epochs=epochs, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=str(tmp_path))
    trainer.fit(lit, train, valid)
    path = tmp_path / "lightning.ckpt"
    trainer.save_checkpoint(path)
    acc = trainer.validate(lit, valid, verbose=False)[0]["val/acc"]
    return path, acc


def test_eval_of_a_lightning_checkpoint_of_a_litmodel(tmp_path):
    path, acc = _lightning_ckpt(tmp_path)
    assert acc > 0.2  # trained: well above the 0.1 of random weights
    value = main(["mode=eval", f"ckpt_path={path}", *DATA, f"hydra.run.dir={tmp_path / 'e'}"])
    assert value == pytest.approx(acc, abs=1e-6)


def test_eval_of_a_checkpoint_of_another_network_is_an_error(tmp_path, capsys):
    path, _ = _lightning_ckpt(tmp_path, epochs=1)
    with pytest.raises(SystemExit):
        main(["mode=eval", f"ckpt_path={path}", *DATA, "model=mlp",
              f"hydra.run.dir={tmp_path / 'e'}"])
    err = capsys.readouterr().err
    assert str(path) in err and ("missing keys" in err or "no parameter" in err)


def test_checkpoint_that_matches_no_key_is_an_error(tmp_path):
    from lit_amp.cli.checkpoint import load_network

    path = tmp_path / "other.ckpt"
    torch.save({"state_dict": {"foo.bar": torch.zeros(2)}}, path)
    with pytest.raises(ConfigError, match="holds no parameter"):
        load_network(str(path), CNN1D())


def test_train_resumes_from_a_lit_amp_checkpoint(tmp_path):
    first = tmp_path / "first"
    main(["epochs=2", "valid_frequency=1", *DATA, f"hydra.run.dir={first}"])
    ckpt = json.loads((first / "result.json").read_text())["latest_ckpt"]
    saved = torch.load(ckpt, weights_only=True)
    assert saved["append_info"]["epoch_num"] == 2
    second = tmp_path / "second"
    main(["epochs=3", "valid_frequency=1", f"ckpt_path={ckpt}", *DATA,
          f"hydra.run.dir={second}"])
    result = json.loads((second / "result.json").read_text())
    assert result["initial_epoch"] == 2
    new = torch.load(result["latest_ckpt"], weights_only=True)
    # one more epoch (2 steps) was trained, continuing the epoch count and Adam's step count
    assert new["append_info"]["epoch_num"] == 3
    assert new["lit_amp_format"] == "lit_amp/2"  # one format: Lightning's dict
    adam_steps = [float(s["step"]) for s in new["optimizer_states"][0]["state"].values()]
    assert adam_steps and all(s == 2 * 2 + 2 for s in adam_steps)


def test_train_resumes_from_a_lightning_checkpoint(tmp_path):
    path, _ = _lightning_ckpt(tmp_path, epochs=2)
    out = tmp_path / "r"
    main(["epochs=3", "valid_frequency=1", f"ckpt_path={path}", *DATA, f"hydra.run.dir={out}"])
    result = json.loads((out / "result.json").read_text())
    assert result["initial_epoch"] == 2
    new = torch.load(result["latest_ckpt"], weights_only=True)
    assert all(float(s["step"]) == 6 for s in new["optimizer_states"][0]["state"].values())


def test_train_from_a_weights_only_file_is_refused(tmp_path, capsys):
    path = tmp_path / "w.ckpt"
    torch.manual_seed(0)
    torch.save({"network": CNN1D().state_dict()}, path)
    with pytest.raises(SystemExit):
        main(["epochs=2", f"ckpt_path={path}", *DATA, f"hydra.run.dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err
    assert "not a resumable checkpoint" in err and str(path) in err


def test_resume_past_the_final_epoch_is_refused(tmp_path, capsys):
    path, _ = _lightning_ckpt(tmp_path, epochs=2)
    with pytest.raises(SystemExit):
        main(["epochs=2", f"ckpt_path={path}", *DATA, f"hydra.run.dir={tmp_path / 'r'}"])
    assert "nothing to resume" in capsys.readouterr().err


def test_resume_with_an_existing_backup_is_refused(tmp_path, capsys):
    path, _ = _lightning_ckpt(tmp_path, epochs=1)
    run = tmp_path / "r"
    (run / "backup").mkdir(parents=True)
    torch.save({"network": {}}, run / "backup" / "backup.ckpt")
    with pytest.raises(SystemExit):
        main(["epochs=3", f"ckpt_path={path}", "callbacks=fault_tolerant", *DATA[:4],
              "logger=none", f"hydra.run.dir={run}"])
    assert "BackupAndRestore backup" in capsys.readouterr().err


@pytest.mark.slow
def test_resume_under_two_process_ddp(tmp_path):
    """trainer=ddp_sim (2 CPU processes): train 2 epochs, resume to 3 from the checkpoint."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items()
           if k not in ("LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR", "WORLD_SIZE", "NODE_RANK")}
    env.update(PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    base = [sys.executable, "-m", "lit_amp", "trainer=ddp_sim", "valid_frequency=1", *DATA[:3],
            "data.batch_size=50", "callbacks=minimal", "logger=none"]

    def lit_amp(*args):
        proc = subprocess.run([*base, *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]

    lit_amp("epochs=2", "hydra.run.dir=first")
    ckpt = json.loads((tmp_path / "first" / "result.json").read_text())["latest_ckpt"]
    lit_amp("epochs=3", f"ckpt_path={ckpt}", "hydra.run.dir=second")
    result = json.loads((tmp_path / "second" / "result.json").read_text())
    assert result["status"] == "ok" and result["initial_epoch"] == 2
    new = torch.load(result["latest_ckpt"], weights_only=True)
    assert new["append_info"]["epoch_num"] == 3
    # 200 samples, batch 50, 2 ranks: 2 steps per rank and epoch; Adam continued from 4 to 6
    assert all(float(s["step"]) == 6 for s in new["optimizer_states"][0]["state"].values())


def _model_train_ckpt(tmp_path, epochs=2):
    """``Model.train`` with lit_amp's ModelCheckpoint (no append_info) at each epoch end."""
    from lit_amp import Model
    from lit_amp.callbacks import CheckpointConfig, ModelCheckpoint

    train, valid = synthetic_loaders(num_train=200, num_valid=100, batch_size=100, seed=0)
    torch.manual_seed(0)
    net = CNN1D()
    model = Model(net, nn.CrossEntropyLoss(), torch.optim.Adam(net.parameters(), 1e-2),
                  metrics={"acc"})
    ckpt = ModelCheckpoint("m", str(tmp_path / "ck"), CheckpointConfig(save_checkpoint_steps=2))
    model.train(epochs, train, callbacks=[ckpt])
    return ckpt.latest_ckpt_file_name, model.eval(valid)["acc"]


def test_eval_and_resume_of_a_model_checkpoint_file(tmp_path):
    """One format: a lit_amp ModelCheckpoint file evaluates and resumes like Lightning's."""
    path, acc = _model_train_ckpt(tmp_path)
    value = main(["mode=eval", f"ckpt_path={path}", *DATA, f"hydra.run.dir={tmp_path / 'e'}"])
    assert value == pytest.approx(acc, abs=1e-6)
    out = tmp_path / "r"
    main(["epochs=3", "valid_frequency=1", f"ckpt_path={path}", *DATA, f"hydra.run.dir={out}"])
    result = json.loads((out / "result.json").read_text())
    assert result["initial_epoch"] == 2  # the epoch's last batch was done: 2 epochs finished
    new = torch.load(result["latest_ckpt"], weights_only=True)
    assert all(float(s["step"]) == 6 for s in new["optimizer_states"][0]["state"].values())


def test_resume_from_a_mid_epoch_lightning_checkpoint_is_refused(tmp_path, capsys):
    from lightning.pytorch.callbacks import ModelCheckpoint as LightningModelCheckpoint

    train, _ = synthetic_loaders(num_train=200, num_valid=100, batch_size=100, seed=0)
    net = CNN1D()
    lit = LitModel(net, nn.CrossEntropyLoss(), torch.optim.Adam(net.parameters(), 1e-2))
    saver = LightningModelCheckpoint(dirpath=str(tmp_path / "ck"), every_n_train_steps=1,
                                     save_top_k=-1)
    L.Trainer(max_steps=3, logger=False, enable_progress_bar=False, enable_model_summary=False,
              callbacks=[saver]).fit(lit, train)
    mid = tmp_path / "mid.ckpt"  # (hydra's overrides take no '=' in a value)
    mid.write_bytes((tmp_path / "ck" / "epoch=1-step=3.ckpt").read_bytes())  # epoch 2, batch 1
    with pytest.raises(SystemExit):
        main(["epochs=3", f"ckpt_path={mid}", *DATA, f"hydra.run.dir={tmp_path / 'r'}"])
    assert "middle of an epoch" in capsys.readouterr().err


def test_a_run_resumed_from_its_backup_counts_the_restored_epochs(tmp_path, capsys):
    """callbacks=fault_tolerant: a second run in the same directory continues after the backup's
    epoch; its epoch lines and result.json count from there, not from 0."""
    run = tmp_path / "r"
    args = ["callbacks=fault_tolerant", "callbacks.backup_and_restore.delete_checkpoint=false",
            *DATA[:4], "logger=none", f"hydra.run.dir={run}"]
    main(["epochs=1", *args])
    capsys.readouterr()
    main(["epochs=2", *args])
    out = capsys.readouterr().out
    assert "epoch 2/2" in out and "epoch 1/2" not in out
    assert json.loads((run / "result.json").read_text())["initial_epoch"] == 1
