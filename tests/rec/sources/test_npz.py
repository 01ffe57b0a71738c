"""read_npz gives what np.load gives: the same arrays, or the same exception, for any bytes.

One difference: where np.load raises an OSError that no read of the file raised (a seek to a
negative offset from a corrupt zip directory, a bzip2 member that does not decode),
read_npz raises zipfile.BadZipFile, so that DirectorySource sets the shard aside as bad data
instead of retrying it as an I/O error. The reference below (``_np_load``) reads np.load's
OSError that way: these files are local, no read of them fails.

Memory: ``keys`` leaves the other members unread, ``max_bytes`` refuses a shard whose wanted
arrays declare more (zip bombs) before anything is decompressed.
"""

from __future__ import annotations

import errno
import io
import json
import math
import os
import struct
import tracemalloc
import zipfile
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lit_amp.rec.sources import DirectorySource, SyntheticClickSource, write_shard
from lit_amp.rec.sources import npz as npz_mod
from lit_amp.rec.sources.npz import ShardTooLarge, read_npz
from lit_amp.rec.sources.schema import ClickSchema

SHARD_ARRAYS = ClickSchema.shard_arrays


def _np_load(path, keys=None):
    """np.load's arrays (those in ``keys``); an OSError it raises is corrupt data."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files if keys is None or k in keys}
    except OSError as exc:  # a local file: no read failed (see the module docstring)
        raise zipfile.BadZipFile(str(exc)) from exc


def _outcome(read, path):
    """("ok", {name: (dtype, shape, bytes)}) or ("error", exception type)."""
    try:
        arrays = read(path)
    except Exception as exc:  # noqa: BLE001 - the type is the outcome
        return "error", type(exc)
    return "ok", {k: v if isinstance(v, bytes) else (v.dtype, v.shape, v.tobytes())
                  for k, v in arrays.items()}


def _read_npz_outcome(path, keys=None):
    """read_npz's outcome, the same from a path and from a file descriptor (as
    DirectorySource reads it), and never an OSError for a local file's bytes."""
    by_path = _outcome(lambda p: read_npz(p, keys), path)
    fd = os.open(path, os.O_RDONLY)
    try:
        by_fd = _outcome(lambda p: read_npz(fd, keys), path)
    finally:
        os.close(fd)
    assert by_fd == by_path
    assert by_path[0] == "ok" or not issubclass(by_path[1], OSError), by_path
    return by_path


ARRAYS = {
    "id": np.arange(5, dtype=np.int64),
    "label": np.array([0, 1, 1, 0, 1], np.float32),
    "dense": np.linspace(-1, 1, 65, dtype=np.float32).reshape(5, 13),
    "cat": np.arange(130, dtype=np.uint64).reshape(5, 26),
    "b": np.array([True, False]),
    "zero_d": np.array(3.5),
    "empty": np.zeros((0, 4), np.int32),
    "big_endian": np.arange(4, dtype=">i4"),
}


def test_the_arrays_of_a_shard_equal_np_loads_and_take_the_fast_path(tmp_path, monkeypatch):
    path = write_shard(tmp_path, "part-0", SyntheticClickSource(batch_size=64).columns(0))
    monkeypatch.setattr(np, "load", lambda *a, **k: pytest.fail("np.load was used"))
    got = read_npz(path)
    monkeypatch.undo()
    want = _np_load(path)
    assert list(got) == list(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k])
        assert got[k].flags.writeable and got[k].flags.aligned and got[k].flags.c_contiguous


@pytest.mark.parametrize("member", sorted(ARRAYS))
def test_every_plain_dtype_and_shape_reads_back_aligned(tmp_path, member):
    # names of every length: the members' data sit at every offset modulo 8
    path = tmp_path / "a.npz"
    np.savez(path, **{member * k: ARRAYS[member] for k in range(1, 5)})
    got = read_npz(path)
    assert _outcome(read_npz, path) == _outcome(_np_load, path)
    assert all(a.flags.aligned and a.flags.writeable for a in got.values())


