"""Reading served weights (``lit_amp.rec.serving.reader``): the same weights as the trainer at
every version, polling that applies only the new deltas, and a torn / missing / foreign delta
refused with the version before it served instead.
"""

from __future__ import annotations

import logging
import os
import pickle

import pytest
import torch

from lit_amp.rec import LazyAdam, WideDeep
from lit_amp.rec.serving.reader import load_published
from lit_amp.rec.serving.writer import publish_weights
from lit_amp.rec.sources import SyntheticClickSource
from tests.rec._helpers import tiny_net, touch_rows
from tests.rec.serving._helpers import published_chain, publisher, same_state, table


def test_the_reader_sees_the_trainers_weights_at_every_version(tmp_path):
    torch.manual_seed(0)
    net = WideDeep(vocab_size=500, embed_dim=4, hidden=(8,), sparse=True)
    opt = LazyAdam(net.parameters(), lr=0.05)
    pub = publisher(net, opt, tmp_path, full_every_n_publishes=4)
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
        assert same_state(served.state_dict(), net)
    assert kinds == ["full", "delta", "delta", "delta", "full", "delta", "delta", "delta", "full"]


def test_a_torn_delta_is_refused_and_the_valid_prefix_served(tmp_path, caplog):
    _, _, _, states = published_chain(tmp_path)
    path = tmp_path / "delta-000000000004.pt"
    raw = bytearray(path.read_bytes())
    at = raw.find(states[4][4].numpy().tobytes())  # row 4's values, as the delta stores them
    assert at > 0
    raw[at + 5] ^= 0xFF  # one flipped bit pattern: the zip still opens, the checksum fails
    path.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger="lit_amp.rec.serving.reader"):
        payload = load_published(tmp_path)
    assert payload["version"] == 3 and torch.equal(payload["network"]["weight"], states[3])
    assert "delta version 4 refused" in caplog.text and "serving version 3" in caplog.text
    assert "delta-000000000004.pt" in payload["refused"]


def test_a_truncated_or_missing_delta_is_refused(tmp_path, caplog):
    _, _, _, states = published_chain(tmp_path)
    path = tmp_path / "delta-000000000003.pt"
    path.write_bytes(path.read_bytes()[:100])
    with caplog.at_level(logging.WARNING, logger="lit_amp.rec.serving.reader"):
        assert load_published(tmp_path)["version"] == 2
    assert "cannot be read" in caplog.text
    path.unlink()
    payload = load_published(tmp_path)
    assert payload["version"] == 2 and "missing" in payload["refused"]
    assert torch.equal(payload["network"]["weight"], states[2])


def test_a_delta_of_another_chain_is_refused(tmp_path):
    published_chain(tmp_path / "a")
    published_chain(tmp_path / "b")
    os.replace(tmp_path / "b" / "delta-000000000003.pt", tmp_path / "a" / "delta-000000000003.pt")
    payload = load_published(tmp_path / "a")
    assert payload["version"] == 2 and "does not continue" in payload["refused"]


def test_a_torn_full_snapshot_falls_back_to_the_previous_chain(tmp_path, caplog):
    emb, opt = table(rows=1000)
    pub = publisher(emb, opt, tmp_path, full_every_n_publishes=3)
    states = {}
    for v in range(1, 6):  # full 1, deltas 2-3, full 4, delta 5
        touch_rows(emb, opt, [v])
        pub.publish(step=v)
        states[v] = emb.weight.detach().clone()
    (tmp_path / "full-000000000004.pt").write_bytes(b"torn")
    with caplog.at_level(logging.WARNING, logger="lit_amp.rec.serving.reader"):
        payload = load_published(tmp_path)
    assert payload["version"] == 3 and torch.equal(payload["network"]["weight"], states[3])
    assert "full snapshot full-000000000004.pt is refused" in caplog.text
    for name in ("full-000000000001.pt", "full-000000000004.pt"):
        (tmp_path / name).write_bytes(b"torn")
    with pytest.raises(ValueError, match="no readable full snapshot"):
        load_published(tmp_path)


def test_polling_applies_only_the_new_deltas_in_place(tmp_path, monkeypatch):
    emb, opt = table(rows=1000)
    pub = publisher(emb, opt, tmp_path)
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
    monkeypatch.setattr("lit_amp.rec.serving.reader.torch.load",
                        lambda p, **kw: loaded.append(os.path.basename(p)) or real_load(p, **kw))
    new = load_published(tmp_path, served, since=payload)
    assert loaded == ["delta-000000000002.pt", "delta-000000000003.pt"]
    assert new is not payload and (payload["version"], new["version"]) == (1, 3)
    assert torch.equal(served.weight, emb.weight)


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/lit_amp_pwned_delta",))


def test_a_pickled_gadget_in_a_delta_is_refused_without_running(tmp_path):
    published_chain(tmp_path, n=2)
    with open(tmp_path / "delta-000000000002.pt", "wb") as f:
        pickle.dump({"network": _Evil()}, f)
    payload = load_published(tmp_path)
    assert payload["version"] == 1 and "cannot be read" in payload["refused"]
    assert not os.path.exists("/tmp/lit_amp_pwned_delta")


def test_load_published_without_anything_published(tmp_path):
    with pytest.raises(ValueError, match="no published weights"):
        load_published(tmp_path)


def test_load_published_on_a_corrupt_file_names_the_file(tmp_path):
    path = publish_weights(tiny_net(), tmp_path, step=1)
    with open(path, "wb") as f:
        f.write(b"not a torch file")
    with pytest.raises(ValueError, match="model-000000000001.pt.*cannot be read"):
        load_published(tmp_path)


