"""A one-node SLURM cluster in a temporary folder: MUNGE, slurmctld and slurmd of the tests.

:class:`SlurmCluster` writes a ``slurm.conf`` (one node named after ``hostname -s`` with 2
CPUs, a ``debug`` partition oversubscribed up to 8 jobs per CPU and a ``down`` partition that
never starts a job; state, spool, logs, MUNGE key and socket inside the folder), starts
``munged``, ``slurmctld`` and ``slurmd`` in the foreground as child processes, waits (bounded)
until ``sinfo`` shows the node idle, and :meth:`SlurmCluster.stop` cancels what is still queued
and ends exactly those three processes, by pid. Clients reach it through ``SLURM_CONF``
(:attr:`SlurmCluster.env`). A requeued job waits ``cred_expire`` = 5 s before it starts again
(SLURM's default is 120 s) and a job that ignores SIGTERM is killed after ``KillWait`` = 15 s.

By hand (prints the ``SLURM_CONF`` to export; Ctrl-C or SIGTERM stops the cluster)::

    python -m tests.cluster.slurm_cluster
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

#: the commands the cluster and its clients need (Debian: slurm-wlm and munge)
COMMANDS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "sinfo", "scontrol",
            "scancel")
#: CPUs of the one node (what the tests size their jobs for)
NODE_CPUS = 2


def missing_reason() -> str | None:
    """Why no cluster can run here (None when one can)."""
    missing = [c for c in COMMANDS if shutil.which(c) is None]
    if missing:
        return (f"SLURM is not installed (missing {', '.join(missing)}); run "
                "tests/cluster/install_slurm.sh as root (make test does)")
    if os.geteuid() != 0:
        return "the test cluster's slurmd runs jobs as root: run the slurm tests as root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _conf(root: Path, node: str) -> str:
    sock = root / "munge" / "munge.socket"
    return "\n".join([
        "ClusterName=litamp",
        f"SlurmctldHost={node}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={sock},cred_expire=5",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
        f"SlurmctldPort={_free_port()}",
        f"SlurmdPort={_free_port()}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/builtin",
        "SchedulerParameters=sched_interval=2",
        "SlurmdParameters=config_overrides",
        "MpiDefault=none",
        "JobRequeue=1",
        "KillWait=15",
        "MinJobAge=600",
        "ReturnToService=2",
        f"NodeName={node} CPUs={NODE_CPUS} State=UNKNOWN",
        f"PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP "
        "OverSubscribe=FORCE:8",
        f"PartitionName=down Nodes={node} MaxTime=INFINITE State=DOWN",
        "",
    ])


class SlurmCluster:
    """One SLURM node on this machine, its files under ``root``.

    Args:
        root: an empty folder for the configuration, state, logs and MUNGE files.
    """

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.procs: dict[str, subprocess.Popen] = {}
        #: the environment of a client (sbatch, squeue, lit-amp): SLURM_CONF set
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def _start(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "wb")  # noqa: SIM115 - kept by the process
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                            env=self.env, start_new_session=True)
        log.close()

    def start(self, timeout_s: float = 30.0) -> SlurmCluster:
        """Write the configuration, start the daemons, wait until the node is idle.

        Raises:
            RuntimeError: a daemon exited, or the node was not idle within ``timeout_s``
                (the message holds the daemons' last log lines).
        """
        for sub in ("state", "spool", "log", "munge"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        munge = self.root / "munge"
        munge.chmod(0o700)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.conf.write_text(_conf(self.root, self.node))
        self._start("munged", ["munged", "-F", "--force", f"--socket={munge / 'munge.socket'}",
                               f"--key-file={key}", f"--pid-file={munge / 'munged.pid'}",
                               f"--log-file={self.root / 'log' / 'munged.log'}",
                               f"--seed-file={munge / 'munged.seed'}"])
        self._wait(lambda: (munge / "munge.socket").exists(), 10.0, "munged's socket")
        self._start("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._start("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.node])
        self._wait(lambda: self.node_state() == "idle", timeout_s, "the node to be idle")
        return self

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"SLURM test cluster: {', '.join(dead)} exited while waiting "
                                   f"for {what}:\n{self.logs()}")
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"SLURM test cluster: no {what} within {timeout_s:.0f} s:\n"
                           f"{self.logs()}")

    def node_state(self) -> str:
        """``sinfo``'s state of the node in the ``debug`` partition (``''`` when unknown)."""
        out = subprocess.run(["sinfo", "-h", "-p", "debug", "-n", self.node, "-o", "%t"],
                             capture_output=True, text=True, env=self.env, timeout=10)
        return out.stdout.strip()

    def logs(self, lines: int = 15) -> str:
        """The last ``lines`` lines of every daemon's log."""
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def stop(self, timeout_s: float = 20.0) -> None:
        """Cancel every job still queued, then end the daemons this object started (by pid)."""
        if self.procs.get("slurmctld") is not None and self.procs["slurmctld"].poll() is None:
            jobs = self.queued()
            if jobs:
                subprocess.run(["scancel", "--full", *jobs], env=self.env, capture_output=True,
                               timeout=10)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and self.queued():
                time.sleep(0.5)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def queued(self) -> list[str]:
        """The ids of the jobs squeue still lists."""
        out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                             env=self.env, timeout=10)
        return out.stdout.split()


def main() -> None:
    reason = missing_reason()
    if reason:
        raise SystemExit(reason)
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):  # also when started in the background
        signal.signal(sig, interrupt)
    cluster = SlurmCluster(tempfile.mkdtemp(prefix="lit_amp_slurm_")).start()
    print(f"SLURM test cluster up: export SLURM_CONF={cluster.conf}  (Ctrl-C stops it)",
          flush=True)
    try:
        while all(p.poll() is None for p in cluster.procs.values()):
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
