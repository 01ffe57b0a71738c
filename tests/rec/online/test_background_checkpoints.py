"""online_train's background checkpoints: training goes on while a checkpoint is written, and
each file still holds exactly the state of its step."""

from __future__ import annotations

import errno
import logging
import os
import time

import pytest
import torch
from torch import nn

from lit_amp.callbacks import Callback
from lit_amp.rec import CheckpointOptions, LazyAdam, RecModel, StopOptions, WideDeep
from lit_amp.rec.online.checkpoint_files import latest_checkpoint, list_checkpoints
from lit_amp.rec.sources import SyntheticClickSource
from lit_amp.rec.state import snapshot as snapshot_mod
from lit_amp.serialization import load_checkpoint

LOGGER = "lit_amp.rec.online.checkpoints"


def _model(collisionless: bool = False) -> RecModel:
    torch.manual_seed(0)
    # collision-free: a budget of 26 x 20 rows, so the stream's new ids evict others
    net = WideDeep(vocab_size=20 if collisionless else 400, embed_dim=4, hidden=(8,),
                   sparse=True, collisionless=collisionless)
    opt = LazyAdam(net.parameters(), lr=0.05)
    if collisionless:
        net.embedding.attach(opt)  # a reused row's moments are zeroed
    return RecModel(net, nn.BCEWithLogitsLoss(), opt)


@pytest.fixture
def slow_writes(monkeypatch):
    """Every table is copied on write, in small chunks, each written slowly: a checkpoint's
    write spans several training steps."""
    monkeypatch.setattr(snapshot_mod, "MIN_PROTECTED_BYTES", 0)
    monkeypatch.setattr(snapshot_mod, "CHUNK_BYTES", 8192)
    as_bytes = snapshot_mod.as_bytes

    def slow(t):
        time.sleep(0.001)
        return as_bytes(t)

    monkeypatch.setattr(snapshot_mod, "as_bytes", slow)


def _figures(caplog) -> list[dict]:
    return [r.lit_amp_checkpoint for r in caplog.records if hasattr(r, "lit_amp_checkpoint")]


class StateAt(Callback):
    """The network's and the optimizer's state at the end of every ``every``-th step."""

    def __init__(self, model: RecModel, every: int) -> None:
        self.model, self.every, self.states, self.times = model, every, {}, []

    def on_train_step_end(self, run_context):
        step = int(run_context.original_args().cur_step_num)
        self.times.append(time.monotonic())
        if step % self.every == 0:
            opt = self.model.lit_model.optimizer.state_dict()["state"]
            self.states[step] = (
                {k: v.clone() for k, v in self.model._network.state_dict().items()},
                {i: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
                 for i, s in opt.items()},
            )


@pytest.mark.parametrize("collisionless,full_every", [(False, 1), (True, 1), (False, 3)],
                         ids=["hashed", "collisionless", "hashed-row-increments"])
def test_each_background_checkpoint_holds_the_state_of_its_step(tmp_path, slow_writes, caplog,
                                                                collisionless, full_every):
    """With collision-free tables, ids arriving during the writes take rows, evict others and
    reset their moments: written from the live tables, copied on write, not cloned. With row
    increments, a file holds only the table rows changed since the previous one, and reading
    it (its chain) gives the whole state of its step."""
    model = _model(collisionless)
    seen = StateAt(model, every=4)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        s = model.online_train(
            SyntheticClickSource(batch_size=32, vocab_size=2000), callbacks=[seen],
            checkpoint=CheckpointOptions(tmp_path, ckpt_every_n_steps=4, keep_checkpoint_max=50,
                                         full_every_n_checkpoints=full_every),
            stop=StopOptions(max_steps=24),
        )
    assert s.steps == 24
    files = list_checkpoints(tmp_path)
    assert [int(os.path.basename(p)[7:19]) for p in files] == [4, 8, 12, 16, 20, 24]
    increments = [p.endswith("-rows.ckpt") for p in files]
    assert increments == ([False, True, True] * 2 if full_every == 3 else [False] * 6)
    if full_every == 3:
        table = model._network.embedding.weight
        for path in files[1:3] + files[4:]:
            raw = torch.load(path, weights_only=True)
            (keys, rows), *_ = raw["lit_amp_rows"]["tensors"]
            assert 0 < len(rows) < 0.8 * table.shape[0]  # the rows 4 steps touched, no more
            assert raw["state_dict"][keys[-1]].shape == (len(rows), table.shape[1])
        sizes = [os.path.getsize(p) for p in files]
        assert max(sizes[1:3] + sizes[4:]) < 0.8 * min(sizes[0], sizes[3])
    for path in files:
        state = load_checkpoint(path)
        weights, opt = seen.states[state["online"]["step"]]
        assert all(torch.equal(state["network"][k], v) for k, v in weights.items()), path
        for i, st in opt.items():
            for k, v in st.items():
                got = state["optimizer"]["state"][i][k]
                assert torch.equal(got, v) if torch.is_tensor(v) else got == v, (path, k)
    figures = _figures(caplog)
    assert [f["step"] for f in figures] == [4, 8, 12, 16, 20, 24]
    protected = 2 if collisionless else 1  # IdEmbedding: the table, and its id-map buffers
    assert all(f["background"] and f["protected"] >= protected for f in figures)
    if collisionless:
        assert int(model._network.embedding.evictions) > 0
    assert sum(f["cow_rows"] for f in figures) > 0  # steps changed rows during the writes
    # taking a snapshot blocked the loop for a fraction of what writing it took (a wait for
    # the previous write, when the machine is slow, is counted apart)
    taking = sum(f["stall_s"] - f["waited_s"] for f in figures)
    assert taking < 0.5 * sum(f["write_s"] for f in figures)


