"""The record schema of the built-in sources: Criteo-like click logs.

A record is ``{"id": int, "label": 0 | 1, "dense": [13 numbers], "cat": [26 ids]}`` (JSON
lines), or the same columns as arrays in an ``.npz``/``.pt`` shard: ``id`` (n,), ``label``
(n,), ``dense`` (n, 13), ``cat`` (n, 26). Dense values may be ``null`` (missing, read as 0);
categorical ids are non-negative ints or strings (hashed with CRC-32, as Criteo's hex ids).

A batch, as the sources yield it and :class:`~lit_amp.rec.modules.wide_deep.WideDeep` takes it::

    ({"dense": float32 (B, 13), "cat": int64 (B, 26), "record_id": int64 (B,)}, float32 (B,))

Pass your own schema object (same four methods) to a source for other record layouts.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["ClickSchema", "Columns"]

Columns = dict[str, np.ndarray]

_INT64_MAX = 2**63 - 1
_F32_MAX = float(np.finfo(np.float32).max)


def _short(value: Any, limit: int = 200) -> str:
    """``repr(value)``, cut to ``limit`` characters (error messages stay small)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "...(truncated)"


def _cat_id(value: Any) -> int:
    if isinstance(value, int):  # (a JSON true/false counts as 1/0)
        if value < 0:
            raise ValueError(f"categorical id {value} is negative")
        if value > _INT64_MAX:
            raise ValueError(f"categorical id {_short(value)} does not fit in int64")
        return value
    if isinstance(value, str):
        return zlib.crc32(value.encode())
    raise ValueError(f"categorical id {value!r} is not an int or a str")


