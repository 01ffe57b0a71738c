"""Serving weights (``lit_amp.rec.publish``): full files written atomically, delta publishing
(numbered full snapshots and row deltas) and the reader that replays them.

What a server sees: the same weights as the trainer at every version it loads, a file size that
follows the rows a step touched (not the table size), and a torn / missing / foreign delta
refused with the version before it served instead.
"""

from __future__ import annotations

import logging
import os
import pickle

import pytest
import torch

from lit_amp.rec import LazyAdam, PublishOptions, StopOptions, WideDeep
from lit_amp.rec.publish import DeltaPublisher, latest_published, load_published, publish_weights
from lit_amp.rec.sources import SyntheticClickSource
from tests.rec._helpers import make_model, sparse_table, tiny_net, touch_rows

ROW_BYTES = 8 * 4 + 8  # an fp32 row of width 8 plus its int64 index


def _table(rows: int = 200_000, seed: int = 0):
    return sparse_table(rows, seed)


def _publisher(emb, opt, d, **kw) -> DeltaPublisher:
    pub = DeltaPublisher(emb, d, **kw)
    pub.attach(opt)
    return pub


def _same(state: dict, net: torch.nn.Module) -> bool:
    mine = net.state_dict()
    return state.keys() == mine.keys() and all(torch.equal(state[k], mine[k]) for k in mine)


def test_delta_bytes_follow_the_touched_rows_not_the_table(tmp_path):
    emb, opt = _table()
    pub = _publisher(emb, opt, tmp_path)
    full = os.path.getsize(pub.publish(step=1))
    assert full > 200_000 * 8 * 4  # the whole table
    sizes = {}
    for k in (10, 100, 1000):
        touch_rows(emb, opt, torch.randperm(200_000)[:k])
        path = pub.publish(step=k)
        assert pub.last_kind == "delta" and pub.last_rows == k
        sizes[k] = os.path.getsize(path)
    for k, size in sizes.items():
        assert size <= k * ROW_BYTES + 8_000  # k rows plus a fixed header
    assert sizes[1000] - sizes[100] == pytest.approx(900 * ROW_BYTES, rel=0.05)
    assert sizes[1000] < 0.01 * full
    assert _same(load_published(tmp_path)["network"], emb)


def test_the_reader_sees_the_trainers_weights_at_every_version(tmp_path):
    torch.manual_seed(0)
    net = WideDeep(vocab_size=500, embed_dim=4, hidden=(8,), sparse=True)
    opt = LazyAdam(net.parameters(), lr=0.05)
    pub = _publisher(net, opt, tmp_path, full_every_n_publishes=4)
    src = iter(SyntheticClickSource(batch_size=16, seed=1))
    kinds = []
    for step in range(1, 10):
        features, label = next(src)
        opt.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(net(features), label).backward()
        opt.step()
        pub.publish(step)
        kinds.append(pub.last_kind)
        served = WideDeep(vocab_size=500, embed_dim=4, hidden=(8,))
        payload = load_published(tmp_path, served)
        assert payload["version"] == step and payload["refused"] is None
        assert _same(served.state_dict(), net)
    assert kinds == ["full", "delta", "delta", "delta", "full", "delta", "delta", "delta", "full"]


def _chain(tmp_path, n: int = 5):
    """A full snapshot and n - 1 deltas; the table's state at every version."""
    emb, opt = _table(rows=1000)
    pub = _publisher(emb, opt, tmp_path)
    states = {}
    for v in range(1, n + 1):
        if v > 1:
            touch_rows(emb, opt, [v, 10 * v])
        pub.publish(step=v)
        states[v] = emb.weight.detach().clone()
    return emb, opt, pub, states


def test_a_torn_delta_is_refused_and_the_valid_prefix_served(tmp_path, caplog):
    _, _, _, states = _chain(tmp_path)
    path = tmp_path / "delta-000000000004.pt"
    raw = bytearray(path.read_bytes())
    at = raw.find(states[4][4].numpy().tobytes())  # row 4's values, as the delta stores them
    assert at > 0
    raw[at + 5] ^= 0xFF  # one flipped bit pattern: the zip still opens, the checksum fails
    path.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger="lit_amp.rec.publish"):
        payload = load_published(tmp_path)
    assert payload["version"] == 3 and torch.equal(payload["network"]["weight"], states[3])
    assert "delta version 4 refused" in caplog.text and "serving version 3" in caplog.text
    assert "delta-000000000004.pt" in payload["refused"]


