"""Every option of every config group composes and is built (conf/, ``lit_amp.cli.build``)."""

from __future__ import annotations

import importlib.util
import re

import lightning as L
import pytest
import torch

from lit_amp.cli import CONF_DIR
from lit_amp.cli.build import build
from lit_amp.cli.schema import ConfigError
from tests.cli._helpers import compose_cfg, has_module, options

ONLINE = ("mode=online", "model=wide_deep", "data=clicks_stream", "data.num_records=64",
          "data.batch_size=32", "callbacks=none")
_HAS_TB = importlib.util.find_spec("tensorboard") or importlib.util.find_spec("tensorboardX")
_HAS_OPTUNA = has_module("hydra_plugins.hydra_optuna_sweeper")

# (group, option) -> extra overrides needed to build it
_CONTEXT = {
    ("model", "wide_deep"): ONLINE,
    ("data", "clicks_stream"): ONLINE,
    ("data", "clicks_dir"): ONLINE[:2] + ("data=clicks_dir", "callbacks=none"),
    ("data", "clicks_socket"): ONLINE[:2] + ("data=clicks_socket", "callbacks=none"),
    ("data", "clicks_kafka"): ONLINE[:2] + ("data=clicks_kafka", "callbacks=none"),
}
_GROUPS = ("amp", "loss_scale", "boost", "optimizer", "trainer", "model", "data", "callbacks",
           "logger", "online", "paths", "debug")
CASES = [(g, o) for g in _GROUPS for o in options(g)]


def _missing_extra(group: str, option: str) -> str | None:
    """The lit_amp extra a logger option needs when its package is missing."""
    if group == "logger" and option in ("tensorboard", "many") and not _HAS_TB:
        return "tensorboard"
    if group == "logger" and option in ("wandb", "mlflow") and not has_module(option):
        return option
    return None


def test_every_group_has_options():
    for g in _GROUPS:
        assert options(g), g
    assert (CONF_DIR / "config.yaml").read_text().startswith("# lit-amp")


@pytest.mark.parametrize(("group", "option"), CASES, ids=[f"{g}={o}" for g, o in CASES])
def test_option_composes_and_instantiates(group, option, tmp_path):
    extra = _CONTEXT.get((group, option), ())
    ov = [*extra, f"{group}={option}"] if f"{group}={option}" not in extra else list(extra)
    if (group, option) == ("data", "clicks_dir"):
        ov.append(f"data.directory={tmp_path / 'stream'}")
    cfg = compose_cfg(ov, tmp_path)
    missing = _missing_extra(group, option)
    if missing:  # the error names the extra that installs the logger's package
        with pytest.raises(ConfigError, match=re.escape(f"pip install 'lit_amp[{missing}]'")):
            build(cfg)
        return
    b = build(cfg)  # instantiates data, network, loss, metrics, optimizer, callbacks, loggers
    assert isinstance(b.network, torch.nn.Module)
    assert b.model is not None and b.model.lit_model is not None
    if group == "amp":
        assert b.model.lit_model.amp_level == option
    if group == "loss_scale":
        if option in ("fixed", "dynamic"):
            name = type(b.model_kwargs["loss_scale_manager"]).__name__
            assert name.lower().startswith(option)
        elif option == "none":
            assert b.model_kwargs["loss_scale_manager"] is None
        else:
            assert "loss_scale_manager" not in b.model_kwargs
    if group == "boost":
        assert b.model.lit_model.boost_level == option
    if group == "optimizer":
        assert isinstance(b.optimizer, torch.optim.Optimizer)
        if option.startswith("thor"):
            assert type(b.model).__name__ == "ThorModel"
    if group == "trainer":
        kw = dict(b.trainer_kwargs)
        assert "_target_" not in kw
        accel = str(kw.get("accelerator"))
        if accel in ("gpu", "cuda") and torch.cuda.device_count() < 1:
            return  # composes and builds; a Trainer needs a GPU
        L.Trainer(max_epochs=1, **kw)
    if group == "callbacks":
        assert len(b.callbacks) == len([v for v in cfg.callbacks.values() if v]) + 1


@pytest.mark.parametrize("name", options("experiment"))
def test_experiment_builds(name, tmp_path):
    cfg = compose_cfg([f"experiment={name}", "debug=fdr"], tmp_path, fast=False)
    b = build(cfg)
    assert b.model is not None
    text = (CONF_DIR / "experiment" / f"{name}.yaml").read_text()
    assert text.startswith("# @package _global_") and "Launch:" in text


def test_every_config_file_is_commented_with_a_launch_line():
    for path in CONF_DIR.rglob("*.yaml"):
        text = path.read_text()
        assert text.lstrip().startswith("#"), path
        if path.parent.name != "hydra" or path.name != "default.yaml":
            assert "lit-amp" in text, f"{path}: no launch command"


@pytest.mark.skipif(not _HAS_OPTUNA, reason="needs lit_amp[optuna] (hydra-optuna-sweeper)")
def test_optuna_search_composes(tmp_path):
    cfg = compose_cfg(["hparams_search=optuna"], tmp_path)
    assert cfg.hydra.sweeper.direction == "maximize"
    assert "optimizer.lr" in cfg.hydra.sweeper.params
    assert str(cfg.hydra.mode) in ("RunMode.MULTIRUN", "MULTIRUN")
