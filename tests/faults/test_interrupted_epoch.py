"""A preemption mid-epoch is not an epoch end: what a user of ``Model.fit`` sees (issue #48.6).

A real subprocess runs ``Model.fit`` with an eval dataset, ``OnRequestExit`` (SIGTERM),
``BackupAndRestore``, ``ModelCheckpoint(save_checkpoint_steps=6)``, Lightning's
``CSVLogger`` (the ``lit-amp`` CLI's ``logger=csv``) and a callback recording every
``on_eval_end``. At epoch 2 step 5 of 10 the parent sends SIGTERM; the process stops after
that step and is started again with the same command. Compared with a run never interrupted:

(a) the stop evaluates nothing: no ``on_eval_end``, no eval row in the CSV log for epoch 2;
(b) the resumed run evaluates epoch 2 at its real end, once, with the uninterrupted run's
    result (exact resume: the same weights);
(c) the CSV log's epoch and step columns continue: the two starts' rows together are the
    uninterrupted run's rows;
(d) the checkpoint files the resumed run writes carry the uninterrupted run's names (no
    ``_1`` prefix, ``save_checkpoint_steps`` counted from the run's start); the first start
    also leaves the checkpoint of its stop, ``net-2_5.ckpt``.

Run as a script (``python -m tests.faults.test_interrupted_epoch WORKDIR [STOP]``) it is the
training process.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

EPOCHS, N, BATCH = 3, 80, 8  # 10 batches an epoch, 30 steps
ROOT = Path(__file__).resolve().parents[2]


def _train(work: Path, stop_at: tuple[int, int] | None) -> None:
    import torch
    from lightning.pytorch.loggers import CSVLogger
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from lit_amp import Model
    from lit_amp.callbacks import (
        BackupAndRestore,
        Callback,
        CheckpointConfig,
        ModelCheckpoint,
        OnRequestExit,
    )

    torch.manual_seed(0)
    x = torch.randn(N + 24, 6)
    y = (x[:, 0] + x[:, 1] > 0).long()
    train = DataLoader(TensorDataset(x[:N], y[:N]), batch_size=BATCH, shuffle=True)
    valid = DataLoader(TensorDataset(x[N:], y[N:]), batch_size=BATCH)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    model = Model(net, nn.CrossEntropyLoss(), torch.optim.Adam(net.parameters(), 1e-2),
                  metrics={"acc", "loss"},
                  trainer={"logger": CSVLogger(str(work), name="logs"), "log_every_n_steps": 1,
                           "enable_checkpointing": False, "enable_progress_bar": False,
                           "accelerator": "cpu"})
    exit_cb = OnRequestExit(directory=str(work / "exit"))
    events = open(work / "events.jsonl", "a")

    class Record(Callback):
        def on_train_step_end(self, run_context) -> None:
            cb = run_context.original_args()
            step = (cb.cur_step_num - 1) % cb.batch_num + 1
            if stop_at is not None and (cb.cur_epoch_num, step) == stop_at:
                (work / "ready").write_text("1")
                deadline = time.time() + 60
                while not exit_cb.exit and time.time() < deadline:  # the parent's SIGTERM
                    time.sleep(0.01)

        def on_eval_end(self, run_context) -> None:
            cb = run_context.original_args()
            events.write(json.dumps(["eval", cb.cur_epoch_num, cb.metrics]) + "\n")
            events.flush()

    model.fit(EPOCHS, train, valid, callbacks=[
        Record(), exit_cb, BackupAndRestore(str(work / "backup")),
        ModelCheckpoint(prefix="net", directory=str(work / "ckpt"),
                        config=CheckpointConfig(save_checkpoint_steps=6,
                                                keep_checkpoint_max=50))])
    events.close()


def _run(work: Path, stop: str | None = None) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "tests.faults.test_interrupted_epoch", str(work)]
    return subprocess.Popen(cmd + ([stop] if stop else []), cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen) -> None:
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out


def _evals(work: Path) -> list:
    return [json.loads(line) for line in (work / "events.jsonl").read_text().splitlines()]


def _csv_rows(work: Path) -> list[list[dict]]:
    """The rows of each start's ``metrics.csv`` (``logs/version_<start>``), empty cells left out."""
    out = []
    for version in sorted((work / "logs").glob("version_*"), key=lambda p: int(p.name[8:])):
        with open(version / "metrics.csv", newline="") as f:
            out.append([{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(f)])
    return out


@pytest.mark.slow  # three training processes (~15 s each on 2 busy cores)
def test_a_stop_mid_epoch_is_not_evaluated_and_the_resumed_run_continues_its_numbering(
        tmp_path: Path) -> None:
    ref, work = tmp_path / "ref", tmp_path / "work"
    ref.mkdir()
    work.mkdir()
    reference = _run(ref)
    first = _run(work, "2:5")
    deadline = time.time() + 120
    while not (work / "ready").exists():
        assert first.poll() is None, first.communicate()[0]
        assert time.time() < deadline, "the training process never reached epoch 2 step 5"
        time.sleep(0.05)
    first.send_signal(signal.SIGTERM)
    _finish(first)
    _finish(reference)

    # (a) the stop at epoch 2 step 5 evaluated nothing
    assert [e[1] for e in _evals(work)] == [1], "the interrupted epoch 2 was evaluated"
    (stopped_rows,) = _csv_rows(work)
    assert not [r for r in stopped_rows if "val/acc" in r and r["epoch"] != "0"]
    before = {p.name for p in (work / "ckpt").iterdir()}
    assert before == {"net-1_6.ckpt", "net-2_2.ckpt", "net-2_5.ckpt"}  # 2_5: the stop's

    _finish(_run(work))  # the same command again
    expected = _evals(ref)
    assert [e[1] for e in expected] == [1, 2, 3]
    # (b) epoch 2 evaluated once, at its end, with the uninterrupted run's result
    assert _evals(work) == expected
    # (c) the two starts' CSV rows together are the uninterrupted run's
    (ref_rows,) = _csv_rows(ref)
    first_rows, resumed_rows = _csv_rows(work)
    assert [(r["epoch"], r["step"]) for r in first_rows + resumed_rows] == [
        (r["epoch"], r["step"]) for r in ref_rows]
    assert first_rows + resumed_rows == ref_rows
    # (d) the resumed run's checkpoints carry the uninterrupted run's names
    names = {p.name for p in (ref / "ckpt").iterdir()}
    assert names == {"net-1_6.ckpt", "net-2_2.ckpt", "net-2_8.ckpt", "net-3_4.ckpt",
                     "net-3_10.ckpt"}
    assert {p.name for p in (work / "ckpt").iterdir()} == names | {"net-2_5.ckpt"}


if __name__ == "__main__":
    _work = Path(sys.argv[1])
    _stop = tuple(int(v) for v in sys.argv[2].split(":")) if len(sys.argv) > 2 else None
    _train(_work, _stop)
