"""A full disk while saving a checkpoint (issue #18 item 6): a named error, the old file intact.

A 64 KiB tmpfs, and a 2 MiB ext4 image (where checkpoints are written around the page cache,
``O_DIRECT``), are mounted (we run as root in CI; the test skips when mounting is not
allowed); a first checkpoint is saved, the disk is filled, and a second, larger save must
raise an ``OSError`` (ENOSPC) naming the file and the free space, leave no temp file behind,
and leave the first checkpoint loadable with its original weights.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest
import torch

from lit_amp import load_checkpoint, save_checkpoint
from lit_amp._io import TMP_PREFIX


@pytest.fixture(params=["tmpfs", "ext4"])
def tiny_disk(tmp_path: Path, request):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if request.param == "tmpfs":
        cmds = [["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)]]
    else:
        image = tmp_path / "ext4.img"
        with open(image, "wb") as f:
            f.truncate(2 << 20)
        cmds = [["mkfs.ext4", "-q", "-F", str(image)], ["mount", "-o", "loop", str(image),
                                                          str(mnt)]]
    for cmd in cmds:
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"cannot mount a {request.param} here: {exc}")
        if res.returncode != 0:
            pytest.skip(f"cannot mount a {request.param} here: {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30)


def test_save_checkpoint_on_a_full_disk(tiny_disk: Path) -> None:
    torch.manual_seed(0)
    small = torch.nn.Linear(8, 8)
    path = tiny_disk / "net.ckpt"
    save_checkpoint(small, str(path))
    before = {k: v.clone() for k, v in small.state_dict().items()}
    # fill the disk, leaving less than a checkpoint of the big net needs
    with open(tiny_disk / "filler", "wb", buffering=0) as f:
        with pytest.raises(OSError) as full:
            while True:
                f.write(b"\0" * 1024)
    assert full.value.errno == errno.ENOSPC
    big = torch.nn.Linear(256, 256)  # ~260 KB of weights
    with pytest.raises(OSError) as info:
        save_checkpoint(big, str(path))
    assert info.value.errno == errno.ENOSPC
    message = str(info.value)
    assert str(path) in message and "bytes free" in message
    assert not [n for n in os.listdir(tiny_disk) if n.startswith(TMP_PREFIX)]  # no temp left
    state = load_checkpoint(str(path))  # the old checkpoint still loads, unchanged
    assert all(torch.equal(state["network"][k], before[k]) for k in before)
    fresh = torch.nn.Linear(8, 8)
    load_checkpoint(str(path), fresh)
    assert torch.equal(fresh.weight, small.weight)
