"""kill -9 while a full snapshot is being published in the background: a server never sees a
torn or incomplete version (it serves the newest delta on the older full snapshot, exactly
the trainer's weights of that version), and a restarted publisher cleans up and starts a new
chain that serves its own weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from lit_amp.rec.serving.reader import load_published
from tests.faults._kill import kill_when

pytestmark = pytest.mark.slow  # two publisher processes: ~10 s on a shared 2-core machine

WORKER = str(Path(__file__).with_name("_slow_publish_worker.py"))


def _logged(log: Path) -> dict[int, int]:
    """``{version: crc of the table}`` of the complete lines of the worker's log."""
    out = {}
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[int(parts[0])] = int(parts[1])
    return out


def _served(d: Path) -> tuple[int, int]:
    payload = load_published(d)
    assert payload["refused"] is None
    return payload["version"], zlib.crc32(payload["network"]["weight"].numpy().tobytes())


def test_kill_during_a_background_full_publish_serves_only_whole_versions(tmp_path):
    d, log, marker = tmp_path / "publish", tmp_path / "versions.log", tmp_path / "writing"
    cmd = [sys.executable, WORKER, "--dir", str(d), "--log", str(log)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # full snapshot 4 is being written; deltas 5 and 6 are published meanwhile
    kill_when([*cmd, "--slow", "60", "--marker", str(marker)], env,
              lambda: marker.exists() and max(_logged(log), default=0) >= 6,
              "the slow full snapshot")
    names = os.listdir(d)
    assert "full-000000000004.pt" not in names  # the write in flight left only a temp file
    assert any(n.startswith(".tmp-lit_amp-full-000000000004") for n in names)
    # a delta may have been in flight too (a loaded machine): its temp file is left as well
    temps = [n for n in names if n.startswith(".tmp-")]
    logged = _logged(log)
    version, crc = _served(d)  # full 1 + deltas 2..version: every delta of the chain
    # the newest logged delta may still have been in its writer's hands; a version published
    # but not logged yet may be on disk
    assert version >= 5 and max(logged) - 1 <= version <= max(logged) + 1
    if version in logged:
        assert crc == logged[version]  # exactly the trainer's weights of that version

    # the restart removes the temp file, starts a new chain and serves its own weights
    final = subprocess.run([*cmd, "--steps", "5", "--seed", "1"], env=env, capture_output=True,
                           timeout=120)
    assert final.returncode == 0, (final.stdout + final.stderr).decode()[-3000:]
    summary = json.loads(final.stdout.decode().split("SUMMARY ", 1)[1].splitlines()[0])
    assert summary["removed"] == len(temps)
    assert not [n for n in os.listdir(d) if n.startswith(".tmp-")]
    logged = _logged(log)
    assert _served(d) == (summary["version"], logged[summary["version"]])
    assert load_published(d)["full"] > version  # the new chain's full snapshot
