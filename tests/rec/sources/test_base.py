"""What every source shares (``lit_amp.rec.sources.base``): a dead-letter file that cannot be
written never stops the stream. The ``StreamSource`` protocol itself is run for every source
class in test_contract.py.

The default dead-letter file lies in the watched folder; on a read-only mount (a common way to
share a data folder) the first bad record used to raise. Now the record goes to the log (one
WARNING names the path), is still counted, and the valid rows are trained. (A dead-letter
path under a file, for every source: ``test_contract.py``.)
"""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from lit_amp.rec.sources import DeadLetterFile, DirectorySource
from tests.faults._servers import line, record
from tests.rec.sources.contract import ids_of


def _rows(n: int, bad: set[int]) -> bytes:
    return b"".join(b"{broken\n" if i in bad else line(record(i)) for i in range(n))


def _fallback_warnings(caplog, path) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if "cannot write the dead-letter file" in r.getMessage() and str(path) in r.getMessage()
    ]


@pytest.fixture
def read_only_folder(tmp_path: Path):
    """A tmpfs holding one JSON-lines file with 2 bad rows, then remounted read-only."""
    mnt = tmp_path / "ro"
    mnt.mkdir()
    try:
        res = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        (mnt / "part-0.jsonl").write_bytes(_rows(8, {2, 5}))
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True, timeout=30)
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30)


def test_a_read_only_data_folder_logs_dead_letters_instead_of_raising(read_only_folder, caplog):
    caplog.set_level(logging.WARNING)
    src = DirectorySource(read_only_folder, batch_size=4, max_idle_s=0)
    assert ids_of(src) == [0, 1, 3, 4, 6, 7]
    assert src.malformed == 2
    assert len(_fallback_warnings(caplog, read_only_folder / "_dead_letter.jsonl")) == 1
    logged = [r.getMessage() for r in caplog.records if "malformed record at" in r.getMessage()]
    assert len(logged) == 2 and "'row': 2" in logged[0] and "{broken" in logged[0]


def test_dead_letter_file_write_never_raises_on_os_errors(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.WARNING)
    import lit_amp.rec.sources.base as base

    def erofs(*a, **k):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(base.os, "open", erofs)
    dl = DeadLetterFile(tmp_path / "dead.jsonl", "demo")
    for i in range(3):
        dl.write({"row": i}, "bad", "{oops")
    assert dl.count == 3
    assert len(_fallback_warnings(caplog, tmp_path / "dead.jsonl")) == 1
    monkeypatch.undo()  # the folder becomes writable again: the file is used again
    dl.write({"row": 3}, "bad", "{oops")
    assert (tmp_path / "dead.jsonl").read_text().count("\n") == 1
