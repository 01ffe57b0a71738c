"""The typed schema and its resolvers (``lit_amp.cli.schema``): bad values fail at composition,
SLURM's devices and GPUs per node, one run directory per run (a SLURM job, a torchrun agent's
ranks, a timestamp otherwise)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from tests.cli._helpers import compose_cfg, has_module

_HAS_SUBMITIT = has_module("hydra_plugins.hydra_submitit_launcher")


def test_schema_rejects_bad_values(tmp_path):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="amp.level"):
        compose_cfg(["amp.level=O7"], tmp_path)
    with pytest.raises(ConfigCompositionException):
        compose_cfg(["epochs=abc"], tmp_path)
    with pytest.raises(ConfigCompositionException, match="Could not find 'amp/O9'"):
        compose_cfg(["amp=O9"], tmp_path)


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
    """Stand-in for ``hydra/launcher/lit_amp_submitit_slurm`` (hydra_plugins/lit_amp_slurm),
    which registers only where hydra-submitit-launcher is installed (the GPU machine lacks it)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(group="hydra/launcher", name="lit_amp_submitit_slurm", node={
        "_target_": "hydra_plugins.lit_amp_slurm.launcher.LitAmpSlurmLauncher",
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