def test_a_truncated_or_missing_delta_is_refused(tmp_path, caplog):
    _, _, _, states = _chain(tmp_path)
    path = tmp_path / "delta-000000000003.pt"
    path.write_bytes(path.read_bytes()[:100])
    with caplog.at_level(logging.WARNING, logger="lit_amp.rec.publish"):
        assert load_published(tmp_path)["version"] == 2
    assert "cannot be read" in caplog.text
    path.unlink()
    payload = load_published(tmp_path)
    assert payload["version"] == 2 and "missing" in payload["refused"]
    assert torch.equal(payload["network"]["weight"], states[2])


def test_a_delta_of_another_chain_is_refused(tmp_path):
    _chain(tmp_path / "a")
    _chain(tmp_path / "b")
    os.replace(tmp_path / "b" / "delta-000000000003.pt", tmp_path / "a" / "delta-000000000003.pt")
    payload = load_published(tmp_path / "a")
    assert payload["version"] == 2 and "does not continue" in payload["refused"]


def test_a_torn_full_snapshot_falls_back_to_the_previous_chain(tmp_path, caplog):
    emb, opt = _table(rows=1000)
    pub = _publisher(emb, opt, tmp_path, full_every_n_publishes=3)
    states = {}
    for v in range(1, 6):  # full 1, deltas 2-3, full 4, delta 5
        touch_rows(emb, opt, [v])
        pub.publish(step=v)
        states[v] = emb.weight.detach().clone()
    (tmp_path / "full-000000000004.pt").write_bytes(b"torn")
    with caplog.at_level(logging.WARNING, logger="lit_amp.rec.publish"):
        payload = load_published(tmp_path)
    assert payload["version"] == 3 and torch.equal(payload["network"]["weight"], states[3])
    assert "full snapshot full-000000000004.pt is refused" in caplog.text
    for name in ("full-000000000001.pt", "full-000000000004.pt"):
        (tmp_path / name).write_bytes(b"torn")
    with pytest.raises(ValueError, match="no readable full snapshot"):
        load_published(tmp_path)


def test_polling_applies_only_the_new_deltas_in_place(tmp_path, monkeypatch):
    emb, opt = _table(rows=1000)
    pub = _publisher(emb, opt, tmp_path)
    pub.publish(step=1)
    served = torch.nn.Embedding(1000, 8)
    payload = load_published(tmp_path, served)
    assert load_published(tmp_path, served, since=payload) is payload  # nothing new
    touch_rows(emb, opt, [1, 2])
    pub.publish(step=2)
    touch_rows(emb, opt, [3])
    pub.publish(step=3)
    loaded = []
    real_load = torch.load
    monkeypatch.setattr("lit_amp.rec.publish.torch.load",
                        lambda p, **kw: loaded.append(os.path.basename(p)) or real_load(p, **kw))
    new = load_published(tmp_path, served, since=payload)
    assert loaded == ["delta-000000000002.pt", "delta-000000000003.pt"]
    assert new is not payload and (payload["version"], new["version"]) == (1, 3)
    assert torch.equal(served.weight, emb.weight)


def test_a_failed_write_keeps_latest_and_the_next_delta_covers_its_rows(tmp_path, monkeypatch):
    emb, opt, pub, _ = _chain(tmp_path, n=2)
    touch_rows(emb, opt, [500, 501])

    def broken_save(obj, f, *a, **k):
        f.write(b"partial bytes")
        raise OSError("disk full")

    real_save = torch.save
    monkeypatch.setattr("lit_amp.rec.publish.torch.save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        pub.publish(step=3)
    monkeypatch.setattr("lit_amp.rec.publish.torch.save", real_save)
    assert os.path.basename(latest_published(tmp_path)) == "delta-000000000002.pt"
    touch_rows(emb, opt, [7])
    pub.publish(step=4)
    assert pub.last_rows == 3  # rows 500, 501 of the failed publish and row 7
    assert _same(load_published(tmp_path)["network"], emb)


def test_a_big_delta_becomes_a_full_snapshot_and_old_chains_are_pruned(tmp_path):
    emb, opt = _table(rows=1000)
    pub = _publisher(emb, opt, tmp_path, max_delta_fraction=0.1, keep_full_max=2)
    pub.publish(step=1)
    touch_rows(emb, opt, torch.arange(50))
    pub.publish(step=2)
    touch_rows(emb, opt, torch.arange(200))  # 20 % of the table
    pub.publish(step=3)
    assert pub.last_kind == "full"
    touch_rows(emb, opt, torch.arange(300))
    pub.publish(step=4)
    assert sorted(os.listdir(tmp_path)) == ["LATEST", "full-000000000003.pt",
                                            "full-000000000004.pt"]


def test_a_dense_optimizer_publishes_the_table_whole(tmp_path, caplog):
    emb = torch.nn.Embedding(100, 4, sparse=True)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1, momentum=0.9)  # moves rows not in the grad
    pub = _publisher(emb, opt, tmp_path, max_delta_fraction=1.0)
    pub.publish(step=1)
    with caplog.at_level(logging.WARNING, logger="lit_amp.rec.state.touched"):
        touch_rows(emb, opt, [0])
        touch_rows(emb, opt, [1])  # momentum moves row 0 again
    pub.publish(step=2)
    assert pub.last_kind == "delta" and pub.last_rows == 0  # the table whole, not by rows
    assert "momentum" in caplog.text
    assert _same(load_published(tmp_path)["network"], emb)


