"""Deltas written by a thread (``DeltaPublisher(background=True)``, the default of
``online_train``'s ``PublishOptions``): the loop goes on while a delta is written, the file
holds the weights of its publish, ``LATEST`` and ``publish_hook`` name it only once it is on
disk, and a failed write is rolled back so that no version goes missing from the chain."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest
import torch
from torch import nn

from lit_amp.rec import LazyAdam, PublishOptions, StopOptions, WideDeep
from lit_amp.rec.serving.full_snapshots import BackgroundFullWriter
from lit_amp.rec.serving.reader import latest_published, load_published
from lit_amp.rec.serving.writer import DeltaPublisher
from lit_amp.rec.sources import SyntheticClickSource
from tests.rec._helpers import Recorder, make_model

ROWS = 50_000


class Net(nn.Module):
    """A sparse table (row deltas) and a dense head (written whole in every delta)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(ROWS, 8, sparse=True)
        self.head = nn.Linear(8, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids)).pow(2).sum()


def _net():
    net = Net()
    opt = LazyAdam(net.parameters(), lr=0.1)
    return net, opt


def _train(net: Net, opt, ids) -> None:
    opt.zero_grad(set_to_none=True)
    net(torch.as_tensor(ids)).backward()
    opt.step()


def _state(net: Net) -> dict:
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _started(d, net, opt) -> DeltaPublisher:
    """A background publisher whose first version (a full snapshot) is on disk."""
    pub = DeltaPublisher(net, d, background=True)
    pub.attach(opt)
    pub.publish(step=1)
    pub.close()
    return pub


@pytest.fixture
def gate(monkeypatch):
    """Holds every background delta write until ``gate.set()``."""
    event = threading.Event()
    real = DeltaPublisher._write_file

    def held(payload, path):
        assert event.wait(30)
        return real(payload, path)

    monkeypatch.setattr(DeltaPublisher, "_write_file", staticmethod(held))
    return event


def test_a_delta_holds_its_publish_while_training_goes_on_during_its_write(tmp_path, gate):
    net, opt = _net()
    pub = _started(tmp_path, net, opt)
    _train(net, opt, [3, 7, 9])
    at_publish = _state(net)
    path = pub.publish(step=2)
    assert pub.writing(2) and not os.path.exists(path)
    for _ in range(3):  # the same rows and the dense head change during the write
        _train(net, opt, [3, 7, 11])
        pub.poll()
    assert os.path.basename(latest_published(tmp_path)) == "full-000000000001.pt"
    assert load_published(tmp_path)["version"] == 1
    gate.set()
    pub.poll(wait=True)
    assert not pub.writing(2) and [v for v, _, _ in pub.landed] == [1, 2]
    assert latest_published(tmp_path) == path
    payload = load_published(tmp_path)
    assert payload["version"] == 2 and payload["refused"] is None
    assert _same(payload["network"], at_publish)
    assert not _same(payload["network"], _state(net))  # the live weights moved on
    pub.close()


@pytest.fixture
def held_gather(monkeypatch):
    """Holds every background gather of a delta's rows until ``held_gather.set()``."""
    event = threading.Event()
    real = DeltaPublisher._gather_and_write.__func__

    def held(cls, *args):
        assert event.wait(30)
        return real(cls, *args)

    monkeypatch.setattr(DeltaPublisher, "_gather_and_write", classmethod(held))
    return event


def test_the_next_optimizer_step_waits_until_the_deltas_rows_are_copied(tmp_path, held_gather):
    """The rows are copied by the writer thread while the next forward / backward run; the
    optimizer step that would change them waits, so the delta holds the published step."""
    net, opt = _net()
    pub = _started(tmp_path, net, opt)
    _train(net, opt, [3, 7, 9])
    at_publish = _state(net)
    pub.publish(step=2)
    stepped = threading.Event()

    def next_step() -> None:
        _train(net, opt, [3, 7, 11])
        stepped.set()

    worker = threading.Thread(target=next_step)
    worker.start()
    assert not stepped.wait(0.5)  # forward and backward ran; the step waits for the copy
    assert _same(_state(net), at_publish)
    held_gather.set()
    assert stepped.wait(30)
    worker.join()
    pub.poll(wait=True)
    payload = load_published(tmp_path)
    assert payload["version"] == 2 and _same(payload["network"], at_publish)
    pub.publish(step=3)
    pub.close()
    assert _same(load_published(tmp_path)["network"], _state(net))


def test_rows_written_outside_a_step_during_the_copy_abandon_that_delta(tmp_path, held_gather,
                                                                       caplog):
    net, opt = _net()
    pub = _started(tmp_path, net, opt)
    _train(net, opt, [3, 7, 9])
    pub.publish(step=2)
    with torch.no_grad():  # in place, outside an optimizer step, while the copy waits
        net.emb.weight[7] += 1.0
    held_gather.set()
    with caplog.at_level("WARNING", logger="lit_amp.rec.serving.writer"):
        pub.poll(wait=True)  # abandoned, not raised
    assert "changed outside an optimizer step" in caplog.text
    assert load_published(tmp_path)["version"] == 1  # LATEST still names the full snapshot
    assert not [n for n in os.listdir(tmp_path) if n.startswith("delta-")]
    _train(net, opt, [11])
    pub.publish(step=3)  # version 2 again: rows 3, 7, 9 and 11, copied in the loop now
    pub.close()
    payload = load_published(tmp_path)
    assert payload["version"] == 2 and payload["step"] == 3 and pub.last_rows == 4
    assert _same(payload["network"], _state(net))


