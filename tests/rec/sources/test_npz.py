"""read_npz gives what np.load gives: the same arrays, or the same exception, for any bytes."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lit_amp.rec.sources import SyntheticClickSource, write_shard
from lit_amp.rec.sources import npz as npz_mod
from lit_amp.rec.sources.npz import read_npz


def _np_load(path):
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _outcome(read, path):
    """("ok", {name: (dtype, shape, bytes)}) or ("error", exception type)."""
    try:
        arrays = read(path)
    except Exception as exc:  # noqa: BLE001 - the type is the outcome
        return "error", type(exc)
    return "ok", {k: v if isinstance(v, bytes) else (v.dtype, v.shape, v.tobytes())
                  for k, v in arrays.items()}


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
    assert _outcome(read_npz, path) == _outcome(_np_load, path)


def test_each_distinct_header_is_parsed_once(tmp_path, monkeypatch):
    npz_mod._HEADERS.clear()
    parsed = []
    real = npz_mod._parse_header
    monkeypatch.setattr(npz_mod, "_parse_header", lambda h: parsed.append(h) or real(h))
    gen = SyntheticClickSource(batch_size=32)
    for i in range(5):
        read_npz(write_shard(tmp_path, f"part-{i}", gen.columns(i)))
    assert len(parsed) == 4  # id, label, dense, cat: once each over five files
