"""The Lightning-Hydra template's debug configs, tags, loggers and callbacks on ``lit-amp``
(its keys: tests/cli/test_aliases.py)."""

from __future__ import annotations

import csv
import json

import pytest
import yaml

from lit_amp.cli import main
from lit_amp.cli.build import build
from tests.cli._helpers import FAST, FAST_DATA, compose_cfg

DATA = [*FAST_DATA, *FAST]


def test_template_optimizer_key_tags_and_hparams_reach_the_logger(tmp_path):
    main(["model.optimizer.lr=0.003", "tags=[baseline,amp]", "epochs=1", "valid_frequency=1",
          *DATA, f"hydra.run.dir={tmp_path}"])
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["tags"] == ["baseline", "amp"]
    hparams = yaml.safe_load(next(tmp_path.glob("logs/version_*/hparams.yaml")).read_text())
    assert hparams["optimizer"]["lr"] == 0.003
    assert hparams["tags"] == ["baseline", "amp"] and hparams["amp"]["level"] == "O0"


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
