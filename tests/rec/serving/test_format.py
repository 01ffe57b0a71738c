"""The served files' names and checksums (``lit_amp.rec.serving.format``)."""

from __future__ import annotations

import torch

from lit_amp.rec.serving.format import HEADER, VERSIONED, checksum, versions


def _payload(**change) -> dict:
    payload = {k: None for k in HEADER}
    payload.update({"network": {"w": torch.arange(6.0).reshape(3, 2)}, "rows": {}, **change})
    return payload


def test_the_checksum_covers_the_header_the_tensors_and_the_rows():
    base = checksum(_payload())
    assert checksum(_payload()) == base
    assert checksum(_payload(version=2)) != base
    assert checksum(_payload(network={"w": torch.arange(6.0).reshape(3, 2) + 1})) != base
    assert checksum(_payload(rows={"w": torch.tensor([0, 2])})) != base


def test_versions_lists_the_full_snapshots_and_deltas_of_a_folder(tmp_path):
    for name in ("full-000000000001.pt", "delta-000000000002.pt", "full-000000000002.pt",
                 "full-000000000001.pt.crc", "model-000000000003.pt", "LATEST"):
        (tmp_path / name).write_bytes(b"")
    assert versions(str(tmp_path)) == ({1: "full-000000000001.pt", 2: "full-000000000002.pt"},
                                       {2: "delta-000000000002.pt"})
    assert versions(str(tmp_path / "missing")) == ({}, {})
    assert VERSIONED.match("delta-000000000002.pt").groups() == ("delta", "000000000002")
