"""Shared set-ups of the serving tests: a sparse table, its publisher, a published chain."""

from __future__ import annotations

import torch

from lit_amp.rec.serving.writer import DeltaPublisher
from tests.rec._helpers import sparse_table, touch_rows


def table(rows: int = 200_000, seed: int = 0):
    return sparse_table(rows, seed)


def publisher(emb, opt, d, **kw) -> DeltaPublisher:
    pub = DeltaPublisher(emb, d, **kw)
    pub.attach(opt)
    return pub


def same_state(state: dict, net: torch.nn.Module) -> bool:
    mine = net.state_dict()
    return state.keys() == mine.keys() and all(torch.equal(state[k], mine[k]) for k in mine)


def published_chain(tmp_path, n: int = 5):
    """A full snapshot and n - 1 deltas; the table's state at every version."""
    emb, opt = table(rows=1000)
    pub = publisher(emb, opt, tmp_path)
    states = {}
    for v in range(1, n + 1):
        if v > 1:
            touch_rows(emb, opt, [v, 10 * v])
        pub.publish(step=v)
        states[v] = emb.weight.detach().clone()
    return emb, opt, pub, states
