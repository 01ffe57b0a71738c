"""#18 item 13 (DDP): a stalled rank fails the job within ``peer_timeout``, not 30 minutes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.dist import free_port
from tests.rec._helpers import fill_dir

pytestmark = pytest.mark.slow  # two trainer processes

WORKER = str(Path(__file__).with_name("_fault_worker.py"))


def test_a_stalled_rank_fails_the_job_within_the_peer_timeout(tmp_path):
    fill_dir(tmp_path / "data", 20, 20)
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "LOCAL_RANK": str(rank), "NODE_RANK": "0", "WORLD_SIZE": "2",
               "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, WORKER, "--data", str(tmp_path / "data"), "--ckpt",
               str(tmp_path / "ckpt"), "--log", str(tmp_path / "log"), "--ddp", "2",
               "--batch", "10", "--peer-timeout", "5", "--stall-rank", "1", "--stall-step", "1"]
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT))
    try:
        # rank 1 sleeps after step 1; rank 0 waits in the next collective, then fails
        log1 = tmp_path / "log.rank1"
        while not (log1.exists() and log1.read_text().startswith("1 ")):
            assert procs[0].poll() is None, procs[0].communicate()[0].decode()[-3000:]
            time.sleep(0.1)
        t_stall = time.monotonic()
        out, _ = procs[0].communicate(timeout=90)  # Lightning's default would be 30 minutes
        waited = time.monotonic() - t_stall
        assert procs[0].returncode != 0, out.decode()[-2000:]
        assert waited < 60, f"rank 0 failed only after {waited:.0f} s"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
