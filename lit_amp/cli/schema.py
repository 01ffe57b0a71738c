"""The typed schema of ``lit-amp``'s config tree (``conf/``, at :data:`CONF_DIR`), registered in
Hydra's ConfigStore.

``conf/config.yaml`` lists ``lit_amp_schema`` first in its defaults, so a value of the wrong
type (``epochs=abc``, ``amp.level=O7``) fails at composition with Hydra's one-line message.
Also here: :class:`ConfigError` (a rejected value, reported without a traceback), the
resolvers the launcher's config uses and :func:`check_request` (their error raised as itself at
composition), and the two node helpers the build and run steps share. Imports no torch and no
Lightning.

Example:
    >>> LitAmpSchema().mode, LitAmpSchema().amp.level
    (<Mode.train: 'train'>, <AmpLevel.O0: 'O0'>)
"""

from __future__ import annotations

import dataclasses
import os
import time
from enum import Enum
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from hydra.errors import CompactHydraException
from omegaconf import DictConfig, ListConfig, OmegaConf

from lit_amp.amp.names import AMP_LEVELS, BOOST_LEVELS

__all__ = [
    "Mode",
    "AmpLevel",
    "BoostLevel",
    "AmpSchema",
    "BoostSchema",
    "LitAmpSchema",
    "ConfigError",
    "CONF_DIR",
    "CONFIG_NAME",
    "CONFIG_PATH",
    "SCHEMA_NAME",
    "run_id",
    "check_request",
    "slurm_devices",
    "slurm_gpus",
]

#: The name ``conf/config.yaml``'s defaults list gives the schema.
SCHEMA_NAME = "lit_amp_schema"
#: The primary config of ``conf/``.
CONFIG_NAME = "config"
#: The config tree ``lit-amp`` composes from (package data of ``lit_amp.cli``).
CONF_DIR: Path = Path(__file__).resolve().parent / "conf"
#: Hydra's search path of that tree (found from an installed wheel, too).
CONFIG_PATH = "pkg://lit_amp.cli.conf"


class Mode(Enum):
    """What ``lit-amp`` does: ``train`` (fit + eval), ``eval`` (a checkpoint) or ``online``."""

    train = "train"
    eval = "eval"
    online = "online"


#: MindSpore's AMP levels (from :data:`lit_amp.amp.names.AMP_LEVELS`).
AmpLevel = Enum("AmpLevel", {name: name for name in AMP_LEVELS})  # type: ignore[misc]
#: MindSpore's boost levels (from :data:`lit_amp.amp.names.BOOST_LEVELS`).
BoostLevel = Enum("BoostLevel", {name: name for name in BOOST_LEVELS})  # type: ignore[misc]


@dataclasses.dataclass
class AmpSchema:
    """``amp/``: the level and its BatchNorm override."""

    level: AmpLevel = AmpLevel.O0
    keep_batchnorm_fp32: Optional[bool] = None  # noqa: UP045 - OmegaConf needs typing forms


@dataclasses.dataclass
class BoostSchema:
    """``boost/``: the level and MindSpore's ``boost_config_dict``."""

    level: BoostLevel = BoostLevel.O0
    config: Any = None


@dataclasses.dataclass
class LitAmpSchema:
    """Types of the top-level keys: a bad value fails at composition with Hydra's message."""

    task_name: str = "train"
    mode: Mode = Mode.train
    seed: Optional[int] = 0  # noqa: UP045
    epochs: int = 30
    valid_frequency: Any = 1
    dataset_sink_mode: bool = False
    sink_size: int = -1
    ckpt_path: Optional[str] = None  # noqa: UP045
    optimized_metric: Optional[str] = "acc"  # noqa: UP045
    continue_on_error: bool = True
    extra_trusted_targets: list[str] = dataclasses.field(default_factory=list)
    trusted_hosts: list[str] = dataclasses.field(default_factory=list)
    trusted_env: list[str] = dataclasses.field(default_factory=list)
    tags: list[str] = dataclasses.field(default_factory=list)
    amp: AmpSchema = dataclasses.field(default_factory=AmpSchema)
    boost: BoostSchema = dataclasses.field(default_factory=BoostSchema)
    loss_scale: Any = None
    optimizer: Any = None
    model: Any = None
    data: Any = None
    trainer: Any = None
    callbacks: Any = None
    logger: Any = None
    paths: Any = None
    online: Any = None


ConfigStore.instance().store(name=SCHEMA_NAME, node=LitAmpSchema)