def test_what_the_fast_path_does_not_take_is_read_by_np_load(tmp_path, monkeypatch):
    calls = []
    real = np.load
    monkeypatch.setattr(np, "load", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    np.savez_compressed(tmp_path / "compressed.npz", **ARRAYS)
    np.savez(tmp_path / "fortran.npz", x=np.asfortranarray(np.ones((3, 2))))
    np.save(tmp_path / "x.npy", np.arange(3))
    with zipfile.ZipFile(tmp_path / "comment.npz", "w") as z:
        z.write(tmp_path / "x.npy", "x.npy")
        z.comment = b"a comment"
    with zipfile.ZipFile(tmp_path / "raw.npz", "w") as z:
        z.writestr("notes.txt", b"not an array")
    for name in ("compressed", "fortran", "comment", "raw"):
        path = tmp_path / f"{name}.npz"
        assert _outcome(read_npz, path) == _outcome(_np_load, path), name
    assert len(calls) == 4 + 4  # each file once by read_npz's fallback, once by _np_load


def test_a_pickled_array_is_refused_as_np_load_refuses_it(tmp_path):
    path = tmp_path / "obj.npz"
    np.savez(path, x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match="allow_pickle"):
        read_npz(path)


def test_a_flipped_data_byte_fails_the_checksum_like_np_load(tmp_path):
    path = write_shard(tmp_path, "part-0", SyntheticClickSource(batch_size=64).columns(0))
    data = bytearray(open(path, "rb").read())
    data[200] ^= 0x01  # inside the first member's array bytes
    open(path, "wb").write(bytes(data))
    with pytest.raises(zipfile.BadZipFile, match="CRC"):
        read_npz(path)


_VALID = None


def _valid_bytes(tmp_path_factory) -> bytes:
    global _VALID
    if _VALID is None:
        path = tmp_path_factory.mktemp("npz") / "v.npz"
        np.savez(path, **{k: ARRAYS[k] for k in ("id", "label", "dense", "cat")})
        _VALID = path.read_bytes()
    return _VALID


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)), min_size=1,
                      max_size=4),
       cut=st.one_of(st.none(), st.integers(0, 2000)),
       tail=st.binary(max_size=8))
def test_hostile_bytes_give_np_loads_outcome(tmp_path_factory, edits, cut, tail):
    data = bytearray(_valid_bytes(tmp_path_factory))
    for at, value in edits:
        data[at % len(data)] = value
    if cut is not None:
        data = data[: cut % (len(data) + 1)]
    data += tail
    path = tmp_path_factory.mktemp("hostile") / "h.npz"
    path.write_bytes(bytes(data))
    assert _read_npz_outcome(path) == _outcome(_np_load, path)


def test_each_distinct_header_is_parsed_once(tmp_path, monkeypatch):
    npz_mod._HEADERS.clear()
    parsed = []
    real = npz_mod._parse_header
    monkeypatch.setattr(npz_mod, "_parse_header", lambda h: parsed.append(h) or real(h))
    gen = SyntheticClickSource(batch_size=32)
    for i in range(5):
        read_npz(write_shard(tmp_path, f"part-{i}", gen.columns(i)))
    assert len(parsed) == 4  # id, label, dense, cat: once each over five files


# ---------------------------------------------------------------- zip headers (issue #48, 17)
# np.savez's file, its headers patched: the central and local header of each member, with
# the offsets of the fields zipfile reads (struct formats of npz.py's _ENTRY and _LOCAL)
_CENTRAL_NEED, _CENTRAL_FLAGS, _CENTRAL_METHOD = 6, 8, 10
_LOCAL_NEED, _LOCAL_FLAGS, _LOCAL_METHOD = 4, 6, 8
_UTF8 = 0x800
_VARIANT_ARRAYS = {"id": np.arange(5, dtype=np.int64),
                   "label": np.array([0, 1, 1, 0, 1], np.float32),
                   "é": np.arange(6, dtype=np.int16).reshape(2, 3)}  # zipfile flags it UTF-8