def test_a_checkpoint_due_during_a_write_waits_for_it_and_none_is_lost(tmp_path, slow_writes,
                                                                       caplog):
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        _model().online_train(
            SyntheticClickSource(batch_size=16, vocab_size=2000),
            checkpoint=CheckpointOptions(tmp_path, ckpt_every_n_steps=1, keep_checkpoint_max=50),
            stop=StopOptions(max_steps=6),
        )
    assert len(list_checkpoints(tmp_path)) == 6  # one per step: none skipped
    assert "waited" in caplog.text and "raise ckpt_every_n_steps" in caplog.text
    assert sum(f["waited_s"] > 0 for f in _figures(caplog)) >= 1


def test_a_failed_background_write_stops_training_and_keeps_the_previous(tmp_path, monkeypatch):
    monkeypatch.setattr(snapshot_mod, "MIN_PROTECTED_BYTES", 0)
    calls = []
    real = snapshot_mod.atomic_write

    def full_disk(path, write, **kw):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, f"writing {path!r} failed: No space left on device")
        return real(path, write, **kw)

    monkeypatch.setattr(snapshot_mod, "atomic_write", full_disk)
    model = _model()
    seen = StateAt(model, every=1)
    with pytest.raises(OSError, match="No space left"):
        model.online_train(
            SyntheticClickSource(batch_size=16, vocab_size=2000), callbacks=[seen],
            checkpoint=CheckpointOptions(tmp_path, ckpt_every_n_steps=3),
            stop=StopOptions(max_steps=30),
        )
    assert [os.path.basename(p) for p in list_checkpoints(tmp_path)] == [
        "online-000000000003.ckpt"]
    assert os.listdir(tmp_path) == ["online-000000000003.ckpt"]  # no temp file left
    # raised at a step end after the write failed, at the latest when the next one is due
    assert 6 <= max(seen.states) <= 9


def test_an_exception_waits_for_the_write_in_flight(tmp_path, slow_writes):
    class Boom(Callback):
        def on_train_step_end(self, run_context):
            if run_context.original_args().cur_step_num == 5:
                raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        _model().online_train(
            SyntheticClickSource(batch_size=16, vocab_size=2000), callbacks=[Boom()],
            checkpoint=CheckpointOptions(tmp_path, ckpt_every_n_steps=4),
        )
    assert os.listdir(tmp_path) == ["online-000000000004.ckpt"]  # complete, no temp file
    assert load_checkpoint(tmp_path / "online-000000000004.ckpt")["online"]["step"] == 4


def test_background_false_writes_in_the_loop(tmp_path, caplog):
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        _model().online_train(
            SyntheticClickSource(batch_size=16),
            checkpoint=CheckpointOptions(tmp_path, ckpt_every_n_steps=2, background=False),
            stop=StopOptions(max_steps=4),
        )
    figures = _figures(caplog)
    assert [f["step"] for f in figures] == [2, 4]
    assert not any(f["background"] for f in figures)


def test_background_must_be_a_bool(tmp_path):
    with pytest.raises(TypeError, match="'background' must be"):
        CheckpointOptions(tmp_path, background=1)


def test_a_broken_chain_falls_back_to_the_newest_intact_one_and_resumes(tmp_path, caplog,
                                                                        monkeypatch):
    monkeypatch.setattr(snapshot_mod, "MIN_PROTECTED_BYTES", 0)
    model = _model()
    seen = StateAt(model, every=2)

    def run(m, steps, callbacks=()):
        return m.online_train(
            SyntheticClickSource(batch_size=16, vocab_size=2000), callbacks=list(callbacks),
            checkpoint=CheckpointOptions(tmp_path, ckpt_every_n_steps=2, keep_checkpoint_max=50,
                                         full_every_n_checkpoints=3),
            stop=StopOptions(max_steps=steps))

    run(model, 10, [seen])
    names = [os.path.basename(p) for p in list_checkpoints(tmp_path)]
    assert [n.endswith("-rows.ckpt") for n in names] == [False, True, True, False, True]
    os.remove(tmp_path / names[3])  # the whole checkpoint of step 8: step 10 cannot be read
    with caplog.at_level(logging.WARNING):
        path, state = latest_checkpoint(tmp_path)
    assert os.path.basename(path) == "online-000000000006-rows.ckpt"
    assert "online-000000000010-rows.ckpt" in caplog.text and "chain" in caplog.text
    weights, _ = seen.states[6]
    assert all(torch.equal(state["network"][k], v) for k, v in weights.items())
    resumed = run(_model(), 12)
    assert resumed.resumed_from == path and resumed.steps == 6  # steps 7 to 12
    # the resumed run's first checkpoint is whole; its 10 replaces the broken one
    assert [os.path.basename(p)[7:] for p in list_checkpoints(tmp_path)][-3:] == [
        "000000000008.ckpt", "000000000010-rows.ckpt", "000000000012-rows.ckpt"]
    assert latest_checkpoint(tmp_path)[1]["online"]["step"] == 12
