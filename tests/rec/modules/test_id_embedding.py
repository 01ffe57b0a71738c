"""IdEmbedding: one row per distinct id within a row budget, evictions counted, the id map
saved, restored and published with the weights, any int64 id accepted."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lit_amp.rec import CheckpointOptions, LazyAdam, RecModel, StopOptions, WideDeep
from lit_amp.rec.modules.id_embedding import IdEmbedding
from lit_amp.rec.serving.reader import load_published
from lit_amp.rec.serving.writer import DeltaPublisher
from lit_amp.rec.sources import SyntheticClickSource
from lit_amp.serialization import load_checkpoint, save_checkpoint

I64 = torch.iinfo(torch.int64)
HOSTILE = torch.tensor([0, -1, 1, I64.min, I64.max, I64.min + 1, I64.max - 1, 2**62, -(2**62),
                        2**32, -(2**32), 10**18, 7, -7])


def _distinct_ids(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(I64.min, I64.max, (2 * n,), generator=g)
    return torch.unique(torch.cat([HOSTILE, ids]))[:n]


def _assert_own_rows(emb: IdEmbedding, ids: torch.Tensor) -> torch.Tensor:
    rows = emb.row_of(ids)
    assert (rows < emb.num_rows).all(), "an id lost its row"
    assert torch.unique(rows).numel() == torch.unique(ids).numel(), "two ids share a row"
    return rows


def test_distinct_ids_never_share_a_row_until_the_budget_forces_eviction():
    emb = IdEmbedding(1000, 4)
    ids = _distinct_ids(1000)
    for chunk in ids.split(64):  # the table fills up batch by batch
        emb(chunk)
    rows = _assert_own_rows(emb, ids)
    assert len(emb) == 1000 and int(emb.evictions) == 0
    assert sorted(rows.tolist()) == list(range(1000))
    emb(ids[:900])  # these become more frequent than the last 100
    newcomer = torch.tensor([123456789123])
    assert newcomer not in ids
    emb(newcomer)
    evicted = math.ceil(1000 / 100)  # at least 1 % of the budget at a time
    assert int(emb.evictions) == evicted and len(emb) == 1000 - evicted + 1
    assert emb.row_of(newcomer).item() < 1000
    gone = emb.row_of(ids) == emb.num_rows
    assert int(gone.sum()) == evicted and not gone[:900].any()  # the least frequent went
    _assert_own_rows(emb, torch.cat([ids[~gone], newcomer]))


def test_lru_evicts_the_least_recently_used():
    emb = IdEmbedding(3, 2, policy="lru")
    for i in (1, 2, 3, 1, 2):
        emb(torch.tensor([i]))
    emb(torch.tensor([4]))
    assert emb.row_of(torch.tensor([1, 2, 3, 4])).tolist()[2] == 3  # id 3: the shared row
    assert int(emb.evictions) == 1


def test_ids_of_different_features_get_different_rows():
    emb = IdEmbedding(10, 2, num_features=3)
    ids = torch.tensor([[5, 5, 5], [I64.max, I64.max, -5]])
    emb(ids)
    assert torch.unique(emb.row_of(ids)).numel() == 6  # 6 distinct (feature, id) pairs
    with pytest.raises(ValueError, match="num_features=3"):
        emb(torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="an integer tensor"):
        emb(torch.tensor([[1.0, 2.0, 3.0]]))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(I64.min, I64.max), min_size=1, max_size=40),
                min_size=1, max_size=8))
def test_any_int64_stream_keeps_ids_apart_within_the_budget(batches):
    emb = IdEmbedding(64, 2, num_features=1)
    seen: list[int] = []
    for batch in batches:
        ids = torch.tensor(batch, dtype=torch.long)
        out = emb(ids)
        assert out.shape == (len(batch), 2) and torch.isfinite(out).all()
        seen += batch
    assert len(emb) <= 64
    distinct = torch.unique(torch.tensor(seen))
    if distinct.numel() <= 64:  # no eviction: every id has its own row
        assert int(emb.evictions) == 0
        _assert_own_rows(emb, distinct)
    held = emb.row_of(distinct)
    held = held[held < 64]
    assert torch.unique(held).numel() == held.numel()  # rows are never shared


def test_a_burst_of_new_ids_is_logged_and_the_budget_holds(caplog):
    emb = IdEmbedding(500, 4, sparse=True)
    slots = emb._slots.numel()
    with caplog.at_level(logging.INFO, logger="lit_amp.rec.modules.id_embedding"):
        out = emb(_distinct_ids(2000))  # more new ids than rows, in one batch
        for seed in range(1, 30):  # then a stream of new ids, far more than the budget
            emb(_distinct_ids(300, seed=seed))
    assert out.shape == (2000, 4)
    assert "2000 new ids in one batch" in caplog.text and "found no row" in caplog.text
    assert "the table is full" in caplog.text
    assert int(emb.overflows) == 1500 and int(emb.evictions) > 0
    assert len(emb) <= 500 and emb.weight.shape[0] == 501 and emb._slots.numel() == slots


def test_evaluation_reads_unknown_ids_from_the_shared_row_and_allocates_nothing():
    emb = IdEmbedding(10, 3)
    emb(torch.tensor([1, 2]))
    emb.eval()
    out = emb(torch.tensor([1, 99]))
    assert len(emb) == 2 and torch.equal(out[1], emb.weight[10])
    assert torch.equal(out[1], torch.zeros(3))


def test_a_reused_row_starts_with_fresh_optimizer_moments():
    emb = IdEmbedding(2, 2, sparse=True, policy="lru")
    opt = LazyAdam(emb.parameters(), lr=0.1)
    emb.attach(opt)
    for ids in ([1, 2], [1]):
        opt.zero_grad()
        emb(torch.tensor(ids)).sum().backward()
        opt.step()
    opt.zero_grad()
    emb(torch.tensor([3])).sum().backward()  # evicts id 2 (least recent) from row 1
    assert emb.row_of(torch.tensor([3])).item() == 1
    opt.step()
    m = opt.state[emb.weight]["exp_avg"][1]
    assert torch.allclose(m, torch.full((2,), 0.1))  # (1 - beta1) * grad: no old momentum


def _stream(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(-(10**15), 10**15, (32, 26), generator=g) % 5000 * 9973
            for _ in range(n)]


def test_a_resumed_run_maps_ids_exactly_as_before(tmp_path):
    def net():
        torch.manual_seed(0)
        return WideDeep(vocab_size=40, embed_dim=4, hidden=(8,), sparse=True,
                        collisionless=True)

    first, second = _stream(6, 1), _stream(6, 2)
    dense = torch.rand(32, 13)
    a = net()
    for cat in first:
        a({"dense": dense, "cat": cat})
    path = tmp_path / "a.ckpt"
    save_checkpoint(a, str(path))
    b = net()
    b.load_state_dict(load_checkpoint(str(path))["network"])  # weights_only=True
    assert int(a.embedding.evictions) > 0  # the budget (1040 rows) was exceeded
    for cat in first + second:
        assert torch.equal(a.embedding.row_of(cat), b.embedding.row_of(cat))
    for cat in second:  # both continue: the same allocations and evictions
        a({"dense": dense, "cat": cat})
        b({"dense": dense, "cat": cat})
    assert torch.equal(a.embedding.row_keys, b.embedding.row_keys)
    assert int(a.embedding.evictions) == int(b.embedding.evictions)
    assert torch.equal(a.embedding.weight, b.embedding.weight)  # new rows: the same values


def test_online_train_resumes_the_id_map_from_its_checkpoint(tmp_path):
    def model():
        torch.manual_seed(0)
        net = WideDeep(vocab_size=20, embed_dim=4, hidden=(8,), sparse=True, collisionless=True)
        return RecModel(net, torch.nn.BCEWithLogitsLoss(), LazyAdam(net.parameters(), lr=0.01))

    first = model()
    first.online_train(SyntheticClickSource(batch_size=16, vocab_size=10**6, seed=4),
                       stop=StopOptions(max_steps=4), checkpoint=CheckpointOptions(tmp_path))
    trained = first.lit_model.network.embedding
    assert int(trained.evictions) > 0  # 4 x 16 x 26 Zipf ids into 520 rows
    second = model()
    s = second.online_train(SyntheticClickSource(batch_size=16, vocab_size=10**6, seed=4),
                            stop=StopOptions(max_steps=4), checkpoint=CheckpointOptions(tmp_path))
    resumed = second.lit_model.network.embedding
    assert s.resumed_from is not None and s.steps == 0
    assert torch.equal(resumed.row_keys, trained.row_keys)
    ids = torch.cat([b[0]["cat"] for b in SyntheticClickSource(batch_size=16, vocab_size=10**6,
                                                               seed=4, num_records=64)])
    assert torch.equal(resumed.row_of(ids), trained.row_of(ids))


def test_under_ddp_every_rank_keeps_the_same_id_map(monkeypatch):
    """Two ranks (threads) see different ids; each admits the union, so the maps agree."""
    import threading

    from lit_amp.rec.modules import id_embedding

    barrier, box = threading.Barrier(2), {}

    def all_gather_rows(t):
        box[threading.current_thread().name] = t
        barrier.wait()
        out = torch.cat([box["rank0"], box["rank1"]])
        barrier.wait()
        return out

    monkeypatch.setattr(id_embedding, "world_size", lambda: 2)
    monkeypatch.setattr(id_embedding, "_all_gather_rows", all_gather_rows)
    ranks = [IdEmbedding(300, 4, num_features=2) for _ in range(2)]
    streams = [_stream(8, seed)[:8] for seed in (5, 6)]
    errors = []

    def run(r):
        try:
            for cat in streams[r]:
                ranks[r](cat[:, :2])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,), name=f"rank{r}") for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    a, b = ranks
    assert int(a.evictions) > 0  # 8 steps of up to 64 new keys per rank in 300 rows
    assert torch.equal(a.row_keys, b.row_keys) and torch.equal(a.weight, b.weight)
    for cat in streams[0] + streams[1]:
        assert torch.equal(a.row_of(cat[:, :2]), b.row_of(cat[:, :2]))


def test_the_id_map_is_published_with_the_rows_and_served_the_same(tmp_path):
    def net():
        torch.manual_seed(0)
        return WideDeep(vocab_size=40, embed_dim=4, hidden=(8,), sparse=True,
                        collisionless=True)

    trainer, served = net(), net()
    opt = LazyAdam(trainer.parameters(), lr=0.05)
    pub = DeltaPublisher(trainer, tmp_path, max_delta_fraction=1.0)
    pub.attach(opt)
    dense, payload = torch.rand(32, 13), None
    for step, cat in enumerate(_stream(5, 3), start=1):
        opt.zero_grad()
        trainer({"dense": dense, "cat": cat}).sum().backward()
        opt.step()
        pub.publish(step)
        payload = load_published(tmp_path, served, since=payload)  # deltas, applied in place
        assert payload["version"] == step
        if step > 1:
            assert pub.last_kind == "delta" and "embedding.row_keys" in payload["network"]
        cats = torch.cat(_stream(5, 3))
        assert torch.equal(served.embedding.row_of(cats), trainer.embedding.row_of(cats))
    trainer.eval(), served.eval()
    batch = {"dense": dense, "cat": cat}
    assert torch.equal(served(batch), trainer(batch))
    fresh = net().eval()
    load_published(tmp_path, fresh)  # a full replay gives the same map
    assert torch.equal(fresh(batch), trainer(batch))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), chunk=st.integers(1, 60), n=st.integers(1, 70),
       policy=st.sampled_from(["lfu", "lru"]))
def test_the_evicted_rows_are_the_least_used_in_row_order_at_any_chunk_size(seed, chunk, n,
                                                                            policy):
    """Victims are chosen chunk by chunk (no whole-table scores at 26 M rows): the same rows
    as sorting every evictable row by (lookups, last use) -- or last use for LRU -- and row."""
    from lit_amp.rec.modules import id_embedding

    g = torch.Generator().manual_seed(seed)
    emb = IdEmbedding(50, 2, policy=policy)
    emb.row_keys[:, 0] = torch.where(torch.rand(50, generator=g) < 0.2, -1, 0)  # free rows
    emb.row_keys[:, 1] = torch.arange(50)
    emb.row_count.copy_(torch.randint(0, 3, (50,), generator=g))  # many ties
    emb.row_seen.copy_(torch.randint(0, 4, (50,), generator=g))
    emb.row_count[7] = 2**40  # a count past the int32 range sorts last
    protect = torch.randperm(50, generator=g)[:5]
    old = id_embedding._VICTIM_CHUNK
    id_embedding._VICTIM_CHUNK = chunk
    try:
        got = emb._victims(n, protect).tolist()
    finally:
        id_embedding._VICTIM_CHUNK = old
    evictable = [r for r in range(50)
                 if emb.row_keys[r, 0] >= 0 and r not in protect.tolist()]
    def order(r: int) -> tuple:
        seen = int(emb.row_seen[r])
        return ((seen,) if policy == "lru" else (min(int(emb.row_count[r]), 2**31 - 1), seen)), r
    assert got == sorted(sorted(evictable, key=order)[:n])


def test_sparse_gradients_under_ddp_are_refused_with_the_way_out(monkeypatch):
    """Real DDP fails in backward on a sparse gradient that is not an nn.Embedding's (seen
    with 2-process gloo); the first training step says so instead, and what to use."""
    from lit_amp.rec.modules import id_embedding

    monkeypatch.setattr(id_embedding, "world_size", lambda: 2)
    monkeypatch.setattr(id_embedding, "_all_gather_rows", lambda t: torch.cat([t, t]))
    ids = torch.tensor([[1, 2], [3, 4]])
    with pytest.raises(RuntimeError, match=r"'sparse' must be False when training on 2 ranks"):
        IdEmbedding(10, 2, num_features=2, sparse=True)(ids)
    assert IdEmbedding(10, 2, num_features=2)(ids).shape == (2, 2, 2)  # dense: trains
    with torch.no_grad():  # evaluation and serving are not refused
        assert IdEmbedding(10, 2, num_features=2, sparse=True)(ids).shape == (2, 2, 2)
