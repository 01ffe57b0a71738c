"""The state of every job of a ``lit-amp -m`` sweep, interrupted sweeps and ``--resume``.

A sweep directory holds ``sweep.json`` (the command's overrides and every planned job),
``<job>/job.json`` (a job started) and ``<job>/result.json`` (it ended: ``ok``, ``failed`` or
``interrupted``); :func:`job_states` joins them into ``done``, ``failed``, ``interrupted`` or
``not started``. Within :func:`interruptible` a SIGTERM or SIGINT raises
:class:`SweepInterrupted`: the running job records ``interrupted`` and the sweep stops
(:func:`lit_amp.cli.sweep_summary.interrupted_exit`). ``--resume`` reruns the same sweep
directory and skips the jobs that are done. Imports no torch and no Lightning.

Example:
    >>> states = job_states(
    ...     [{"job_num": 0, "overrides": ["amp=O0"]}, {"job_num": 1, "overrides": ["amp=O2"]}],
    ...     [{"job_num": 0, "status": "ok", "_dir": "0"}], [])
    >>> [(s["_dir"], s["state"]) for s in states]
    [('0', 'done'), ('1', 'not started')]
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from lit_amp._signals import SignalRecorder
from lit_amp.cli.schema import ConfigError

__all__ = [
    "JOB_FILE",
    "MANIFEST",
    "RESUME_FLAG",
    "STATES",
    "SweepInterrupted",
    "find_sweep",
    "interruptible",
    "job_states",
    "load_jobs",
    "load_manifest",
    "state_counts",
    "take_resume_flag",
]

#: the sweep's list of jobs, in the sweep directory
MANIFEST = "sweep.json"
#: a job's start marker, in its directory
JOB_FILE = "job.json"
#: ``lit-amp -m ... --resume``: run only the jobs of the sweep that are not done
RESUME_FLAG = "--resume"
#: the states of a job, in the order the summary counts them
STATES = ("done", "failed", "interrupted", "not started")
_STATUS_STATE = {"ok": "done", "failed": "failed", "interrupted": "interrupted"}

#: set by ``lit-amp --resume`` for the sweep it runs (read by the task and the callback)
resume_active = False
#: the directory of the sweep running in this process (set when it starts)
current_sweep_dir: Path | None = None


class SweepInterrupted(BaseException):  # noqa: N818 - it is not an error of the program
    """A SIGTERM or SIGINT reached ``lit-amp`` during a ``-m`` sweep.

    A ``BaseException``, like ``KeyboardInterrupt``: a job's ``except Exception`` (a sweep
    that continues on errors) does not swallow it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        """``SIGTERM`` / ``SIGINT``."""
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return str(self.signum)