def test_a_restarted_publisher_continues_the_versions_with_a_full_snapshot(tmp_path):
    emb, opt, _, _ = _chain(tmp_path, n=3)
    pub = _publisher(emb, opt, tmp_path)
    assert os.path.basename(pub.publish(step=3)) == "full-000000000004.pt"


def test_non_finite_rows_are_never_published(tmp_path):
    emb, opt, pub, states = _chain(tmp_path, n=2)
    emb.weight.grad = None
    opt.zero_grad()
    emb(torch.tensor([9])).sum().mul(float("nan")).backward()
    opt.step()
    with pytest.raises(RuntimeError, match="non-finite value in 'weight'"):
        pub.publish(step=3)
    assert load_published(tmp_path)["version"] == 2


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/lit_amp_pwned_delta",))


def test_a_pickled_gadget_in_a_delta_is_refused_without_running(tmp_path):
    _chain(tmp_path, n=2)
    with open(tmp_path / "delta-000000000002.pt", "wb") as f:
        pickle.dump({"network": _Evil()}, f)
    payload = load_published(tmp_path)
    assert payload["version"] == 1 and "cannot be read" in payload["refused"]
    assert not os.path.exists("/tmp/lit_amp_pwned_delta")


def test_online_train_publishes_deltas_that_replay_to_the_trained_weights(tmp_path):
    torch.manual_seed(0)
    net = WideDeep(vocab_size=2000, embed_dim=4, hidden=(8,), sparse=True)
    infos: list[dict] = []
    model = make_model()
    model = type(model)(net, torch.nn.BCEWithLogitsLoss(), LazyAdam(net.parameters(), lr=0.01))
    s = model.online_train(
        SyntheticClickSource(batch_size=8, num_records=64),
        stop=StopOptions(max_steps=8),
        publish=PublishOptions(tmp_path, publish_every_n_steps=2, delta=True,
                               publish_hook=infos.append),
    )
    assert [(i["step"], i["kind"]) for i in infos] == [
        (2, "full"), (4, "delta"), (6, "delta"), (8, "delta")]
    assert max(i["bytes"] for i in infos[1:]) < 0.1 * infos[0]["bytes"]
    assert s.last_published == latest_published(tmp_path)
    served = WideDeep(vocab_size=2000, embed_dim=4, hidden=(8,))
    payload = load_published(tmp_path, served)
    assert payload["version"] == 4 and payload["step"] == 8 and payload["records"] == 64
    assert _same(served.state_dict(), model.lit_model.network)


