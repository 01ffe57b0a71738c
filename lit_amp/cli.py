"""``lit-amp``: the Hydra application that composes lit_amp from ``conf/``.

``lit-amp`` (also ``python -m lit_amp``) trains the default experiment, MNIST-1D's CNN through
``Model.fit`` (what ``make demo`` runs); every option is a config group of ``conf/``::

    lit-amp                                        # the default experiment
    lit-amp amp=O3 boost=O1 optimizer=thor trainer=ddp_sim
    lit-amp mode=eval ckpt_path=runs/train/<run>/checkpoints/mnist1d_cnn-30_40.ckpt
    lit-amp mode=online experiment=online
    lit-amp -m amp=O0,O1,O2,O3                     # one result.json per run + a summary
    lit-amp --help                                 # the groups and their options

What a run does (:func:`run`): seed; build data, network, loss, metrics, optimizer (THOR from
the network), loss-scale manager, callbacks, loggers and the Trainer arguments through the one
instantiate helper (:func:`lit_amp.instantiate.instantiate`); build ``Model`` (``RecModel`` for
``mode=online``; converted by ``ConvertModelUtils`` for THOR); train / evaluate / train online;
print a metrics table and write ``result.json`` in the run directory (rank 0 only); return
``cfg.optimized_metric`` for sweepers. Mistakes in the configuration (an unknown option, a
value of the wrong type, an argument a lit_amp class rejects) are reported by Hydra as one
message, not a traceback.

Example:
    >>> from lit_amp.cli import CONF_DIR
    >>> (CONF_DIR / "config.yaml").is_file()
    True
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import json
import logging
import math
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import lightning as L
from hydra.core.config_store import ConfigStore
from hydra.errors import CompactHydraException
from omegaconf import DictConfig, ListConfig, OmegaConf

from lit_amp.instantiate import instantiate

__all__ = [
    "CONF_DIR",
    "CONFIG_NAME",
    "ConfigError",
    "Built",
    "build",
    "run",
    "main",
    "ThroughputMonitor",
]

log = logging.getLogger(__name__)

CONFIG_NAME = "config"


def _find_conf_dir() -> Path:
    """``conf/`` inside the installed package (wheel), else the repository's top-level one."""
    here = Path(__file__).resolve().parent
    for cand in (here / "conf", here.parent / "conf"):
        if (cand / f"{CONFIG_NAME}.yaml").is_file():
            return cand
    return here.parent / "conf"


#: The config tree ``lit-amp`` composes from.
CONF_DIR: Path = _find_conf_dir()


# ---------------------------------------------------------------------------------- schema
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


ConfigStore.instance().store(name="lit_amp_schema", node=LitAmpSchema)


class ConfigError(CompactHydraException):
    """A configuration lit_amp rejects; Hydra prints just this message (no traceback)."""


def _name(value: Any) -> str:
    return value.name if isinstance(value, Enum) else str(value)


def _plain(node: Any) -> Any:
    """A resolved plain-Python copy of a config node (enums as their names)."""
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True, enum_to_str=True)
    return node


# ---------------------------------------------------------------------------------- helpers
def _is_rank_zero() -> bool:
    from lightning.fabric.utilities.rank_zero import _get_rank

    return (_get_rank() or 0) == 0


def _echo(*parts: Any) -> None:
    """``print`` on the global rank 0 only (the CLI's user-facing output)."""
    if _is_rank_zero():
        print(*parts, flush=True)


def _batch_len(batch: Any) -> int:
    """Samples in a batch: ``(x, y)`` tuples, dicts of tensors, or a sink's list of batches."""
    import torch

    if torch.is_tensor(batch):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, Mapping):
        for v in batch.values():
            return _batch_len(v)
        return 0
    if isinstance(batch, (list, tuple)) and batch:
        first = batch[0]
        if isinstance(first, (list, tuple)) and len(batch) > 1 and not torch.is_tensor(first):
            return sum(_batch_len(b) for b in batch)  # a sink: a list of (x, y) batches
        return _batch_len(first)
    return 0