def _write_json(path: Path, data: Any) -> None:
    """Write a small JSON file atomically (a temp file of lit_amp's prefix, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-lit_amp-" + path.name + ".", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, default=str)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------- the sweep's list of jobs


def planned_jobs(config: Any) -> list[dict] | None:
    """Every job a sweep will launch, ``{"job_num", "overrides"}``; None if not known.

    Known for Hydra's basic sweeper (``-m a=1,2 b=x,y``: the product, in its order); other
    sweepers (Optuna, ...) choose their jobs as they go.
    """
    target = str(config.hydra.sweeper.get("_target_", ""))
    if not target.endswith("BasicSweeper"):
        return None
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = config.hydra.sweeper.get("params") or {}
    lines = [f"{k}={v}" for k, v in params.items()] + [str(o) for o in config.hydra.overrides.task]
    try:
        overrides = OverridesParser.create().parse_overrides(lines)
        batches = BasicSweeper.split_arguments(overrides, None)
    except Exception:  # noqa: BLE001 - what Hydra cannot parse here it reports itself
        return None
    jobs = [list(job) for batch in batches for job in batch]
    return [{"job_num": i, "overrides": job} for i, job in enumerate(jobs)]


def load_manifest(sweep_dir: str | Path) -> dict | None:
    """``<sweep_dir>/sweep.json`` (None when missing or unreadable)."""
    data = _read_json(Path(sweep_dir) / MANIFEST)
    return data if isinstance(data, dict) and isinstance(data.get("jobs"), list) else None


def start_sweep(config: Any) -> None:
    """At the start of a sweep: remember its directory and write ``sweep.json`` (a resumed
    sweep keeps its start time and adds the time it was resumed)."""
    global current_sweep_dir
    sweep_dir = Path(str(config.hydra.sweep.dir))
    current_sweep_dir = sweep_dir
    jobs = planned_jobs(config)
    old = load_manifest(sweep_dir)
    if jobs is None:
        return
    manifest = {"overrides": [str(o) for o in config.hydra.overrides.task], "jobs": jobs,
                "started": (old or {}).get("started", time.strftime("%Y-%m-%d %H:%M:%S"))}
    if old is not None:
        manifest["resumed"] = [*old.get("resumed", []), time.strftime("%Y-%m-%d %H:%M:%S")]
    _write_json(sweep_dir / MANIFEST, manifest)


def start_job(config: Any) -> None:
    """At the start of a job of a sweep: ``<job dir>/job.json`` (its number and process)."""
    out = Path(str(config.hydra.runtime.output_dir))
    _write_json(out / JOB_FILE, {
        "job_num": int(config.hydra.job.num),
        "overrides": [str(o) for o in config.hydra.overrides.task],
        "pid": os.getpid(), "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    })


# ---------------------------------------------------------------- states


def load_jobs(sweep_dir: str | Path) -> list[dict]:
    """Every ``<sweep_dir>/**/job.json``, with ``_dir`` (relative to ``sweep_dir``)."""
    root = Path(sweep_dir)
    rows = []
    for path in root.rglob(JOB_FILE) if root.is_dir() else []:
        data = _read_json(path)
        if isinstance(data, dict):
            data["_dir"] = str(path.parent.relative_to(root))
            rows.append(data)
    return rows


def _alive(marker: dict) -> bool:
    """Whether the process that started a job is still running (on this host)."""
    pid = marker.get("pid")
    if not isinstance(pid, int) or marker.get("host") != socket.gethostname():
        return False
    if pid == os.getpid():
        return False  # this process: the job is not running any more when a summary is made
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError, OSError):
        return False
    return True


def _key(row: dict) -> tuple:
    return tuple(str(o) for o in row.get("overrides") or [])


def job_states(planned: Sequence[dict] | None, results: Sequence[dict],
               started: Sequence[dict]) -> list[dict]:
    """One row per job: its ``result.json`` (or what is known) plus ``state``.

    Args:
        planned: the sweep's jobs (``sweep.json``), None when unknown.
        results: the jobs' ``result.json`` rows (:func:`lit_amp.cli.sweep_summary.load_results`).
        started: the jobs' ``job.json`` rows (:func:`load_jobs`).

    Returns:
        Rows in job order: a result row gets ``state`` ``done``, ``failed`` or
        ``interrupted``; a started job without a result ``interrupted`` (``running`` while
        its process lives); a planned job that never started ``not started``.
    """
    by_num: dict[int, dict] = {}
    by_key: dict[tuple, dict] = {}
    extra: list[dict] = []
    for r in results:
        row = {**r, "state": _STATUS_STATE.get(str(r.get("status")), "failed")}
        num = r.get("job_num")
        if isinstance(num, int):
            by_num[num] = row
        else:
            by_key.setdefault(_key(r), row)
            extra.append(row)
    for m in started:
        num = m.get("job_num")
        if not isinstance(num, int) or num in by_num or _key(m) in by_key:
            continue
        by_num[num] = {"_dir": m.get("_dir", str(num)), "job_num": num,
                       "overrides": m.get("overrides") or [],
                       "status": "interrupted", "value": None,
                       "state": "running" if _alive(m) else "interrupted"}
    if planned is None:
        rows = [by_num[n] for n in sorted(by_num)]
        return rows + [r for r in extra if r not in rows]
    out, used = [], set()
    for job in planned:
        num = int(job["job_num"])
        row = by_num.get(num) or by_key.get(_key(job))
        if row is None:
            row = {"_dir": str(num), "job_num": num, "overrides": list(job["overrides"]),
                   "status": "not started", "value": None, "state": "not started"}
        used.add(id(row))
        out.append(row)
    return out + [r for r in [*by_num.values(), *extra] if id(r) not in used]


def state_counts(rows: Sequence[dict]) -> dict[str, int]:
    """``{state: number of jobs}`` for the states that occur, in :data:`STATES` order.

    Example:
        >>> state_counts([{"state": "done"}, {"state": "not started"}, {"state": "done"}])
        {'done': 2, 'not started': 1}
    """
    counts: dict[str, int] = {}
    for s in (*STATES, "running"):
        n = sum(1 for r in rows if r.get("state") == s)
        if n:
            counts[s] = n
    return counts


def incomplete_line(rows: Sequence[dict]) -> str | None:
    """``sweep incomplete: ...; to run what is missing: the same command with --resume``."""
    counts = state_counts(rows)
    if not any(s in counts for s in ("interrupted", "not started", "running")):
        return None
    parts = ", ".join(f"{n} {s}" for s, n in counts.items())
    return (f"sweep incomplete ({parts} of {len(rows)} jobs); to run what is missing, run the "
            f"same command again with {RESUME_FLAG}")


# ---------------------------------------------------------------- --resume


def take_resume_flag(argv: Sequence[str]) -> tuple[list[str], bool]:
    """Remove ``--resume`` from a command line; say whether it was there.

    Raises:
        ConfigError: ``--resume`` without ``-m`` (it resumes a sweep).

    Example:
        >>> take_resume_flag(["-m", "amp=O0,O2", "--resume"])
        (['-m', 'amp=O0,O2'], True)
    """
    args = [a for a in argv if a != RESUME_FLAG]
    if len(args) == len(argv):
        return args, False
    if not is_multirun(args):
        raise ConfigError(
            f"lit-amp: {RESUME_FLAG} resumes a sweep: use it with -m and the sweep's overrides "
            f"(lit-amp -m amp=O0,O2 seed=0,1 {RESUME_FLAG})."
        )
    return args, True


def is_multirun(argv: Sequence[str]) -> bool:
    """Whether a command line runs a ``-m`` sweep."""
    return any(a in ("-m", "--multirun") or a == "hydra.mode=MULTIRUN" for a in argv)


def task_overrides(argv: Sequence[str]) -> list[str]:
    """The overrides of a command line that Hydra records as the task's (not ``hydra.*``)."""
    out = []
    for a in argv:
        if "=" not in a or a.startswith("-"):
            continue
        if a.split("=", 1)[0].lstrip("+~").startswith("hydra"):
            continue
        out.append(a)
    return out


