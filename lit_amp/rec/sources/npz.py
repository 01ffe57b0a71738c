"""Reading a ``.npz`` shard: what ``np.load`` returns, in half its time on ``np.savez``'s files.

:class:`~lit_amp.rec.sources.DirectorySource` reads one shard per training step, in the
training loop. For a 4,096-record shard ``np.load`` spends more time in Python (the zip
reader's per-read bookkeeping, an ``ast`` parse of every array header) than in reading and
checksumming the bytes. :func:`read_npz` reads each member's bytes straight into its array
(one copy from the page cache), checks its CRC-32 as ``zipfile`` does, and parses each
distinct array header once.

It takes this path only for what ``np.savez`` writes: an uncompressed, unencrypted zip
without a comment, data before it or zip64 records, its members contiguous from offset 0,
each ``.npy`` array of a plain dtype in C order, with the general-purpose flags of
``np.savez`` (none, or the UTF-8 name flag) equal in the local and the central header, a
"version needed to extract" ``zipfile`` supports and no extra field in the central
directory. Anything else, a failed checksum or a malformed byte included, is handed to
``np.load(..., allow_pickle=False)``: the same arrays, or the same exception. One
exception: where ``np.load`` raises an ``OSError`` that no read of the file raised (a
member's offset before the start of the file, so ``zipfile`` seeks to a negative position:
``[Errno 22] Invalid argument``; a bzip2 member that does not decode: ``Invalid data
stream``), :func:`read_npz` raises :class:`zipfile.BadZipFile`: a corrupt file is bad data,
and an ``OSError`` is left to mean an I/O error (:class:`~lit_amp.rec.sources.DirectorySource`
retries those, and sets bad data aside at once).

Memory: ``keys`` names the arrays wanted; the other members are never read or
decompressed (``np.load`` is lazy too: ``{k: z[k] for k in z.files if k in keys}``).
``max_bytes`` bounds what the wanted arrays may take: each member's declared uncompressed
size and its ``.npy`` header's ``shape`` x ``itemsize`` are checked before any member's data
is read or decompressed, and a shard over the limit raises :class:`ShardTooLarge` (a zip
bomb: a few MB of deflated zeros that ``np.load`` would grow into GBs).
"""

from __future__ import annotations

import errno
import io
import math
import os
import struct
import zipfile
import zlib
from collections.abc import Collection
from typing import Any

import numpy as np

__all__ = ["ShardTooLarge", "read_npz"]

_END = struct.Struct("<4s4H2LH")  # end of central directory record (no comment)
_ENTRY = struct.Struct("<4s6H3L5H2L")  # central directory file header
_LOCAL = struct.Struct("<4s5H3L2H")  # local file header
_MAGIC = b"\x93NUMPY"
_HEADERS: dict[bytes, tuple[tuple[int, ...], np.dtype]] = {}  # .npy header -> shape, dtype
_MAX_HEADERS = 256
_TAIL = 4096  # bytes read from the end: the directory of a shard's few members
_HEAD = 1024  # bytes read at a member: its local header, name and .npy header
_UTF8_NAME = 0x800  # general-purpose flag bit 11, which zipfile sets for a non-ASCII name
_MAX_EXTRACT_VERSION = 63  # zipfile.MAX_EXTRACT_VERSION: above it np.load refuses the file


class ShardTooLarge(ValueError):
    """A shard whose wanted arrays declare more bytes than ``max_bytes``: refused before
    any of them is read or decompressed."""


class _Slow(Exception):
    """Not a file of the fast path: ``np.load`` reads it."""


class _IOFailed(OSError):
    """The OS failed a read of the file: an I/O error (np.load's other OSErrors are not)."""


class _File:
    """The file descriptor as ``np.load`` reads it (from its own position; not closed).

    An ``OSError`` of a read (or of a seek other than ``EINVAL``, an invalid position) is
    raised as :class:`_IOFailed`, still an ``OSError`` for ``zipfile`` and ``np.load``.
    """

    _raw = io.FileIO

    def __init__(self, fd: int) -> None:
        self._f = self._raw(fd, "r", closefd=False)

    def read(self, n: int = -1) -> bytes:
        try:
            return self._f.read(n)
        except OSError as exc:
            raise _IOFailed(exc.errno, exc.strerror) from exc

    def seek(self, pos: int, whence: int = 0) -> int:
        try:
            return self._f.seek(pos, whence)
        except OSError as exc:
            if exc.errno == errno.EINVAL:  # a negative offset from a corrupt directory
                raise
            raise _IOFailed(exc.errno, exc.strerror) from exc

    def tell(self) -> int:
        return self._f.tell()

    def seekable(self) -> bool:
        return True

    def close(self) -> None:
        self._f.close()