def test_publish_is_atomic_when_a_write_fails(tmp_path, monkeypatch):
    net = tiny_net()
    publish_weights(net, tmp_path, step=1)
    real_save = torch.save

    def broken_save(obj, f, *a, **k):
        f.write(b"partial bytes")
        raise OSError("disk full")

    monkeypatch.setattr("lit_amp.rec.publish.torch.save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        publish_weights(net, tmp_path, step=2)
    monkeypatch.setattr("lit_amp.rec.publish.torch.save", real_save)
    assert sorted(os.listdir(tmp_path)) == ["LATEST", "model-000000000001.pt"]
    assert load_published(tmp_path)["step"] == 1


def test_load_published_without_anything_published(tmp_path):
    with pytest.raises(ValueError, match="no published weights"):
        load_published(tmp_path)


def test_load_published_on_a_corrupt_file_names_the_file(tmp_path):
    path = publish_weights(tiny_net(), tmp_path, step=1)
    with open(path, "wb") as f:
        f.write(b"not a torch file")
    with pytest.raises(ValueError, match="model-000000000001.pt.*cannot be read"):
        load_published(tmp_path)


def test_a_due_full_snapshot_written_in_the_loop_builds_no_delta(tmp_path, monkeypatch):
    from lit_amp.rec import publish

    built = []
    real = publish._delta_of
    monkeypatch.setattr(publish, "_delta_of", lambda *a, **k: built.append(1) or real(*a, **k))
    emb, opt = _table(rows=10_000)
    pub = _publisher(emb, opt, tmp_path, full_every_n_publishes=2)
    for step in range(1, 6):  # full, delta, full, delta, full
        touch_rows(emb, opt, torch.randperm(10_000)[:50])
        pub.publish(step=step)
        assert pub.last_kind == ("full" if step % 2 else "delta")
    assert len(built) == 2  # one per delta written, none for the fulls of steps 3 and 5
    assert _same(load_published(tmp_path)["network"], emb)


def test_touched_rows_taken_lazily_are_the_rows_taken_eagerly_and_stay_as_taken():
    from lit_amp.rec.state.touched import MarkedRows, TouchedRows

    emb = torch.nn.Embedding(1000, 4, sparse=True)
    opt = torch.optim.SparseAdam(emb.parameters())
    eager, lazy = TouchedRows(emb), TouchedRows(emb)
    eager.attach(opt)
    lazy.attach(opt)
    eager.take(), lazy.take(lazy=True)  # the first look: everything

    def step(ids):
        opt.zero_grad()
        emb(torch.tensor(ids)).sum().backward()
        opt.step()

    step([5, 900, 5, 17])
    want, got = eager.take(), lazy.take(lazy=True)
    marked = got["weight"]
    assert isinstance(marked, MarkedRows) and len(marked) == marked.numel() == 3
    step([3])  # marked after the take: not in it, in the next
    assert marked.rows().tolist() == want["weight"].tolist() == [5, 17, 900]
    assert lazy.take(lazy=True)["weight"].rows().tolist() == [3]
    lazy.mark(got)  # a failed publish marks them again
    assert lazy.take()["weight"].tolist() == [5, 17, 900]
    assert lazy.take(lazy=True) == {}


def test_lazily_taken_bitmaps_are_cleared_and_marked_again_without_losing_or_keeping_a_row():
    """A listed MarkedRows hands its bitmap back cleared and the next take marks into it (no new
    map to fault in); over random steps, takes and listings (before or after later steps and
    takes, as a writer thread would), every take's rows are exactly those stepped since the
    take before."""
    import random

    from lit_amp.rec.state.touched import TouchedRows

    emb = torch.nn.Embedding(500, 2, sparse=True)
    opt = torch.optim.SparseAdam(emb.parameters())
    touched = TouchedRows(emb)
    touched.attach(opt)
    touched.take(lazy=True)
    rnd = random.Random(0)
    since: set[int] = set()
    unlisted: list[tuple[object, set[int]]] = []  # (MarkedRows, rows it must list)
    reused = 0
    for _ in range(300):
        action = rnd.random()
        if action < 0.5:
            ids = [rnd.randrange(500) for _ in range(rnd.randrange(1, 6))]
            opt.zero_grad()
            emb(torch.tensor(ids)).sum().backward()
            opt.step()
            since.update(ids)
        elif action < 0.75:
            before = touched._rows_of.get("weight")
            spare = touched._spare.get("weight")
            got = touched.take(lazy=True)
            if since:
                unlisted.append((got["weight"], since))
                if spare is not None:
                    assert touched._rows_of["weight"] is spare  # marked into again
                    reused += 1
                assert touched._rows_of["weight"] is not before
            else:
                assert got == {}
            since = set()
        elif unlisted:
            marked, want = unlisted.pop(rnd.randrange(len(unlisted)))
            assert marked.rows().tolist() == sorted(want)
    for marked, want in unlisted:
        assert marked.rows().tolist() == sorted(want)
    final = touched.take()
    assert (final["weight"].tolist() if "weight" in final else []) == sorted(since)
    assert reused > 10