def slurm_devices(devices: Any) -> int:
    """``${lit_amp.slurm_devices:${trainer.devices}}``: GPUs (= SLURM tasks) per node, an int.

    SLURM's ``gpus_per_node`` / ``tasks_per_node`` must be integers chosen at submission, where
    Lightning's ``devices: auto`` means nothing; a list of GPU indices counts its entries.

    Args:
        devices: ``trainer.devices``.

    Returns:
        The number of devices per node.

    Raises:
        ConfigError: ``auto``, ``-1`` or anything but an int >= 1 / a list of indices.

    Example:
        >>> slurm_devices(4), slurm_devices("2"), slurm_devices([0, 1])
        (4, 2, 2)
    """
    if isinstance(devices, (list, tuple, ListConfig)) and len(devices) > 0:
        return len(devices)
    text = str(devices).strip()
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise ConfigError(
        f"lit-amp: hydra/launcher=slurm needs trainer.devices=<GPUs per node> as an int (SLURM "
        f"allocates them at submission), but got trainer.devices={devices!r}; e.g. "
        "lit-amp -m hydra/launcher=slurm trainer=ddp trainer.devices=4 trainer.num_nodes=2"
    )


def slurm_gpus(accelerator: Any, devices: Any) -> int | None:
    """``${lit_amp.slurm_gpus:${trainer.accelerator},${trainer.devices}}``: GPUs per node to
    ask SLURM for: as many as devices when the trainer runs on GPUs (``gpu``, ``cuda``, or
    ``auto``, which takes the GPUs SLURM gives), none (null) for ``cpu`` and other devices.

    Raises:
        ConfigError: a GPU accelerator with ``devices`` that is not an int (see
            :func:`slurm_devices`).

    Example:
        >>> slurm_gpus("gpu", 4), slurm_gpus("cpu", 2), slurm_gpus("auto", [0, 1])
        (4, None, 2)
    """
    if str(accelerator).strip().lower() in ("gpu", "cuda", "auto"):
        return slurm_devices(devices)
    return None


def check_request(cfg: Any) -> None:
    """At composition: the launcher's per-node counts resolve, or their ``ConfigError``
    (``trainer.devices=auto``) is raised as itself, not inside Hydra's traceback of the
    launcher it could not build.

    Raises:
        ConfigError: ``hydra.launcher.tasks_per_node`` / ``gpus_per_node`` cannot be resolved
            to what SLURM needs (see :func:`slurm_devices`).
    """
    from omegaconf.errors import InterpolationResolutionError

    launcher = OmegaConf.select(cfg, "hydra.launcher", default=None)
    if launcher is None or "lit_amp" not in str(launcher.get("_target_", "")):
        return
    for key in ("tasks_per_node", "gpus_per_node"):
        try:
            launcher.get(key)
        except InterpolationResolutionError as exc:
            cause = exc.__cause__ or exc.__context__  # OmegaConf raises it during the handling
            if isinstance(cause, ConfigError):
                raise cause from None
            raise


def _agent_start_time() -> str | None:
    """Start time of this process's parent (torchrun's agent), shared by its local ranks."""
    try:
        with open(f"/proc/{os.getppid()}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    start = boot + ticks / os.sysconf("SC_CLK_TCK")
    return time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(start))


def run_id() -> str:
    """``${lit_amp.run_id:}``: the name of a run's directory, the same on every rank of a job.

    ``SLURM_JOB_ID`` under SLURM (a requeued job finds its directory again); ``LIT_AMP_RUN_ID``
    when set; under torchrun (``TORCHELASTIC_RUN_ID`` set) the start time of the torchrun agent
    (every local rank has the same; ``torchrun --rdzv-id=<id>`` names the run by that id);
    else the current time, ``%Y-%m-%d_%H-%M-%S``. Lightning's own DDP launcher passes its
    directory to the workers.

    Returns:
        The directory name.

    Example:
        >>> os.environ.get("SLURM_JOB_ID") is not None or run_id()[:2] == "20"
        True
    """
    for var in ("SLURM_JOB_ID", "LIT_AMP_RUN_ID"):
        if os.environ.get(var):
            return os.environ[var]
    elastic = os.environ.get("TORCHELASTIC_RUN_ID")
    if elastic is not None:
        if elastic not in ("", "none"):
            return f"torchrun-{elastic}"
        agent = _agent_start_time()
        if agent is not None:
            return agent
    return time.strftime("%Y-%m-%d_%H-%M-%S")


OmegaConf.register_new_resolver("lit_amp.slurm_devices", slurm_devices, replace=True)
OmegaConf.register_new_resolver("lit_amp.slurm_gpus", slurm_gpus, replace=True)
OmegaConf.register_new_resolver("lit_amp.run_id", run_id, use_cache=True, replace=True)


class ConfigError(CompactHydraException):
    """A configuration lit_amp rejects; Hydra prints just this message (no traceback)."""


def _name(value: Any) -> str:
    """An enum's name, or ``str(value)``."""
    return value.name if isinstance(value, Enum) else str(value)


def _plain(node: Any) -> Any:
    """A resolved plain-Python copy of a config node (enums as their names)."""
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True, enum_to_str=True)
    return node