def _log_dir(argv: Sequence[str]) -> Path:
    for a in argv:
        key, _, value = a.partition("=")
        if key.lstrip("+") == "paths.log_dir":
            return Path(value.strip("'\""))
    return Path(os.environ.get("LIT_AMP_LOG_DIR") or "runs")


def find_sweep(argv: Sequence[str]) -> Path | None:
    """The newest sweep directory under ``<log_dir>/*/multirun/`` started with ``argv``'s
    overrides (its ``sweep.json``), or None."""
    wanted = task_overrides(argv)
    found = []
    for manifest in _log_dir(argv).glob(f"*/multirun/*/{MANIFEST}"):
        data = load_manifest(manifest.parent)
        if data is not None and data.get("overrides") == wanted:
            found.append((manifest.stat().st_mtime, manifest.parent))
    return max(found)[1] if found else None


def resume_argv(argv: Sequence[str]) -> tuple[list[str], str]:
    """``argv`` with the directory of the sweep to resume; and the note to print.

    Raises:
        ConfigError: no ``hydra.sweep.dir`` and no earlier sweep of these overrides, or a
            ``hydra.sweep.dir`` whose sweep was started with other overrides.
    """
    given = [a for a in argv if a.split("=", 1)[0] == "hydra.sweep.dir"]
    if given:
        where = given[-1].split("=", 1)[1].strip("'\"")
        old = load_manifest(where)
        if old is not None and old.get("overrides") != task_overrides(argv):
            raise ConfigError(
                f"lit-amp: {RESUME_FLAG}: the sweep in {where!r} was started with other "
                f"overrides ({' '.join(map(str, old.get('overrides') or []))}); run that "
                f"command with {RESUME_FLAG}, or start a new sweep (another hydra.sweep.dir)."
            )
        return list(argv), f"lit-amp: {RESUME_FLAG}: resuming the sweep in {where}"
    found = find_sweep(argv)
    if found is None:
        raise ConfigError(
            f"lit-amp: {RESUME_FLAG}: no earlier sweep with these overrides "
            f"({' '.join(task_overrides(argv)) or 'none'}) under "
            f"{_log_dir(argv)}/*/multirun/; name its directory: hydra.sweep.dir=<dir>."
        )
    note = f"lit-amp: {RESUME_FLAG}: resuming the sweep in {found}"
    return [*argv, f"hydra.sweep.dir={found}"], note


def _job() -> tuple[Path, int, list[str]] | None:
    """This job's ``(output dir, number, overrides)`` from Hydra's runtime, None outside one."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    try:
        return (Path(str(hc.runtime.output_dir)), int(hc.job.num),
                [str(o) for o in hc.overrides.task])
    except (TypeError, ValueError, AttributeError):
        return None


def in_sweep() -> bool:
    """Whether this process runs a job of a ``-m`` sweep."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def done_result() -> dict | None:
    """Resuming: the ``result.json`` of this job when it is done with the same overrides."""
    job = _job() if resume_active else None
    if job is None:
        return None
    out, _, overrides = job
    result = _read_json(out / "result.json")
    if isinstance(result, dict) and result.get("status") == "ok" and \
            [str(o) for o in result.get("overrides") or []] == overrides:
        return result
    return None


def record_interrupted(config: Any, exc: SweepInterrupted) -> None:
    """Write ``status: interrupted`` into the job's ``result.json`` (the sweep stops)."""
    job = _job()
    if job is None:
        return
    out, num, overrides = job
    _write_json(out / "result.json", {
        "task_name": str(config.get("task_name", "")), "job_num": num, "overrides": overrides,
        "status": "interrupted", "value": None, "optimized_metric": config.get("optimized_metric"),
        "error": f"interrupted by {exc.name}", "output_dir": str(out),
    })


# ---------------------------------------------------------------- signals


def _raise(signum: int) -> None:
    # the next signal ends the process at once (a user pressing Ctrl-C twice)
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, signal.SIG_DFL)
    raise SweepInterrupted(signum)


@contextlib.contextmanager
def interruptible(enabled: bool) -> Iterator[None]:
    """Within the block SIGTERM and SIGINT raise :class:`SweepInterrupted` (main thread only;
    a handler someone else installed is kept)."""
    signals = SignalRecorder((signal.SIGTERM, signal.SIGINT), _raise)
    if enabled:
        signals.install(over_defaults_only=True)
    try:
        yield
    finally:
        signals.restore()
