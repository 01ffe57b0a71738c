"""The submit side of ``hydra/launcher=slurm``: check the request, submit, watch the jobs.

hydra-submitit-launcher submits a sweep as one job array and waits for every result without a
bound; lit_amp's launcher (``hydra_plugins.lit_amp_slurm``) runs :func:`launch` instead:
:func:`preflight` refuses, before anything is submitted, a time limit or a partition the
cluster cannot run (``sinfo``); :func:`watch` polls ``squeue``, cancels a job pending too long
and reports one that left the queue without a result; :func:`record_lost` marks such a job
failed and lets the sweep go on (``continue_on_error``); :func:`forward_signal_setup` makes the
batch shell forward submitit's signal to ``srun``. Details and tests: docs/clusters.md.
Imports no torch.
"""

from __future__ import annotations

import getpass
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hydra.errors import CompactHydraException

from lit_amp.cli.schema import ConfigError

__all__ = ["SlurmJobError", "forward_signal_setup", "gpus_of", "launch",
           "preflight", "record_lost", "watch"]

log = logging.getLogger(__name__)


class SlurmJobError(CompactHydraException):
    """A SLURM job of a sweep that cannot give a result (Hydra prints the message)."""


def _run(argv: list[str], what: str) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise ConfigError(
            f"lit-amp: hydra/launcher=slurm needs SLURM's commands, but {argv[0]} was not "
            "found: run lit-amp -m on a SLURM login node (sbatch, squeue, sinfo on the PATH)."
        ) from None
    except subprocess.TimeoutExpired:
        raise ConfigError(f"lit-amp: {what}: {argv[0]} did not answer within 60 s; is the "
                          "SLURM controller up?") from None
    if out.returncode != 0:
        raise ConfigError(f"lit-amp: {what}: {' '.join(argv)} failed: {out.stderr.strip()}")
    return out.stdout


def gpus_of(gres: str) -> int:
    """The GPUs of a node from ``sinfo``'s GRES column.

    Example:
        >>> gpus_of("gpu:4"), gpus_of("gpu:a100:8(S:0-1),shard:2"), gpus_of("(null)")
        (4, 8, 0)
    """
    total = 0
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def _partitions() -> tuple[dict[str, list[tuple[int, int]]], str | None]:
    """``{partition: [(CPUs, GPUs) of each node]}`` and the default partition."""
    parts: dict[str, list[tuple[int, int]]] = {}
    default = None
    for line in _run(["sinfo", "-h", "-N", "-o", "%P|%c|%G"], "reading the partitions"
                     ).splitlines():
        name, cpus, gres = (line.split("|") + ["", ""])[:3]
        if name.endswith("*"):
            name = default = name[:-1]
        digits = "".join(ch for ch in cpus if ch.isdigit())
        parts.setdefault(name, []).append((int(digits or 0), gpus_of(gres)))
    return parts, default


def _trainer(config: Any, key: str) -> Any:
    try:
        return config.trainer.get(key)
    except Exception:  # noqa: BLE001 - a config without a trainer node
        return None


def _check_time_limit(params: dict) -> None:
    """Refuse a time limit SLURM would not keep and a signal lead that covers all of it.

    SLURM reads ``--time=-1`` (and ``0``) as no limit, so ``timeout_min`` must be an int >= 1.
    SLURM sends submitit's signal ``signal_delay_s`` before the limit; a lead of the whole
    limit or more signals every start at once: the job trains a step, is requeued, and
    submitit gives up after ``max_num_timeout`` such starts.

    Args:
        params: the launcher's resolved options (``timeout_min``, ``signal_delay_s``).

    Raises:
        ConfigError: naming the key, its value and what is allowed.

    Example:
        >>> _check_time_limit({"timeout_min": 120, "signal_delay_s": 120})
    """
    limit, lead = params.get("timeout_min"), params.get("signal_delay_s")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)
                              or limit < 1):
        raise ConfigError(
            f"lit-amp: hydra.launcher.timeout_min={limit!r} is not a time limit (SLURM reads "
            "--time=-1 or 0 as no limit, and a requeued job would never be stopped before "
            "its backup); allowed: an int >= 1 (minutes).")
    if lead is None:
        return
    if not isinstance(lead, int) or isinstance(lead, bool) or lead < 0:
        raise ConfigError(
            f"lit-amp: hydra.launcher.signal_delay_s={lead!r} is not a lead time; allowed: an "
            "int >= 0 (seconds before the time limit).")
    if limit is not None and lead >= limit * 60:
        raise ConfigError(
            f"lit-amp: hydra.launcher.signal_delay_s={lead} is not shorter than "
            f"hydra.launcher.timeout_min={limit} ({limit * 60} s): every start of the job "
            "would get SLURM's signal at once, train a step and be requeued until submitit "
            f"gives up; allowed: signal_delay_s < {limit * 60} (leave at least one step and "
            "one backup write), or a larger timeout_min.")


