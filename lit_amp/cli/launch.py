"""DDP and Hydra launcher glue of ``lit-amp`` (scoped context managers around one job).

- :func:`ddp_children_in_job_dir`: Lightning's DDP script launcher re-runs ``sys.argv`` for the
  worker processes; inside a ``-m`` sweep that re-launches the whole sweep (Lightning #11617,
  Hydra #2070). For the job only, Lightning's ``_hydra_subprocess_cmd`` is replaced by
  :func:`hydra_subprocess_cmd`, which runs the job's own overrides in the job's directory.
- :func:`ddp_job_scope`: a job that launched its own workers leaves no process group or
  ``MASTER_PORT``/``LOCAL_RANK`` environment behind for the next job of a sweep.
- :func:`spawn_sharing`: ``ddp_spawn`` workers share tensors through files (``file_system``).

Imports no torch and no Lightning at module level.

Example:
    >>> config_flags(["-cn", "x", "amp=O2", "--config-dir=/c"])
    ['-cn', 'x', '--config-dir=/c']
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from lit_amp._runtime import dist_ready

__all__ = [
    "config_flags",
    "hydra_subprocess_cmd",
    "ddp_job_scope",
    "ddp_children_in_job_dir",
    "spawn_sharing",
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