class ThroughputMonitor(L.Callback):
    """Logs ``samples_per_s``: training samples per second over all ranks, evaluation excluded.

    Logged at each train epoch end (rank 0), so it reaches the loggers and
    ``trainer.callback_metrics`` (also from spawned DDP workers).

    Example:
        >>> ThroughputMonitor().samples
        0
    """

    def __init__(self) -> None:
        self.samples = 0
        self._t0 = 0.0
        self._eval_s = 0.0
        self._eval_t0: float | None = None

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.samples, self._t0, self._eval_s = 0, time.perf_counter(), 0.0

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
        batch_idx: int,
    ) -> None:
        self.samples += _batch_len(batch)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._eval_t0 = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._eval_t0 is not None:
            self._eval_s += time.perf_counter() - self._eval_t0
            self._eval_t0 = None

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        dt = time.perf_counter() - self._t0 - self._eval_s
        if dt > 0 and self.samples:
            value = self.samples * trainer.world_size / dt
            pl_module.log("samples_per_s", float(value), rank_zero_only=True, logger=True)


# ---------------------------------------------------------------------------------- build
@dataclasses.dataclass
class Built:
    """Everything :func:`build` made from a config.

    Attributes:
        model: the ``Model`` (``ThorModel`` for THOR, ``RecModel`` for ``mode=online``).
        network, loss_fn, optimizer, metrics: what the Model was built from.
        train, valid: the training data (a stream source in online mode) and the evaluation
            data (None when the data node gives none).
        callbacks: MindSpore and Lightning callbacks for train/fit/online_train.
        trainer_kwargs: the ``trainer={...}`` dict given to the Model.
        model_kwargs: MindSpore's kwargs given to the Model (loss_scale_manager, ...).
    """

    model: Any
    network: Any
    loss_fn: Any
    optimizer: Any
    metrics: Any
    train: Any
    valid: Any
    callbacks: list
    trainer_kwargs: dict
    model_kwargs: dict


def _split_data(loaders: Any) -> tuple[Any, Any]:
    if isinstance(loaders, Mapping):
        train = loaders.get("train")
        valid = loaders.get("valid", loaders.get("val", loaders.get("test")))
        return train, valid
    if isinstance(loaders, (tuple, list)) and 1 <= len(loaders) <= 3:
        return loaders[0], (loaders[1] if len(loaders) > 1 else None)
    return loaders, None


def _metrics(node: Any, make: Any) -> Any:
    """``[acc, loss]`` -> a set of names; ``{name: name | metric node}`` -> name -> Metric."""
    if node is None:
        return None
    if isinstance(node, ListConfig) or isinstance(node, (list, tuple)):
        return {str(n) for n in node}
    if isinstance(node, (DictConfig, Mapping)):
        from lit_amp.metrics import get_metric_fn

        out = {}
        for key, value in node.items():
            if isinstance(value, (DictConfig, Mapping)) and "_target_" in value:
                out[str(key)] = make(value, f"model.metrics.{key}")
            else:
                out[str(key)] = get_metric_fn(str(value))
        return out
    return {str(node)}


def _fill_steps_per_epoch(node: Any, steps: int | None) -> None:
    """Set every ``steps_per_epoch: null`` below ``node`` (THOR's schedules) to ``steps``."""
    if not isinstance(node, DictConfig) or steps is None:
        return
    for key in list(node.keys()):
        value = node._get_node(key)
        if key == "steps_per_epoch" and value._is_none():
            node[key] = int(steps)
        elif isinstance(value, DictConfig):
            _fill_steps_per_epoch(value, steps)


def _make_optimizer(factory: Any, network: Any) -> Any:
    """Call an optimizer factory with the network (THOR: ``thor(net, ...)``) or its parameters."""
    func = factory.func if isinstance(factory, functools.partial) else factory
    try:
        first = next(iter(inspect.signature(func).parameters), "")
    except (TypeError, ValueError):
        first = ""
    if first in ("net", "network", "model", "module"):
        return factory(network)
    return factory(network.parameters())


def _trainer_kwargs(cfg: DictConfig, make: Any) -> dict:
    node = cfg.get("trainer")
    if node is None:
        kw: dict = {}
    elif "_target_" in node:
        kw = dict(make(node, "trainer", _partial_=True).keywords)
    else:
        kw = dict(_plain(node))
    kw = {k: v for k, v in kw.items() if v is not None}
    loggers = [
        make(n, f"logger.{k}")
        for k, n in (cfg.get("logger") or {}).items()
        if n is not None and "_target_" in n
    ]
    kw["logger"] = loggers if loggers else False
    return kw


