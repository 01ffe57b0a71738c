"""Reading a ``.npz`` shard: what ``np.load`` returns, in half its time on ``np.savez``'s files.

:class:`~lit_amp.rec.sources.DirectorySource` reads one shard per training step, in the
training loop. For a 4,096-record shard ``np.load`` spends more time in Python (the zip
reader's per-read bookkeeping, an ``ast`` parse of every array header) than in reading and
checksumming the bytes. :func:`read_npz` reads each member's bytes straight into its array
(one copy from the page cache), checks its CRC-32 as ``zipfile`` does, and parses each
distinct array header once.

It takes this path only for what ``np.savez`` writes: an uncompressed, unencrypted zip
without a comment or data before it, whose members are ``.npy`` arrays of a plain dtype in C
order. Anything else, a failed checksum or a malformed byte included, is handed to
``np.load(path, allow_pickle=False)``: the same arrays, or the same exception, as before.
"""

from __future__ import annotations

import io
import math
import os
import struct
import zlib
from typing import Any

import numpy as np

__all__ = ["read_npz"]

_END = struct.Struct("<4s4H2LH")  # end of central directory record (no comment)
_ENTRY = struct.Struct("<4s6H3L5H2L")  # central directory file header
_LOCAL = struct.Struct("<4s5H3L2H")  # local file header
_MAGIC = b"\x93NUMPY"
_HEADERS: dict[bytes, tuple[tuple[int, ...], np.dtype]] = {}  # .npy header -> shape, dtype
_MAX_HEADERS = 256
_TAIL = 4096  # bytes read from the end: the directory of a shard's few members
_HEAD = 1024  # bytes read at a member: its local header, name and .npy header


class _Slow(Exception):
    """Not a file of the fast path: ``np.load`` reads it."""


def read_npz(path: str | os.PathLike | int) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` file at ``path``: ``{name: array}`` as
    ``np.load(path, allow_pickle=False)`` gives them.

    Args:
        path: the file, or a file descriptor open for reading (read from offset 0 whatever
            its position; left open).

    Raises:
        What ``np.load`` raises for the file (a corrupt or truncated file, a pickled array).

    Example:
        >>> import tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "a.npz")
        >>> np.savez(path, x=np.arange(3), y=np.ones((2, 2), np.float32))
        >>> {k: v.tolist() for k, v in read_npz(path).items()}
        {'x': [0, 1, 2], 'y': [[1.0, 1.0], [1.0, 1.0]]}
    """
    given = isinstance(path, int)
    fd = path if given else os.open(path, os.O_RDONLY)
    try:
        return _arrays(fd)
    except (_Slow, struct.error, ValueError, TypeError, KeyError, IndexError):
        pass
    finally:
        if not given:
            os.close(fd)
    if given:  # np.load reads a file object from its position: a copy of fd, from offset 0
        with os.fdopen(os.dup(fd), "rb") as f:
            f.seek(0)
            with np.load(f, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _arrays(fd: int) -> dict[str, np.ndarray]:
    """Each member read straight into its own array (aligned, writable: one copy, from the
    page cache), its CRC-32 checked."""
    size = os.fstat(fd).st_size
    tail = os.pread(fd, min(size, _TAIL), max(0, size - _TAIL))
    sig, disk, cd_disk, n_here, n, cd_size, cd_off, comment = _END.unpack_from(tail, len(tail) - 22)
    if sig != b"PK\x05\x06" or disk or cd_disk or n_here != n or comment or \
            cd_off + cd_size != size - 22:
        raise _Slow
    if cd_size + 22 > len(tail):
        tail = os.pread(fd, cd_size + 22, cd_off)
    directory = memoryview(tail)[len(tail) - 22 - cd_size:len(tail) - 22]
    out: dict[str, np.ndarray] = {}
    at, end_of_data = 0, 0
    for _ in range(n):
        (sig, _made, _need, flags, method, _t, _d, crc, csize, usize, name_len, extra_len,
         comment_len, _disk, _ia, _ea, offset) = _ENTRY.unpack_from(directory, at)
        if sig != b"PK\x01\x02" or flags & 0x1 or method != 0 or csize != usize or \
                0xFFFFFFFF in (csize, usize, offset) or offset < end_of_data:
            raise _Slow
        raw_name = bytes(directory[at + 46:at + 46 + name_len])
        at += 46 + name_len + extra_len + comment_len
        name = raw_name.decode("utf-8" if flags & 0x800 else "cp437")
        if not name.endswith(".npy") or name[:-4] in out:
            raise _Slow
        head = os.pread(fd, min(_HEAD, cd_off - offset), offset)
        local = _LOCAL.unpack_from(head, 0)
        start = 30 + local[9] + local[10]
        if local[0] != b"PK\x03\x04" or local[3] != 0 or head[30:30 + local[9]] != raw_name:
            raise _Slow
        end_of_data = offset + start + usize
        if end_of_data > cd_off:
            raise _Slow
        out[name[:-4]] = _array(fd, memoryview(head)[start:], offset + start, usize, crc)
    if at != cd_size:
        raise _Slow
    return out


def _array(fd: int, head: memoryview, at: int, size: int, crc: int) -> np.ndarray:
    """The ``.npy`` member of ``size`` bytes at offset ``at``, whose first bytes are ``head``."""
    if bytes(head[:6]) != _MAGIC or head[6] not in (1, 2) or head[7] != 0:
        raise _Slow
    length = 10 + int.from_bytes(head[8:10], "little") if head[6] == 1 else \
        12 + int.from_bytes(head[8:12], "little")
    if length > len(head):
        raise _Slow
    header = bytes(head[:length])
    data = np.empty(size - length, np.uint8)
    if len(data) and os.preadv(fd, [data], at + length) != len(data):
        raise _Slow
    if zlib.crc32(data, zlib.crc32(header)) != crc:
        raise _Slow  # np.load raises zipfile's BadZipFile
    known = _HEADERS.get(header)
    if known is None:
        known = _HEADERS[header] = _parse_header(header)
        if len(_HEADERS) > _MAX_HEADERS:
            _HEADERS.pop(next(iter(_HEADERS)))
    shape, dtype = known
    if len(data) != dtype.itemsize * math.prod(shape):
        raise _Slow
    return data.view(dtype).reshape(shape)


def _parse_header(header: bytes) -> tuple[tuple[int, ...], np.dtype]:
    f = io.BytesIO(header)
    try:
        version = np.lib.format.read_magic(f)
        read: Any = {(1, 0): np.lib.format.read_array_header_1_0,
                     (2, 0): np.lib.format.read_array_header_2_0}[version]
        shape, fortran_order, dtype = read(f)
    except Exception as exc:  # noqa: BLE001 - whatever np.load makes of it, it says so
        raise _Slow from exc
    if fortran_order or dtype.hasobject or f.tell() != len(header) or dtype.itemsize == 0:
        raise _Slow
    return shape, dtype
