"""The Lightning-Hydra template's keys, debug configs, tags, loggers and missing plugins."""

from __future__ import annotations

import csv
import importlib.util
import json

import pytest
import torch
import yaml

from lit_amp.cli import main
from lit_amp.cli.build import build
from tests.cli._helpers import compose_cfg

DATA = ["data=synthetic", "data.num_train=200", "data.num_valid=100",
        "trainer.enable_progress_bar=false", "callbacks=minimal"]


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _epochs_trained(run) -> int:
    ckpt = json.loads((run / "result.json").read_text())["latest_ckpt"]
    return int(torch.load(ckpt, weights_only=True)["append_info"]["epoch_num"])


@pytest.mark.parametrize("key", ["trainer.max_epochs", "+trainer.max_epochs"])
def test_template_max_epochs_is_an_alias_of_epochs(key, tmp_path, capsys):
    main([f"{key}=2", "valid_frequency=1", "logger=none", *DATA, f"hydra.run.dir={tmp_path}"])
    assert _epochs_trained(tmp_path) == 2
    assert "trainer.max_epochs is lit-amp's epochs" in capsys.readouterr().err


def test_template_optimizer_key_tags_and_hparams_reach_the_logger(tmp_path):
    main(["model.optimizer.lr=0.003", "tags=[baseline,amp]", "epochs=1", "valid_frequency=1",
          *DATA, f"hydra.run.dir={tmp_path}"])
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["tags"] == ["baseline", "amp"]
    hparams = yaml.safe_load(next(tmp_path.glob("logs/version_*/hparams.yaml")).read_text())
    assert hparams["optimizer"]["lr"] == 0.003
    assert hparams["tags"] == ["baseline", "amp"] and hparams["amp"]["level"] == "O0"


@pytest.mark.parametrize(("override", "names"), [
    ("trainer.precision=bf16-mixed", "amp=O0"),
    ("trainer.max_steps=5", "trainer.limit_train_batches"),
])
def test_template_keys_without_an_equivalent_name_the_key_to_use(override, names, tmp_path,
                                                                  capsys):
    with pytest.raises(SystemExit) as info:
        main([override, *DATA, f"hydra.run.dir={tmp_path}"])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert override.split("=")[0] in err and names in err


def test_lightning_model_checkpoint_from_the_command_line(tmp_path):
    main(["+callbacks.best._target_=lightning.pytorch.callbacks.ModelCheckpoint",
          f"+callbacks.best.dirpath={tmp_path / 'best'}", "+callbacks.best.monitor=val/eval_loss",
          "epochs=2", "valid_frequency=1", "logger=none", *DATA, f"hydra.run.dir={tmp_path}"])
    assert list((tmp_path / "best").glob("*.ckpt"))


@pytest.mark.parametrize(("option", "key", "value"), [
    ("default", "detect_anomaly", True),
    ("overfit", "overfit_batches", 3),
])
def test_template_debug_options(option, key, value, tmp_path):
    cfg = compose_cfg([f"debug={option}"], tmp_path)
    assert build(cfg).trainer_kwargs[key] == value


def test_debug_overfit_drives_the_training_loss_down(tmp_path):
    main(["debug=overfit", "epochs=8", "trainer.log_every_n_steps=1", *DATA,
          f"hydra.run.dir={tmp_path}"])
    rows = list(csv.DictReader(next(tmp_path.glob("logs/version_*/metrics.csv")).open()))
    losses = [float(r["train/loss"]) for r in rows
              if r.get("train/loss") and not r.get("val/eval_loss")]
    assert len(losses) >= 8 and losses[-1] < 0.5 * losses[0]


def test_debug_profiler_writes_its_report(tmp_path):
    main(["debug=profiler", "valid_frequency=null", "logger=none", *DATA,
          f"hydra.run.dir={tmp_path}"])
    report = list(tmp_path.glob("*profile*.txt"))
    assert report and "run_training_epoch" in report[0].read_text()


@pytest.mark.parametrize(("option", "extra", "module"), [
    ("hparams_search=optuna", "optuna", "hydra_plugins.hydra_optuna_sweeper"),
    ("hydra/launcher=slurm", "slurm", "hydra_plugins.hydra_submitit_launcher"),
    ("logger=tensorboard", "tensorboard", "tensorboard"),
    ("logger=wandb", "wandb", "wandb"),
])
def test_missing_plugin_names_the_extra(option, extra, module, tmp_path, capsys):
    if _has(module) or (module == "tensorboard" and _has("tensorboardX")):
        pytest.skip(f"{module} is installed")
    args = ["-m", option] if "launcher" in option else [option]
    with pytest.raises(SystemExit) as info:
        main([*args, *DATA, f"hydra.run.dir={tmp_path}"])
    assert info.value.code == 1
    assert f"pip install 'lit_amp[{extra}]'" in capsys.readouterr().err
