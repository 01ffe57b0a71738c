"""Every option of every config group composes and instantiates (conf/)."""

from __future__ import annotations

import importlib.util
import re

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf

from lit_amp.cli import CONF_DIR
from lit_amp.cli.build import build
from lit_amp.cli.schema import ConfigError
from tests.cli._helpers import compose_cfg, options

ONLINE = ("mode=online", "model=wide_deep", "data=clicks_stream", "data.num_records=64",
          "data.batch_size=32", "callbacks=none")
_HAS_TB = importlib.util.find_spec("tensorboard") or importlib.util.find_spec("tensorboardX")


def _has(module: str) -> bool:
    try:  # find_spec of "a.b" raises when the package "a" itself is missing
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


_HAS_OPTUNA = _has("hydra_plugins.hydra_optuna_sweeper")
_HAS_SUBMITIT = _has("hydra_plugins.hydra_submitit_launcher")

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
    if group == "logger" and option in ("wandb", "mlflow") and not _has(option):
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


def test_schema_rejects_bad_values(tmp_path):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="amp.level"):
        compose_cfg(["amp.level=O7"], tmp_path)
    with pytest.raises(ConfigCompositionException):
        compose_cfg(["epochs=abc"], tmp_path)
    with pytest.raises(ConfigCompositionException, match="Could not find 'amp/O9'"):
        compose_cfg(["amp=O9"], tmp_path)


@pytest.mark.skipif(not _HAS_OPTUNA, reason="needs lit_amp[optuna] (hydra-optuna-sweeper)")
def test_optuna_search_composes(tmp_path):
    cfg = compose_cfg(["hparams_search=optuna"], tmp_path)
    assert cfg.hydra.sweeper.direction == "maximize"
    assert "optimizer.lr" in cfg.hydra.sweeper.params
    assert str(cfg.hydra.mode) in ("RunMode.MULTIRUN", "MULTIRUN")


@pytest.mark.skipif(not _HAS_SUBMITIT, reason="needs lit_amp[slurm] (hydra-submitit-launcher)")
def test_slurm_launcher_composes(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    cfg = compose_cfg(["hydra/launcher=slurm", "trainer=ddp", "trainer.devices=4",
                       "trainer.num_nodes=2"], tmp_path)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.tasks_per_node == 4 and launcher.gpus_per_node == 4 and launcher.nodes == 2
    assert launcher.max_num_timeout >= 1
    assert str(launcher.submitit_folder).startswith(str(cfg.hydra.sweep.dir))
    # a requeued (same SLURM job id) run finds the same run directory
    assert OmegaConf.select(cfg, "hydra.run.dir").endswith("/4242")


def test_run_dir_is_timestamped_outside_slurm(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    cfg = compose_cfg([], tmp_path)
    last = OmegaConf.select(cfg, "hydra.run.dir").rsplit("/", 1)[-1]
    assert last[:2] == "20" and "_" in last


def _fake_submitit_slurm() -> None:
    """Stand-in for hydra-submitit-launcher's ``hydra/launcher/submitit_slurm`` schema."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(group="hydra/launcher", name="submitit_slurm", node={
        "_target_": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
        "timeout_min": 60, "nodes": 1, "tasks_per_node": 1, "gpus_per_node": None,
        "cpus_per_task": None, "mem_gb": None, "partition": None, "max_num_timeout": 0,
        "signal_delay_s": 120, "submitit_folder": "x", "additional_parameters": {},
        "setup": None,
    })


@pytest.mark.parametrize(("devices", "expected"), [("4", 4), ("[0,1]", 2), (None, None)])
def test_slurm_launcher_composes_with_the_ddp_trainer(devices, expected, tmp_path):
    """`-m hydra/launcher=slurm trainer=ddp`: integer GPUs/tasks per node, or a clear error."""
    if not _HAS_SUBMITIT:
        _fake_submitit_slurm()
    ov = ["hydra/launcher=slurm", "trainer=ddp", "trainer.num_nodes=2"]
    cfg = compose_cfg([*ov, f"trainer.devices={devices}"] if devices else ov, tmp_path)
    launcher = cfg.hydra.launcher
    if expected is None:  # trainer=ddp's `devices: auto` means nothing to SLURM
        with pytest.raises(Exception, match="trainer.devices=<GPUs per node>.*'auto'"):
            _ = launcher.gpus_per_node
        return
    assert launcher.tasks_per_node == expected and launcher.gpus_per_node == expected
    assert isinstance(launcher.gpus_per_node, int) and launcher.nodes == 2


_RANK = """
import os, sys, time
sys.path.insert(0, {root!r})
time.sleep(float(sys.argv[1]))
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from lit_amp.cli import CONF_DIR
with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
    cfg = compose("config", return_hydra_config=True)
print(OmegaConf.select(cfg, "hydra.run.dir"))
"""

_AGENT = """
import os, subprocess, sys
env = {{**os.environ, "TORCHELASTIC_RUN_ID": "none"}}
env.pop("SLURM_JOB_ID", None)
env.pop("LIT_AMP_RUN_ID", None)
ranks = [subprocess.Popen([sys.executable, "-c", {rank!r}, str(1.2 * r)], env={{**env,
         "LOCAL_RANK": str(r), "RANK": str(r)}}, stdout=subprocess.PIPE, text=True)
         for r in (0, 1)]
print("|".join(p.communicate()[0].strip() for p in ranks))
"""


def test_ranks_started_by_torchrun_share_one_run_directory(tmp_path):
    """Two ranks of one torchrun agent, started over a second apart, name the same run dir."""
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    agent = _AGENT.format(rank=_RANK.format(root=root))
    out = subprocess.run([sys.executable, "-c", agent], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    dirs = out.stdout.strip().split("|")
    assert len(dirs) == 2 and dirs[0] == dirs[1] and dirs[0].endswith(tuple("0123456789")), out
