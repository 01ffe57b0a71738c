"""A ``torch.save`` file written storage by storage: what a snapshot's writer streams.

``torch.save`` under ``torch.serialization.skip_data`` writes the file's structure and skips
each storage's bytes (a ``seek``); :func:`save_by_storage` writes the bytes of each storage
there instead, from a writer per storage (in the order :func:`storage_order` finds them, the
order the pickler meets them). A snapshot so writes its tables chunk by chunk from live rows,
never holding a second copy; ``torch.load`` reads the file as any other.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from typing import IO, Any

import torch

__all__ = ["StorageStream", "Tap", "as_bytes", "save_by_storage", "storage_order"]


class _Null:
    def write(self, b: Any) -> int:
        return len(b)


def storage_order(payload: Any) -> list[torch.UntypedStorage]:
    """The storages of ``payload`` in the order ``torch.save`` writes them.

    ``torch.save`` numbers storages as its pickler first meets them; pickling the same object
    graph with the same protocol meets them in the same order.
    """
    order: list[torch.UntypedStorage] = []
    seen: dict[int, int] = {}

    class _Order(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            if isinstance(obj, torch.storage.TypedStorage) or torch.is_storage(obj):
                s = obj._untyped_storage if isinstance(obj, torch.storage.TypedStorage) else obj
                if s._cdata not in seen:
                    seen[s._cdata] = len(order)
                    order.append(s)
                return ("storage", seen[s._cdata])
            return None

    with torch.serialization.skip_data():
        _Order(_Null(), protocol=torch.serialization.DEFAULT_PROTOCOL).dump(payload)
    return order


class StorageStream:
    """The file ``torch.save`` writes into under ``skip_data``: where it would skip a storage's
    bytes (``seek(n, SEEK_CUR)``), the snapshot's bytes of that storage are written instead."""

    def __init__(self, f: IO[bytes], writers: list[tuple[int, Any]]) -> None:
        self.f = f
        self._writers = iter(writers)
        self.error: BaseException | None = None  # torch.save reports it as "write failed"

    def write(self, b: Any) -> int:
        return self.f.write(b)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence != os.SEEK_CUR:
            return self.f.seek(offset, whence)
        try:
            nbytes, write = next(self._writers, (None, None))
            if nbytes != offset:
                raise RuntimeError(
                    f"online_train: a checkpoint storage of {offset} bytes was expected to hold "
                    f"{nbytes}; the snapshot does not match torch.save's layout (nothing "
                    "written)."
                )
            write(self.f)
        except BaseException as exc:
            self.error = exc
            raise
        return self.f.tell()

    def tell(self) -> int:
        return self.f.tell()

    def flush(self) -> None:
        self.f.flush()

    def finish(self) -> None:
        if next(self._writers, None) is not None:
            raise RuntimeError("online_train: torch.save wrote fewer storages than the snapshot "
                               "holds (nothing written).")


class Tap:
    """A file whose writes are also shown to ``tap(key, chunk)`` (when given)."""

    def __init__(self, f: IO[bytes], key: int, tap: Any) -> None:
        self.f, self.key, self.tap = f, key, tap

    def write(self, b: memoryview) -> int:
        if self.tap is not None:
            self.tap(self.key, b)
        return self.f.write(b)


def as_bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def save_by_storage(f: IO[bytes], payload: Any,
                    writers: list[tuple[int, Callable[[IO[bytes]], Any]]]) -> None:
    """``torch.save(payload, f)``, each storage's bytes written by its ``(nbytes, write)`` of
    ``writers`` (in :func:`storage_order`; empty storages left out).

    Raises:
        RuntimeError: the writers do not match ``torch.save``'s storages; a writer's error.
    """
    stream = StorageStream(f, writers)
    try:
        with torch.serialization.skip_data():
            torch.save(payload, stream)
    except Exception:
        if stream.error is not None:
            raise stream.error from None
        raise
    stream.finish()