def preflight(params: dict, config: Any = None) -> None:
    """Check the launcher's request against the partition before anything is submitted.

    Args:
        params: the launcher's resolved options (``partition``, ``nodes``, ``tasks_per_node``,
            ``cpus_per_task``, ``gpus_per_node``).
        config: the sweep's config (its ``trainer.devices`` / ``num_nodes`` are named in the
            messages).

    Raises:
        ConfigError: the partition does not exist; a node of it has fewer CPUs than
            ``tasks_per_node x cpus_per_task`` or fewer GPUs than ``gpus_per_node``; it has
            fewer nodes than ``nodes``; ``timeout_min`` is not an int >= 1 (SLURM reads
            ``--time=-1`` or ``0`` as no limit) or ``signal_delay_s`` is negative or not
            shorter than the limit (checked first, without asking SLURM); SLURM's commands
            are missing or fail.
    """
    _check_time_limit(params)
    parts, default = _partitions()
    partition = params.get("partition")
    if partition is not None and partition not in parts:
        raise ConfigError(
            f"lit-amp: hydra.launcher.partition={partition!r} is not a partition of this "
            f"cluster; allowed: {', '.join(sorted(parts)) or 'none (sinfo lists none)'}.")
    name = partition or default
    if name is None or name not in parts:
        raise ConfigError("lit-amp: this cluster has no default partition: set "
                          f"hydra.launcher.partition to one of {', '.join(sorted(parts))}.")
    nodes = parts[name]
    devices = _trainer(config, "devices")
    tasks, per_task = int(params.get("tasks_per_node") or 1), int(params.get("cpus_per_task") or 1)
    cpus = max(c for c, _ in nodes)
    if tasks * per_task > cpus:
        raise ConfigError(
            f"lit-amp: trainer.devices={devices} asks for {tasks} SLURM tasks per node "
            f"(hydra.launcher.tasks_per_node) x hydra.launcher.cpus_per_task={per_task} = "
            f"{tasks * per_task} CPUs, but the nodes of partition {name!r} have at most {cpus}; "
            f"allowed: trainer.devices <= {cpus // per_task} with cpus_per_task={per_task}.")
    gpus = int(params.get("gpus_per_node") or 0)
    most = max(g for _, g in nodes)
    if gpus > most:
        raise ConfigError(
            f"lit-amp: trainer.devices={devices} asks for {gpus} GPUs per node "
            f"(hydra.launcher.gpus_per_node, trainer.accelerator="
            f"{_trainer(config, 'accelerator')}), but the nodes of partition {name!r} have at "
            f"most {most}; allowed: trainer.devices <= {most}"
            + (", or trainer.accelerator=cpu on CPU nodes." if most == 0 else "."))
    want = int(params.get("nodes") or 1)
    if want > len(nodes):
        raise ConfigError(
            f"lit-amp: trainer.num_nodes={_trainer(config, 'num_nodes')} asks for {want} nodes "
            f"(hydra.launcher.nodes), but partition {name!r} has {len(nodes)}; allowed: "
            f"trainer.num_nodes <= {len(nodes)}.")


