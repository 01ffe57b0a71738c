"""#18 items 12 and 14: what the cursor counts as trained is what was applied; bad options."""

from __future__ import annotations

import pytest
import torch

from lit_amp.boost import AutoBoost
from lit_amp.rec import CheckpointOptions, StopOptions, ValidationOptions
from lit_amp.rec.online.checkpoint_files import latest_checkpoint
from lit_amp.rec.sources import DirectorySource
from tests.faults._servers import line, record
from tests.rec._helpers import Recorder, make_model


def _accumulate(n: int) -> AutoBoost:
    return AutoBoost("O0", {"boost": {"mode": "manual", "grad_accumulation": True},
                            "grad_accumulation": {"grad_accumulation_step": n}})


def test_with_gradient_accumulation_the_cursor_counts_only_applied_batches(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "part-0.jsonl").write_bytes(b"".join(line(record(i)) for i in range(32)))
    ckpt = CheckpointOptions(tmp_path / "ckpt", ckpt_every_n_steps=1)
    src = DirectorySource(data, batch_size=4, max_idle_s=0)
    # 7 batches, updates after batches 3 and 6: batch 7's gradients are never applied
    summary = make_model().online_train(src, callbacks=[_accumulate(3)],
                                        dataset_sink_mode=False, checkpoint=ckpt,
                                        stop=StopOptions(max_steps=7))
    assert summary.steps == 7 and summary.total_records == 24
    assert latest_checkpoint(ckpt.ckpt_dir)[1]["online"]["records"] == 24
    rec = Recorder()
    make_model().online_train(DirectorySource(data, batch_size=4, max_idle_s=0),
                              callbacks=[rec], dataset_sink_mode=False, checkpoint=ckpt)
    assert [i for ids in rec.ids for i in ids] == list(range(24, 32))  # batch 7 retrained


def test_at_a_clean_stream_end_the_open_accumulation_window_is_applied(tmp_path):
    """#18: 7 batches with grad_accumulation_step=3 and the stream ending: updates after
    batches 3 and 6, then batch 7's window (1 batch, its gradient scaled by 3/1) is applied
    at the end and counted (before: it was left unapplied, 24 records, and read again)."""
    from torch import nn
    from torch.nn.functional import binary_cross_entropy_with_logits as bce

    from lit_amp.rec import RecModel
    from tests.rec._helpers import tiny_net

    data = tmp_path / "data"
    data.mkdir()
    (data / "part-0.jsonl").write_bytes(b"".join(line(record(i)) for i in range(28)))
    ckpt = CheckpointOptions(tmp_path / "ckpt", ckpt_every_n_steps=1)
    net = tiny_net()
    model = RecModel(net, nn.BCEWithLogitsLoss(), torch.optim.SGD(net.parameters(), 0.5))
    summary = model.online_train(DirectorySource(data, batch_size=4, max_idle_s=0),
                                 callbacks=[_accumulate(3)], dataset_sink_mode=False,
                                 checkpoint=ckpt)
    assert summary.steps == 7 and summary.total_records == 28
    assert summary.stop_reason == "idle_timeout"
    assert latest_checkpoint(ckpt.ckpt_dir)[1]["online"]["records"] == 28
    # the reference: the mean gradient of each window, the last one of 1 batch
    ref = tiny_net()
    opt = torch.optim.SGD(ref.parameters(), 0.5)
    batches = list(DirectorySource(data, batch_size=4, max_idle_s=0))
    for window in (batches[0:3], batches[3:6], batches[6:7]):
        opt.zero_grad()
        (sum(bce(ref(x), y) for x, y in window) / len(window)).backward()
        opt.step()
    for (k, a), b in zip(net.state_dict().items(), ref.state_dict().values()):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), k
    rec = Recorder()  # a restart has nothing left to train
    make_model().online_train(DirectorySource(data, batch_size=4, max_idle_s=0),
                              callbacks=[rec], dataset_sink_mode=False, checkpoint=ckpt)
    assert rec.ids == []


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: StopOptions(max_time=float("nan")), "'max_time'"),
        (lambda: CheckpointOptions("c", ckpt_every_n_seconds=float("nan")),
         "'ckpt_every_n_seconds'"),
        (lambda: ValidationOptions(valid_every_n_steps=0), "'valid_every_n_steps'"),
        (lambda: StopOptions(peer_timeout=float("nan")), "'peer_timeout'"),
        (lambda: StopOptions(peer_timeout=0), "'peer_timeout'"),
    ],
)
def test_nan_and_zero_cadences_are_refused_by_name(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_resuming_a_finished_stream_says_so(tmp_path, caplog):
    data = tmp_path / "data"
    data.mkdir()
    (data / "part-0.jsonl").write_bytes(b"".join(line(record(i)) for i in range(8)))
    ckpt = CheckpointOptions(tmp_path / "ckpt")
    for _ in range(2):
        summary = make_model().online_train(DirectorySource(data, batch_size=4, max_idle_s=0),
                                            dataset_sink_mode=False, checkpoint=ckpt)
    assert summary.steps == 0 and summary.total_records == 8
    assert summary.stop_reason == "idle_timeout"
    assert any("trained 0 steps" in r.getMessage() and r.levelname == "WARNING"
               for r in caplog.records)


def test_checkpoints_and_published_weights_are_fsynced_file_and_folder(tmp_path, monkeypatch):
    import os

    from lit_amp.rec import PublishOptions

    synced: list[str] = []
    real = os.fsync

    def spy(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    data = tmp_path / "data"
    data.mkdir()
    (data / "part-0.jsonl").write_bytes(b"".join(line(record(i)) for i in range(8)))
    ckpt, pub = tmp_path / "ckpt", tmp_path / "pub"
    make_model().online_train(DirectorySource(data, batch_size=4, max_idle_s=0),
                              dataset_sink_mode=False, checkpoint=CheckpointOptions(ckpt),
                              publish=PublishOptions(pub))
    for folder in (ckpt, pub):
        assert str(folder) in synced  # the rename is durable
        assert any(os.path.dirname(p) == str(folder) and p != str(folder) for p in synced)
