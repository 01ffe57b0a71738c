"""#48 item 13: a stop (SIGTERM) is honoured while DirectorySource parses a big JSON-lines
shard, within about ``poll_interval`` plus one chunk of lines, not after the whole shard."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np

from lit_amp.rec.sources import DirectorySource, SyntheticClickSource, write_shard
from tests.rec._helpers import Recorder, make_model

BIG = 60_000  # records of the big shard: ~10 MB, seconds to parse on a shared machine


def _cols(first: int, n: int):
    cols = SyntheticClickSource(batch_size=n, seed=0).columns(0)
    cols["id"] = np.arange(first, first + n, dtype=np.int64)
    return cols


def test_sigterm_is_honoured_while_a_big_shard_is_parsed(tmp_path):
    write_shard(tmp_path, "part-0", _cols(0, 8), "jsonl")
    write_shard(tmp_path, "part-1", _cols(1000, BIG), "jsonl")
    t0 = time.monotonic()
    assert len(list(DirectorySource(tmp_path, batch_size=BIG, max_idle_s=0))) == 2
    full_pass = time.monotonic() - t0  # listing and parsing both files, once
    sent = []

    def kill_soon(rc):  # after step 1 the source starts parsing part-1
        if rc.original_args().cur_step_num == 1:
            def kill():
                sent.append(time.monotonic())
                os.kill(os.getpid(), signal.SIGTERM)

            threading.Timer(0.3, kill).start()

    src = DirectorySource(tmp_path, batch_size=8, max_idle_s=5, poll_interval=0.05)
    s = make_model().online_train(src, callbacks=Recorder(kill_soon), dataset_sink_mode=False)
    waited = time.monotonic() - sent[0]
    assert (s.steps, s.stop_reason) == (1, "signal:SIGTERM")
    assert waited < max(1.0, full_pass / 3), (waited, full_pass)  # before: the whole parse
    # part-1 was not consumed: a restart from the cursor reads all of it
    state = src.state_dict()
    assert "part-1.jsonl" not in state["done"] and not state["partial"]
    again = DirectorySource(tmp_path, batch_size=BIG, max_idle_s=0)
    again.load_state_dict(state)
    got = [i for f, _ in again for i in f["record_id"].tolist()]
    assert got == list(range(1000, 1000 + BIG))


def test_a_shard_parsed_in_chunks_gives_the_same_rows_and_dead_letters(tmp_path):
    """Bad rows in several chunks keep their row numbers; valid rows come out in order."""
    lines = [f'{{"id": {i}, "label": 0, "dense": [0.5], "cat": [1]}}' for i in range(10_000)]
    from lit_amp.rec.sources.schema import ClickSchema

    good = ClickSchema().to_json_lines(_cols(0, 10_000)).splitlines()
    for i in (3, 4097, 9999):
        good[i] = lines[i].encode()  # wrong lengths: dead-lettered
    good[5000] = b""  # a blank line: no record
    (tmp_path / "part-0.jsonl").write_bytes(b"\n".join(good) + b"\n")
    src = DirectorySource(tmp_path, batch_size=4096, max_idle_s=0)
    ids = [i for f, _ in src for i in f["record_id"].tolist()]
    assert ids == [i for i in range(10_000) if i not in (3, 4097, 5000, 9999)]
    assert src.malformed == 3
    import json

    dead = [json.loads(x) for x in (tmp_path / "_dead_letter.jsonl").read_text().splitlines()]
    assert sorted(d["position"]["row"] for d in dead) == [3, 4097, 9999]
