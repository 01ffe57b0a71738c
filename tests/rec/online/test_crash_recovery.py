"""At-least-once delivery: kill -9 the trainer mid-stream, restart it, and prove by record ids
that nothing was lost and that the duplicates are exactly the records trained after the last
checkpoint (at most one checkpoint interval)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lit_amp.rec.online.checkpoint_files import list_checkpoints
from tests.rec._helpers import fill_dir

pytestmark = pytest.mark.slow  # two trainer processes: ~15-40 s on a shared 2-core machine

WORKER = str(Path(__file__).with_name("_online_worker.py"))
BATCH, CKPT_EVERY, FILES, PER_FILE = 40, 4, 30, 40


def _read_log(path: Path) -> list[tuple[int, list[int]]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines(keepends=True):
        if line.endswith("\n"):  # a line cut by the kill is not a trained batch's record
            step, *ids = line.split()
            out.append((int(step), [int(i) for i in ids]))
    return out


@pytest.mark.parametrize("delete_consumed", [False, True], ids=["keep", "delete_consumed"])
def test_sigkill_mid_stream_loses_nothing_and_duplicates_stay_within_one_interval(
    tmp_path, delete_consumed
):
    data, ckpt, log = tmp_path / "data", tmp_path / "ckpt", tmp_path / "trained.log"
    all_ids = fill_dir(data, FILES, PER_FILE, fmt="jsonl")
    files = sorted(p.name for p in data.iterdir())
    cmd = [
        sys.executable,
        WORKER,
        "--data",
        str(data),
        "--ckpt",
        str(ckpt),
        "--log",
        str(log),
        "--batch",
        str(BATCH),
        "--ckpt-every",
        str(CKPT_EVERY),
        "--max-idle",
        "0.5",
        *(["--delete-consumed"] if delete_consumed else []),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    # the restart is launched now and waits for a go file after its imports (saves time)
    go = tmp_path / "go"
    second = subprocess.Popen(
        [*cmd, "--sleep", "0", "--wait-for", str(go)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    # 1) a slow run (sleeps after each step), killed with SIGKILL once 10 steps are logged
    first = subprocess.Popen(
        [*cmd, "--sleep", "0.08"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while len(_read_log(log)) < 10:
            assert first.poll() is None, first.stdout.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the trainer did not start in time"
            time.sleep(0.02)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    except BaseException:
        second.kill()
        raise
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == -signal.SIGKILL
    run1 = _read_log(log)
    steps1 = [s for s, _ in run1]
    assert steps1 == list(range(1, len(run1) + 1)) and len(run1) < FILES  # killed mid-stream
    ckpt_step = int(Path(list_checkpoints(ckpt)[-1]).stem.split("-")[1])
    assert 0 < ckpt_step <= len(run1) <= ckpt_step + CKPT_EVERY
    left = sorted(p.name for p in data.iterdir() if p.name.startswith("part-"))
    if delete_consumed:
        # only files that the checkpoint before the newest counts as consumed are gone (one
        # file = one batch here): the newest checkpoint's files are all still there
        assert ckpt_step > CKPT_EVERY  # at least two checkpoints, so something was deleted
        assert left == files[ckpt_step - CKPT_EVERY :]
    else:
        assert left == files

    # 2) restart: it resumes from the newest checkpoint and drains the folder
    go.write_text("")
    try:
        stdout, stderr = second.communicate(timeout=90)
    finally:
        if second.poll() is None:
            second.kill()
    out = stdout.decode()
    assert second.returncode == 0, (out + stderr.decode())[-3000:]
    summary = json.loads(out.split("SUMMARY ", 1)[1].splitlines()[0])
    assert summary["stop_reason"] == "idle_timeout"
    assert summary["resumed_from"].endswith(f"online-{ckpt_step:012d}.ckpt")
    run2 = _read_log(log)[len(run1) :]
    assert run2[0][0] == ckpt_step + 1  # the step counter continues from the checkpoint

    trained = [i for _, ids in run1 + run2 for i in ids]
    assert set(trained) == set(all_ids)  # nothing lost
    redone = [i for _, ids in run1[ckpt_step:] for i in ids]  # trained after the checkpoint
    dups = sorted(i for i in set(trained) if trained.count(i) > 1)
    assert dups == sorted(redone)  # exactly the records trained after the last checkpoint
    assert len(dups) <= CKPT_EVERY * BATCH  # at most one checkpoint interval
    assert len(trained) == len(all_ids) + len(dups)
    # drained: with delete_consumed the final checkpoint released every file
    left = sorted(p.name for p in data.iterdir() if p.name.startswith("part-"))
    assert left == ([] if delete_consumed else files)
