"""Shared pieces of the CLI tests: composing ``conf/``, a weight-digest callback and stand-in
commands (SLURM's, for the launcher tests)."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from lit_amp.cli import CONF_DIR, CONFIG_NAME

# small, fast defaults for every composed test config
FAST_DATA = ("data=synthetic", "data.num_train=200", "data.num_valid=100")
FAST = ("callbacks=minimal", "trainer.enable_progress_bar=false")


def compose_cfg(overrides: Sequence[str], out: Path, *, fast: bool = True) -> DictConfig:
    """Compose ``conf/config.yaml`` with ``overrides`` as ``lit-amp`` would, outputs in ``out``."""
    fast_ov: list[str] = []
    if fast:
        if not any(o.startswith(("data=", "experiment=")) for o in overrides):
            fast_ov += FAST_DATA
        fast_ov += FAST
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            CONFIG_NAME, overrides=[*fast_ov, *overrides], return_hydra_config=True
        )
    with open_dict(cfg):
        cfg.paths.output_dir = str(out)
        cfg.paths.root_dir = str(out)
        cfg.hydra.runtime.output_dir = str(out)
        cfg.hydra.runtime.cwd = os.getcwd()
        cfg.hydra.job.num = 0
        cfg.hydra.job.id = "test"
    HydraConfig.instance().set_config(cfg)
    return cfg


def has_module(module: str) -> bool:
    """Whether ``module`` is importable (``find_spec("a.b")`` raises when ``a`` is missing)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def options(group: str) -> list[str]:
    """The option names of a config group (its YAML files)."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


class WeightDigest(L.Callback):
    """Writes each rank's parameters at the end of training to ``<out>/weights_rank<r>.json``."""

    def __init__(self, out: str) -> None:
        self.out = out

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        flat = torch.cat([p.detach().float().flatten().cpu() for p in pl_module.parameters()])
        with open(os.path.join(self.out, f"weights_rank{trainer.global_rank}.json"), "w") as f:
            json.dump({"rank": trainer.global_rank, "world": trainer.world_size,
                       "weights": flat.tolist()}, f)


def fake_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, output: str) -> None:
    """A ``name`` command on the PATH that prints ``output``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / name
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
