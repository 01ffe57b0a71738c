"""``online_train``'s checkpoints (``lit_amp.rec.online.checkpoints``): cadence and resume
(weights, optimizer, loss scale, cursor and counters together), fallback, consumed files."""

from __future__ import annotations

import logging
import os
import time

import pytest
import torch

from lit_amp._io import TMP_PREFIX
from lit_amp.amp.loss_scale.managers import DynamicLossScaleManager
from lit_amp.rec import (
    CheckpointOptions,
    PublishOptions,
    StopOptions,
)
from lit_amp.rec.online.checkpoint_files import list_checkpoints
from lit_amp.rec.sources import DirectorySource, SyntheticClickSource
from lit_amp.serialization import load_checkpoint
from tests.rec._helpers import Recorder, fill_dir, make_model


def test_checkpoints_by_steps_keep_the_newest(tmp_path):
    s = make_model().online_train(
        SyntheticClickSource(batch_size=8, num_records=80),
        checkpoint=CheckpointOptions(tmp_path, ckpt_every_n_steps=3, keep_checkpoint_max=2),
    )
    names = [os.path.basename(p) for p in list_checkpoints(tmp_path)]
    assert names == ["online-000000000009.ckpt", "online-000000000010.ckpt"]  # 3, 6 pruned
    assert s.last_checkpoint.endswith("online-000000000010.ckpt")
    state = load_checkpoint(s.last_checkpoint, weights_only=False)  # with its views
    assert set(state) >= {"network", "optimizer", "online", "append_info"}
    assert state["online"]["step"] == 10 and state["online"]["records"] == 80
    assert state["online"]["cursors"] == [{"batches": 10}]


def test_checkpoints_by_seconds(tmp_path):
    s = make_model().online_train(
        SyntheticClickSource(batch_size=4, rate=400.0),
        checkpoint=CheckpointOptions(tmp_path, ckpt_every_n_seconds=0.15, keep_checkpoint_max=100),
        stop=StopOptions(max_time=0.8),
    )
    assert s.stop_reason == "max_time"
    assert len(list_checkpoints(tmp_path)) >= 3


def test_resume_restores_weights_optimizer_loss_scale_cursor_and_counters(tmp_path):
    data, ckpt = tmp_path / "data", tmp_path / "ckpt"
    all_ids = fill_dir(data, 6, 10)
    lsm = {"loss_scale_manager": DynamicLossScaleManager(2**10, 2, 3)}
    first = make_model(seed=0, **lsm)
    rec1 = Recorder()
    s1 = first.online_train(
        DirectorySource(data, batch_size=10, max_idle_s=0),
        callbacks=rec1,
        checkpoint=CheckpointOptions(ckpt, ckpt_every_n_steps=2),
        stop=StopOptions(max_steps=4),
    )
    assert (s1.steps, s1.stop_reason) == (4, "max_steps")
    lit1 = first.lit_model
    assert lit1.loss_scale is not None and lit1.loss_scale.state_dict()

    second = make_model(seed=123, **lsm)  # different initial weights: all must be restored
    rec2 = Recorder()
    s2 = second.online_train(
        DirectorySource(data, batch_size=10, max_idle_s=0),
        callbacks=rec2,
        checkpoint=CheckpointOptions(ckpt),
        stop=StopOptions(max_steps=5),
    )
    assert s2.resumed_from.endswith("online-000000000004.ckpt")
    # counters continue: cur_step_num 5 is the first step of this run, max_steps is absolute
    assert [e[2] for e in rec2.events if e[0] == "on_train_step_end"] == [5]
    assert (s2.steps, s2.total_steps, s2.total_records) == (1, 5, 50)
    # the stream continues after the last trained record
    assert sum(rec1.ids + rec2.ids, []) == all_ids[:50]

    # restored state equals the state the first run checkpointed
    third = make_model(seed=7, **lsm)
    state = torch.load(list_checkpoints(ckpt)[-2], weights_only=False)  # step 4
    assert state["online"]["step"] == 4
    third.lit_model.apply_amp()
    third.lit_model.load_checkpoint_state(state)
    sd1, sd3 = lit1.network.state_dict(), third.lit_model.network.state_dict()
    assert all(torch.equal(sd1[k], sd3[k]) for k in sd1)
    o1, o3 = lit1.optimizer.state_dict(), third.lit_model.optimizer.state_dict()
    assert o1["state"].keys() == o3["state"].keys()
    assert all(
        torch.equal(o1["state"][k]["exp_avg"], o3["state"][k]["exp_avg"]) for k in o1["state"]
    )
    assert third.lit_model.loss_scale.state_dict() == lit1.loss_scale.state_dict()