@contextlib.contextmanager
def _building(key: str) -> Iterator[None]:
    """Report a value that a constructor rejects as a :class:`ConfigError` naming ``key``."""
    try:
        yield
    except CompactHydraException:
        raise
    except (TypeError, ValueError, NotImplementedError, ImportError) as exc:
        raise ConfigError(
            f"lit-amp: the configuration of '{key}' was rejected: {type(exc).__name__}: {exc}\n"
            "(see the composed config with `lit-amp --cfg job`; HYDRA_FULL_ERROR=1 for the "
            "traceback)"
        ) from exc


def _validate(cfg: DictConfig) -> None:
    """Range checks the schema's types cannot express (bad values fail before any work)."""
    if cfg.epochs < 1:
        raise ConfigError(f"lit-amp: 'epochs' must be >= 1, but got {cfg.epochs}.")
    if cfg.sink_size == 0 or cfg.sink_size < -1:
        raise ConfigError(f"lit-amp: 'sink_size' must be -1 or >= 1, but got {cfg.sink_size}.")
    vf = _plain(cfg.get("valid_frequency"))
    ok = vf is None or (isinstance(vf, int) and not isinstance(vf, bool) and vf >= 1) or (
        isinstance(vf, list) and all(isinstance(e, int) and e >= 1 for e in vf)
    )
    if not ok:
        raise ConfigError(
            "lit-amp: 'valid_frequency' must be null, an int >= 1 or a list of epochs, but got "
            f"{vf!r}."
        )


def build(cfg: DictConfig) -> Built:
    """Build data, network, optimizer, callbacks and the Model from a composed config.

    Args:
        cfg: a config composed from ``conf/`` (``hydra.compose`` or ``lit-amp``).

    Returns:
        A :class:`Built`.

    Raises:
        hydra.errors.InstantiationException: a ``_target_`` failed (Hydra's message, naming the
            config key).
        ConfigError: a lit_amp class rejected a configured value.
    """
    _validate(cfg)
    trusted = [str(p) for p in (cfg.get("extra_trusted_targets") or [])]
    mode = _name(cfg.mode)

    def make(node: Any, key: str, *args: Any, **kw: Any) -> Any:
        with _building(key):
            return instantiate(node, *args, trusted=trusted, **kw)

    # data
    if mode == "online":
        train, valid = make(cfg.data, "data"), None
    else:
        train, valid = _split_data(make(cfg.data, "data"))
    # network, loss, metrics
    mcfg = cfg.model
    network = make(mcfg.network, "model.network")
    loss_fn = make(mcfg.loss_fn, "model.loss_fn") if mcfg.get("loss_fn") is not None else None
    with _building("model.metrics"):
        metrics = _metrics(mcfg.get("metrics"), make)
    # optimizer (THOR's schedules need the steps per epoch)
    optimizer = None
    if cfg.get("optimizer") is not None:
        steps = None
        if cfg.dataset_sink_mode and cfg.sink_size > 0:
            steps = int(cfg.sink_size)
        elif hasattr(train, "__len__"):
            with contextlib.suppress(TypeError):
                steps = len(train)
        _fill_steps_per_epoch(cfg.optimizer, steps)
        factory = make(cfg.optimizer, "optimizer")
        with _building("optimizer"):
            optimizer = _make_optimizer(factory, network)
    # MindSpore kwargs
    model_kwargs: dict[str, Any] = {}
    ls = cfg.get("loss_scale")
    if ls is not None and "_target_" in ls:
        model_kwargs["loss_scale_manager"] = make(ls, "loss_scale")
    elif ls is not None and ls.get("enabled", True) is False:
        model_kwargs["loss_scale_manager"] = None
    amp_level = _name(cfg.amp.level)
    if cfg.amp.get("keep_batchnorm_fp32") is not None:
        model_kwargs["keep_batchnorm_fp32"] = bool(cfg.amp.keep_batchnorm_fp32)
    boost_level = _name(cfg.boost.level)
    if boost_level != "O0" and cfg.boost.get("config") is not None:
        model_kwargs["boost_config_dict"] = _plain(cfg.boost.config)
    # callbacks and Trainer arguments
    callbacks = [
        make(n, f"callbacks.{k}")
        for k, n in (cfg.get("callbacks") or {}).items()
        if n is not None
    ]
    trainer_kwargs = _trainer_kwargs(cfg, make)
    if mode != "online":
        callbacks.append(ThroughputMonitor())
    # the Model
    with _building("amp / loss_scale / boost / model"):
        if mode == "online":
            from lit_amp.rec import RecModel as model_cls
        else:
            from lit_amp import Model as model_cls
        model = model_cls(
            network,
            loss_fn,
            optimizer,
            metrics=metrics,
            amp_level=amp_level,
            boost_level=boost_level,
            trainer=trainer_kwargs,
            **model_kwargs,
        )
        if type(optimizer).__module__.startswith("lit_amp.thor"):
            from lit_amp.thor import ConvertModelUtils

            kbn = model_kwargs.get("keep_batchnorm_fp32", amp_level in ("O2", "auto"))
            model = ConvertModelUtils.convert_to_thor_model(
                model,
                network=network,
                loss_fn=loss_fn,
                optimizer=optimizer,
                metrics=metrics,
                amp_level=amp_level,
                loss_scale_manager=model_kwargs.get("loss_scale_manager"),
                keep_batchnorm_fp32=kbn,
            )
    return Built(
        model, network, loss_fn, optimizer, metrics, train, valid, callbacks, trainer_kwargs,
        model_kwargs,
    )


