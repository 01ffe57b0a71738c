"""SIGTERM mid-epoch, then resume: every batch of every epoch trained exactly once (issue #18.5).

A real subprocess trains with ``Model.train`` + ``OnRequestExit`` + ``BackupAndRestore`` (a
net with dropout and noise from numpy's and Python's ``random`` global generators, so the
global random states matter too). At a seeded step of epoch 3 it signals the
parent, which sends SIGTERM; the process stops cleanly and is started again with the same
command. The concatenated list of (epoch, sample ids) both runs trained must equal the
uninterrupted run's, and the final weights must be bit-identical. Loaders: in order; shuffled
with a seeded generator; shuffled from the global RNG.

Run as a script (``python -m tests.faults.test_resume_exactly_once WORKDIR LOADER [STOP]``) it is
the training process.
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

EPOCHS, N, BATCH = 5, 96, 8  # 12 batches an epoch, 60 steps
ROOT = Path(__file__).resolve().parents[2]


class _Noise(torch.nn.Module):
    """Adds noise drawn from numpy's and Python's global generators (their states matter)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import random

        import numpy as np

        return x + float(np.random.randn()) * 1e-2 + random.random() * 1e-2


def _train(work: Path, loader_kind: str, stop_at: tuple[int, int] | None) -> None:
    import random

    import numpy as np
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from lit_amp import Model
    from lit_amp.callbacks import BackupAndRestore, LambdaCallback, OnRequestExit

    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    x = torch.randn(N, 5)
    x[:, 0] = torch.arange(N) * 1e-3  # the sample id, readable back from a batch
    y = (x[:, 1] > 0).long()
    ds = TensorDataset(x, y)
    if loader_kind == "ordered":
        data = DataLoader(ds, batch_size=BATCH)
    elif loader_kind == "seeded":
        data = DataLoader(ds, batch_size=BATCH, shuffle=True,
                          generator=torch.Generator().manual_seed(7))
    else:  # shuffled from the global RNG
        data = DataLoader(ds, batch_size=BATCH, shuffle=True)
    net = nn.Sequential(_Noise(), nn.Linear(5, 16), nn.ReLU(), nn.Dropout(0.3),
                        nn.Linear(16, 2))
    model = Model(net, nn.CrossEntropyLoss(), torch.optim.Adam(net.parameters(), 1e-2),
                  trainer={"logger": False, "enable_checkpointing": False,
                           "accelerator": "cpu"})
    exit_cb = OnRequestExit(directory=str(work / "exit"))
    log = open(work / "trained.jsonl", "a")

    def step_begin(rc) -> None:
        cb = rc.original_args()
        ids = [round(v * 1e3) for v in cb.train_dataset_element[0][:, 0].tolist()]
        step = (cb.cur_step_num - 1) % cb.batch_num + 1  # continues after a resume (#18)
        log.write(json.dumps([cb.cur_epoch_num, step, ids]) + "\n")
        log.flush()

    def step_end(rc) -> None:
        cb = rc.original_args()
        step = (cb.cur_step_num - 1) % cb.batch_num + 1
        if stop_at is not None and (cb.cur_epoch_num, step) == stop_at:
            (work / "ready").write_text("1")
            deadline = time.time() + 60
            while not exit_cb.exit and time.time() < deadline:  # wait for the parent's SIGTERM
                time.sleep(0.01)

    model.train(EPOCHS, data, callbacks=[
        LambdaCallback(on_train_step_begin=step_begin, on_train_step_end=step_end),
        exit_cb, BackupAndRestore(str(work / "backup"))])
    log.close()
    torch.save(net.state_dict(), work / "final.pt")


def _run(work: Path, loader_kind: str, stop: str | None = None) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "tests.faults.test_resume_exactly_once", str(work), loader_kind]
    return subprocess.Popen(cmd + ([stop] if stop else []), cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen) -> None:
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out


def _trained(work: Path) -> list:
    return [json.loads(line) for line in (work / "trained.jsonl").read_text().splitlines()]


@pytest.mark.slow  # three training processes each (~30 s on 2 busy cores)
@pytest.mark.parametrize("loader_kind", ["ordered", "seeded", "global_rng"])
def test_sigterm_mid_epoch_then_resume_trains_every_batch_once(tmp_path: Path,
                                                               loader_kind: str) -> None:
    ref, work = tmp_path / "ref", tmp_path / "work"
    ref.mkdir()
    work.mkdir()
    reference = _run(ref, loader_kind)
    first = _run(work, loader_kind, "3:7")
    deadline = time.time() + 120
    while not (work / "ready").exists():
        assert first.poll() is None, first.communicate()[0]
        assert time.time() < deadline, "the training process never reached epoch 3 step 7"
        time.sleep(0.05)
    first.send_signal(signal.SIGTERM)
    _finish(first)
    _finish(reference)
    interrupted = _trained(work)
    assert interrupted[-1][0] == 3 and len(interrupted) == 2 * 12 + 7  # stopped mid-epoch 3
    assert (work / "backup" / "backup.ckpt").is_file()  # kept: the run did not finish
    _finish(_run(work, loader_kind))  # restarted with the same command
    assert not (work / "backup" / "backup.ckpt").exists()  # deleted once training finished

    expected = _trained(ref)
    assert len(expected) == EPOCHS * N // BATCH
    got = _trained(work)
    assert len(got) == len(expected), "batches were lost or trained twice"
    assert got == expected  # the same batches, in the same epochs, order and step numbers
    a = torch.load(ref / "final.pt", weights_only=True)
    b = torch.load(work / "final.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a), "final weights differ from an uninterrupted run"


if __name__ == "__main__":
    _work, _kind = Path(sys.argv[1]), sys.argv[2]
    _stop = tuple(int(v) for v in sys.argv[3].split(":")) if len(sys.argv) > 3 else None
    _train(_work, _kind, _stop)