def _headers(data: bytes) -> list[tuple[int, int]]:
    """(central header offset, local header offset) of each member of a plain zip."""
    cd_size, cd_off = struct.unpack_from("<2L", data, len(data) - 10)
    at, out = cd_off, []
    while at < cd_off + cd_size:
        name_len, extra_len, comment_len = struct.unpack_from("<3H", data, at + 28)
        out.append((at, struct.unpack_from("<L", data, at + 42)[0]))
        at += 46 + name_len + extra_len + comment_len
    return out


def _patch(data: bytes, member: int, **fields: int) -> bytes:
    """``data`` with 16-bit header fields of member ``member`` set, e.g. central_flags=..."""
    out = bytearray(data)
    central, local = _headers(data)[member]
    for field, value in fields.items():
        where, what = field.split("_")
        at = (central if where == "central" else local) + \
            globals()[f"_{where.upper()}_{what.upper()}"]
        struct.pack_into("<H", out, at, value)
    return bytes(out)


def _variant_base(tmp_path) -> bytes:
    path = tmp_path / "base.npz"
    np.savez(path, **_VARIANT_ARRAYS)
    return path.read_bytes()


def _flags_of(data: bytes, member: int) -> int:
    return struct.unpack_from("<H", data, _headers(data)[member][0] + _CENTRAL_FLAGS)[0]


REFUSED = {  # the shards of the issue that read_npz read and np.load refuses
    "flag bit 5 (compressed patched data)": lambda d: _patch(
        d, 0, central_flags=1 << 5, local_flags=1 << 5),
    "flag bit 6 (strong encryption)": lambda d: _patch(
        d, 1, central_flags=1 << 6, local_flags=1 << 6),
    "version needed to extract 255": lambda d: _patch(d, 0, central_need=255),
    "UTF-8 name flag in the central header only": lambda d: _patch(
        d, 2, local_flags=_flags_of(d, 2) & ~_UTF8),
}


@pytest.mark.parametrize("variant", sorted(REFUSED))
def test_headers_np_load_refuses_are_refused(tmp_path, variant):
    base = _variant_base(tmp_path)
    assert _flags_of(base, 2) & _UTF8  # the non-ASCII name's member: UTF-8 in both headers
    path = tmp_path / "v.npz"
    path.write_bytes(REFUSED[variant](base))
    want = _outcome(_np_load, path)
    assert want[0] == "error"
    assert _read_npz_outcome(path) == want
    assert _read_npz_outcome(path, SHARD_ARRAYS) == _outcome(
        lambda p: _np_load(p, SHARD_ARRAYS), path)


def test_refused_headers_and_corrupt_offsets_are_set_aside_at_once_not_trained(tmp_path):
    """Before: the shards with flag bit 5, flag bit 6 or version 255 were trained end to
    end, and a shard whose zip directory points before the file's start raised OSError,
    retried 4 times as an I/O error before it was set aside. (The UTF-8 flag disagreement
    matters only for a non-ASCII member name, which no array ClickSchema reads has:
    np.load with the same keys reads such a shard too.)"""
    gen = SyntheticClickSource(batch_size=8, seed=0)
    good = write_shard(tmp_path / "src", "good", gen.columns(0))
    data = open(good, "rb").read()
    bad = {f"bad-{i}": REFUSED[v](data) for i, v in enumerate(sorted(REFUSED)) if "UTF" not in v}
    bad["bad-offset"] = _shifted_directory(data)
    folder = tmp_path / "stream"
    folder.mkdir()
    for name, content in bad.items():
        (folder / f"{name}.npz").write_bytes(content)
    (folder / "ok.npz").write_bytes(data)
    src = DirectorySource(folder, batch_size=8, max_idle_s=0.0, suffixes=("npz",))
    assert sum(len(label) for _, label in src) == 8  # ok.npz only
    dead = [json.loads(x) for x in (folder / "_dead_letter.jsonl").read_text().splitlines()]
    assert sorted(d["position"]["file"] for d in dead) == sorted(f"{n}.npz" for n in bad)
    assert all(d["position"]["row"] is None for d in dead)
    assert not any("attempts" in d["error"] for d in dead)  # none retried as I/O errors
    assert src.malformed == len(bad)


