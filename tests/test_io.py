"""Atomic writes (``lit_amp._io``): temp files of a killed write are removed when training
starts again.

A process killed while ``ModelCheckpoint`` or ``BackupAndRestore`` writes leaves the temp file
of the atomic write behind (full-size: one per preemption). The next run removes those of its
own files only, in its own directory — never another program's files, another prefix's, or
a temp file whose write is still in progress.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lit_amp._io import atomic_write
from lit_amp.callbacks.backup_and_restore import BackupAndRestore
from lit_amp.callbacks.checkpoint import CheckpointConfig, ModelCheckpoint
from tests.callbacks._helpers import simulate_train
from tests.helpers.pages import CACHE_ADVICE, resident_pages

ROOT = Path(__file__).resolve().parents[1]

# a writer killed in the middle of both writes (kill -9: no cleanup of any kind)
_KILLED_WRITER = """
import sys, threading, time
from lit_amp._io import atomic_write
def stuck(f):
    f.write(b"half a checkpoint")
    f.flush()
    time.sleep(600)
ckpt, backup = sys.argv[1], sys.argv[2]
threading.Thread(target=atomic_write, args=(backup, stuck), daemon=True).start()
atomic_write(ckpt, stuck)
"""


def _killed_mid_write(ckpt: Path, backup: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(ckpt), str(backup)],
                            env=env)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            temps = [p for d in {ckpt.parent, backup.parent} for p in d.iterdir()
                     if p.name.startswith(".tmp")]
            if len(temps) == 2:
                break
            assert proc.poll() is None, "the writer died before writing"
            time.sleep(0.05)
        else:
            raise AssertionError("the writer wrote no temp files")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def _foreign(directory: Path) -> list[Path]:
    """Files that are not the callback's: another program's and another lit_amp prefix's."""
    names = ["data.tmp", ".tmp-other-program", "net-1_4.ckpt.tmp",
             ".tmp-lit_amp-other-1_4.ckpt.abc123", ".tmp-lit_amp-backup.ckpt.abc123"]
    paths = [directory / n for n in names]
    for p in paths:
        p.write_bytes(b"not mine")
    return paths


def test_a_killed_write_leaves_temps_that_the_next_run_removes(tmp_path):
    ckpt_dir, backup_dir = tmp_path / "ckpt", tmp_path / "backup"
    ckpt_dir.mkdir()
    backup_dir.mkdir()
    _killed_mid_write(ckpt_dir / "net-2_3.ckpt", backup_dir / "backup.ckpt")
    stale = sorted(p.name for d in (ckpt_dir, backup_dir) for p in d.iterdir())
    assert len(stale) == 2 and all(n.startswith(".tmp-lit_amp-") for n in stale), stale
    foreign_ckpt = _foreign(ckpt_dir)
    (backup_dir / "data.tmp").write_bytes(b"not mine")

    # the rerun: its prefix becomes net_1 (net's files exist) and the old temps still go
    (ckpt_dir / "net-1_3.ckpt").write_bytes(b"")
    mc = ModelCheckpoint(prefix="net", directory=str(ckpt_dir),
                         config=CheckpointConfig(save_checkpoint_steps=100))
    bar = BackupAndRestore(str(backup_dir), delete_checkpoint=False)
    simulate_train([mc, bar], epochs=1, batches=2)

    left = sorted(p.name for p in ckpt_dir.iterdir())
    assert left == sorted([*(p.name for p in foreign_ckpt), "net-1_3.ckpt", "net_1-1_2.ckpt"])
    assert sorted(p.name for p in backup_dir.iterdir()) == ["backup.ckpt", "data.tmp"]


def test_a_write_in_progress_keeps_its_temp(tmp_path):
    busy = tmp_path / ".tmp-lit_amp-CKP-1_1.ckpt.busy01"
    busy.write_bytes(b"being written")
    with open(busy, "rb") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # another process's atomic_write holds it
        simulate_train([ModelCheckpoint(directory=str(tmp_path))], epochs=1, batches=1)
        assert busy.exists()
    simulate_train([ModelCheckpoint(directory=str(tmp_path))], epochs=1, batches=1)
    assert not busy.exists()  # its writer is gone: removed at the next start



