"""kill -9 while a checkpoint is being written in the background: nothing is lost, no torn
checkpoint is ever read, and the source keeps every file the unfinished checkpoint covers."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lit_amp.rec.online.checkpoint_files import latest_checkpoint, list_checkpoints
from tests.faults._kill import kill_when
from tests.faults._trained_log import trained_batches
from tests.rec._helpers import fill_dir

pytestmark = pytest.mark.slow  # two trainer processes: ~10-20 s on a shared 2-core machine

WORKER = str(Path(__file__).with_name("_slow_checkpoint_worker.py"))
FILES, PER_FILE, BATCH, CKPT_EVERY = 14, 20, 20, 3


@pytest.mark.parametrize("full_every,slow_from,durable", [
    (1, 2, ["online-000000000003.ckpt"]),
    (3, 3, ["online-000000000003.ckpt", "online-000000000006-rows.ckpt"]),
], ids=["whole", "row-increments"])
def test_kill_during_a_slow_background_write_loses_nothing(tmp_path, full_every, slow_from,
                                                           durable):
    """Row increments: the write killed is the second increment after the whole checkpoint
    of step 3; the restart resumes from the first one (its chain)."""
    data, ckpt, log, marker = (tmp_path / n for n in ("data", "ckpt", "trained.log", "writing"))
    all_ids = fill_dir(data, FILES, PER_FILE, fmt="jsonl")
    files = sorted(p.name for p in data.iterdir())
    cmd = [sys.executable, WORKER, "--data", str(data), "--ckpt", str(ckpt), "--log", str(log),
           "--batch", str(BATCH), "--ckpt-every", str(CKPT_EVERY),
           "--full-every", str(full_every)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    kept = (slow_from - 1) * CKPT_EVERY  # the step of the newest durable checkpoint
    killed = f"online-{slow_from * CKPT_EVERY:012d}"
    # 1) the checkpoint after it is written slowly; training goes on meanwhile, and the
    # trainer is killed once two more steps are trained, in the middle of that write
    kill_when([*cmd, "--sleep", "0.05", "--slow", "0.2", "--marker", str(marker),
               "--slow-from", str(slow_from)], env,
              lambda: marker.exists() and len(trained_batches(log)) >= kept + CKPT_EVERY + 2,
              "the slow write")
    run1 = trained_batches(log)
    assert os.path.basename(marker.read_text()).startswith(killed)
    assert [s for s, _ in run1] == list(range(1, len(run1) + 1)) and len(run1) > kept + 3
    # the write in flight left only a temp file: the newest checkpoint is the durable one
    assert [os.path.basename(p) for p in list_checkpoints(ckpt)] == durable
    assert any(n.startswith(f".tmp-lit_amp-{killed}") for n in os.listdir(ckpt))
    assert latest_checkpoint(ckpt)[1]["online"]["step"] == kept
    # only the files the durable checkpoint covers are deleted: the next one's were not
    assert sorted(p.name for p in data.iterdir() if p.name.startswith("part-")) == files[kept:]

    # 2) the restart resumes from it, removes the temp file and trains everything
    final = subprocess.run(cmd, env=env, capture_output=True, timeout=120)
    assert final.returncode == 0, (final.stdout + final.stderr).decode()[-3000:]
    summary = json.loads(final.stdout.decode().split("SUMMARY ", 1)[1].splitlines()[0])
    assert summary["resumed_from"].endswith(durable[-1])
    assert summary["stop_reason"] == "idle_timeout"
    assert not [n for n in os.listdir(ckpt) if n.startswith(".tmp-")]
    run2 = trained_batches(log)[len(run1):]
    assert run2[0][0] == kept + 1
    trained = [i for _, ids in run1 + run2 for i in ids]
    counts = collections.Counter(trained)
    assert set(counts) == set(all_ids)  # nothing lost
    redone = sorted(i for _, ids in run1[kept:] for i in ids)  # trained after the durable one
    assert sorted(i for i, c in counts.items() for _ in range(c - 1)) == redone