def _shifted_directory(data: bytes) -> bytes:
    """The central directory's offset in the end record moved 1000 bytes on: zipfile takes
    the difference for data before the zip and seeks each member 1000 bytes before its
    offset, before the file's start for the first (np.load: OSError [Errno 22])."""
    out = bytearray(data)
    cd_off = struct.unpack_from("<L", out, len(out) - 6)[0]
    struct.pack_into("<L", out, len(out) - 6, cd_off + 1000)
    return bytes(out)


def test_np_loads_oserrors_for_corrupt_bytes_are_bad_zip_files(tmp_path):
    base = _variant_base(tmp_path)
    cases = {"offset": _shifted_directory(base),
             # bzip2 (method 12) named for stored bytes: the stream does not decode
             "bzip2": _patch(base, 0, central_method=12, local_method=12)}
    for name, content in cases.items():
        path = tmp_path / f"{name}.npz"
        path.write_bytes(content)
        with pytest.raises(OSError):
            with np.load(path, allow_pickle=False) as z:
                {k: z[k] for k in z.files}
        with pytest.raises(zipfile.BadZipFile):
            read_npz(path)


def test_an_io_error_is_still_an_oserror(tmp_path, monkeypatch):
    """Only corrupt bytes become BadZipFile: a read the OS fails stays an OSError (and
    DirectorySource retries it), on np.load's path and on the fast path."""
    np.savez_compressed(tmp_path / "c.npz", **ARRAYS)  # np.load's path
    np.savez(tmp_path / "s.npz", **ARRAYS)  # the fast path

    class Failing(io.FileIO):
        def read(self, n=-1):
            if self.tell() > 0:
                raise OSError(errno.EIO, "Input/output error")
            return super().read(n)

    monkeypatch.setattr(npz_mod._File, "_raw", Failing)
    with pytest.raises(OSError) as caught:
        read_npz(tmp_path / "c.npz")
    assert caught.value.errno == errno.EIO and type(caught.value) is OSError

    def pread(*args):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(npz_mod.os, "pread", pread)
    with pytest.raises(OSError) as caught:
        read_npz(tmp_path / "s.npz")
    assert caught.value.errno == errno.EIO


_BITS = st.lists(st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, 11, 12, 13, 15]), max_size=3).map(
    lambda bits: sum({1 << b for b in bits}))
_VERSIONS = st.one_of(st.sampled_from([0, 10, 20, 45, 62, 63, 64, 255]),
                      st.integers(0, 0xFFFF))
_METHODS = st.sampled_from([0, 0, 0, 8, 12, 14, 99])
_MEMBER_EDIT = st.fixed_dictionaries({}, optional={
    "central_flags": _BITS, "local_flags": _BITS,  # drawn apart: the headers disagree
    "central_need": _VERSIONS, "local_need": _VERSIONS,
    "central_method": _METHODS, "local_method": _METHODS,
})


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(_MEMBER_EDIT, min_size=3, max_size=3),
       same_flags=st.lists(st.booleans(), min_size=3, max_size=3),
       keys=st.one_of(st.none(), st.sets(st.sampled_from(sorted(_VARIANT_ARRAYS)))))
def test_header_variants_give_np_loads_outcome(tmp_path_factory, edits, same_flags, keys):
    """Flag bits (each member's, in its central and its local header, equal or not),
    "version needed to extract" in either header, the method in either: read_npz's outcome
    (arrays or exception type, every member or only ``keys``) is np.load's."""
    data = _valid_variant_bytes(tmp_path_factory)
    for member, (edit, same) in enumerate(zip(edits, same_flags)):
        edit = dict(edit)
        base_flags = _flags_of(data, member)
        for side in ("central", "local"):
            if f"{side}_flags" in edit:
                edit[f"{side}_flags"] ^= base_flags  # toggles of what np.savez wrote
        if same and "central_flags" in edit:
            edit["local_flags"] = edit["central_flags"]
        data = _patch(data, member, **edit)
    path = tmp_path_factory.mktemp("variant") / "v.npz"
    path.write_bytes(data)
    assert _read_npz_outcome(path, keys) == _outcome(lambda p: _np_load(p, keys), path)


_VARIANT = None