def test_a_failed_delta_is_rolled_back_and_its_rows_written_again(tmp_path, monkeypatch):
    net, opt = _net()
    pub = _started(tmp_path, net, opt)
    real = DeltaPublisher._write_file

    def disk_full(payload, path):
        raise OSError(f"disk full writing {path}")

    monkeypatch.setattr(DeltaPublisher, "_write_file", staticmethod(disk_full))
    _train(net, opt, [100, 101])
    pub.publish(step=2)
    with pytest.raises(OSError, match="disk full"):
        pub.poll(wait=True)
    assert pub.version == 1  # version 2 is written again by the next publish
    assert os.path.basename(latest_published(tmp_path)) == "full-000000000001.pt"
    assert not [n for n in os.listdir(tmp_path) if n.startswith("delta-")]
    monkeypatch.setattr(DeltaPublisher, "_write_file", staticmethod(real))
    _train(net, opt, [7])
    path = pub.publish(step=3)
    pub.close()
    assert os.path.basename(path) == "delta-000000000002.pt"
    assert pub.last_rows == 3  # rows 100, 101 of the failed write and row 7
    payload = load_published(tmp_path)
    assert payload["version"] == 2 and payload["step"] == 3 and payload["refused"] is None
    assert _same(payload["network"], _state(net))


def test_the_next_publish_raises_a_failed_delta_it_did_not_see(tmp_path, monkeypatch):
    net, opt = _net()
    pub = _started(tmp_path, net, opt)

    def disk_full(payload, path):
        raise OSError("disk full")

    monkeypatch.setattr(DeltaPublisher, "_write_file", staticmethod(disk_full))
    _train(net, opt, [5])
    pub.publish(step=2)
    _train(net, opt, [6])
    with pytest.raises(OSError, match="disk full"):
        pub.publish(step=3)  # waits for the delta of step 2, then raises its failure
    monkeypatch.undo()
    pub.publish(step=4)
    pub.close()
    payload = load_published(tmp_path)
    assert payload["version"] == 2 and payload["step"] == 4
    assert _same(payload["network"], _state(net))


def test_online_train_names_a_delta_to_the_hook_once_it_is_on_disk(tmp_path):
    torch.manual_seed(0)
    net = WideDeep(vocab_size=2000, embed_dim=4, hidden=(8,), sparse=True)
    model = make_model()
    model = type(model)(net, torch.nn.BCEWithLogitsLoss(), LazyAdam(net.parameters(), lr=0.01))
    seen: list[tuple] = []

    def hook(info: dict) -> None:  # what a server polling LATEST would load now
        seen.append((info["kind"], info["step"], os.path.exists(info["path"]),
                     latest_published(tmp_path) == info["path"]))

    model.online_train(
        SyntheticClickSource(batch_size=8, num_records=80),
        stop=StopOptions(max_steps=10),
        publish=PublishOptions(tmp_path, publish_every_n_steps=2, delta=True,
                               publish_hook=hook),
    )
    assert [s[:2] for s in seen] == [("full", 2), ("delta", 4), ("delta", 6), ("delta", 8),
                                     ("delta", 10)]
    assert all(on_disk and named for _, _, on_disk, named in seen)
    served = WideDeep(vocab_size=2000, embed_dim=4, hidden=(8,))
    assert load_published(tmp_path, served)["step"] == 10
    mine = model.lit_model.network.state_dict()
    assert all(torch.equal(served.state_dict()[k], mine[k]) for k in mine)


def test_the_loop_counts_a_deltas_rows_and_the_writer_thread_lists_them(tmp_path, monkeypatch):
    """Listing the changed rows of a big table (~11 ms at 26 M rows) is the writer's work: the
    loop's publish only counts them; marks made after the publish go into the next delta."""
    from lit_amp.rec.state.touched import MarkedRows

    listed = []
    real = MarkedRows.rows
    monkeypatch.setattr(MarkedRows, "rows", lambda self: listed.append(
        threading.current_thread().name) or real(self))
    net, opt = _net()
    pub = _started(tmp_path, net, opt)
    _train(net, opt, [3, 7, 9])
    pub.publish(step=2)
    assert pub.last_rows == 3
    _train(net, opt, [11])  # after the publish: the next delta's
    pub.poll(wait=True)
    assert listed and all(n.startswith("lit_amp-publish-delta") for n in listed)
    assert sorted(load_published(tmp_path)["network"]) == sorted(net.state_dict())
    delta = torch.load(tmp_path / "delta-000000000002.pt", weights_only=True)
    assert delta["rows"]["emb.weight"].tolist() == [3, 7, 9]
    pub.publish(step=3)
    pub.poll(wait=True)
    delta = torch.load(tmp_path / "delta-000000000003.pt", weights_only=True)
    assert delta["rows"]["emb.weight"].tolist() == [11]
    assert _same(load_published(tmp_path)["network"], _state(net))
    pub.close()


