"""Wide&Deep, the example recommender network.

:class:`WideDeep` takes the batches of the built-in sources
(``{"dense": (B, 13), "cat": (B, 26), ...}``) and returns one click logit per record; train it
with ``torch.nn.BCEWithLogitsLoss``. Categorical ids are hashed into ``vocab_size`` rows per
feature (``id % vocab_size``), so any id works; with ``collisionless=True`` every distinct id
gets its own row instead (:class:`~lit_amp.rec.modules.id_embedding.IdEmbedding`, within a
budget of ``num_cat * vocab_size`` rows). With ``sparse=True`` the embedding gradients are
sparse and :class:`~lit_amp.rec.optim.LazyAdam` keeps a step's cost independent of the table
size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from lit_amp.rec.huge_pages import huge_empty
from lit_amp.rec.modules.id_embedding import IdEmbedding

__all__ = ["WideDeep"]


def _init_rows(rows: torch.Tensor) -> None:
    """A new id's row: its wide weight (column 0) zero, its deep embedding small and random."""
    nn.init.normal_(rows, std=0.01)
    rows[:, 0] = 0.0


class WideDeep(nn.Module):
    """Wide&Deep (Cheng et al., 2016) for Criteo-like click data.

    - wide: a linear model over the hashed categorical ids (one weight per id, summed) and the
      dense features;
    - deep: per-feature embeddings of the ids, concatenated with ``log1p`` of the dense
      features, through an MLP.

    Both parts share one table (``embedding``: column 0 holds each id's wide weight, the other
    ``embed_dim`` columns its deep embedding), looked up once per distinct id of the batch.

    The output is ``wide + deep``: one logit per record, shape ``(B,)``.

    Args:
        num_dense: dense features (Criteo: 13).
        num_cat: categorical features (Criteo: 26).
        vocab_size: hashed rows per categorical feature (``collisionless``: the row budget
            per feature, ``num_cat * vocab_size`` rows shared by all features).
        embed_dim: embedding width of the deep part.
        hidden: MLP widths.
        dropout: dropout after each hidden layer.
        sparse: sparse embedding gradients (use :class:`LazyAdam`, SGD or Adagrad).
        collisionless: one row per distinct ``(feature, id)`` (an
            :class:`~lit_amp.rec.modules.id_embedding.IdEmbedding` that evicts the least frequently
            used ids when full) instead of ``id % vocab_size``; ``net.embedding.attach(opt)``
            gives a row reused for a new id fresh optimizer moments. Under DDP it needs
            ``sparse=False`` (DDP takes sparse gradients only from ``nn.Embedding``; sparse
            collision-free tables are refused at the first training step).

    Raises:
        ValueError: a non-positive size.

    Example:
        >>> from lit_amp.rec.sources import SyntheticClickSource
        >>> net = WideDeep(vocab_size=100, embed_dim=4, hidden=(8,))
        >>> features, label = next(iter(SyntheticClickSource(batch_size=5)))
        >>> net(features).shape
        torch.Size([5])
    """

    def __init__(
        self,
        num_dense: int = 13,
        num_cat: int = 26,
        vocab_size: int = 10_000,
        embed_dim: int = 16,
        hidden: Sequence[int] = (256, 128),
        dropout: float = 0.0,
        sparse: bool = False,
        collisionless: bool = False,
    ) -> None:
        super().__init__()
        for name, v in (("num_cat", num_cat), ("vocab_size", vocab_size), ("embed_dim", embed_dim)):
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(
                    f"For 'WideDeep', the argument '{name}' must be a positive int, but got {v!r}."
                )
        if not isinstance(num_dense, int) or num_dense < 0:
            raise ValueError(
                f"For 'WideDeep', the argument 'num_dense' must be an int >= 0, but got "
                f"{num_dense!r}."
            )
        self.num_dense, self.num_cat, self.vocab_size = num_dense, num_cat, vocab_size
        self.register_buffer(
            "offsets", torch.arange(num_cat, dtype=torch.long) * vocab_size, persistent=False
        )
        rows = num_cat * vocab_size
        # one table for both parts: column 0 is an id's wide (linear) weight, columns 1.. its
        # deep embedding — one lookup and one sparse gradient per step instead of two
        self.embedding: nn.Module = (
            IdEmbedding(rows, embed_dim + 1, num_features=num_cat, sparse=sparse,
                        init=_init_rows)
            if collisionless else nn.Embedding(rows, embed_dim + 1, sparse=sparse,
                                               _weight=huge_empty(rows, embed_dim + 1))
        )
        self.wide_dense = nn.Linear(num_dense, 1) if num_dense else None
        layers: list[nn.Module] = []
        width = num_cat * embed_dim + num_dense
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            width = h
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)
        if not collisionless:
            with torch.no_grad():
                _init_rows(self.embedding.weight)

    def forward(self, features: Mapping[str, torch.Tensor] | Sequence[torch.Tensor]) -> Any:
        """``features``: ``{"dense", "cat"}`` (extra keys ignored) or ``(dense, cat)``."""
        if isinstance(features, Mapping):
            dense, cat = features["dense"], features["cat"]
        else:
            dense, cat = features[0], features[1]
        if isinstance(self.embedding, IdEmbedding):
            e = self.embedding(cat)  # (B, num_cat, 1 + embed_dim)
        else:
            idx = torch.remainder(cat, self.vocab_size) + self.offsets
            # look each distinct row up once: the sparse gradient then has one entry per
            # distinct id of the batch, which makes the optimizer's coalesce cheap
            # (index_select: the values of [inverse], cheaper when torch runs several threads)
            rows, inverse = torch.unique(idx, return_inverse=True)
            e = self.embedding(rows).index_select(0, inverse.reshape(-1))
            e = e.reshape(*idx.shape, -1)  # (B, num_cat, 1 + embed_dim)
        wide = e[..., 0].sum(dim=1)
        deep = e[..., 1:].flatten(1)
        if self.num_dense:
            x = torch.log1p(dense.float().clamp_min(0.0)).to(deep.dtype)
            wide = wide + self.wide_dense(x).squeeze(1)
            deep = torch.cat([x, deep], dim=1)
        return wide + self.mlp(deep).squeeze(1)
