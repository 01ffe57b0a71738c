"""Writing served weights (``lit_amp.rec.serving.writer``): full files written atomically, and
delta publishing (numbered full snapshots and row deltas) whose size follows the rows a step
touched, not the table size; a failed or non-finite write never moves ``LATEST``.
"""

from __future__ import annotations

import logging
import os

import pytest
import torch

from lit_amp.rec import LazyAdam, PublishOptions, StopOptions, WideDeep
from lit_amp.rec.serving.reader import latest_published, load_published
from lit_amp.rec.serving.writer import publish_weights
from lit_amp.rec.sources import SyntheticClickSource
from tests.rec._helpers import make_model, tiny_net, touch_rows
from tests.rec.serving._helpers import published_chain, publisher, same_state, table

ROW_BYTES = 8 * 4 + 8  # an fp32 row of width 8 plus its int64 index


def test_delta_bytes_follow_the_touched_rows_not_the_table(tmp_path):
    emb, opt = table()
    pub = publisher(emb, opt, tmp_path)
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
    assert same_state(load_published(tmp_path)["network"], emb)


def test_a_failed_write_keeps_latest_and_the_next_delta_covers_its_rows(tmp_path, monkeypatch):
    emb, opt, pub, _ = published_chain(tmp_path, n=2)
    touch_rows(emb, opt, [500, 501])

    def broken_save(obj, f, *a, **k):
        f.write(b"partial bytes")
        raise OSError("disk full")

    real_save = torch.save
    monkeypatch.setattr("lit_amp.rec.serving.writer.torch.save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        pub.publish(step=3)
    monkeypatch.setattr("lit_amp.rec.serving.writer.torch.save", real_save)
    assert os.path.basename(latest_published(tmp_path)) == "delta-000000000002.pt"
    touch_rows(emb, opt, [7])
    pub.publish(step=4)
    assert pub.last_rows == 3  # rows 500, 501 of the failed publish and row 7
    assert same_state(load_published(tmp_path)["network"], emb)


def test_a_big_delta_becomes_a_full_snapshot_and_old_chains_are_pruned(tmp_path):
    emb, opt = table(rows=1000)
    pub = publisher(emb, opt, tmp_path, max_delta_fraction=0.1, keep_full_max=2)
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
    pub = publisher(emb, opt, tmp_path, max_delta_fraction=1.0)
    pub.publish(step=1)
    with caplog.at_level(logging.WARNING, logger="lit_amp.rec.state.touched"):
        touch_rows(emb, opt, [0])
        touch_rows(emb, opt, [1])  # momentum moves row 0 again
    pub.publish(step=2)
    assert pub.last_kind == "delta" and pub.last_rows == 0  # the table whole, not by rows
    assert "momentum" in caplog.text
    assert same_state(load_published(tmp_path)["network"], emb)


def test_a_restarted_publisher_continues_the_versions_with_a_full_snapshot(tmp_path):
    emb, opt, _, _ = published_chain(tmp_path, n=3)
    pub = publisher(emb, opt, tmp_path)
    assert os.path.basename(pub.publish(step=3)) == "full-000000000004.pt"


def test_non_finite_rows_are_never_published(tmp_path):
    emb, opt, pub, states = published_chain(tmp_path, n=2)
    emb.weight.grad = None
    opt.zero_grad()
    emb(torch.tensor([9])).sum().mul(float("nan")).backward()
    opt.step()
    with pytest.raises(RuntimeError, match="non-finite value in 'weight'"):
        pub.publish(step=3)
    assert load_published(tmp_path)["version"] == 2


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
    assert same_state(served.state_dict(), model.lit_model.network)


def test_publish_is_atomic_when_a_write_fails(tmp_path, monkeypatch):
    net = tiny_net()
    publish_weights(net, tmp_path, step=1)
    real_save = torch.save

    def broken_save(obj, f, *a, **k):
        f.write(b"partial bytes")
        raise OSError("disk full")

    monkeypatch.setattr("lit_amp.rec.serving.writer.torch.save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        publish_weights(net, tmp_path, step=2)
    monkeypatch.setattr("lit_amp.rec.serving.writer.torch.save", real_save)
    assert sorted(os.listdir(tmp_path)) == ["LATEST", "model-000000000001.pt"]
    assert load_published(tmp_path)["step"] == 1


def test_a_due_full_snapshot_written_in_the_loop_builds_no_delta(tmp_path, monkeypatch):
    from lit_amp.rec.serving import writer

    built = []
    real = writer._delta_of
    monkeypatch.setattr(writer, "_delta_of", lambda *a, **k: built.append(1) or real(*a, **k))
    emb, opt = table(rows=10_000)
    pub = publisher(emb, opt, tmp_path, full_every_n_publishes=2)
    for step in range(1, 6):  # full, delta, full, delta, full
        touch_rows(emb, opt, torch.randperm(10_000)[:50])
        pub.publish(step=step)
        assert pub.last_kind == ("full" if step % 2 else "delta")
    assert len(built) == 2  # one per delta written, none for the fulls of steps 3 and 5
    assert same_state(load_published(tmp_path)["network"], emb)