@CACHE_ADVICE
def test_a_checkpoint_written_with_drop_cache_leaves_the_page_cache(tmp_path):
    import torch

    from lit_amp._io import atomic_write
    from lit_amp.serialization import checkpoint_payload, write_checkpoint

    data = os.urandom(8 << 20)
    kept = Path(atomic_write(tmp_path / "kept.bin", lambda f: f.write(data)))
    dropped = Path(atomic_write(tmp_path / "dropped.bin", lambda f: f.write(data),
                                drop_cache=True))
    resident, pages = resident_pages(kept)
    assert resident > pages // 2  # written, not dropped: still cached
    assert resident_pages(dropped)[0] < pages // 20
    assert dropped.read_bytes() == data  # only the cache went: the content is whole
    # a checkpoint (lit_amp's format) is written that way
    ckpt = Path(write_checkpoint(checkpoint_payload(
        {"w": torch.randn(1 << 20)}, None), tmp_path / "net"))
    resident, pages = resident_pages(ckpt)
    assert resident < pages // 20, (resident, pages)


def _direct_writes(monkeypatch) -> list:
    """Every :class:`lit_amp._io._DirectFile` opened from here on."""
    from lit_amp import _io

    opened, real = [], _io._DirectFile.open.__func__

    def spy(cls, fd):
        f = real(cls, fd)
        opened.append(f)
        return f

    monkeypatch.setattr(_io._DirectFile, "open", classmethod(spy))
    return opened


@CACHE_ADVICE
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(0, 5 * 4096 + 7), max_size=12),
       seek_at=st.one_of(st.none(), st.integers(0, 11)))
def test_a_drop_cache_write_goes_around_the_page_cache_with_every_byte_in_place(
        tmp_path, monkeypatch, sizes, seek_at):
    # pieces of any size, across the aligned buffer's end (3 blocks here) and the blocks'
    from lit_amp import _io

    monkeypatch.setattr(_io._DirectFile, "STAGE", 3 * 4096)
    opened = _direct_writes(monkeypatch)
    rng = np.random.default_rng(len(sizes))
    pieces = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]

    def write(f):
        for i, b in enumerate(pieces):
            if i == seek_at:  # a writer that asks where it is and seeks (torch.save may)
                assert f.tell() == sum(map(len, pieces[:i]))
                f.seek(0, os.SEEK_CUR)
            f.write(memoryview(b))

    path = Path(atomic_write(tmp_path / "a.bin", write, drop_cache=True))
    data = b"".join(pieces)
    assert path.read_bytes() == data
    if opened and opened[0] is not None:  # a filesystem that allows O_DIRECT
        f = opened[0]
        before_seek = sum(map(len, pieces[:seek_at])) if seek_at is not None else len(data)
        assert f.direct_bytes == before_seek - before_seek % 4096  # the whole blocks


def test_a_filesystem_or_device_refusing_direct_writes_gets_the_bytes_through_the_cache(
        tmp_path, monkeypatch):
    from lit_amp import _io

    opened = _direct_writes(monkeypatch)
    shm = Path("/dev/shm")
    if shm.is_dir():  # tmpfs: O_DIRECT refused (before Linux 6.6) or allowed
        data = os.urandom(3 * 4096 + 5)
        path = Path(atomic_write(shm / f"lit_amp-test-{os.getpid()}.bin",
                                 lambda f: f.write(data), drop_cache=True))
        try:
            assert path.read_bytes() == data
        finally:
            path.unlink()
    # a device that refuses a direct write itself (EINVAL at the write): the rest is buffered
    real_write, refused = os.write, []

    def refusing(fd, b):
        if _io.fcntl.fcntl(fd, _io.fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(len(b))
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, b)

    monkeypatch.setattr(_io.os, "write", refusing)
    data = os.urandom((8 << 20) + 12345)
    path = Path(atomic_write(tmp_path / "b.bin", lambda f: f.write(data), drop_cache=True))
    assert path.read_bytes() == data
    if opened[-1] is not None:
        assert refused and opened[-1].direct_bytes == 0 and not opened[-1].direct


# ------------------------------------------------------------- BackgroundJobs, prune_newest
def _fail(message: str) -> None:
    raise ValueError(message)