def _wide_deep_model():
    torch.manual_seed(0)
    net = WideDeep(vocab_size=2000, embed_dim=4, hidden=(8,), sparse=True)
    model = make_model()
    return type(model)(net, torch.nn.BCEWithLogitsLoss(), LazyAdam(net.parameters(), lr=0.01))


def _serving_hook(publish_dir, seen: list) -> Callable[[dict], None]:
    """A hook recording what a server reacting to it would find: ``(kind, step, the file is
    on disk, LATEST names it)``."""

    def hook(info: dict) -> None:
        seen.append((info["kind"], info["step"], os.path.exists(info["path"]),
                     latest_published(publish_dir) == info["path"]))

    return hook


def test_the_hook_waits_for_a_slow_first_full_snapshot_and_then_names_each_version(
        tmp_path, held_full_writes):
    """The first full snapshot is written until step 7: the deltas of steps 4 and 6 land
    before it, and nothing is named (nor given to the hook) until it is on disk; then each
    version is, in publish order, each while ``LATEST`` names it."""
    model = _wide_deep_model()
    seen: list[tuple] = []
    released_at: list[int] = []

    def release(rc) -> None:
        step = rc.original_args().cur_step_num
        if step == 7:
            assert seen == [] and not os.path.exists(tmp_path / "LATEST")
            released_at.append(step)
            held_full_writes.set()

    model.online_train(
        SyntheticClickSource(batch_size=8, num_records=80), callbacks=Recorder(release),
        stop=StopOptions(max_steps=10),
        publish=PublishOptions(tmp_path, publish_every_n_steps=2, delta=True,
                               publish_hook=_serving_hook(tmp_path, seen)),
    )
    assert released_at == [7]
    assert seen == [("full", 2, True, True), ("delta", 4, True, True), ("delta", 6, True, True),
                    ("delta", 8, True, True), ("delta", 10, True, True)]
    assert load_published(tmp_path)["step"] == 10


def test_the_publisher_names_versions_landed_behind_a_full_snapshot_one_at_a_time(
        tmp_path, held_full_writes):
    net, opt = _net()
    named: list[tuple] = []

    def on_named(version: int, path: str, nbytes: int) -> None:
        named.append((version, os.path.basename(path), os.path.getsize(path) == nbytes,
                      latest_published(tmp_path) == path))

    pub = DeltaPublisher(net, tmp_path, background=True, on_named=on_named)
    pub.attach(opt)
    pub.publish(step=1)  # the full snapshot, held
    for step, ids in ((2, [3]), (3, [7])):
        _train(net, opt, ids)
        pub.publish(step=step)
        pub.poll(wait=True)  # the delta is on disk, LATEST is held back by the full
    assert named == [] and latest_published(tmp_path) is None
    held_full_writes.set()
    pub.close()
    assert named == [(1, "full-000000000001.pt", True, True),
                     (2, "delta-000000000002.pt", True, True),
                     (3, "delta-000000000003.pt", True, True)]
    assert [v for v, _, _ in pub.landed] == [1, 2, 3]
    assert _same(load_published(tmp_path)["network"], _state(net))


@pytest.mark.parametrize("broken", ["full", "delta"])
def test_the_hook_is_not_called_for_a_failed_write(tmp_path, monkeypatch, broken):
    def disk_full(*args):
        raise OSError("disk full")

    if broken == "full":
        monkeypatch.setattr(BackgroundFullWriter, "_write", staticmethod(disk_full))
    else:
        monkeypatch.setattr(DeltaPublisher, "_write_file", staticmethod(disk_full))
    seen: list[tuple] = []
    with pytest.raises(OSError, match="disk full"):
        _wide_deep_model().online_train(
            SyntheticClickSource(batch_size=8, num_records=80), stop=StopOptions(max_steps=10),
            publish=PublishOptions(tmp_path, publish_every_n_steps=2, delta=True,
                                   publish_hook=_serving_hook(tmp_path, seen)),
        )
    assert all(kind != broken for kind, *_ in seen)
    assert all(on_disk and named for _, _, on_disk, named in seen)


@pytest.mark.parametrize("delta", [False, True])
def test_a_publish_written_in_the_loop_is_named_to_the_hook_once_on_disk(tmp_path, delta):
    seen: list[tuple] = []
    _wide_deep_model().online_train(
        SyntheticClickSource(batch_size=8, num_records=56), stop=StopOptions(max_steps=7),
        publish=PublishOptions(tmp_path, publish_every_n_steps=2, delta=delta, background=False,
                               publish_hook=_serving_hook(tmp_path, seen)),
    )
    kinds = ["full", "delta", "delta", "delta"] if delta else ["full"] * 4
    assert seen == [(k, s, True, True) for k, s in zip(kinds, [2, 4, 6, 7])]