# ---------------------------------------------------------------------------------- run
def _output_dir(cfg: DictConfig) -> Path:
    try:
        out = cfg.paths.output_dir
    except Exception:  # noqa: BLE001 - no Hydra runtime (plain compose)
        out = None
    return Path(out) if out else Path.cwd()


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return False
    return HydraConfig.get().mode == RunMode.MULTIRUN


def _overrides() -> list[str]:
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    return [str(o) for o in HydraConfig.get().overrides.task]


def _scalar(v: Any) -> Any:
    try:
        import torch

        if torch.is_tensor(v):
            return v.item() if v.numel() == 1 else v.tolist()
    except ImportError:  # pragma: no cover
        pass
    if hasattr(v, "tolist"):
        return v.tolist()
    return v


def _log_dir(model: Any, kw: dict) -> str | None:
    trainer = getattr(model, "trainer", None)
    lg = getattr(trainer, "logger", None) if trainer is not None else None
    if lg is not None and getattr(lg, "log_dir", None):
        return str(lg.log_dir)
    loggers = kw.get("logger") or []
    for lg in loggers if isinstance(loggers, list) else [loggers]:
        if getattr(lg, "log_dir", None):
            return str(lg.log_dir)
    return None


def _ckpt_info(callbacks: list) -> tuple[str | None, str | None]:
    for cb in callbacks:
        if type(cb).__name__ == "ModelCheckpoint" and hasattr(cb, "latest_ckpt_file_name"):
            directory = getattr(cb, "_directory", None) or getattr(cb, "directory", None)
            latest = cb.latest_ckpt_file_name or None
            if latest is None and directory and os.path.isdir(str(directory)):
                # written by a spawned DDP worker: this process's callback never saw it
                files = sorted(Path(str(directory)).glob("*.ckpt"), key=os.path.getmtime)
                latest = str(files[-1]) if files else None
            return (str(directory) if directory else None), latest
    return None, None


