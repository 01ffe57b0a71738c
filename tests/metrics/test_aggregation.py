"""Loss, Perplexity and Dice (``lit_amp.metrics.aggregation``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchmetrics.aggregation import MeanMetric

from lit_amp.metrics import AUC, Accuracy, Dice, Loss, Perplexity
from tests.metrics._data import SIZES, rng, stacked
from tests.metrics._tester import MetricCase, MetricTester, case_id, value

pytestmark = pytest.mark.filterwarnings("ignore:The ``compute`` method of metric")


def _loss_batches():
    g = rng(8)
    return [(g.random(n),) for n in SIZES] + [(np.array(6.0),)]  # a 0-d loss too


def _loss_ref(batches):
    return np.mean([b[0].mean() for b in batches])


def _prob_batches():
    g = rng(9)
    return [(g.dirichlet(np.ones(4), size=n), g.integers(0, 4, size=n)) for n in SIZES]


def _ignore_batches():
    return [(p, np.where(np.arange(len(y)) % 3 == 0, -100, y)) for p, y in _prob_batches()]


def _perplexity_ref(batches):
    p, y = stacked(batches, 0), stacked(batches, 1)
    keep = y != -100
    picked = p[np.arange(len(y)), np.where(keep, y, 0)]
    return np.exp(-np.log(np.clip(picked, 1e-10, None))[keep].mean())


def _dice_batches():
    g = rng(10)
    return [(g.random((n, 2)), g.integers(0, 2, size=(n, 2))) for n in SIZES]


def _dice_ref(batches):
    total = 0.0
    for p, t in batches:
        p, t = p.reshape(-1), t.reshape(-1).astype(float)
        total += 2 * p @ t / (p @ p + t @ t + 1e-5)
    return total / sum(len(b[1]) for b in batches)


CASES = [
    MetricCase("loss", Loss, _loss_batches, _loss_ref),
    MetricCase("perplexity", Perplexity, _prob_batches, _perplexity_ref),
    MetricCase("perplexity-ignore", lambda: Perplexity(ignore_label=-100), _ignore_batches,
               _perplexity_ref),
    MetricCase("dice", Dice, _dice_batches, _dice_ref),
]


@pytest.mark.parametrize("case", CASES, ids=case_id)
class TestAggregation(MetricTester):
    """(a)-(d) of the shared tester for Loss, Perplexity and Dice."""


def test_loss_is_unweighted_mean_of_batch_means():
    batches = [np.array([1.0]), np.array([2.0, 4.0]), np.array([0.0, 0.0, 0.0, 0.0, 10.0])]
    m = Loss()
    for b in batches:
        m.update(torch.tensor(b))
    m.update(torch.tensor(6.0))  # 0-d
    expected = (1.0 + 3.0 + 2.0 + 6.0) / 4
    assert value(m) == pytest.approx(expected)
    weighted = np.concatenate([*batches, [6.0]]).mean()
    assert expected != pytest.approx(weighted)


def test_loss_is_a_float64_mean_metric_and_keeps_nan():
    m = Loss()
    assert isinstance(m, MeanMetric)
    m.update(torch.tensor([1.0, 2.0], dtype=torch.float32))
    assert m.compute().dtype == torch.float64
    m.reset()
    assert m.weight.dtype == torch.float64
    m.update(torch.tensor([float("nan")]))  # MindSpore propagates a NaN loss
    assert np.isnan(value(m))


def test_loss_errors_and_flag():
    assert Loss.is_loss_metric is True
    assert Accuracy.is_loss_metric is False and AUC.is_loss_metric is False
    with pytest.raises(RuntimeError, match="'Loss' can not be calculated"):
        Loss().compute()
    with pytest.raises(ValueError, match="dimension of the input 'loss'"):
        Loss().update(torch.zeros(2, 2))
    with pytest.raises(ValueError, match="needs 1 input"):
        Loss().update(torch.zeros(2), torch.zeros(2))


def test_perplexity_and_dice_mindspore_doc_examples():
    x = torch.tensor([[0.2, 0.5], [0.3, 0.1], [0.9, 0.6]])
    p = Perplexity()
    p.update(x, torch.tensor([1, 0, 1]))
    assert value(p) == pytest.approx(2.231443166940565)
    ign = Perplexity(ignore_label=-100)
    ign.update(x, torch.tensor([1, -100, 1]))
    assert value(ign) == pytest.approx(np.exp(-(np.log(0.5) + np.log(0.6)) / 2))

    d = Dice(smooth=1e-5)
    d.update(x, torch.tensor([[0, 1], [1, 0], [0, 1]]))
    assert value(d) == pytest.approx(0.20467791371802546)
    with pytest.raises(ValueError, match="smooth"):
        Dice(smooth=0.0)
    with pytest.raises(TypeError, match="smooth"):
        Dice(smooth="1")
    with pytest.raises(TypeError, match="ignore_label"):
        Perplexity(ignore_label=1.5)