def launch(launcher: Any, job_overrides: Any, initial_job_idx: int) -> list:
    """hydra-submitit-launcher's ``launch`` with :func:`preflight` before and :func:`watch`
    after the submission; returns each job's Hydra ``JobReturn``."""
    import submitit
    from hydra.core.singleton import Singleton
    from hydra.core.utils import filter_overrides
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf

    from lit_amp.cli.trust import current_grants

    config = launcher.config
    params = dict(launcher.params)
    preflight(params, config)
    loader = launcher.hydra_context.config_loader
    for overrides in job_overrides:  # each job's config, checked here before any is submitted
        loader.load_sweep_config(config, list(overrides))
    launcher.grants = current_grants()  # the node checks its job against the same grants
    executor = submitit.AutoExecutor(cluster="slurm", folder=params.pop("submitit_folder"),
                                     slurm_max_num_timeout=params.pop("max_num_timeout"))
    params["setup"] = [*forward_signal_setup(submitit.JobEnvironment.USR_SIG),
                       *(params.get("setup") or [])]
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()})
    sweep_dir = Path(str(config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    if "mode" in config.hydra.sweep:
        os.chmod(sweep_dir, mode=int(str(config.hydra.sweep.mode), 8))
    log.info(f"Submitit 'slurm' sweep output dir : {sweep_dir}")
    rows = []
    for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
        log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
        rows.append((list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}",
                     Singleton.get_state()))
    jobs = executor.map_array(launcher, *zip(*rows))
    log.info("Submitted SLURM job(s) %s", ", ".join(j.job_id for j in jobs))
    keep_going = bool(config.get("continue_on_error", True))
    lost = watch(jobs, launcher.max_pending_min, keep_going=keep_going)
    returns = []
    for (overrides, _, idx, *_), job in zip(rows, jobs):
        if job.job_id not in lost:
            try:
                returns.append(job.results()[0])
                continue
            except Exception:  # submitit's error (its result says the task failed)
                if not keep_going:
                    raise
                lost[job.job_id] = f"SLURM job {job.job_id} ended with an error"
        returns.append(record_lost(launcher, job, idx, overrides, lost[job.job_id]))
    return returns


def forward_signal_setup(signal_name: str = "USR2") -> list[str]:
    """Lines for the batch script, before submitit's ``srun``: ``srun`` becomes a shell function
    that runs the real one in the background and forwards ``SIG<signal_name>`` to it.

    SLURM's ``scancel --signal=USR2 --batch`` (and ``--full``, and ``#SBATCH --signal=B:...``)
    signals the batch shell only. Without a trap, bash ends on SIGUSR2 and SLURM ends the job
    (the tasks get SIGTERM: no requeue). A trap alone runs only after a foreground command
    ends; with ``srun`` in the background the shell's ``wait`` returns at the signal, the trap
    sends it to ``srun``, and ``srun`` forwards it to every task, as for
    ``scancel --signal=USR2``. The function returns ``srun``'s exit status.

    Example:
        >>> forward_signal_setup("USR2")[0].startswith("srun() {")
        True
    """
    sig = signal_name.upper().removeprefix("SIG")
    return [
        f'srun() {{ command srun "$@" & local pid=$! rc; trap "kill -{sig} $pid 2>/dev/null" '
        f'{sig}; while :; do wait "$pid"; rc=$?; if [ "$rc" -gt 128 ] && kill -0 "$pid" '
        f'2>/dev/null; then continue; fi; break; done; trap - {sig}; return "$rc"; }}'
    ]


def _log_error(job: Any) -> str:
    """What the job's log says went wrong: its last line naming an error (``srun: error: ...:
    tasks 0-1: Killed``, submitit's or Python's), else its last line; "" without a log.

    submitit's own ``job.results()`` is not asked: for a job without a result it waits for the
    job's state from ``sacct``, which a cluster without accounting never gives.
    """
    try:
        lines = [ln.strip() for ln in Path(job.paths.stderr).read_text(errors="replace")
                 .splitlines() if ln.strip()]
    except OSError:
        return ""
    errors = [ln for ln in lines if "error" in ln.lower() or "killed" in ln.lower()]
    return (errors or lines or [""])[-1][:300]


def record_lost(launcher: Any, job: Any, idx: int, overrides: list[str], reason: str) -> Any:
    """A job that ended without a result, in a sweep that continues on errors: write its
    ``result.json`` (``status: failed``, the reason: SLURM's state and its log's error) into
    its directory and return Hydra's ``JobReturn`` of a failed job of such a sweep (NaN, as
    :func:`lit_amp.cli.run.run` returns)."""
    import json
    import math

    from hydra.core.utils import JobReturn, JobStatus
    from omegaconf import open_dict

    error = _log_error(job)
    cfg = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
    with open_dict(cfg):
        cfg.hydra.job.num = idx
        cfg.hydra.job.id = job.job_id
    out = Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
    message = reason + (f"; its log says: {error}" if error else "") + \
        f"; its log: {job.paths.stderr}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps({
        "task_name": str(cfg.get("task_name", "")), "job_num": idx,
        "overrides": [str(o) for o in overrides], "status": "failed", "value": None,
        "optimized_metric": cfg.get("optimized_metric"), "error": message,
        "output_dir": str(out), "slurm_job_id": job.job_id}, indent=2, default=str))
    print(f"lit-amp: {message}; recorded as failed in {out / 'result.json'}", file=sys.stderr,
          flush=True)
    return JobReturn(overrides=list(overrides), cfg=cfg, hydra_cfg=None, working_dir=str(out),
                     task_name=str(cfg.hydra.job.name), status=JobStatus.COMPLETED,
                     _return_value=math.nan)