def _valid_variant_bytes(tmp_path_factory) -> bytes:
    global _VARIANT
    if _VARIANT is None:
        _VARIANT = _variant_base(tmp_path_factory.mktemp("npz"))
    return _VARIANT


# ---------------------------------------------------------------- zip bombs (issue #48, 16)
_MIB = 1 << 20
_BOMB_MIB = 512  # zeros deflated about 1000:1: 512 MiB in a 0.5 MB member
_LIMIT = 256 * _MIB  # DirectorySource's default max_shard_bytes


def _zip(path, members) -> str:
    """A zip written by hand: ``members`` are (name, data, crc, declared size, method)."""
    out, central = bytearray(), bytearray()
    for name, data, crc, size, method in members:
        raw = name.encode()
        central += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, method, 0, 0x21, crc,
                               len(data), size, len(raw), 0, 0, 0, 0, 0, len(out)) + raw
        out += struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, method, 0, 0x21, crc, len(data),
                           size, len(raw), 0) + raw + data
    out += central + struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(members),
                                 len(members), len(central), len(out), 0)
    with open(path, "wb") as f:
        f.write(out)
    return str(path)


def _member(name, array):
    """``name.npy`` holding ``array``, deflated (as np.savez_compressed writes it)."""
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asarray(array))
    raw = buf.getvalue()
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    return name + ".npy", c.compress(raw) + c.flush(), zlib.crc32(raw), len(raw), 8


def _zeros_member(name, shape, dtype, zero_bytes=None, declared=None):
    """``name.npy``: a header of ``shape`` and ``dtype``, then ``zero_bytes`` zeros
    (default: what the header says), deflated about 1000:1. Every MiB of zeros is compressed
    once (a full flush makes each MiB's deflate block the same), so a bomb of GBs takes
    milliseconds to build."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {
        "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
        "shape": shape})
    header = buf.getvalue()
    if zero_bytes is None:
        zero_bytes = math.prod(shape) * np.dtype(dtype).itemsize
    mib, rest = divmod(zero_bytes, _MIB)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    parts = [c.compress(header) + c.flush(zlib.Z_FULL_FLUSH)]
    block = c.compress(bytes(_MIB)) + c.flush(zlib.Z_FULL_FLUSH) if mib else b""
    parts += [block] * mib + [c.compress(bytes(rest)) + c.flush()]
    crc = zlib.crc32(header)
    zeros = bytes(_MIB)
    for _ in range(mib):
        crc = zlib.crc32(zeros, crc)
    crc = zlib.crc32(bytes(rest), crc)
    size = len(header) + zero_bytes
    return name + ".npy", b"".join(parts), crc, size if declared is None else declared, 8


def _columns(n=64):
    return SyntheticClickSource(batch_size=n, seed=0).columns(0)


@pytest.fixture(scope="module")
def bombs(tmp_path_factory):
    """Shards of valid columns (deflated) where one member is a zip bomb of 512 MiB."""
    folder = tmp_path_factory.mktemp("bombs")
    cols = _columns()
    good = [_member(k, cols[k]) for k in SHARD_ARRAYS]
    bomb = _zeros_member("cat", (_BOMB_MIB * _MIB // 8,), np.uint64)
    junk = _zeros_member("junk", (_BOMB_MIB * _MIB,), np.uint8)
    return {
        "read": _zip(folder / "read.npz", good[:3] + [bomb]),  # 'cat' is the bomb
        "unread": _zip(folder / "unread.npz", good[:2] + [junk] + good[2:]),
    }


def _peak(fn):
    """(fn's result or exception, the peak of Python and numpy allocations while it ran)."""
    tracemalloc.start()
    try:
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - returned, for the caller to check
            result = exc
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_zip_bomb_is_refused_before_it_is_decompressed(bombs):
    """Before: np.load decompressed the 512 MiB member (0.5 MB on disk): Python's peak
    grew by 512 MiB. Now its declared size is checked first: a few KB."""
    assert os.path.getsize(bombs["read"]) < 2 * _MIB
    got, peak = _peak(lambda: read_npz(bombs["read"], SHARD_ARRAYS, max_bytes=_LIMIT))
    assert isinstance(got, ShardTooLarge) and "'cat.npy'" in str(got), got
    assert peak < 2 * _MIB, peak


def test_an_unread_member_is_never_decompressed(bombs, monkeypatch):
    """A 512 MiB bomb beside the arrays the schema reads: never opened, under any limit."""
    opened = []
    real = zipfile.ZipFile.open
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda self, name, *a, **k: opened.append(
        getattr(name, "filename", name)) or real(self, name, *a, **k))
    for limit in (None, _LIMIT):
        opened.clear()
        got, peak = _peak(
            lambda limit=limit: read_npz(bombs["unread"], SHARD_ARRAYS, max_bytes=limit))
        assert not isinstance(got, Exception), got
        assert list(got) == list(SHARD_ARRAYS)
        assert all(np.array_equal(got[k], v) for k, v in _columns().items())
        assert "junk.npy" not in opened and opened
        assert peak < 2 * _MIB, peak