def test_resume_false_starts_over(tmp_path):
    stop = StopOptions(max_steps=2)
    make_model().online_train(
        SyntheticClickSource(batch_size=4), checkpoint=CheckpointOptions(tmp_path), stop=stop
    )
    s = make_model().online_train(
        SyntheticClickSource(batch_size=4),
        checkpoint=CheckpointOptions(tmp_path, resume=False),
        stop=stop,
    )
    assert s.resumed_from is None and s.steps == 2


def test_an_unreadable_newest_checkpoint_falls_back_to_the_previous(tmp_path, caplog):
    make_model().online_train(
        SyntheticClickSource(batch_size=4),
        checkpoint=CheckpointOptions(tmp_path, ckpt_every_n_steps=1),
        stop=StopOptions(max_steps=3),
    )
    (tmp_path / "online-000000000099.ckpt").write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING):
        s = make_model().online_train(
            SyntheticClickSource(batch_size=4),
            checkpoint=CheckpointOptions(tmp_path),
            stop=StopOptions(max_steps=4),
        )
    assert s.resumed_from.endswith("online-000000000003.ckpt")
    assert "unreadable checkpoint" in caplog.text


def test_no_readable_checkpoint_is_an_error_not_a_silent_restart(tmp_path):
    (tmp_path / "online-000000000005.ckpt").write_bytes(b"garbage")
    with pytest.raises(RuntimeError, match="none of the 1 checkpoint"):
        make_model().online_train(
            SyntheticClickSource(batch_size=4), checkpoint=CheckpointOptions(tmp_path)
        )


def test_checkpoints_load_with_weights_only(tmp_path):
    data = tmp_path / "data"
    fill_dir(data, 2, 4)
    s = make_model().online_train(
        DirectorySource(data, batch_size=4, max_idle_s=0),
        checkpoint=CheckpointOptions(tmp_path / "ckpt"),
    )
    state = torch.load(s.last_checkpoint, weights_only=True)
    (cursor,) = state["online"]["cursors"]
    assert (cursor["done"], cursor["partial"]) == (["part-000000.npz", "part-000001.npz"], {})
    assert sorted(cursor["sigs"]) == cursor["done"]  # the files' identities, for a restart


def test_a_dataset_without_cursor_warns_when_checkpointing(tmp_path, caplog):
    batches = list(SyntheticClickSource(batch_size=4, num_records=8))
    with caplog.at_level(logging.WARNING):
        make_model().online_train(batches, checkpoint=CheckpointOptions(tmp_path))
    assert "cannot hold the stream position" in caplog.text


def test_delete_consumed_needs_checkpoints_and_drains_the_folder_with_them(
    tmp_path, caplog, monkeypatch
):
    data = tmp_path / "data"
    fill_dir(data, 6, 8)
    files = sorted(p.name for p in data.iterdir())

    def src():
        return DirectorySource(data, batch_size=8, max_idle_s=0.0, delete_consumed=True)

    # without checkpoints: a warning, and every file stays (nothing would survive a crash)
    with caplog.at_level(logging.WARNING, logger="lit_amp.rec"):
        s = make_model().online_train(src())
    assert s.records == 48
    assert "nothing will be deleted" in caplog.text
    assert sorted(p.name for p in data.iterdir()) == files
    # with checkpoints every 2 steps: trained once, and the folder ends empty when the run
    # returns, though the files are deleted in the background and every unlink is slow
    real_remove = os.remove
    monkeypatch.setattr(os, "remove", lambda p: (time.sleep(0.05), real_remove(p)))
    source = src()
    s = make_model().online_train(
        source, checkpoint=CheckpointOptions(tmp_path / "ckpt", ckpt_every_n_steps=2)
    )
    assert s.records == 48 and s.stop_reason == "idle_timeout"
    assert [p.name for p in data.iterdir()] == []
    assert source.files_deleted == 6


def test_stale_temp_files_of_a_killed_writer_are_removed_at_start(tmp_path):
    ckpt, pub = tmp_path / "ckpt", tmp_path / "pub"
    for d in (ckpt, pub):
        d.mkdir()
        (d / (TMP_PREFIX + "killed")).write_bytes(b"half a checkpoint")
        (d / "keep.txt").write_text("not ours")
    make_model().online_train(
        SyntheticClickSource(batch_size=4, num_records=8),
        checkpoint=CheckpointOptions(ckpt),
        publish=PublishOptions(pub),
    )
    for d in (ckpt, pub):
        names = os.listdir(d)
        assert not any(n.startswith(TMP_PREFIX) for n in names)
        assert "keep.txt" in names
    assert len(list_checkpoints(ckpt)) == 1 and "LATEST" in os.listdir(pub)
