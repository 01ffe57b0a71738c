"""Start a worker process and kill -9 it once a condition holds (the fault tests' one way)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable


def kill_when(cmd: list[str], env: dict, ready: Callable[[], bool], what: str,
              timeout: float = 90.0) -> None:
    """Run ``cmd``; SIGKILL it as soon as ``ready()``; fail if it exits first or ``what``
    (the awaited event, in words) does not happen within ``timeout`` seconds."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            assert time.monotonic() < deadline, f"{what} did not happen in time"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
