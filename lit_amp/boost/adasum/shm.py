"""An all-gather through shared memory for ranks that share one host (AdaSum's exchange).

Gloo -- torch's CPU backend -- moves every collective through TCP sockets and a chain of
worker and I/O threads; on a busy machine each collective then costs thread wake-ups however
small the tensor (docs/benchmarks.md, "Boost levels", has the measurements).
:class:`ShmAllGather` instead maps one file in ``/dev/shm`` into every rank:

- ``data[parity, rank, :m]``: each rank's row, double-buffered by the call's parity;
- ``flags[rank]``: the number of the last call whose row that rank has written.

A call writes the row, then the flag, then spins (yielding the core) until every flag has
reached the call number, and returns the ``[world, m]`` view. Double buffering is enough: a
rank can only be one call ahead (call ``k + 1`` waits for everybody's flag ``k + 1``, written
after they finished reading call ``k``), so the rows of call ``k`` stay intact until the next
call. Ordering relies on x86-64's total store order (the row's stores become visible before the
flag's); other architectures use the process group (``shm_supported`` says so). The file is
unlinked as soon as every rank has mapped it, so nothing is left behind, even after a crash.

Used by :class:`~lit_amp.boost.adasum.callback.AdaSum` (``transport="auto"``) when the default
group is gloo and every rank runs on this host; CPU only.
"""

from __future__ import annotations

import logging
import os
import platform
import socket
import time
import uuid
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["ShmAllGather", "shm_supported"]

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
DEFAULT_TIMEOUT_S = 1800.0  # gloo's default collective timeout
LIVENESS_EVERY_S = 1.0  # while waiting, how often to check that the late ranks still run


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie - exited, not yet reaped - counts as dead);
    when it cannot be told, it is assumed to run."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def _host_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def shm_supported() -> tuple[bool, str]:
    """Whether this process can use :class:`ShmAllGather` at all, and why not."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False, f"needs x86-64 store ordering, this is {platform.machine()}"
    if not (os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)):
        return False, f"{SHM_DIR} is not a writable directory"
    return True, ""


class ShmAllGather:
    """All-gather of a flat fp32 CPU vector among the ranks of the default group, through
    shared memory. Construct it on every rank at once (it uses the default group to agree).

    Args:
        numel: the largest vector a call may gather.
        timeout_s: how long a call waits for the slowest rank before raising RuntimeError.

    Raises:
        RuntimeError: from :meth:`__init__` (on every rank alike) when a rank cannot map the
            file or the ranks do not share it, e.g. containers with private ``/dev/shm``
            (check :meth:`usable` first), and from :meth:`all_gather` when a rank it waits for
            has exited (checked every second, when the ranks share a pid namespace) or stays
            away longer than ``timeout_s``.
    """

    def __init__(self, numel: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.world = dist.get_world_size()
        self.rank = dist.get_rank()
        self.numel = int(numel)
        self.timeout_s = float(timeout_s)
        self.calls = 0
        name: list[Any] = [None]
        if self.rank == 0:
            name[0] = os.path.join(SHM_DIR, f"lit_amp_adasum_{uuid.uuid4().hex}")
        dist.broadcast_object_list(name, src=0)
        self.path = str(name[0])
        floats = 2 * self.world * self.numel + 2 * self.world  # rows + int64 flags
        buf: Tensor | None = None
        err = ""
        try:
            buf = torch.from_file(self.path, shared=True, size=floats, dtype=torch.float32)
        except Exception as exc:  # noqa: BLE001 - reported to every rank below
            err = f"rank {self.rank}: {exc}"
        infos: list[Any] = [None] * self.world
        # every rank has mapped it (or failed) past here; the pids let a waiting rank notice
        # that a peer died (gloo would see its socket close), if all share a pid namespace
        dist.all_gather_object(infos, (err, os.getpid(), _pid_namespace()))
        errors = [e for e, _, _ in infos]
        same_ns = len({ns for _, _, ns in infos}) == 1 and infos[0][2] is not None
        self.pids: list[int] | None = [pid for _, pid, _ in infos] if same_ns else None
        try:  # whoever comes first removes the name; the mappings stay
            os.unlink(self.path)
        except OSError:
            pass
        bad = [e for e in errors if e]
        if bad or buf is None:
            raise RuntimeError("ShmAllGather: could not map the shared file: " + "; ".join(bad))
        self._buf = buf
        self.data = buf[: 2 * self.world * self.numel].view(2, self.world, self.numel)
        self.flags = buf[2 * self.world * self.numel :].view(torch.int64)
        # one mapping for all? (a private /dev/shm per container would give each rank its own
        # file under the same name): every rank writes a token, then reads everybody's
        self.flags[self.rank] = -1 - self.rank
        dist.barrier()
        seen = self.flags.tolist() == [-1 - r for r in range(self.world)]
        shared: list[Any] = [None] * self.world
        dist.all_gather_object(shared, seen)
        self.flags[self.rank] = 0
        dist.barrier()
        if not all(shared):
            self.close()
            raise RuntimeError(
                "ShmAllGather: the ranks do not see one shared file (separate /dev/shm?)."
            )

    @staticmethod
    def usable() -> tuple[bool, str]:
        """Whether every rank of the default group is on this host and can map shared memory
        (collective: call it on every rank)."""
        ok, why = shm_supported()
        infos: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(infos, (_host_id(), ok, why))
        hosts = {h for h, _, _ in infos}
        if len(hosts) > 1:
            return False, f"the ranks run on {len(hosts)} hosts"
        reasons = [w for _, o, w in infos if not o]
        if reasons:
            return False, reasons[0]
        return True, ""

    def all_gather(self, flat: Tensor) -> Tensor:
        """Every rank's ``flat`` as the rows of a ``[world, m]`` view, valid until the next
        call (all ranks call with the same ``m <= numel``)."""
        m = flat.numel()
        if m > self.numel:
            raise ValueError(f"ShmAllGather: {m} elements exceed the capacity {self.numel}.")
        self.calls += 1
        k = self.calls
        rows = self.data[k % 2]
        rows[self.rank, :m].copy_(flat.reshape(-1))
        self.flags[self.rank] = k  # after the row: x86-64 keeps the two stores in order
        if int(self.flags.min()) < k:
            self._wait(k)
        return rows[:, :m]

    def _wait(self, k: int) -> None:
        start = time.monotonic()
        deadline = start + self.timeout_s
        next_check = start + LIVENESS_EVERY_S
        spins = 0
        while int(self.flags.min()) < k:
            os.sched_yield()
            spins += 1
            if spins % 1024:
                continue
            now = time.monotonic()
            if now >= next_check and self.pids is not None:
                next_check = now + LIVENESS_EVERY_S
                late = [r for r, f in enumerate(self.flags.tolist()) if f < k]
                dead = [r for r in late if not _alive(self.pids[r])]
                if dead:
                    raise RuntimeError(
                        f"AdaSum: rank(s) {dead} (pid {[self.pids[r] for r in dead]}) exited "
                        f"while rank {self.rank} waited for them in the shared-memory exchange "
                        f"#{k}."
                    )
            if now > deadline:
                late = [r for r, f in enumerate(self.flags.tolist()) if f < k]
                raise RuntimeError(
                    f"AdaSum: rank {self.rank} waited more than {self.timeout_s:g} s in the "
                    f"shared-memory exchange #{k} for rank(s) {late} (did a rank stop or "
                    "skip an optimizer step the others took?)."
                )

    def close(self) -> None:
        """Drop the mapping (the file itself is already unlinked)."""
        self.data = self.flags = self._buf = None