class ClickSchema:
    """Criteo-like click records: id, label, ``num_dense`` dense and ``num_cat`` categorical.

    Args:
        num_dense: dense features per record (Criteo: 13).
        num_cat: categorical features per record (Criteo: 26).

    Example:
        >>> s = ClickSchema(num_dense=2, num_cat=3)
        >>> row = s.parse_json('{"id": 7, "label": 1, "dense": [0.5, null], "cat": [1, 2, "a"]}')
        >>> cols = s.rows_to_columns([row])
        >>> (features, label) = s.to_batch(cols)
        >>> features["cat"].shape, float(label[0]), int(features["record_id"][0])
        (torch.Size([1, 3]), 1.0, 7)
    """

    #: the arrays of a shard that :meth:`check_columns` reads (DirectorySource neither
    #: reads nor decompresses an ``.npz`` shard's other members)
    shard_arrays = ("id", "label", "dense", "cat")

    def __init__(self, num_dense: int = 13, num_cat: int = 26) -> None:
        for name, v in (("num_dense", num_dense), ("num_cat", num_cat)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(
                    f"For 'ClickSchema', the argument '{name}' must be an int >= 0, but got {v!r}."
                )
        self.num_dense = num_dense
        self.num_cat = num_cat

    # ------------------------------------------------------------------ one record (JSON)
    def parse_json(self, line: str | bytes) -> tuple[int, float, list[float], list[int]]:
        """Parse and validate one JSON record.

        Every way a line can fail to decode is a ``ValueError``: ``None`` (a Kafka tombstone),
        another type than str/bytes, bad JSON or UTF-8, nesting too deep for the decoder
        (``"[" * 100000``), a number literal too long to convert.

        Raises:
            ValueError: the line is not a valid record (the message says why).
        """
        if line is None:
            raise ValueError("no record: the value is None (e.g. a Kafka tombstone)")
        if not isinstance(line, (str, bytes, bytearray)):
            raise ValueError(
                f"a record must be JSON text (str or bytes), got {type(line).__name__}"
            )
        try:
            obj = json.loads(line)
        except RecursionError:
            raise ValueError("not valid JSON: nested too deeply to decode") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON: {exc}") from None
        except (ValueError, TypeError, MemoryError) as exc:  # UTF-8, a huge number literal
            raise ValueError(f"not valid JSON: {type(exc).__name__}: {exc}") from None
        return self.parse_obj(obj)

    def parse_obj(self, obj: Any) -> tuple[int, float, list[float], list[int]]:
        """Validate one decoded record (a dict)."""
        if not isinstance(obj, dict):
            raise ValueError(f"a record must be a JSON object, got {type(obj).__name__}")
        missing = [k for k in ("id", "label", "dense", "cat") if k not in obj]
        if missing:
            raise ValueError(f"missing field(s) {missing}")
        rid, label, dense, cat = obj["id"], obj["label"], obj["dense"], obj["cat"]
        if not isinstance(rid, int) or isinstance(rid, bool):
            raise ValueError(f"'id' must be an int, got {_short(rid)}")
        if not -_INT64_MAX - 1 <= rid <= _INT64_MAX:
            raise ValueError(f"'id' {_short(rid)} does not fit in int64")
        if isinstance(label, bool) or label not in (0, 1):
            raise ValueError(f"'label' must be 0 or 1, got {_short(label)}")
        if not isinstance(dense, list) or len(dense) != self.num_dense:
            raise ValueError(
                f"'dense' must be a list of {self.num_dense} numbers, got {_short(dense)}"
            )
        dvals = []
        for v in dense:
            if v is None:
                dvals.append(0.0)
            elif isinstance(v, (int, float)):  # (JSON true/false: 1/0)
                try:
                    f = float(v)
                except OverflowError:  # an int too large even for float64
                    f = math.inf
                if not math.isfinite(f) or abs(f) > _F32_MAX:  # float32 would be inf / nan
                    raise ValueError(
                        f"'dense' holds {_short(v)}, which is not finite in float32"
                    )
                dvals.append(f)
            else:
                raise ValueError(f"'dense' holds {_short(v)}, not a finite number or null")
        if not isinstance(cat, list) or len(cat) != self.num_cat:
            raise ValueError(f"'cat' must be a list of {self.num_cat} ids, got {_short(cat)}")
        return rid, float(label), dvals, [_cat_id(c) for c in cat]

    def rows_to_columns(self, rows: Sequence[tuple]) -> Columns:
        """Validated rows (from :meth:`parse_obj`) -> columns."""
        n = len(rows)
        return {
            "id": np.fromiter((r[0] for r in rows), dtype=np.int64, count=n),
            "label": np.fromiter((r[1] for r in rows), dtype=np.float32, count=n),
            "dense": np.asarray([r[2] for r in rows], dtype=np.float32).reshape(n, self.num_dense),
            "cat": np.asarray([r[3] for r in rows], dtype=np.int64).reshape(n, self.num_cat),
        }

    def parse_json_lines(
        self, lines: Sequence[bytes]
    ) -> tuple[Columns, np.ndarray, list[tuple[int, str, bytes]]]:
        """Parse many JSON lines: ``(columns of the valid rows, their line indexes, bad rows)``.

        ``bad rows`` are ``(line_index, error, raw_line)``. Blank lines are not records.
        """
        fast = self._parse_json_lines_fast(lines)
        if fast is not None:
            return fast
        rows, index, bad = [], [], []
        for i, raw in enumerate(lines):
            if not raw.strip():
                continue
            try:
                rows.append(self.parse_json(raw))
                index.append(i)
            except ValueError as exc:
                bad.append((i, str(exc), raw))
            except Exception as exc:  # noqa: BLE001 - a bad row is set aside, never a crash
                bad.append((i, f"{type(exc).__name__}: {exc}", raw))
        return self.rows_to_columns(rows), np.asarray(index, dtype=np.int64), bad

    def _parse_json_lines_fast(
        self, lines: Sequence[bytes]
    ) -> tuple[Columns, np.ndarray, list[tuple[int, str, bytes]]] | None:
        """All lines valid: vectorised checks. Else None (use the slow path).

        Each line is decoded on its own: decoding the lines joined into one JSON array (as
        this once did) lets a line such as ``{...}, {...}`` pass as two records and shifts
        every later row's index.
        """
        index = [i for i, raw in enumerate(lines) if raw.strip()]
        if not index:
            return None
        try:
            objs = [json.loads(lines[i]) for i in index]
            with np.errstate(over="ignore"):
                return self._fast_columns(objs, index)
        except Exception:  # noqa: BLE001 - any bad line (even "[" * 100000): the slow path
            return None

    def _fast_columns(
        self, objs: list, index: list[int]
    ) -> tuple[Columns, np.ndarray, list[tuple[int, str, bytes]]] | None:
        try:
            ids = [o["id"] for o in objs]
            labels = [o["label"] for o in objs]
            if not set(map(type, ids)) <= {int} or not set(map(type, labels)) <= {int, float}:
                return None
            n = len(objs)
            dense = np.asarray([o["dense"] for o in objs])
            if dense.dtype.kind not in "biuf":  # a string ("1"), null or nested value: slow path
                return None
            cols = {
                "id": np.asarray(ids, dtype=np.int64),
                "label": np.asarray(labels, dtype=np.float32),
                "dense": dense.astype(np.float32),
                "cat": np.asarray([o["cat"] for o in objs]),
            }
        except Exception:  # noqa: BLE001 - the slow path validates row by row and says why
            return None
        if (
            not set(map(type, objs)) <= {dict}
            or cols["dense"].shape != (n, self.num_dense)
            or cols["cat"].shape != (n, self.num_cat)
            or (self.num_cat and cols["cat"].dtype != np.int64)  # (uint64: ids over int64)
            or not np.isfinite(cols["dense"]).all()
            or not ((cols["label"] == 0) | (cols["label"] == 1)).all()
            or (self.num_cat and (cols["cat"] < 0).any())
        ):
            return None
        cols["cat"] = cols["cat"].astype(np.int64).reshape(n, self.num_cat)
        return cols, np.asarray(index, dtype=np.int64), []

    # ------------------------------------------------------------------ arrays (npz / pt)
    def check_columns(
        self, arrays: Mapping[str, Any]
    ) -> tuple[Columns, np.ndarray, list[tuple[int, str, dict]], int]:
        """Validate a shard's arrays: ``(valid columns, their row indexes, bad rows, n_rows)``.

        Raises:
            ValueError: the shard as a whole is unusable (missing arrays, mismatched lengths).
        """
        missing = [k for k in self.shard_arrays if k not in arrays]
        if missing:
            raise ValueError(f"shard lacks array(s) {missing}")
        cols = {k: np.asarray(_to_numpy(arrays[k])) for k in self.shard_arrays}
        n = len(cols["id"])
        if cols["dense"].ndim == 1 and self.num_dense == 0:
            cols["dense"] = cols["dense"].reshape(n, 0)
        if cols["cat"].ndim == 1 and self.num_cat == 0:
            cols["cat"] = cols["cat"].reshape(n, 0)
        shapes = {k: v.shape for k, v in cols.items()}
        if (
            cols["id"].ndim != 1
            or cols["label"].shape != (n,)
            or cols["dense"].shape != (n, self.num_dense)
            or cols["cat"].shape != (n, self.num_cat)
        ):
            raise ValueError(
                f"shard arrays have shapes {shapes}; expected id ({n},), label ({n},), dense "
                f"({n}, {self.num_dense}), cat ({n}, {self.num_cat})"
            )
        for k in ("id", "cat"):
            if not np.issubdtype(cols[k].dtype, np.integer):
                raise ValueError(f"shard array '{k}' must be integer, got {cols[k].dtype}")
        label = cols["label"].astype(np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            # a value over float32's range: inf
            dense = cols["dense"].astype(np.float32, copy=False)
        if self._clean(cols, label, dense):  # every row valid: no per-row masks, no copies
            valid = {
                "id": cols["id"].astype(np.int64, copy=False),
                "label": label.astype(np.float32),
                "dense": dense,
                "cat": cols["cat"].astype(np.int64, copy=False),
            }
            return valid, np.arange(n, dtype=np.int64), [], n
        id_ok = _fits_int64(cols["id"])
        cat_ok = _fits_int64(cols["cat"]).all(axis=1) if self.num_cat else True
        ok = (label == 0) | (label == 1)
        ok &= np.isfinite(dense).all(axis=1) if self.num_dense else True
        ok &= id_ok & cat_ok
        ok &= (cols["cat"] >= 0).all(axis=1) if self.num_cat else True
        bad_idx = np.flatnonzero(~ok)
        bad = []
        for i in bad_idx.tolist():
            why = (
                f"'label' must be 0 or 1, got {label[i]}"
                if label[i] not in (0.0, 1.0)
                else "'dense' holds a value that is non-finite in float32"
                if self.num_dense and not np.isfinite(dense[i]).all()
                else f"'id' {int(cols['id'][i])} does not fit in int64"
                if not id_ok[i]
                else "'cat' holds an id that does not fit in int64"
                if not np.all(cat_ok if np.ndim(cat_ok) == 0 else cat_ok[i])
                else "'cat' holds a negative id"
            )
            bad.append((i, why, self.row_dict(cols, i)))
        index = np.flatnonzero(ok).astype(np.int64)
        valid = {
            "id": cols["id"].astype(np.int64)[index],
            "label": label.astype(np.float32)[index],
            "dense": dense[index],
            "cat": cols["cat"].astype(np.int64)[index],
        }
        return valid, index, bad, n

    def _clean(self, cols: Columns, label: np.ndarray, dense: np.ndarray) -> bool:
        """Whether every row is valid, by whole-array reductions (the common case)."""
        if not len(label) or not ((label == 0) | (label == 1)).all():
            return False
        if self.num_dense and not np.isfinite(dense).all():
            return False
        cat = cols["cat"]
        if not _all_fit_int64(cols["id"]) or self.num_cat and not _all_fit_int64(cat):
            return False
        return not self.num_cat or cat.dtype.kind != "i" or cat.min() >= 0

    @staticmethod
    def row_dict(cols: Mapping[str, np.ndarray], i: int) -> dict:
        """Row ``i`` of columns as a JSON-able dict (for dead letters and producers)."""
        return {
            "id": int(cols["id"][i]),
            "label": float(cols["label"][i]),
            "dense": [float(x) for x in cols["dense"][i]],
            "cat": [int(x) for x in cols["cat"][i]],
        }

    # ------------------------------------------------------------------ batches
    def to_batch(self, cols: Columns) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Columns -> ``({"dense", "cat", "record_id"}, label)`` tensors."""
        features = {
            "dense": torch.from_numpy(np.ascontiguousarray(cols["dense"], dtype=np.float32)),
            "cat": torch.from_numpy(np.ascontiguousarray(cols["cat"], dtype=np.int64)),
            "record_id": torch.from_numpy(np.ascontiguousarray(cols["id"], dtype=np.int64)),
        }
        return features, torch.from_numpy(np.ascontiguousarray(cols["label"], dtype=np.float32))

    @staticmethod
    def concat(parts: Sequence[Columns]) -> Columns:
        """Concatenate column chunks."""
        if len(parts) == 1:
            return parts[0]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    @staticmethod
    def slice(cols: Columns, start: int, stop: int) -> Columns:
        """Rows ``[start, stop)`` of columns."""
        return {k: v[start:stop] for k, v in cols.items()}

    def to_json_lines(self, cols: Columns) -> bytes:
        """Columns -> JSON-lines bytes (what a producer writes)."""
        n = len(cols["id"])
        return b"".join(
            (json.dumps(self.row_dict(cols, i), separators=(",", ":")) + "\n").encode()
            for i in range(n)
        )


def _fits_int64(a: np.ndarray) -> np.ndarray:
    """Elementwise: the integer value is representable as int64 (uint64 may not be)."""
    if a.dtype.kind == "u" and a.dtype.itemsize >= 8:
        return a <= np.uint64(_INT64_MAX)
    return np.ones(a.shape, dtype=bool)


def _all_fit_int64(a: np.ndarray) -> bool:
    """Whether every integer value of ``a`` is representable as int64."""
    return a.dtype.kind != "u" or a.dtype.itemsize < 8 or not a.size or \
        a.max() <= np.uint64(_INT64_MAX)


def _to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)
