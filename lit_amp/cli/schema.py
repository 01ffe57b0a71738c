"""The typed schema of ``lit-amp``'s config tree (``conf/``), registered in Hydra's ConfigStore.

``conf/config.yaml`` lists ``lit_amp_schema`` first in its defaults, so a value of the wrong
type (``epochs=abc``, ``amp.level=O7``) fails at composition with Hydra's one-line message.
Also here: :class:`ConfigError` (a rejected value, reported without a traceback) and the two
node helpers the build and run steps share. Imports no torch and no Lightning.

Example:
    >>> LitAmpSchema().mode, LitAmpSchema().amp.level
    (<Mode.train: 'train'>, <AmpLevel.O0: 'O0'>)
"""

from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from hydra.errors import CompactHydraException
from omegaconf import DictConfig, ListConfig, OmegaConf

__all__ = [
    "Mode",
    "AmpLevel",
    "BoostLevel",
    "AmpSchema",
    "BoostSchema",
    "LitAmpSchema",
    "ConfigError",
    "SCHEMA_NAME",
]

#: The name ``conf/config.yaml``'s defaults list gives the schema.
SCHEMA_NAME = "lit_amp_schema"


class Mode(Enum):
    """What ``lit-amp`` does: ``train`` (fit + eval), ``eval`` (a checkpoint) or ``online``."""

    train = "train"
    eval = "eval"
    online = "online"


class AmpLevel(Enum):
    """MindSpore's AMP levels."""

    O0 = "O0"
    O1 = "O1"
    O2 = "O2"
    O3 = "O3"
    auto = "auto"


class BoostLevel(Enum):
    """MindSpore's boost levels."""

    O0 = "O0"
    O1 = "O1"
    O2 = "O2"


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
    valid_frequency: Any = 5
    dataset_sink_mode: bool = False
    sink_size: int = -1
    ckpt_path: Optional[str] = None  # noqa: UP045
    optimized_metric: Optional[str] = "acc"  # noqa: UP045
    continue_on_error: bool = True
    extra_trusted_targets: list[str] = dataclasses.field(default_factory=list)
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
