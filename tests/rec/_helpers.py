"""Small shared pieces for the RecModel tests: a tiny Wide&Deep, a hook recorder, data files, a
finite synthetic stream and the exact AUC."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from lit_amp.callbacks import Callback
from lit_amp.callbacks.base import TRAIN_HOOKS  # noqa: F401 - re-exported to the rec tests
from lit_amp.rec import RecModel, WideDeep
from lit_amp.rec.sources import SyntheticClickSource, write_shard

EVAL_HOOKS = ("on_eval_begin", "on_eval_step_end", "on_eval_end")


def synthetic_stream(n_batches: int | None = None, bs: int = 16, **kw: Any) -> SyntheticClickSource:
    """``n_batches`` batches of ``bs`` synthetic records (unbounded when None)."""
    return SyntheticClickSource(
        batch_size=bs, num_records=None if n_batches is None else n_batches * bs, **kw
    )


def exact_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """ROC AUC over every positive-negative pair (ties count half)."""
    pos, neg = scores[labels > 0.5], scores[labels <= 0.5]
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0).double() + 0.5 * (diff == 0).double()).mean())


def sparse_table(rows: int, seed: int = 0) -> tuple[torch.nn.Embedding, torch.optim.Optimizer]:
    """A sparse ``rows`` x 8 embedding table and its SparseAdam (what delta publishing tracks)."""
    torch.manual_seed(seed)
    emb = torch.nn.Embedding(rows, 8, sparse=True)
    return emb, torch.optim.SparseAdam(emb.parameters(), lr=0.1)


def touch_rows(emb: torch.nn.Embedding, opt: torch.optim.Optimizer, ids: Any) -> None:
    """One optimizer step that changes the rows ``ids`` of ``emb``."""
    opt.zero_grad()
    emb(torch.as_tensor(ids)).pow(2).sum().backward()
    opt.step()


def tiny_net(seed: int = 0) -> WideDeep:
    torch.manual_seed(seed)
    return WideDeep(vocab_size=64, embed_dim=4, hidden=(16,))


def make_model(metrics: Any = None, seed: int = 0, **kw: Any) -> RecModel:
    net = tiny_net(seed)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    return RecModel(net, nn.BCEWithLogitsLoss(), opt, metrics=metrics, **kw)


class Recorder(Callback):
    """Records (hook, cur_epoch_num, cur_step_num) for every hook; optional per-step action."""

    def __init__(self, on_step=None) -> None:
        self.events: list[tuple[str, int, int]] = []
        self.ids: list[list[int]] = []
        self.metrics_seen: list[Any] = []
        self.on_step = on_step

    def _rec(self, hook: str, rc: Any) -> None:
        cb = rc.original_args()
        self.events.append((hook, int(cb.cur_epoch_num), int(cb.cur_step_num)))

    def on_train_begin(self, rc):
        self._rec("on_train_begin", rc)

    def on_train_epoch_begin(self, rc):
        self._rec("on_train_epoch_begin", rc)

    def on_train_step_begin(self, rc):
        self._rec("on_train_step_begin", rc)

    def on_train_step_end(self, rc):
        self._rec("on_train_step_end", rc)
        el = rc.original_args().train_dataset_element
        self.ids.append(el[0]["record_id"].tolist())
        if self.on_step is not None:
            self.on_step(rc)

    def on_train_epoch_end(self, rc):
        self._rec("on_train_epoch_end", rc)
        self.metrics_seen.append(rc.original_args().get("eval_results"))

    def on_train_end(self, rc):
        self._rec("on_train_end", rc)

    def on_eval_begin(self, rc):
        self._rec("on_eval_begin", rc)

    def on_eval_step_end(self, rc):
        self._rec("on_eval_step_end", rc)

    def on_eval_end(self, rc):
        self._rec("on_eval_end", rc)

    def hooks(self) -> list[str]:
        return [e[0] for e in self.events]


def fill_dir(
    directory: str | os.PathLike,
    n_files: int,
    per_file: int,
    fmt: str = "npz",
    *,
    start: int = 0,
    seed: int = 0,
) -> list[int]:
    """Write files part-{start..}: record ids are contiguous; returns all ids written."""
    gen = SyntheticClickSource(batch_size=per_file, seed=seed, vocab_size=1000)
    ids: list[int] = []
    for i in range(start, start + n_files):
        cols = gen.columns(i)
        write_shard(directory, f"part-{i:06d}", cols, fmt)
        ids.extend(cols["id"].tolist())
    return ids
