"""Publishing on ``online_train``'s cadence (``lit_amp.rec.online.publisher``): by steps, by
seconds (also while the stream is idle), loadable weights."""

from __future__ import annotations

import os
import time

import torch

from lit_amp.rec import PublishOptions, StopOptions, load_published
from lit_amp.rec.serving.reader import latest_published
from lit_amp.rec.sources import SyntheticClickSource
from tests.rec._helpers import Recorder, make_model, tiny_net


def test_publish_by_steps_writes_loadable_weights(tmp_path):
    infos: list[dict] = []
    model = make_model()
    s = model.online_train(
        SyntheticClickSource(batch_size=8, num_records=56),
        publish=PublishOptions(
            tmp_path, publish_every_n_steps=2, keep_published_max=2, publish_hook=infos.append
        ),
    )
    assert [i["step"] for i in infos] == [2, 4, 6, 7]  # every 2 steps, and at the end
    assert sorted(os.listdir(tmp_path)) == [
        "LATEST",
        "model-000000000006.pt",
        "model-000000000007.pt",
    ]
    assert s.last_published == latest_published(tmp_path)
    fresh = tiny_net(seed=99)
    payload = load_published(tmp_path, fresh)
    assert payload["step"] == 7 and payload["records"] == 56
    trained = model.lit_model.network.state_dict()
    assert all(torch.equal(v, trained[k]) for k, v in fresh.state_dict().items())
    assert infos[-1]["cursor"] == {"batches": 7}


def test_publish_by_seconds_also_while_the_stream_is_idle(tmp_path):
    infos: list[dict] = []
    step_times: dict[int, float] = {}
    rec = Recorder(
        lambda rc: step_times.setdefault(rc.original_args().cur_step_num, time.monotonic())
    )
    make_model().online_train(
        SyntheticClickSource(batch_size=2, rate=4.0),  # one batch every 0.5 s
        callbacks=rec,
        publish=PublishOptions(
            tmp_path,
            publish_every_n_seconds=0.1,
            publish_hook=lambda i: infos.append({**i, "t": time.monotonic()}),
        ),
        stop=StopOptions(max_time=1.6),
    )
    # step 1's weights were published while waiting for batch 2, not only when it came
    first = next(i for i in infos if i["step"] == 1)
    assert 2 not in step_times or first["t"] < step_times[2]
