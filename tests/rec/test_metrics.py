"""The stream AUC (``lit_amp.rec.metrics``): the binned AUC against the exact one, the sliding
window's constant memory, as a validation metric of ``online_train``, its argument checks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_amp.rec import RecModel, SlidingWindowAUC, ValidationOptions, WideDeep, binned_auc
from lit_amp.rec.sources import SyntheticClickSource
from tests.rec._helpers import Recorder, exact_auc


def test_binned_auc_matches_the_exact_auc():
    g = torch.Generator().manual_seed(0)
    labels = (torch.rand(3000, generator=g) < 0.3).float()
    scores = torch.sigmoid(torch.randn(3000, generator=g) + 1.5 * labels)
    m = SlidingWindowAUC(window=10_000, num_chunks=10, num_bins=1000, from_logits=False)
    m.update(scores, labels)
    assert abs(float(m.compute()) - exact_auc(scores, labels)) < 2e-3


def test_sliding_window_forgets_old_records_in_constant_memory():
    m = SlidingWindowAUC(window=1000, num_chunks=4, num_bins=100)
    g = torch.Generator().manual_seed(1)
    y = (torch.rand(2000, generator=g) < 0.5).float()
    m.update(torch.where(y > 0, 3.0, -3.0), y)  # perfectly ranked
    assert float(m.compute()) == 1.0
    size = m.pos.numel() + m.neg.numel()
    y2 = (torch.rand(1000, generator=g) < 0.5).float()
    m.update(torch.where(y2 > 0, -3.0, 3.0), y2)  # then perfectly wrong: the window slides
    assert float(m.compute()) < 0.3
    assert m.pos.numel() + m.neg.numel() == size == 2 * 4 * 100
    m.reset()
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert torch.isnan(m.compute())
    assert torch.isnan(binned_auc(torch.zeros(3), torch.ones(3)))


def test_sliding_window_auc_as_a_validation_metric():
    net = WideDeep(vocab_size=100, embed_dim=4, hidden=(8,))
    model = RecModel(
        net,
        nn.BCEWithLogitsLoss(),
        torch.optim.Adam(net.parameters(), 1e-2),
        metrics={"auc": SlidingWindowAUC(window=5000)},
    )
    rec = Recorder()
    model.online_train(
        SyntheticClickSource(batch_size=64, num_records=64 * 6),
        callbacks=rec,
        validation=ValidationOptions(valid_every_n_steps=3, valid_window=2),
    )
    assert 0.0 <= rec.metrics_seen[-1]["auc"] <= 1.0


def test_sliding_window_auc_bad_arguments():
    with pytest.raises(ValueError, match="'window' \\(3\\) must be >= 'num_chunks'"):
        SlidingWindowAUC(window=3, num_chunks=4)
    with pytest.raises(ValueError, match="same number of elements"):
        SlidingWindowAUC().update(torch.zeros(3), torch.zeros(2))
