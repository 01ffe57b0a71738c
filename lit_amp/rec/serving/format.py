"""The files of ``lit_amp.rec.serving``: names, formats and checksums, shared by writer and reader.

A publish folder holds one of two layouts, and ``LATEST``, a one-line text file naming the
newest file (written after that file, so a reader never sees a partial one):

- *full*: ``model-{step:012d}.pt`` holding ``{"network": state_dict, "step", "records",
  "published_at", "format"}`` (:data:`PUBLISH_FORMAT`);
- *delta*: numbered versions of one chain per publisher (:data:`DELTA_FORMAT`):
  ``full-{version:012d}.pt`` holds the whole ``state_dict``, ``delta-{version:012d}.pt`` the
  rows (and dense tensors) changed since ``version - 1``. Each file carries its version, the
  version it applies to, its chain id and a CRC32 of its content (:func:`checksum`; a full
  snapshot written in the background has it in ``<file>.crc``).
"""

from __future__ import annotations

import os
import re
import zlib

import torch

__all__ = ["PUBLISH_FORMAT", "DELTA_FORMAT", "PUBLISHED", "VERSIONED", "HEADER", "checksum",
           "byte_size", "tensor_crc", "versions"]

PUBLISH_FORMAT = "lit_amp.rec/1"
#: the format of the numbered full snapshots and deltas of a ``DeltaPublisher``
DELTA_FORMAT = "lit_amp.rec.delta/1"
#: a full-layout file
PUBLISHED = re.compile(r"^model-(\d+)\.pt$")
#: a delta-layout file: its kind and version
VERSIONED = re.compile(r"^(full|delta)-(\d+)\.pt$")
#: the fields of a versioned file the checksum covers besides its tensors
HEADER = ("format", "kind", "version", "base", "full", "chain", "step", "records")


def tensor_crc(crc: int, t: torch.Tensor) -> int:
    t = t.detach().cpu().contiguous().reshape(-1)
    crc = zlib.crc32(f"{t.dtype}:{t.numel()};".encode(), crc)
    return zlib.crc32(t.view(torch.uint8).numpy(), crc)


def checksum(payload: dict) -> int:
    """CRC32 over the header fields, every tensor and every row index of a versioned file."""
    crc = zlib.crc32(repr([payload.get(k) for k in HEADER]).encode())
    rows = payload["rows"]
    for key in sorted(payload["network"]):
        crc = zlib.crc32(key.encode(), crc)
        crc = tensor_crc(crc, payload["network"][key])
        if key in rows:
            crc = tensor_crc(crc, rows[key])
    return crc


def byte_size(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def versions(directory: str) -> tuple[dict[int, str], dict[int, str]]:
    """``({version: full file name}, {version: delta file name})`` of ``directory``."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return {}, {}
    fulls: dict[int, str] = {}
    deltas: dict[int, str] = {}
    for n in names:
        m = VERSIONED.match(n)
        if m:
            (fulls if m.group(1) == "full" else deltas)[int(m.group(2))] = n
    return fulls, deltas
