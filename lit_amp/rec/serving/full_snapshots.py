"""Full snapshots of a :class:`~lit_amp.rec.serving.writer.DeltaPublisher`, written in a thread.

At tens of millions of rows a full snapshot is gigabytes: written by the training loop it
stalls the stream for seconds. :class:`BackgroundFullWriter` freezes the snapshot instead
(:class:`~lit_amp.rec.state.snapshot.Snapshots`: small tensors cloned, big tables copied on
write) and writes it in a thread. The file's checksum (the one every versioned file carries)
is computed from the bytes as they are written and stored beside it, in ``<file>.crc``, since
the file's header is written before its tensors.
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Iterable
from concurrent.futures import Future

import torch

from lit_amp._io import BackgroundJobs, atomic_write
from lit_amp.rec.state.snapshot import Snapshot, Snapshots

__all__ = ["BackgroundFullWriter", "streamable"]

log = logging.getLogger(__name__)


def streamable(state: dict[str, torch.Tensor]) -> bool:
    """Whether every tensor of ``state`` is a dense CPU tensor that is its whole storage, no
    two sharing one (the file's bytes are then the tensors' bytes, one after the other)."""
    seen = set()
    for t in state.values():
        if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided or \
                t.device.type != "cpu" or not t.is_contiguous() or t.storage_offset() != 0:
            return False
        s = t.untyped_storage()
        if s.nbytes() != t.numel() * t.element_size() or s._cdata in seen:
            return False
        seen.add(s._cdata)
    return True


class _StreamChecksum:
    """``format.checksum`` of a full snapshot from the bytes as the writer streams them:
    the header, then per tensor (in key order, which is the file's order) its key, dtype and
    size, then its bytes."""

    def __init__(self, header_crc: int, network: dict[str, torch.Tensor]) -> None:
        self.crc = header_crc
        self.keys = list(network)
        self.tensors = network
        self.index = {t.untyped_storage()._cdata: i for i, t in enumerate(network.values())}
        self.next = 0  # the next key whose prefix is not in the checksum yet

    def _prefixes(self, upto: int) -> None:
        while self.next <= upto:
            key = self.keys[self.next]
            t = self.tensors[key]
            self.crc = zlib.crc32(key.encode(), self.crc)
            self.crc = zlib.crc32(f"{t.dtype}:{t.numel()};".encode(), self.crc)
            self.next += 1

    def __call__(self, storage: int, chunk: memoryview) -> None:
        i = self.index.get(storage)
        if i is None:
            raise RuntimeError("DeltaPublisher: a full snapshot wrote a storage that is not one "
                               "of its tensors; its checksum cannot be computed.")
        if i >= self.next:
            self._prefixes(i)
        self.crc = zlib.crc32(chunk, self.crc)

    def value(self) -> int:
        self._prefixes(len(self.keys) - 1)
        return self.crc


class BackgroundFullWriter:
    """Writes one full snapshot at a time in a thread (see the module docstring).

    Args:
        optimizers: the optimizers that step the published network (copy-on-write hooks).
        network: the published network (its modules that change rows themselves are copied on
            write when they announce those writes, cloned otherwise: see :class:`Snapshots`).
    """

    def __init__(self, optimizers: Iterable[torch.optim.Optimizer],
                 network: torch.nn.Module) -> None:
        self._snapshots = Snapshots(optimizers, network=network)
        self._writes = BackgroundJobs("lit_amp-publish-full")  # noted (version, path)

    def start(self, payload: dict, header_crc: int, version: int, path: str) -> None:
        """Freeze ``payload`` (its ``"network"`` in key order, :func:`streamable`) and write
        it to ``path`` in the background, then its checksum to ``<path>.crc``."""
        snap = self._snapshots.take(payload, weights="network")
        crc = _StreamChecksum(header_crc, snap.payload["network"])
        self._writes.submit(self._write, snap, path, crc, note=(version, path))

    @staticmethod
    def _write(snap: Snapshot, path: str, crc: _StreamChecksum) -> None:
        snap.write(path, tap=crc)
        value = crc.value()
        atomic_write(path + ".crc", lambda f: f.write(f"{value}\n".encode()))

    @property
    def pending(self) -> tuple[Future, tuple[int, str]] | None:
        """The write started and not collected: ``(future, (version, path))``, or None."""
        return self._writes.pending

    def busy(self) -> bool:
        return self._writes.busy()

    def collect(self, wait: bool = False) -> tuple[int, str, BaseException | None] | None:
        """The finished write, if any: ``(version, path, error or None)``; ``wait`` for it."""
        done = self._writes.take(wait)
        if done is None:
            return None
        future, (version, path) = done
        error = future.exception()
        if error is not None:
            for name in (path, path + ".crc"):  # what a failed write left
                try:
                    os.remove(name)
                except OSError:
                    pass
        return version, path, error

    def broken(self) -> None:
        """The last snapshot was broken by a write outside a step: clone those tables."""
        active = self._snapshots._active
        if active is not None:
            self._snapshots.broken(active)

    def close(self) -> None:
        """Wait for the write in flight and unhook the optimizers (in the training thread)."""
        self._writes.take(wait=True)  # its error is the caller's (collect)
        self._writes.close()
        self._snapshots.remove()
