"""#18: kill -9 and SIGTERM at seeded random points of a stream holding poison rows.

What is lost: nothing (every valid record is trained). Duplicated: after a kill -9, at most
the records of one checkpoint interval; after a SIGTERM, none (the run stops after the current
step and writes a final checkpoint). Executed: no poison row is ever trained.
"""

from __future__ import annotations

import collections
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.faults._servers import line, record
from tests.faults._trained_log import trained_batches

pytestmark = pytest.mark.slow  # three trainer processes in a row: ~20-40 s

WORKER = str(Path(__file__).with_name("_fault_worker.py"))
FILES, PER_FILE, BATCH, CKPT_EVERY = 16, 20, 20, 3
POISON = ({"dense": [1e39] + [1.0] * 12}, {"id": 2**63}, {"cat": [2**64] + [1] * 25},
          {"label": 7})


def _write_data(data: Path, rng: random.Random) -> tuple[set[int], set[int]]:
    data.mkdir()
    valid, poison = set(), set()
    for k in range(FILES):
        rows = []
        for j in range(PER_FILE):
            i = k * PER_FILE + j
            if rng.random() < 0.05:
                bad = dict(rng.choice(POISON))
                bad.setdefault("id", i)
                rows.append(line(record(i, **bad)))
                if bad["id"] == i:
                    poison.add(i)
            else:
                rows.append(line(record(i)))
                valid.add(i)
        (data / f"part-{k:04d}.jsonl").write_bytes(b"".join(rows))
    return valid, poison


@pytest.mark.parametrize("seed", [18])
def test_kills_and_sigterms_at_random_points_lose_nothing_and_run_no_poison(tmp_path, seed):
    rng = random.Random(seed)
    data, ckpt, log = tmp_path / "data", tmp_path / "ckpt", tmp_path / "trained.log"
    valid, poison = _write_data(data, rng)
    cmd = [sys.executable, WORKER, "--data", str(data), "--ckpt", str(ckpt), "--log", str(log),
           "--batch", str(BATCH), "--ckpt-every", str(CKPT_EVERY), "--sleep", "0.05",
           "--max-idle", "0.5"]
    kills = [signal.SIGKILL, signal.SIGTERM]
    rng.shuffle(kills)
    seen_before = 0
    dup_allowed = 0
    for sig in kills:
        at = seen_before + rng.randint(2, 5)  # steps into this run
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        t_end = time.monotonic() + 120
        while len(trained_batches(log)) < at and proc.poll() is None and time.monotonic() < t_end:
            time.sleep(0.01)
        assert proc.poll() is None, proc.communicate()[0].decode()[-3000:]
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
        if sig == signal.SIGTERM:
            assert proc.returncode == 0 and "signal:SIGTERM" in out.decode(), out.decode()[-2000:]
        else:
            dup_allowed += CKPT_EVERY * BATCH
        seen_before = len(trained_batches(log))
    final = subprocess.run(cmd, capture_output=True, timeout=120)
    assert final.returncode == 0, final.stdout.decode()[-3000:] + final.stderr.decode()[-3000:]
    summary = json.loads(final.stdout.decode().split("SUMMARY ", 1)[1].splitlines()[0])
    assert summary["stop_reason"] == "idle_timeout"
    ids = [i for _, batch in trained_batches(log) for i in batch]
    counts = collections.Counter(ids)
    assert set(counts) == valid, f"lost: {sorted(valid - set(counts))[:20]}"
    assert not set(counts) & poison  # executed: no poison row
    duplicated = sum(c - 1 for c in counts.values())
    assert duplicated <= dup_allowed, (duplicated, dup_allowed)
    dead = [json.loads(x) for x in (data / "_dead_letter.jsonl").read_text().splitlines()]
    bad_rows = {(f"part-{i // PER_FILE:04d}.jsonl", i % PER_FILE)
                for i in range(FILES * PER_FILE) if i not in valid}
    assert {(d["position"]["file"], d["position"]["row"]) for d in dead} == bad_rows
