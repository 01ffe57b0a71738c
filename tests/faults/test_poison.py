"""Poison records: one hostile record is dead-lettered on its own and never reaches the model.

A dense value finite in JSON but not in float32 (1e39), an id or categorical id outside int64:
the row goes to the dead-letter file with its reason, its neighbours are trained, the weights
and what is published stay finite. Here: ``.npz`` arrays and whole runs; the same JSON lines
through every source are in ``tests/rec/sources/test_contract.py``; a non-finite gradient or
weight that no record check can see, in ``tests/rec/online/test_guard.py``.
"""

from __future__ import annotations

import json

import numpy as np
import torch

from lit_amp.rec import PublishOptions
from lit_amp.rec.serving.reader import load_published
from lit_amp.rec.sources import DirectorySource, write_shard
from tests.faults._servers import line, record
from tests.rec._helpers import make_model

POISON = {
    "dense_overflows_float32": {"dense": [1e39] + [1.0] * 12},
    "id_over_int64": {"id": 2**63},
    "cat_over_int64": {"cat": [2**64 + 5] + [1] * 25},
    "dense_int_over_float64": {"dense": [10**400] + [1.0] * 12},
}


def _jsonl(n: int, poison_at: dict[int, dict]) -> bytes:
    return b"".join(line(record(i, **poison_at.get(i, {}))) for i in range(n))


def ids_of(batches) -> list[int]:
    return [i for f, _ in batches for i in f["record_id"].tolist()]


def _dead(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_directory_source_npz_overflowing_values_dead_lettered_alone(tmp_path):
    n = 6
    cols = {
        "id": np.arange(n, dtype=np.uint64),
        "label": np.zeros(n, dtype=np.float64),
        "dense": np.ones((n, 13), dtype=np.float64),
        "cat": np.ones((n, 26), dtype=np.uint64),
    }
    cols["dense"][1, 3] = 1e39  # finite in float64, inf in float32
    cols["cat"][3, 0] = 2**63 + 1  # wraps negative in int64
    cols["id"][4] = 2**64 - 1
    write_shard(tmp_path, "part-0", cols, "npz")
    src = DirectorySource(tmp_path, batch_size=10, max_idle_s=0)
    assert ids_of(list(src)) == [0, 2, 5]
    assert [d["position"]["row"] for d in _dead(tmp_path / "_dead_letter.jsonl")] == [1, 3, 4]


def test_online_train_with_a_poison_row_publishes_finite_weights(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for k in range(3):
        poison = {5: POISON["dense_overflows_float32"]} if k == 1 else {}
        (data / f"part-{k:06d}.jsonl").write_bytes(_jsonl(20, poison))
    model = make_model()
    summary = model.online_train(
        DirectorySource(data, batch_size=8, max_idle_s=0), dataset_sink_mode=False,
        publish=PublishOptions(tmp_path / "pub", publish_every_n_steps=1),
    )
    assert summary.records == 59 and summary.stop_reason == "idle_timeout"
    served = load_published(tmp_path / "pub")["network"]
    assert all(torch.isfinite(v).all() for v in served.values() if v.is_floating_point())
    assert all(torch.isfinite(p).all() for p in model._network.parameters())
