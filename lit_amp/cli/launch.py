"""DDP and Hydra launcher glue of ``lit-amp`` (scoped context managers around one job).

- :func:`ddp_children_in_job_dir`: Lightning's DDP script launcher re-runs ``sys.argv`` for the
  worker processes; inside a ``-m`` sweep that re-launches the whole sweep (Lightning #11617,
  Hydra #2070). For the job only, Lightning's ``_hydra_subprocess_cmd`` is replaced by
  :func:`hydra_subprocess_cmd`, which runs the job's own overrides in the job's directory.
- :func:`ddp_job_scope`: a job that launched its own workers leaves no process group or
  ``MASTER_PORT``/``LOCAL_RANK`` environment behind for the next job of a sweep.
- :func:`spawn_sharing`: ``ddp_spawn`` workers share tensors through files (``file_system``).
- :func:`torchrun_trainer_kwargs`: under torchrun, ``devices``/``num_nodes`` checked against
  the processes torchrun started (a clear error instead of Lightning's traceback).

Imports no torch and no Lightning at module level.

Example:
    >>> config_flags(["-cn", "x", "amp=O2", "--config-dir=/c"])
    ['-cn', 'x', '--config-dir=/c']
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from lit_amp.cli.schema import ConfigError

log = logging.getLogger(__name__)

__all__ = [
    "config_flags",
    "hydra_subprocess_cmd",
    "ddp_job_scope",
    "ddp_children_in_job_dir",
    "spawn_sharing",
    "torchrun_trainer_kwargs",
]

_SKIP_HYDRA_OVERRIDES = (
    "hydra.run", "hydra.sweep", "hydra.mode", "hydra/launcher", "hydra.launcher",
    "hydra/sweeper", "hydra.sweeper", "hydra.job.name", "hydra.output_subdir", "hydra.callbacks",
)
_CONFIG_FLAGS = ("-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir")

#: what Lightning's DDP script launcher writes into the launching process's environment
_DDP_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE", "RANK",
            "LOCAL_WORLD_SIZE", "GROUP_RANK")


def config_flags(argv: Sequence[str]) -> list[str]:
    """Hydra's config-path / config-name / config-dir flags of a command line, with values.

    Args:
        argv: the command line without the program.

    Returns:
        The flags in order (``-cn x`` as two items, ``--config-dir=/c`` as one).
    """
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


def hydra_subprocess_cmd(local_rank: int) -> tuple[list[str], str]:
    """Lightning's command for DDP worker processes, fixed for Hydra sweeps.

    Lightning re-runs ``sys.argv`` with ``hydra.run.dir=<run dir>``; inside a ``-m`` sweep that
    re-launches the whole sweep (Lightning #11617, Hydra #2070). This runs the job's own
    overrides in RUN mode with the job's output directory.

    Args:
        local_rank: the worker's local rank (names its Hydra job).

    Returns:
        ``(command, cwd)`` as Lightning's ``_hydra_subprocess_cmd`` returns them.
    """
    from hydra.core.hydra_config import HydraConfig

    import __main__

    hc = HydraConfig.get()
    if __main__.__spec__ is None:
        command = [sys.executable, os.path.abspath(sys.argv[0])]
    else:
        command = [sys.executable, "-m", __main__.__spec__.name]
    command += config_flags(sys.argv[1:])
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


@contextlib.contextmanager
def ddp_job_scope() -> Iterator[None]:
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
        from lit_amp._runtime import dist_ready  # here: this module imports no torch

        if dist_ready():
            import torch.distributed as dist

            dist.destroy_process_group()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def ddp_children_in_job_dir() -> Iterator[None]:
    """Route Lightning's popen DDP launcher through :func:`hydra_subprocess_cmd` (scoped)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        yield
        return
    import lightning.fabric.strategies.launchers.subprocess_script as fab
    import lightning.pytorch.strategies.launchers.subprocess_script as pl

    saved = (fab._hydra_subprocess_cmd, pl._hydra_subprocess_cmd)
    fab._hydra_subprocess_cmd = pl._hydra_subprocess_cmd = hydra_subprocess_cmd
    try:
        yield
    finally:
        fab._hydra_subprocess_cmd, pl._hydra_subprocess_cmd = saved


def _is_spawn(strategy: Any) -> bool:
    if isinstance(strategy, str):
        return "spawn" in strategy
    return getattr(strategy, "_start_method", None) == "spawn"


@contextlib.contextmanager
def spawn_sharing(strategy: Any) -> Iterator[None]:
    """Share tensors with spawned DDP workers through files, for the run only.

    torch's default ``file_descriptor`` strategy fails on some machines (sandboxes) when a
    DataLoader's seeded ``torch.Generator`` is pickled to the workers ("unable to resize file");
    ``file_system`` works everywhere Linux shared memory does.

    Args:
        strategy: the Trainer's ``strategy`` argument (a name or a Strategy); only spawn
            strategies change the sharing strategy.
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


def _count_devices(devices: Any) -> Any:
    """The number of devices an int, a list of indices or a string ("2", "0,1") names."""
    if isinstance(devices, (list, tuple)):
        return len(devices)
    if isinstance(devices, str) and "," in devices:
        return len([d for d in devices.split(",") if d.strip()])
    if isinstance(devices, str) and devices.strip().isdigit():
        return int(devices)
    return devices


def _torchrun_world() -> tuple[int, int] | None:
    """``(processes per node, nodes)`` of the torchrun job this process belongs to, else None."""
    if os.environ.get("TORCHELASTIC_RUN_ID") is None:
        return None
    try:
        local, world = int(os.environ["LOCAL_WORLD_SIZE"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    return (local, world // local) if local > 0 and world % local == 0 else None


def torchrun_trainer_kwargs(kw: dict) -> dict:
    """The Trainer arguments of a run that torchrun started, checked against torchrun's world.

    Lightning joins the processes torchrun starts (``TorchElasticEnvironment``) but only checks
    ``devices * num_nodes == WORLD_SIZE``, as a traceback from inside ``fit``. Here, under
    torchrun, ``devices: auto`` becomes torchrun's processes per node, and ``devices`` and
    ``num_nodes`` must equal ``--nproc-per-node`` and ``--nnodes``. Outside torchrun ``kw`` is
    returned unchanged.

    torchrun's ``--max-restarts`` with its shared rendezvous store (the default) can hand a
    restarted group the previous attempt's addresses (pytorch#135712; the restart then fails
    with "Connection refused"): a warning says to set ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``.

    Args:
        kw: the ``trainer={...}`` arguments (``devices``, ``num_nodes``).

    Returns:
        ``kw``, with ``devices`` filled in under torchrun when it was ``auto``/``-1``.

    Raises:
        ConfigError: ``trainer.devices`` or ``trainer.num_nodes`` differs from torchrun's.

    Example:
        >>> torchrun_trainer_kwargs({"devices": 2, "num_nodes": 1})  # not under torchrun
        {'devices': 2, 'num_nodes': 1}
    """
    found = _torchrun_world()
    if found is None:
        return kw
    local, nodes = found
    devices, num_nodes = kw.get("devices", "auto"), kw.get("num_nodes", 1)
    if devices in ("auto", -1, "-1"):
        kw = {**kw, "devices": local}
        devices = local
    if _count_devices(devices) != local or num_nodes != nodes:
        raise ConfigError(
            f"lit-amp: torchrun started {local * nodes} process(es), {local} per node on "
            f"{nodes} node(s) (--nproc-per-node={local} --nnodes={nodes}), but "
            f"trainer.devices={devices!r} trainer.num_nodes={num_nodes!r}; set "
            f"trainer.devices={local} trainer.num_nodes={nodes} (or trainer.devices=auto)."
        )
    restarts = os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")
    if (restarts not in ("", "0") and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
            and os.environ.get("RANK", "0") == "0"):
        log.warning(
            "torchrun --max-restarts=%s shares its rendezvous store with the workers: a "
            "restarted group can read the previous attempt's addresses and fail to connect "
            "(pytorch#135712). Start torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in its "
            "environment for restarts that resume.", restarts)
    return kw