def test_background_jobs_raise_a_failed_jobs_error_at_the_next_submit():
    from lit_amp._io import BackgroundJobs

    jobs = BackgroundJobs("test-jobs")
    jobs.submit(_fail, "first")
    ran = []
    with pytest.raises(ValueError, match="first"):
        jobs.submit(ran.append, 1)
    assert ran == [] and jobs.pending is None  # nothing submitted; the error was raised once
    jobs.submit(ran.append, 2)
    jobs.close()
    assert ran == [2]


def test_background_jobs_raise_a_failed_jobs_error_at_close_and_wait():
    from lit_amp._io import BackgroundJobs

    jobs = BackgroundJobs("test-jobs")
    jobs.submit(_fail, "at close")
    with pytest.raises(ValueError, match="at close"):
        jobs.close()
    jobs.close()  # held once: a second close has nothing to raise
    jobs.submit(_fail, "at wait")
    with pytest.raises(ValueError, match="at wait"):
        jobs.wait()
    jobs.close()


def test_background_jobs_run_one_job_at_a_time_in_one_thread():
    import threading

    from lit_amp._io import BackgroundJobs

    jobs = BackgroundJobs("test-jobs")
    gate = threading.Event()
    seen = []

    def job(n):
        seen.append((n, threading.current_thread().name))
        gate.wait(10)

    jobs.submit(job, 1)
    assert jobs.busy()
    second = threading.Thread(target=jobs.submit, args=(job, 2))
    second.start()  # waits for the first job: one in flight
    time.sleep(0.2)
    assert second.is_alive() and [n for n, _ in seen] == [1]
    gate.set()
    second.join(10)
    jobs.close()
    assert [n for n, _ in seen] == [1, 2]
    assert len({name for _, name in seen}) == 1 and seen[0][1].startswith("test-jobs")


def test_background_jobs_take_hands_the_error_to_the_caller():
    from lit_amp._io import BackgroundJobs

    jobs = BackgroundJobs("test-jobs")
    jobs.submit(_fail, "mine", note="a note")
    future, note = jobs.take(wait=True)
    assert note == "a note" and isinstance(future.exception(), ValueError)
    jobs.close()  # taken: not raised again


def test_background_jobs_without_a_limit_queue_in_order():
    from lit_amp._io import BackgroundJobs

    jobs = BackgroundJobs("test-jobs", limit=None)
    out = []
    for n in range(5):
        jobs.submit(lambda n=n: (time.sleep(0.01), out.append(n)))
    assert jobs.wait(10)
    jobs.close()
    assert out == list(range(5))


@pytest.mark.parametrize("keep", [0, 1, 3, 7])
def test_prune_newest_keeps_exactly_the_newest_n(tmp_path, keep):
    from lit_amp._io import prune_newest

    for n in range(1, 6):
        (tmp_path / f"ck-{n}.bin").write_bytes(b"x")
    (tmp_path / "ck-9").mkdir()  # a folder matches too
    (tmp_path / "other-1.bin").write_bytes(b"x")
    kept = prune_newest(tmp_path, r"ck-\d+(\.bin)?", keep,
                        key=lambda n: int(n.split("-")[1].split(".")[0]))
    want = (["ck-1.bin", "ck-2.bin", "ck-3.bin", "ck-4.bin", "ck-5.bin", "ck-9"])[6 - min(keep, 6):]
    assert kept == want
    assert sorted(os.listdir(tmp_path)) == sorted([*want, "other-1.bin"])


def test_prune_newest_keeps_the_chain_a_kept_entry_needs(tmp_path):
    from lit_amp._io import prune_newest

    names = ["a-1", "a-2-inc", "a-3-inc", "a-4", "a-5-inc"]
    for n in names:
        (tmp_path / n).write_bytes(b"x")
    kept = prune_newest(tmp_path, r"a-.*", 3, key=lambda n: int(n.split("-")[1]),
                        needs_previous=lambda n: n.endswith("-inc"))
    assert kept == names[:]  # a-3-inc needs a-2-inc needs a-1
    kept = prune_newest(tmp_path, r"a-.*", 2, key=lambda n: int(n.split("-")[1]),
                        needs_previous=lambda n: n.endswith("-inc"))
    assert kept == ["a-4", "a-5-inc"] and sorted(os.listdir(tmp_path)) == kept
