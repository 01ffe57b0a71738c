"""``lit_amp.rec.state.touched``: the rows taken lazily (bitmaps) equal the rows taken eagerly."""

from __future__ import annotations

import torch


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