def test_directory_source_sets_a_zip_bomb_aside_counted_in_bounded_memory(bombs, tmp_path):
    folder = tmp_path / "stream"
    write_shard(folder, "part-0", _columns(8))
    for name in ("read", "unread"):
        os.link(bombs[name], folder / f"part-1-{name}.npz")
    write_shard(folder, "part-2", _columns(8))
    src = DirectorySource(folder, batch_size=8, max_idle_s=0.0, suffixes=("npz",))
    assert src.max_shard_bytes == _LIMIT  # the default
    rows, peak = _peak(lambda: sum(len(label) for _, label in src))
    assert rows == 8 + 64 + 8  # the unread bomb's shard is trained, the other is not
    assert peak < 8 * _MIB, peak
    dead = [json.loads(x) for x in (folder / "_dead_letter.jsonl").read_text().splitlines()]
    assert [d["position"] for d in dead] == [{"file": "part-1-read.npz", "row": None}]
    assert "limit of 268,435,456 bytes" in dead[0]["error"] and src.malformed == 1
    with pytest.raises(ValueError, match="max_shard_bytes"):
        DirectorySource(folder, batch_size=8, max_shard_bytes=0)


@pytest.mark.parametrize("lie", ["declared size", "npy header"])
def test_a_lying_size_is_checked_too(tmp_path, lie):
    """A member that declares 1 MiB in its zip headers but 1 TiB in its .npy header (np.load
    would allocate the TiB before reading), or a 1 TiB uncompressed size: refused unread."""
    cols = _columns()
    if lie == "npy header":
        cat = _zeros_member("cat", (1 << 37,), np.uint64, zero_bytes=_MIB)
    else:
        cat = _zeros_member("cat", (_MIB // 8,), np.uint64, declared=0xFFFFFFFE)
    path = _zip(tmp_path / "lie.npz", [_member(k, cols[k]) for k in SHARD_ARRAYS[:3]] + [cat])
    got, peak = _peak(lambda: read_npz(path, SHARD_ARRAYS, max_bytes=_LIMIT))
    assert isinstance(got, ShardTooLarge), got
    assert peak < 2 * _MIB, peak


def test_the_fast_path_reads_only_wanted_members_within_the_limit(tmp_path, monkeypatch):
    cols = _columns(4096)
    path = tmp_path / "s.npz"
    np.savez(path, junk=np.zeros(_MIB, np.uint8), **cols)
    size = sum(v.nbytes for v in cols.values())
    read = []
    real = npz_mod._array
    monkeypatch.setattr(npz_mod, "_array", lambda *a: read.append(a[3]) or real(*a))
    monkeypatch.setattr(np, "load", lambda *a, **k: pytest.fail("np.load was used"))
    got = read_npz(path, SHARD_ARRAYS, max_bytes=size + 4 * 128)  # data and .npy headers
    assert list(got) == list(SHARD_ARRAYS) and len(read) == 4 and max(read) < _MIB
    monkeypatch.undo()
    with pytest.raises(ShardTooLarge, match="the limit of"):
        read_npz(path, SHARD_ARRAYS, max_bytes=size)
    with pytest.raises(ShardTooLarge, match="the limit of"):
        read_npz(path, max_bytes=size + 4 * 128)  # every member wanted: junk counts
