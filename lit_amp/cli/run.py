"""Run step of ``lit-amp``: one job = build, train / evaluate / train online, report.

:func:`run` seeds, builds (:func:`lit_amp.cli.build.build`), runs the mode inside the DDP scopes
of :mod:`lit_amp.cli.launch`, prints a metrics table and writes ``result.json`` into the run
directory (rank 0 only). ``result.json`` holds the run's overrides, levels, ``status``,
``value`` (the ``optimized_metric``), ``metrics``, ``samples_per_sec`` (training throughput:
Lightning's ThroughputMonitor, or records per second online) and where the logs and
checkpoints went; :mod:`lit_amp.cli.sweep_summary` tabulates them after a ``-m`` sweep.

Example:
    >>> print(_table([("acc", 0.5), ("wall_s", "1.0")]))
    | metric |  value |
    |--------|--------|
    | acc    | 0.5000 |
    | wall_s |    1.0 |
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from lit_amp._io import atomic_write
from lit_amp.cli import preemption
from lit_amp.cli.build import Built, _steps_per_epoch, build
from lit_amp.cli.checkpoint import ResumeCallback, load_network, resume_state
from lit_amp.cli.console import EpochLine, console_to_log, piped
from lit_amp.cli.launch import ddp_children_in_job_dir, ddp_job_scope, spawn_sharing
from lit_amp.cli.schema import ConfigError, _name, _plain

__all__ = ["run", "THROUGHPUT_KEY"]

log = logging.getLogger(__name__)

#: the key of the training throughput in ``result.json`` (samples per second, all ranks)
THROUGHPUT_KEY = "samples_per_sec"
#: what Lightning's ThroughputMonitor logs: all ranks (only when world_size > 1), one device
_LIGHTNING_THROUGHPUT = ("train/samples_per_sec", "train/device/samples_per_sec")


def _is_rank_zero() -> bool:
    from lightning.fabric.utilities.rank_zero import _get_rank

    return (_get_rank() or 0) == 0


def _echo(*parts: Any) -> None:
    """``print`` on the global rank 0 only (the CLI's user-facing output)."""
    if _is_rank_zero():
        print(*parts, flush=True)


def _note(level: int, msg: str, *args: Any) -> None:
    """Log one of the run's notes on the global rank 0 only.

    Under ``trainer=ddp`` every worker process runs the command again; a note about the run
    (THOR validates after the last epoch, no validation epoch, resuming from a checkpoint)
    would be printed once per rank.
    """
    if _is_rank_zero():
        log.log(level, msg, *args)


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


def _job_num() -> dict:
    """``{"job_num": n}`` for a job of a ``-m`` sweep (its place in the sweep), else ``{}``."""
    if not _in_multirun():
        return {}
    from hydra.core.hydra_config import HydraConfig

    try:
        return {"job_num": int(HydraConfig.get().job.num)}
    except (TypeError, ValueError, AttributeError):
        return {}


def _scalar(v: Any) -> Any:
    import torch

    if torch.is_tensor(v):
        return v.item() if v.numel() == 1 else v.tolist()
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


def _rank_steps_per_epoch(cfg: DictConfig, b: Built) -> int | None:
    """Steps per epoch of one rank (data parallel splits the data), None when unknown."""
    steps = _steps_per_epoch(cfg, b.train)
    if steps is None or cfg.dataset_sink_mode:
        return steps  # every rank runs sink_size steps per sink
    devices, nodes = b.trainer_kwargs.get("devices", 1), b.trainer_kwargs.get("num_nodes", 1)
    if isinstance(devices, (list, tuple)):
        devices = len(devices)
    if not isinstance(devices, int) or not isinstance(nodes, int) or devices < 1:
        return None  # `auto`: the world size is known only once training starts
    return math.ceil(steps / (devices * nodes))


def _resume(cfg: DictConfig, b: Built) -> tuple[int, list]:
    """``ckpt_path`` in train mode: load the weights, return the epoch and the resume callback."""
    path = cfg.get("ckpt_path")
    if not path:
        return 0, []
    path = str(path)
    backups = [str(cb.backup_file) for cb in b.callbacks
               if type(cb).__name__ == "BackupAndRestore" and os.path.isfile(str(cb.backup_file))]
    if backups:
        raise ConfigError(
            f"lit-amp: ckpt_path={path!r} and the BackupAndRestore backup {backups[0]!r} both "
            "say where training resumes; drop ckpt_path to continue from the backup, or use "
            "another run directory (hydra.run.dir=...) to resume from ckpt_path."
        )
    state = load_network(path, b.network)
    resume = resume_state(path, state, _rank_steps_per_epoch(cfg, b))
    if resume.epoch >= int(cfg.epochs):
        raise ConfigError(
            f"lit-amp: ckpt_path={path!r} has already trained {resume.epoch} epoch(s) and "
            f"epochs={cfg.epochs} is the final epoch: nothing to resume. Set epochs to more "
            f"than {resume.epoch}, or use mode=eval to evaluate the checkpoint."
        )
    _note(logging.INFO, "Resuming from %s after epoch %d.", path, resume.epoch)
    return resume.epoch, [ResumeCallback(resume)]


def no_validation_note(vf: Any, initial: int, epochs: int) -> str | None:
    """The one line saying that fit validates in none of the epochs it trains, else None.

    MindSpore's ``Model.fit`` validates after epoch ``e`` when ``e % valid_frequency == 0``
    (or ``e`` is in a list); ``epochs=2`` with ``valid_frequency=5`` never does.

    Example:
        >>> no_validation_note(1, 0, 2) is None, no_validation_note([2], 0, 3) is None
        (True, True)
        >>> print(no_validation_note(5, 0, 2))  # doctest: +ELLIPSIS
        lit-amp: no validation during training: no epoch of 1..2 is a multiple of ...
    """
    trained = range(initial + 1, epochs + 1)
    if isinstance(vf, int) and not isinstance(vf, bool) and vf >= 1:
        if any(e % vf == 0 for e in trained):
            return None
        which = f"a multiple of valid_frequency={vf}"
    elif isinstance(vf, list):
        if any(e in trained for e in vf):
            return None
        which = f"in valid_frequency={vf}"
    else:
        return None
    span = f"{trained.start}..{trained.stop - 1}"
    return (f"lit-amp: no validation during training: no epoch of {span} is {which} "
            "(MindSpore validates after epoch e when e % valid_frequency == 0); the model is "
            "evaluated once after the last epoch. valid_frequency=1 validates every epoch.")


def _run_train(cfg: DictConfig, b: Built) -> tuple[dict, dict]:
    model = b.model
    sink = bool(cfg.dataset_sink_mode)
    vf = _plain(cfg.get("valid_frequency"))
    initial, extra_cbs = _resume(cfg, b)
    # LossMonitor prints each validated epoch's metrics ("Eval result: ..."): not twice
    shown = ("val/",) if any(type(cb).__name__ == "LossMonitor" for cb in b.callbacks) else ()
    line = EpochLine(int(cfg.epochs), initial, print_lines=piped(), leave_out=shown)
    extra_cbs.append(line)
    callbacks = [*b.callbacks, *extra_cbs]
    t0 = time.perf_counter()
    from lit_amp.thor.convert import ThorModel

    if isinstance(model, ThorModel) and vf is not None:
        # MindSpore's THOR model refuses evaluation during training: train, then evaluate once
        _note(logging.INFO, "optimizer=thor: no validation during training (MindSpore's THOR "
              "model refuses it); the model is evaluated after the last epoch.")
        vf = None
    if vf is not None and b.valid is not None and b.metrics:
        note = no_validation_note(vf, initial, int(cfg.epochs))
        if note is not None:
            _note(logging.WARNING, note)
    if vf is None or b.valid is None or not b.metrics:
        model.train(
            int(cfg.epochs), b.train, callbacks=callbacks, dataset_sink_mode=sink,
            sink_size=int(cfg.sink_size), initial_epoch=initial,
        )
    else:
        model.fit(
            int(cfg.epochs), b.train, b.valid, valid_frequency=vf, callbacks=callbacks,
            dataset_sink_mode=sink, sink_size=int(cfg.sink_size), initial_epoch=initial,
        )
    preemption.check_stopped(callbacks)  # a SLURM signal cut training short: no eval, no result
    extra: dict[str, Any] = {"train_s": round(time.perf_counter() - t0, 3),
                             "initial_epoch": line.initial_epoch}
    fit_trainer = model.trainer
    logged = dict(fit_trainer.logged_metrics) if fit_trainer is not None else {}
    found = [logged[k] for k in _LIGHTNING_THROUGHPUT if k in logged]
    if found:
        extra[THROUGHPUT_KEY] = float(found[0])
    extra["log_dir"] = _log_dir(model, b.trainer_kwargs)
    metrics: dict[str, Any] = {}
    if b.valid is not None and b.metrics:
        metrics = model.eval(b.valid)
    return metrics, extra


def _run_eval(cfg: DictConfig, b: Built) -> tuple[dict, dict]:
    path = cfg.get("ckpt_path")
    if not path:
        raise ConfigError("lit-amp: mode=eval needs a checkpoint: ckpt_path=<file.ckpt>.")
    if b.valid is None or not b.metrics:
        raise ConfigError("lit-amp: mode=eval needs evaluation data and model.metrics.")
    load_network(str(path), b.network)
    metrics = b.model.eval(b.valid)
    return metrics, {"ckpt_path": str(path), "log_dir": _log_dir(b.model, b.trainer_kwargs)}


_ONLINE_GROUPS = {
    "stop": ("max_steps", "max_time", "stop_event", "stop_file", "stop_signals"),
    "checkpoint": ("ckpt_dir", "ckpt_every_n_steps", "ckpt_every_n_seconds",
                   "keep_checkpoint_max", "resume"),
    "publish": ("publish_dir", "publish_every_n_steps", "publish_every_n_seconds",
                "keep_published_max"),
    "validation": ("valid_every_n_steps", "valid_window"),
    "sink": ("dataset_sink_mode", "sink_size"),
}
#: the option group's key that turns it on (a null one leaves the group off)
_ONLINE_SWITCH = {"checkpoint": "ckpt_dir", "publish": "publish_dir",
                  "validation": "valid_every_n_steps"}


def online_arguments(online: dict) -> dict:
    """``online_train`` keyword arguments from the flat ``online`` config group.

    Raises:
        ConfigError: an unknown key, or a cadence set for a group whose folder is null.
    """
    from lit_amp.rec import CheckpointOptions, PublishOptions, StopOptions, ValidationOptions

    rest = dict(online)
    groups = {g: {k: rest.pop(k) for k in keys if k in rest} for g, keys in _ONLINE_GROUPS.items()}
    if rest:
        allowed = sorted(k for keys in _ONLINE_GROUPS.values() for k in keys)
        raise ConfigError(f"lit-amp: unknown online option(s) {sorted(rest)}; allowed: {allowed}")
    kwargs: dict[str, Any] = dict(groups["sink"])
    kwargs["stop"] = StopOptions(**groups["stop"])
    classes = {"checkpoint": CheckpointOptions, "publish": PublishOptions,
               "validation": ValidationOptions}
    for group, cls in classes.items():
        values, switch = groups[group], _ONLINE_SWITCH[group]
        if values.get(switch) is not None:
            kwargs[group] = cls(**values)
        elif any(v is not None for k, v in values.items() if k.endswith(("_steps", "_seconds"))):
            raise ConfigError(f"lit-amp: online.{switch} is null but a {group} cadence is set "
                              f"({values}); set online.{switch} or null the cadence.")
    return kwargs


def _run_online(cfg: DictConfig, b: Built) -> tuple[dict, dict]:
    opts = online_arguments(_plain(cfg.get("online")) or {})
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
        extra[THROUGHPUT_KEY] = summary.records / summary.elapsed_s
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
    """``<out>/result.json``, written atomically on rank 0 (None elsewhere)."""
    if not _is_rank_zero():
        return None
    text = json.dumps(result, indent=2, default=str).encode()
    return Path(atomic_write(out / "result.json", lambda f: f.write(text), fsync=False))


def _result_base(cfg: DictConfig) -> dict:
    return {
        "task_name": str(cfg.task_name),
        "mode": _name(cfg.mode),
        **_job_num(),
        "overrides": _overrides(),
        "amp": _name(cfg.amp.level),
        "boost": _name(cfg.boost.level),
        "optimizer": str(cfg.optimizer.get("_target_")) if cfg.get("optimizer") else None,
        "model": str(cfg.model.get("name", "")),
        "optimized_metric": cfg.get("optimized_metric"),
        "tags": list(cfg.get("tags") or []),
    }


def _report(mode: str, result: dict, path: Path | None) -> None:
    """Print the metrics table and where the logs, checkpoints and result went (rank 0)."""
    metrics, extra = result["metrics"], result
    rows = [(k, v) for k, v in metrics.items() if isinstance(v, (int, float))]
    if THROUGHPUT_KEY in extra:
        rows.append((THROUGHPUT_KEY, float(extra[THROUGHPUT_KEY])))
    rows.append(("wall_s", f"{result['wall_s']:.1f}"))
    _echo(f"\nlit-amp {mode} finished: {result['model']}, amp {result['amp']}, "
          f"boost {result['boost']}")
    _echo(_table(rows))
    if "acc" in metrics:
        _echo(f"test accuracy: {float(metrics['acc']):.4f}")
    _echo(f"logs: {extra.get('log_dir') or result['output_dir']}")
    if result["ckpt_dir"] and mode != "eval":
        _echo(f"checkpoints: {result['ckpt_dir']} (latest: {result['latest_ckpt']})")
    if path is not None:
        _echo(f"result: {path}")


def _execute(cfg: DictConfig) -> float | None:
    if cfg.get("seed") is not None:
        import lightning as L

        L.seed_everything(int(cfg.seed), workers=True, verbose=False)
    mode = _name(cfg.mode)
    out = _output_dir(cfg)
    t0 = time.perf_counter()
    b = build(cfg)
    runner = {"train": _run_train, "eval": _run_eval, "online": _run_online}[mode]
    with ddp_job_scope(), ddp_children_in_job_dir(), spawn_sharing(
        b.trainer_kwargs.get("strategy")
    ):
        metrics, extra = runner(cfg, b)
    metrics = {k: _scalar(v) for k, v in metrics.items()}
    key = cfg.get("optimized_metric")
    value = metrics.get(key) if key else None
    if key and value is None:
        _note(logging.WARNING, "optimized_metric=%r is not among the metrics %s.", key,
              sorted(metrics))
    ckpt_dir, latest = _ckpt_info(b.callbacks)
    result = {
        **_result_base(cfg), "status": "ok", "value": value, "metrics": metrics, **extra,
        "wall_s": round(time.perf_counter() - t0, 3), "output_dir": str(out),
        "ckpt_dir": ckpt_dir, "latest_ckpt": latest,
    }
    _report(mode, result, _write_result(out, result))
    return float(value) if isinstance(value, (int, float)) else None


def run(cfg: DictConfig) -> float | None:
    """Run one job (the task function of ``lit-amp``); returns ``cfg.optimized_metric``.

    In a ``-m`` sweep with ``continue_on_error`` a failing job writes ``status: failed`` and the
    error into its ``result.json`` and returns NaN, so the sweep and its summary go on.

    Args:
        cfg: a config composed from ``conf/``.

    Returns:
        The value of the metric named ``optimized_metric`` (None when absent).

    Raises:
        ConfigError: a configuration lit_amp rejects (outside a ``-m`` sweep that continues
            on errors); any error of the run itself likewise.
    """
    with console_to_log():
        return _run_or_record(cfg)


def _run_or_record(cfg: DictConfig) -> float | None:
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
