"""#48 item 15: a file name that is not valid UTF-8 in the watched folder, under 2-process DDP
(gloo, CPU): every rank trains its share and the cursors holding the name are checkpointed
(before: ``shard_of`` raised ``UnicodeEncodeError`` on every rank)."""

from __future__ import annotations

import os

import pytest
import torch

from lit_amp.rec.online.checkpoint_files import list_checkpoints
from lit_amp.rec.sources import SyntheticClickSource, shard_of, write_shard
from lit_amp.rec.sources.schema import ClickSchema
from tests.rec.online.test_ddp_stream import _run_two_ranks

pytestmark = pytest.mark.slow  # two trainer processes: ~10-30 s on a shared 2-core machine

BAD_NAME = os.fsdecode(b"part-\xff\xfe.jsonl")


def test_ddp_trains_a_file_whose_name_is_not_utf8(tmp_path):
    data = tmp_path / "data"
    gen = SyntheticClickSource(batch_size=10, seed=0)
    for i in range(4):
        write_shard(data, f"part-{i:06d}", gen.columns(i), "jsonl")
    cols = gen.columns(99)
    with open(os.path.join(os.fsencode(data), os.fsencode(BAD_NAME)), "wb") as f:
        f.write(ClickSchema().to_json_lines(cols))
    summaries = _run_two_ranks(tmp_path, [])
    assert sum(s["records"] for s in summaries) == 50  # every record, the odd file's too
    state = torch.load(list_checkpoints(tmp_path / "ckpt")[-1], weights_only=False)
    owner = shard_of(BAD_NAME, 2)
    assert BAD_NAME in state["online"]["cursors"][owner]["done"]