def _run_train(cfg: DictConfig, b: Built) -> tuple[dict, dict]:
    model = b.model
    sink = bool(cfg.dataset_sink_mode)
    vf = _plain(cfg.get("valid_frequency"))
    t0 = time.perf_counter()
    if vf is None or b.valid is None or not b.metrics:
        model.train(
            int(cfg.epochs), b.train, callbacks=b.callbacks, dataset_sink_mode=sink,
            sink_size=int(cfg.sink_size),
        )
    else:
        model.fit(
            int(cfg.epochs), b.train, b.valid, valid_frequency=vf, callbacks=b.callbacks,
            dataset_sink_mode=sink, sink_size=int(cfg.sink_size),
        )
    fit_s = time.perf_counter() - t0
    fit_trainer = model.trainer
    extra: dict[str, Any] = {"train_s": round(fit_s, 3)}
    cbm = dict(fit_trainer.callback_metrics) if fit_trainer is not None else {}
    if "samples_per_s" in cbm:
        extra["samples_per_s"] = float(cbm["samples_per_s"])
    extra["log_dir"] = _log_dir(model, b.trainer_kwargs)
    metrics: dict[str, Any] = {}
    if b.valid is not None and b.metrics:
        metrics = model.eval(b.valid)
    return metrics, extra


def _run_eval(cfg: DictConfig, b: Built) -> tuple[dict, dict]:
    path = cfg.get("ckpt_path")
    if not path:
        raise ConfigError("lit-amp: mode=eval needs a checkpoint: ckpt_path=<file.ckpt>.")
    if not os.path.isfile(str(path)):
        raise ConfigError(f"lit-amp: ckpt_path={path!r} is not a file.")
    if b.valid is None or not b.metrics:
        raise ConfigError("lit-amp: mode=eval needs evaluation data and model.metrics.")
    from lit_amp import load_checkpoint

    load_checkpoint(str(path), b.network)
    metrics = b.model.eval(b.valid)
    return metrics, {"ckpt_path": str(path), "log_dir": _log_dir(b.model, b.trainer_kwargs)}


def _run_online(cfg: DictConfig, b: Built) -> tuple[dict, dict]:
    opts = _plain(cfg.get("online")) or {}
    summary = b.model.online_train(b.train, callbacks=b.callbacks or None, **opts)
    res = getattr(b.model.lit_model, "last_eval_results", {}) or {}
    metrics = {k: _scalar(v) for k, v in dict(res.get("metrics", {})).items()}
    extra = {
        k: _scalar(getattr(summary, k))
        for k in ("steps", "records", "total_steps", "stop_reason", "last_checkpoint",
                  "last_published", "elapsed_s")
        if hasattr(summary, k)
    }
    if getattr(summary, "elapsed_s", 0) and getattr(summary, "records", 0):
        extra["samples_per_s"] = summary.records / summary.elapsed_s
    return metrics, extra


def _table(rows: Sequence[tuple[str, Any]]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4f}" if abs(v) < 100 else f"{v:.1f}"
        return str(v)

    cells = [(k, fmt(v)) for k, v in rows]
    w1 = max([len("metric"), *(len(k) for k, _ in cells)])
    w2 = max([len("value"), *(len(v) for _, v in cells)])
    lines = [f"| {'metric':<{w1}} | {'value':>{w2}} |", f"|{'-' * (w1 + 2)}|{'-' * (w2 + 2)}|"]
    lines += [f"| {k:<{w1}} | {v:>{w2}} |" for k, v in cells]
    return "\n".join(lines)


def _write_result(out: Path, result: dict) -> Path | None:
    if not _is_rank_zero():
        return None
    out.mkdir(parents=True, exist_ok=True)
    path = out / "result.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str))
    os.replace(tmp, path)
    return path


def _result_base(cfg: DictConfig) -> dict:
    return {
        "task_name": str(cfg.task_name),
        "mode": _name(cfg.mode),
        "overrides": _overrides(),
        "amp": _name(cfg.amp.level),
        "boost": _name(cfg.boost.level),
        "optimizer": str(cfg.optimizer.get("_target_")) if cfg.get("optimizer") else None,
        "model": str(cfg.model.get("name", "")),
        "optimized_metric": cfg.get("optimized_metric"),
    }