def read_npz(
    path: str | os.PathLike | int,
    keys: Collection[str] | None = None,
    *,
    max_bytes: int | None = None,
) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` file at ``path``: ``{name: array}`` as
    ``np.load(path, allow_pickle=False)`` gives them.

    Args:
        path: the file, or a file descriptor open for reading (read from offset 0 whatever
            its position; left open).
        keys: the arrays wanted (None: all). Members not named are neither read nor
            decompressed; a name the file lacks is left out of the result.
        max_bytes: the most bytes the wanted arrays may declare (None: no limit): the sum
            over them of each member's declared uncompressed size or, if larger, its
            ``.npy`` header's ``shape`` x ``itemsize``, checked before any data is read.

    Raises:
        ShardTooLarge: the wanted arrays declare more than ``max_bytes``.
        zipfile.BadZipFile: a corrupt zip, also where ``np.load`` raises an ``OSError`` that
            no read of the file raised (an invalid seek, a bzip2 stream that does not decode).
        What else ``np.load`` raises for the file (a truncated file, a pickled array, an
        unsupported zip feature: ``NotImplementedError``). An ``OSError`` is an I/O error.

    Example:
        >>> import tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "a.npz")
        >>> np.savez(path, x=np.arange(3), y=np.ones((2, 2), np.float32))
        >>> {k: v.tolist() for k, v in read_npz(path).items()}
        {'x': [0, 1, 2], 'y': [[1.0, 1.0], [1.0, 1.0]]}
        >>> list(read_npz(path, keys=("x",)))
        ['x']
        >>> read_npz(path, max_bytes=100)
        Traceback (most recent call last):
        ...
        lit_amp.rec.sources.npz.ShardTooLarge: ...
    """
    wanted = None if keys is None else frozenset(keys)
    given = isinstance(path, int)
    fd = path if given else os.open(path, os.O_RDONLY)
    try:
        try:
            return _arrays(fd, wanted, max_bytes)
        except (_Slow, struct.error, ValueError, TypeError, KeyError, IndexError):
            pass
        except OSError as exc:  # an offset the kernel refuses: a corrupt file, not I/O
            if exc.errno != errno.EINVAL:
                raise
        return _np_load(fd, wanted, max_bytes)
    finally:
        if not given:
            os.close(fd)


def _np_load(fd: int, wanted: frozenset[str] | None, max_bytes: int | None
             ) -> dict[str, np.ndarray]:
    """``np.load``'s arrays (those ``wanted``), sizes checked before any is decompressed."""
    f = _File(fd)
    try:
        f.seek(0)
        with np.load(f, allow_pickle=False) as z:
            files = [k for k in dict.fromkeys(z.files) if wanted is None or k in wanted]
            if max_bytes is not None:
                _check_sizes(z.zip, files, max_bytes)
            return {k: z[k] for k in files}
    except Exception as exc:
        failed = _io_failure(exc)
        if failed is not None:  # the OS failed a read (zipfile may say "not a zip file")
            raise failed from None
        if isinstance(exc, OSError):  # a seek to a negative offset, a bzip2 stream that
            raise zipfile.BadZipFile(f"corrupt .npz file: {exc}") from exc  # does not decode
        raise
    finally:
        f.close()


def _io_failure(exc: BaseException | None) -> OSError | None:
    """The ``OSError`` of a failed read behind ``exc`` (its cause or context), if any."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, _IOFailed):
            cause = exc.__cause__
            return cause if isinstance(cause, OSError) else exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _check_sizes(zf: zipfile.ZipFile, files: list[str], max_bytes: int) -> None:
    """Raise :class:`ShardTooLarge` if the members of ``files`` declare more than
    ``max_bytes`` (their data not read: at most a few KB of each, its ``.npy`` header)."""
    names = set(zf.namelist())
    total = 0
    for k in files:
        member = k if k in names else k + ".npy"  # the member np.load's z[k] opens
        info = zf.getinfo(member)
        declared = max(info.file_size, _header_bytes(zf, info))
        total += declared
        if total > max_bytes:
            raise ShardTooLarge(
                f"the arrays read declare {total:,} bytes up to member {member!r} ("
                f"{declared:,} bytes), more than the limit of {max_bytes:,} bytes (a zip bomb, "
                f"or a shard larger than allowed: DirectorySource's max_shard_bytes raises it)")


def _header_bytes(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> int:
    """``shape`` x ``itemsize`` as the member's ``.npy`` header declares it (0 where it
    cannot be read: ``np.load`` says what is wrong when it reads the member)."""
    fmt: Any = np.lib.format
    try:
        with zf.open(info) as m:  # decompresses at most a few KB: the magic and header
            version = fmt.read_magic(m)
            if version == (1, 0):
                shape, _, dtype = fmt.read_array_header_1_0(m)
            elif version == (2, 0):
                shape, _, dtype = fmt.read_array_header_2_0(m)
            else:
                shape, _, dtype = fmt._read_array_header(m, version)
    except Exception:  # noqa: BLE001 - np.load's read of the member reports it
        return 0
    if not all(isinstance(d, int) and d >= 0 for d in shape):
        return 0
    return math.prod(shape) * dtype.itemsize


def _arrays(fd: int, wanted: frozenset[str] | None, max_bytes: int | None
            ) -> dict[str, np.ndarray]:
    """Each wanted member read straight into its own array (aligned, writable: one copy,
    from the page cache), its CRC-32 checked. Every header is checked first, so that what
    this returns, ``np.load`` returns too."""
    size = os.fstat(fd).st_size
    tail = os.pread(fd, min(size, _TAIL), max(0, size - _TAIL))
    sig, disk, cd_disk, n_here, n, cd_size, cd_off, comment = _END.unpack_from(tail, len(tail) - 22)
    if sig != b"PK\x05\x06" or disk or cd_disk or n_here != n or comment or \
            cd_off + cd_size != size - 22 or tail[-42:-38] == b"PK\x06\x07":  # zip64 locator
        raise _Slow
    if cd_size + 22 > len(tail):
        tail = os.pread(fd, cd_size + 22, cd_off)
    directory = memoryview(tail)[len(tail) - 22 - cd_size:len(tail) - 22]
    members = []
    seen: set[str] = set()
    at, end_of_data = 0, 0
    for _ in range(n):
        (sig, _made, need, flags, method, _t, _d, crc, csize, usize, name_len, extra_len,
         comment_len, _disk, _ia, _ea, offset) = _ENTRY.unpack_from(directory, at)
        # np.savez's members: contiguous from offset 0 (np.load wants b"PK\x03\x04" first)
        if sig != b"PK\x01\x02" or flags not in (0, _UTF8_NAME) or \
                need > _MAX_EXTRACT_VERSION or method != 0 or csize != usize or extra_len or \
                offset != end_of_data:
            raise _Slow
        raw_name = bytes(directory[at + 46:at + 46 + name_len])
        at += 46 + name_len + comment_len
        name = raw_name.decode("utf-8" if flags else "cp437")
        if not name.endswith(".npy") or "\0" in name or name[:-4] in seen:
            raise _Slow
        seen.add(name[:-4])
        head = os.pread(fd, min(_HEAD, cd_off - offset), offset)
        local = _LOCAL.unpack_from(head, 0)
        start = 30 + local[9] + local[10]
        # zipfile decodes the local name with the local flags: equal flags, equal bytes
        if local[0] != b"PK\x03\x04" or local[2] != flags or local[3] != 0 or \
                head[30:30 + local[9]] != raw_name:
            raise _Slow
        end_of_data = offset + start + usize
        if end_of_data > cd_off:
            raise _Slow
        if wanted is None or name[:-4] in wanted:
            members.append((name[:-4], head, start, offset, usize, crc))
    if at != cd_size or end_of_data != cd_off:
        raise _Slow
    if max_bytes is not None and sum(m[4] for m in members) > max_bytes:
        raise _Slow  # np.load's path checks the same sizes and says which member
    return {name: _array(fd, memoryview(head)[start:], offset + start, usize, crc)
            for name, head, start, offset, usize, crc in members}


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
