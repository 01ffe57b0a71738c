"""The trained-batches log the fault workers write: one ``step id id ...`` line per batch."""

from __future__ import annotations

from pathlib import Path


def trained_batches(log: Path) -> list[tuple[int, list[int]]]:
    """``(step, record ids)`` per complete line; a line cut by a kill is not a trained batch."""
    if not log.exists():
        return []
    out = []
    for x in log.read_text().splitlines(keepends=True):
        if x.endswith("\n"):
            step, *ids = x.split()
            out.append((int(step), [int(i) for i in ids]))
    return out
