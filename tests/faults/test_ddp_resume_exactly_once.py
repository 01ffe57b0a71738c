"""SIGTERM mid-epoch under 2-process DDP, then resume: exact, as in one process (issue #18).

``_ddp_resume_worker.py`` trains with ``Model.train`` + ``OnRequestExit`` + ``BackupAndRestore``
on a seeded shuffling DataLoader (Lightning's DistributedSampler split) and a net that draws
from torch's, numpy's and Python's global generators, seeded per rank. At epoch 3 step 5 of 8
both ranks pause; the test sends SIGTERM to both ranks or to rank 1 only; the ranks agree to
stop after that step, rank 0 writes the backup, and the same command is started again. For
every rank the concatenated ``(epoch, step in epoch, sample ids)`` of both runs must equal the
uninterrupted run's, and the final weights must be bit-identical.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("_ddp_resume_worker.py")
STEPS_PER_RANK = 4 * 8  # EPOCHS x batches per rank and epoch

pytestmark = pytest.mark.slow  # 2-process runs, ~10 s each on a shared 2-core machine


def _start(work: Path, stop: str | None = None, seed: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("PL_GLOBAL_SEED", None)
    if seed is not None:  # the seed of Lightning's DistributedSampler
        env["PL_GLOBAL_SEED"] = seed
    env.pop("LOCAL_RANK", None)
    cmd = [sys.executable, str(WORKER), str(work)] + ([stop] if stop else [])
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen, work: Path) -> None:
    try:
        out, _ = proc.communicate(timeout=240)  # ranks that disagree on stopping hang
    except subprocess.TimeoutExpired:
        for pid_file in work.glob("pid*"):  # rank 1 is Lightning's child of rank 0
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.kill()
        out = proc.communicate()[0]
        raise AssertionError(f"the ranks hung:\n{out[-4000:]}") from None
    assert proc.returncode == 0, out[-4000:]


def _trained(work: Path, rank: int) -> list:
    return [json.loads(line) for line in (work / f"trained{rank}.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    ref = tmp_path_factory.mktemp("ref")
    _finish(_start(ref), ref)
    return ref


# rank 1 alone is signalled, and the run resumes under another PL_GLOBAL_SEED, in one case
@pytest.mark.parametrize("who", ["both", "rank1, resumed under another seed"])
def test_ddp_sigterm_mid_epoch_then_resume_trains_every_batch_once(reference: Path,
                                                                   tmp_path: Path,
                                                                   who: str) -> None:
    first = _start(tmp_path, "3:5")
    deadline = time.time() + 180
    while not all((tmp_path / f"ready{r}").exists() for r in (0, 1)):
        assert first.poll() is None, first.communicate()[0][-4000:]
        assert time.time() < deadline, "the ranks never reached epoch 3 step 5"
        time.sleep(0.05)
    pids = [int((tmp_path / f"pid{r}").read_text()) for r in (0, 1)]
    for r in (0, 1) if who.startswith("both") else (1,):
        os.kill(pids[r], signal.SIGTERM)
    (tmp_path / "sent").write_text("1")
    _finish(first, tmp_path)
    for r in (0, 1):  # both ranks stopped after the same step, mid-epoch 3
        got = _trained(tmp_path, r)
        assert len(got) == 2 * 8 + 5 and got[-1][:2] == [3, 5]
    assert (tmp_path / "backup" / "backup.ckpt").is_file()

    # restarted with the same command (or with another PL_GLOBAL_SEED in the environment: the
    # backup keeps the sampler seed the interrupted run drew its permutations from)
    _finish(_start(tmp_path, seed="5" if "seed" in who else None), tmp_path)
    assert not (tmp_path / "backup" / "backup.ckpt").exists()  # training finished
    for r in (0, 1):
        expected, got = _trained(reference, r), _trained(tmp_path, r)
        assert len(expected) == STEPS_PER_RANK
        # every batch of every epoch once, in order, with the step numbers continuing (the
        # resumed run's first step is step 6 of epoch 3, not step 1)
        assert got == expected, f"rank {r}: batches lost, repeated or reordered"
    a = torch.load(reference / "final.pt", weights_only=True)
    b = torch.load(tmp_path / "final.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a), "final weights differ from an uninterrupted run"
