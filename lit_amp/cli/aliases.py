"""The keys of the Lightning-Hydra template on ``lit-amp``'s command line, and missing plugins.

Users of the `lightning-hydra-template` type its keys from muscle memory. Where ``lit-amp``
keeps its own key for the same thing, :func:`rewrite` turns the template's key into it (and
says so on stderr); where ``lit-amp`` has no such key, the error names the one to use:

===============================  ===========================================================
template                         lit-amp
===============================  ===========================================================
``trainer.max_epochs=N``         ``epochs=N`` (MindSpore's final epoch number)
``trainer.check_val_every_n_     ``valid_frequency=N``
epoch=N``
``model.optimizer.lr=X``         ``optimizer.lr=X`` (any ``model.optimizer.<key>``)
``model.net.<key>=X``            ``model.network.<key>=X``
``trainer.precision=...``        an error naming ``amp=O0|O1|O2|O3|auto``
``trainer.min_epochs`` /         an error naming ``epochs`` and ``trainer.limit_train_batches``
``trainer.max_steps``
===============================  ===========================================================

:func:`check_plugins` names the extra to install when an option needs a Hydra plugin that is
missing (``hparams_search=optuna``: ``pip install lit_amp[optuna]``, ``hydra/launcher=slurm``:
``lit_amp[slurm]``) or a logger's package (``logger=tensorboard|wandb|mlflow``).
:func:`check_packages` does the same for the composed config (a data set, a source or a
logger chosen in a YAML file), before torch and Lightning are imported, so that a missing
package is reported within a second of the start. Imports no torch and no Lightning.

Example:
    >>> rewrite(["trainer.max_epochs=2", "model.optimizer.lr=0.1", "amp=O2"])[0]
    ['epochs=2', 'optimizer.lr=0.1', 'amp=O2']
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

from lit_amp.cli.schema import ConfigError

__all__ = ["ALIASES", "PACKAGES", "PLUGINS", "rewrite", "check_packages", "check_plugins",
           "missing_extra"]

#: template key (or key prefix ending in ".") -> lit-amp's key
ALIASES: dict[str, str] = {
    "trainer.max_epochs": "epochs",
    "trainer.check_val_every_n_epoch": "valid_frequency",
    "model.optimizer.": "optimizer.",
    "model.net.": "model.network.",
}
#: template keys lit-amp has no equivalent for -> what to use instead
_REFUSED: dict[str, str] = {
    "trainer.precision": "lit-amp sets the precision by MindSpore's AMP level: amp=O0 (fp32), "
    "amp=O1 / O2 / O3 (float16 on CUDA, bfloat16 on CPU) or amp=auto (see conf/amp/)",
    "trainer.min_epochs": "lit-amp trains exactly to epochs=N (MindSpore's final epoch); "
    "use epochs=N",
    "trainer.max_steps": "lit-amp counts epochs (epochs=N); for fewer steps per epoch use "
    "trainer.limit_train_batches=N (or debug=limit)",
    "trainer.callbacks": "callbacks come from the callbacks group: callbacks=<option> or "
    "+callbacks.<name>._target_=<class>",
}

#: option (``group=value`` on the command line) -> (module it needs, the lit_amp extra)
PLUGINS: dict[str, tuple[str, str]] = {
    "hparams_search=optuna": ("hydra_plugins.hydra_optuna_sweeper", "optuna"),
    "hydra/sweeper=optuna": ("hydra_plugins.hydra_optuna_sweeper", "optuna"),
    "hydra/launcher=slurm": ("hydra_plugins.hydra_submitit_launcher", "slurm"),
    "hydra/launcher=submitit_slurm": ("hydra_plugins.hydra_submitit_launcher", "slurm"),
    "hydra/launcher=submitit_local": ("hydra_plugins.hydra_submitit_launcher", "slurm"),
    "logger=wandb": ("wandb", "wandb"),
    "logger=mlflow": ("mlflow", "mlflow"),
}
_TENSORBOARD = ("tensorboard", "tensorboardX")

#: ``_target_`` -> (modules, any one of which it needs; the lit_amp extra that installs it, ""
#: for a core dependency: reinstalling lit_amp brings it)
PACKAGES: dict[str, tuple[tuple[str, ...], str]] = {
    "lit_amp.demos.mnist1d_loaders": (("mnist1d",), ""),
    "lit_amp.demos.data.mnist1d_loaders": (("mnist1d",), ""),
    "lit_amp.rec.sources.KafkaSource": (("kafka",), "kafka"),
    "lit_amp.rec.sources.kafka_source.KafkaSource": (("kafka",), "kafka"),
    "lightning.pytorch.loggers.TensorBoardLogger": (_TENSORBOARD, "tensorboard"),
    "lightning.pytorch.loggers.tensorboard.TensorBoardLogger": (_TENSORBOARD, "tensorboard"),
    "lightning.pytorch.loggers.WandbLogger": (("wandb",), "wandb"),
    "lightning.pytorch.loggers.wandb.WandbLogger": (("wandb",), "wandb"),
    "lightning.pytorch.loggers.MLFlowLogger": (("mlflow",), "mlflow"),
    "lightning.pytorch.loggers.mlflow.MLFlowLogger": (("mlflow",), "mlflow"),
}
#: a key of the target's node that replaces the package (KafkaSource's own consumer)
_INSTEAD = {"kafka": "consumer_factory"}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_extra(option: str) -> str | None:
    """The lit_amp extra an option needs when its package is not installed, else None.

    Args:
        option: ``group=value`` as typed (``logger=tensorboard``, ``hparams_search=optuna``).

    Returns:
        The extra's name (``pip install lit_amp[<extra>]``) or None.

    Example:
        >>> missing_extra("amp=O2") is None
        True
    """
    key = option.lstrip("+~")
    if key in ("logger=tensorboard", "logger=many"):
        return None if any(_installed(m) for m in _TENSORBOARD) else "tensorboard"
    if key in PLUGINS:
        module, extra = PLUGINS[key]
        return None if _installed(module) else extra
    return None


def check_plugins(argv: Sequence[str]) -> None:
    """Refuse options whose plugin or package is missing, naming the extra to install.

    Args:
        argv: the command line without the program.

    Raises:
        ConfigError: an option needs a package that is not installed.
    """
    for arg in argv:
        for option in arg.split(" "):
            extra = missing_extra(option)
            if extra is not None:
                raise ConfigError(
                    f"lit-amp: {option} needs a package that is not installed: "
                    f"pip install 'lit_amp[{extra}]'"
                )


def check_packages(cfg: Any) -> None:
    """Refuse a composed config whose targets need a package that is not installed.

    Only the targets of :data:`PACKAGES` are known; nothing is imported (``find_spec``).

    Args:
        cfg: the composed config (``hydra`` is not looked at).

    Raises:
        ConfigError: the message names the config key, the package and the extra.

    Example:
        >>> check_packages({"data": {"_target_": "lit_amp.demos.synthetic_loaders"}})
    """
    for key in list(cfg.keys()):
        if key == "hydra":
            continue
        for where, target in _targets(_value(cfg, key), str(key)):
            modules, extra = PACKAGES.get(str(target), ((), ""))
            if not modules or any(_installed(m) for m in modules):
                continue
            owner = where.rpartition("._target_")[0] or where
            instead = _INSTEAD.get(extra)
            if instead and _node_has(cfg, owner, instead):
                continue
            how = (f"pip install 'lit_amp[{extra}]'" if extra
                   else "pip install lit_amp (it is a dependency)")
            raise ConfigError(
                f"lit-amp: '{owner}' ({target}) needs the package '{modules[0]}', which is not "
                f"installed: {how}"
            )


_MISSING = object()


def _value(node: Any, key: Any) -> Any:
    try:
        return node[key]
    except Exception:  # noqa: BLE001 - an interpolation that does not resolve here
        return _MISSING


def _targets(node: Any, where: str) -> list[tuple[str, Any]]:
    """``(path of the _target_ key, target)`` below a config node (dicts and lists)."""
    if hasattr(node, "keys") and callable(node.keys):
        out = []
        for key in list(node.keys()):
            path = f"{where}.{key}"
            value = _value(node, key)
            if key == "_target_":
                out.append((path, value))
            elif value is not _MISSING:
                out += _targets(value, path)
        return out
    if isinstance(node, (list, tuple)) or type(node).__name__ == "ListConfig":
        return [t for i, v in enumerate(node) for t in _targets(v, f"{where}[{i}]")]
    return []


def _node_has(cfg: Any, where: str, key: str) -> bool:
    node = cfg
    for part in where.split("."):
        try:
            node = node[part]
        except Exception:  # noqa: BLE001 - a list index or a missing key
            return False
    try:
        return node.get(key) is not None
    except Exception:  # noqa: BLE001
        return False


def rewrite(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Replace the template's keys by lit-amp's (see the table above).

    Args:
        argv: the command line without the program.

    Returns:
        ``(new argv, notes)``: one note per replaced key, for stderr.

    Raises:
        ConfigError: a template key lit-amp has no equivalent for; the message names the key
            to use instead.

    Example:
        >>> rewrite(["trainer.precision=bf16-mixed"])
        Traceback (most recent call last):
        ...
        lit_amp.cli.schema.ConfigError: lit-amp: 'trainer.precision' is not a lit-amp key: \
lit-amp sets the precision by MindSpore's AMP level: amp=O0 (fp32), amp=O1 / O2 / O3 (float16 \
on CUDA, bfloat16 on CPU) or amp=auto (see conf/amp/).
    """
    out: list[str] = []
    notes: list[str] = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq or arg.startswith("-"):
            out.append(arg)
            continue
        plus = key[: len(key) - len(key.lstrip("+~"))]
        bare = key[len(plus):]
        if bare in _REFUSED:
            raise ConfigError(f"lit-amp: '{bare}' is not a lit-amp key: {_REFUSED[bare]}.")
        new = bare
        for old, mine in ALIASES.items():
            if old.endswith(".") and bare.startswith(old):
                new = mine + bare[len(old):]
            elif bare == old:
                new = mine
                plus = ""  # lit-amp's key exists: no '+' needed
        if new != bare:
            notes.append(f"lit-amp: {bare} is lit-amp's {new}; running with {plus}{new}={value}")
        out.append(f"{plus}{new}={value}")
    return out, notes