def _execute(cfg: DictConfig) -> float | None:
    if cfg.get("seed") is not None:
        L.seed_everything(int(cfg.seed), workers=True, verbose=False)
    mode = _name(cfg.mode)
    out = _output_dir(cfg)
    t0 = time.perf_counter()
    b = build(cfg)
    runner = {"train": _run_train, "eval": _run_eval, "online": _run_online}[mode]
    with _ddp_job_scope(), _ddp_children_in_job_dir(), _spawn_sharing(
        b.trainer_kwargs.get("strategy")
    ):
        metrics, extra = runner(cfg, b)
    metrics = {k: _scalar(v) for k, v in metrics.items()}
    key = cfg.get("optimized_metric")
    value = metrics.get(key) if key else None
    if key and value is None:
        log.warning("optimized_metric=%r is not among the metrics %s.", key, sorted(metrics))
    ckpt_dir, latest = _ckpt_info(b.callbacks)
    wall = time.perf_counter() - t0
    result = {
        **_result_base(cfg),
        "status": "ok",
        "value": value,
        "metrics": metrics,
        **extra,
        "wall_s": round(wall, 3),
        "output_dir": str(out),
        "ckpt_dir": ckpt_dir,
        "latest_ckpt": latest,
    }
    path = _write_result(out, result)
    rows = [(k, v) for k, v in metrics.items() if isinstance(v, (int, float))]
    if "samples_per_s" in extra:
        rows.append(("samples_per_s", float(extra["samples_per_s"])))
    rows.append(("wall_s", f"{wall:.1f}"))
    _echo(f"\nlit-amp {mode} finished: {result['model']}, amp {result['amp']}, "
          f"boost {result['boost']}")
    _echo(_table(rows))
    if "acc" in metrics:
        _echo(f"test accuracy: {float(metrics['acc']):.4f}")
    _echo(f"logs: {extra.get('log_dir') or out}")
    if ckpt_dir and mode != "eval":
        _echo(f"checkpoints: {ckpt_dir} (latest: {latest})")
    if path is not None:
        _echo(f"result: {path}")
    return float(value) if isinstance(value, (int, float)) else None


def run(cfg: DictConfig) -> float | None:
    """Run one job (the task function of ``lit-amp``); returns ``cfg.optimized_metric``.

    In a ``-m`` sweep with ``continue_on_error`` a failing job writes ``status: failed`` and the
    error into its ``result.json`` and returns NaN, so the sweep and its summary go on.

    Args:
        cfg: a config composed from ``conf/``.

    Returns:
        The value of the metric named ``optimized_metric`` (None when absent).
    """
    try:
        return _execute(cfg)
    except Exception as exc:
        if not (_in_multirun() and cfg.get("continue_on_error", True)):
            raise
        log.error("lit-amp job failed: %s: %s", type(exc).__name__, exc)
        _write_result(
            _output_dir(cfg),
            {**_result_base(cfg), "status": "failed", "value": None,
             "error": f"{type(exc).__name__}: {exc}"},
        )
        _echo(f"lit-amp job failed ({type(exc).__name__}): {exc}")
        return math.nan


# ---------------------------------------------------------------------------------- DDP + Hydra
_SKIP_HYDRA_OVERRIDES = (
    "hydra.run", "hydra.sweep", "hydra.mode", "hydra/launcher", "hydra.launcher",
    "hydra/sweeper", "hydra.sweeper", "hydra.job.name", "hydra.output_subdir", "hydra.callbacks",
)
_CONFIG_FLAGS = ("-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir")


def _config_flags(argv: Sequence[str]) -> list[str]:
    out: list[str] = []
    it = iter(range(len(argv)))
    for i in it:
        a = argv[i]
        if a in _CONFIG_FLAGS and i + 1 < len(argv):
            out += [a, argv[i + 1]]
            next(it, None)
        elif a.split("=", 1)[0] in _CONFIG_FLAGS and "=" in a:
            out.append(a)
    return out


def _hydra_subprocess_cmd(local_rank: int) -> tuple[list[str], str]:
    """Lightning's command for DDP worker processes, fixed for Hydra sweeps.

    Lightning re-runs ``sys.argv`` with ``hydra.run.dir=<run dir>``; inside a ``-m`` sweep that
    re-launches the whole sweep (Lightning #11617, Hydra #2070). This runs the job's own
    overrides in RUN mode with the job's output directory.
    """
    from hydra.core.hydra_config import HydraConfig

    import __main__

    hc = HydraConfig.get()
    if __main__.__spec__ is None:
        command = [sys.executable, os.path.abspath(sys.argv[0])]
    else:
        command = [sys.executable, "-m", __main__.__spec__.name]
    command += _config_flags(sys.argv[1:])
    command += [str(o) for o in hc.overrides.task]
    command += [
        str(o) for o in hc.overrides.hydra if not str(o).startswith(_SKIP_HYDRA_OVERRIDES)
    ]
    command += [
        f'hydra.run.dir="{hc.runtime.output_dir}"',
        f"hydra.job.name={hc.job.name}_ddp_process_{local_rank}",
        "hydra.output_subdir=null",
        "hydra.mode=RUN",
    ]
    return command, str(hc.runtime.cwd)