def _queue() -> dict[str, tuple[str, str]]:
    """``{job id: (state, reason)}`` of this user's jobs in SLURM's queue."""
    out = _run(["squeue", "-h", "-r", "-u", getpass.getuser(), "-o", "%i|%T|%r"],
               "watching the jobs")
    rows = (line.split("|") for line in out.splitlines() if line.count("|") == 2)
    return {job: (state, reason) for job, state, reason in rows}


def _has_result(job: Any) -> bool:
    tasks = [job.task(k) for k in range(job.num_tasks)] if job.num_tasks > 1 else [job]
    return all(t.paths.result_pickle.exists() for t in tasks)


def _final_state(job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                         text=True, timeout=60)
    fields = dict(f.split("=", 1) for f in out.stdout.split() if "=" in f)
    if not fields:
        return "unknown: SLURM no longer lists it"
    return f"{fields.get('JobState')}, reason {fields.get('Reason')}, exit code " \
           f"{fields.get('ExitCode')}"


def watch(jobs: list, max_pending_min: float | None, poll_s: float = 1.0,
          notice_s: float = 60.0, grace_s: float = 30.0,
          keep_going: bool = False) -> dict[str, str]:
    """Wait until every job has its result, within bounds SLURM cannot break.

    Args:
        jobs: submitit jobs.
        max_pending_min: minutes a job may stay pending (None: no bound).
        poll_s: seconds between two looks at the queue.
        notice_s: seconds between two notices about a pending job.
        grace_s: seconds a job that left the queue gets to show its result file.
        keep_going: a job that left the queue without a result is noted and the others are
            waited for (a sweep with ``continue_on_error``); False: it raises at once.

    Returns:
        ``{job id: why}`` of the jobs that ended without a result (only with ``keep_going``).

    Raises:
        SlurmJobError: a job stayed pending longer than ``max_pending_min`` (it is cancelled;
            the other jobs go on), or (without ``keep_going``) left the queue without a result.
    """
    pending: dict[str, float] = {}
    gone: dict[str, float] = {}
    told: dict[str, float] = {}
    lost: dict[str, str] = {}
    while True:
        waiting = [j for j in jobs if j.job_id not in lost and not _has_result(j)]
        if not waiting:
            return lost
        queue, now = _queue(), time.monotonic()
        for job in waiting:
            row = queue.get(job.job_id)
            if row is None:
                if now - gone.setdefault(job.job_id, now) > grace_s and not _has_result(job):
                    why = (f"SLURM job {job.job_id} ended without a result "
                           f"({_final_state(job.job_id)})")
                    if not keep_going:
                        raise SlurmJobError(f"lit-amp: {why}; its log: {job.paths.stderr}")
                    lost[job.job_id] = why
                    others = [j.job_id for j in waiting if j is not job]
                    print(f"lit-amp: {why}; continue_on_error: the sweep goes on"
                          + (f" (waiting for job(s) {', '.join(others)})" if others else ""),
                          file=sys.stderr, flush=True)
                continue
            gone.pop(job.job_id, None)
            if row[0] != "PENDING":
                pending.pop(job.job_id, None)
                continue
            waited = now - pending.setdefault(job.job_id, now)
            if max_pending_min is not None and waited > float(max_pending_min) * 60:
                subprocess.run(["scancel", job.job_id], capture_output=True, timeout=60)
                others = [j.job_id for j in jobs if j is not job]
                raise SlurmJobError(
                    f"lit-amp: SLURM job {job.job_id} stayed pending for {waited:.0f} s "
                    f"(reason: {row[1]}), longer than hydra.launcher.max_pending_min="
                    f"{max_pending_min}; it was cancelled"
                    + (f" (job(s) {', '.join(others)} go on)" if others else "")
                    + ". Allowed: a larger max_pending_min, or null to wait without bound.")
            if waited - told.get(job.job_id, 0.0) >= notice_s:
                told[job.job_id] = waited
                print(f"lit-amp: SLURM job {job.job_id} pending for {waited:.0f} s (reason: "
                      f"{row[1]}); hydra.launcher.max_pending_min={max_pending_min}",
                      file=sys.stderr, flush=True)
        time.sleep(poll_s)