#: what Lightning's DDP script launcher writes into the launching process's environment
_DDP_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE", "RANK",
            "LOCAL_WORLD_SIZE", "GROUP_RANK")


@contextlib.contextmanager
def _ddp_job_scope() -> Iterator[None]:
    """Leave no DDP state behind a job that launched its own worker processes.

    Lightning's script launcher sets ``LOCAL_RANK``/``MASTER_PORT``/... in the launching process
    and keeps the process group until exit. In a ``-m`` sweep the next job would then believe
    its workers were started externally and reuse a process group whose peers have exited (a
    hang). A job that started without ``LOCAL_RANK`` (it launched the workers) restores the
    environment and destroys the process group when it ends; worker processes are untouched.
    """
    if "LOCAL_RANK" in os.environ:  # a worker process, or launched by torchrun / SLURM
        yield
        return
    saved = {k: os.environ.get(k) for k in _DDP_ENV}
    try:
        yield
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _ddp_children_in_job_dir() -> Iterator[None]:
    """Route Lightning's popen DDP launcher through :func:`_hydra_subprocess_cmd` (scoped)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        yield
        return
    import lightning.fabric.strategies.launchers.subprocess_script as fab
    import lightning.pytorch.strategies.launchers.subprocess_script as pl

    saved = (fab._hydra_subprocess_cmd, pl._hydra_subprocess_cmd)
    fab._hydra_subprocess_cmd = pl._hydra_subprocess_cmd = _hydra_subprocess_cmd
    try:
        yield
    finally:
        fab._hydra_subprocess_cmd, pl._hydra_subprocess_cmd = saved


def _is_spawn(strategy: Any) -> bool:
    if isinstance(strategy, str):
        return "spawn" in strategy
    return getattr(strategy, "_start_method", None) == "spawn"


@contextlib.contextmanager
def _spawn_sharing(strategy: Any) -> Iterator[None]:
    """Share tensors with spawned DDP workers through files, for the run only.

    torch's default ``file_descriptor`` strategy fails on some machines (sandboxes) when a
    DataLoader's seeded ``torch.Generator`` is pickled to the workers ("unable to resize file");
    ``file_system`` works everywhere Linux shared memory does.
    """
    if not _is_spawn(strategy) or sys.platform != "linux":
        yield
        return
    import torch.multiprocessing as tmp

    saved = tmp.get_sharing_strategy()
    tmp.set_sharing_strategy("file_system")
    try:
        yield
    finally:
        tmp.set_sharing_strategy(saved)


# ---------------------------------------------------------------------------------- entry
def main(argv: Sequence[str] | None = None) -> float | None:
    """The ``lit-amp`` command (also ``python -m lit_amp``).

    Args:
        argv: command-line arguments (overrides, ``-m``, ``--cfg job``, ...); None reads
            ``sys.argv`` — the console-script form.

    Returns:
        With ``argv`` given, the optimized metric of the (last) run, e.g. the test accuracy of
        ``main([])``; with ``argv=None`` None, so that the console script's ``sys.exit(main())``
        exits with status 0.

    Raises:
        SystemExit: status 1 when Hydra reports an error (an unknown option, a bad value, a
            failing run), status 0 after ``--help``.
    """
    import hydra

    results: list[float | None] = []

    def task(cfg: DictConfig) -> float | None:
        value = run(cfg)
        results.append(value)
        return value

    app = hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name=CONFIG_NAME)(task)
    saved = sys.argv
    if argv is not None:
        sys.argv = [saved[0] if saved else "lit-amp", *argv]
    try:
        app()
    finally:
        sys.argv = saved
    if argv is None:
        return None
    return results[-1] if results else None


if __name__ == "__main__":  # pragma: no cover
    main()
