"""MAE and MSE (``lit_amp.metrics.regression``): divided by samples, not elements."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_amp.metrics import MAE, MSE
from tests.metrics._data import SIZES, rng, stacked
from tests.metrics._tester import MetricCase, MetricTester, case_id, value

pytestmark = pytest.mark.filterwarnings("ignore:The ``compute`` method of metric")


def _batches(shape=(3,), flat_label=False):
    g = rng(7)
    out = []
    for n in SIZES:
        y_pred, y = g.random((n, *shape)), g.random((n, *shape))
        out.append((y_pred, y.reshape(n) if flat_label else y))
    return out


def _ref(power):
    def ref(batches):
        y_pred, y = stacked(batches, 0), stacked(batches, 1).reshape(-1, *batches[0][0].shape[1:])
        return (np.abs(y - y_pred) ** power).sum() / len(y)

    return ref


CASES = [
    MetricCase("mae", MAE, _batches, _ref(1)),
    MetricCase("mse", MSE, _batches, _ref(2)),
    MetricCase("mse-label-reshaped", MSE, lambda: _batches((1,), flat_label=True), _ref(2)),
]


@pytest.mark.parametrize("case", CASES, ids=case_id)
class TestRegression(MetricTester):
    """(a)-(d) of the shared tester for MAE and MSE."""


def test_mae_mse_divide_by_samples_not_elements():
    y_pred = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    y = np.array([[1.5, 2.0, 1.0], [4.0, 3.0, 6.5]])
    mae, mse = MAE(), MSE()
    for m in (mae, mse):
        m.update(torch.tensor(y_pred), torch.tensor(y))
    assert value(mae) == pytest.approx(np.abs(y - y_pred).sum() / 2)  # 2.5, not 5/6
    assert value(mse) == pytest.approx(((y - y_pred) ** 2).sum() / 2)


def test_mae_mse_errors():
    with pytest.raises(RuntimeError, match="'MSE' can not be calculated"):
        MSE().compute()
    with pytest.raises(ValueError, match="as many elements"):
        MAE().update(torch.zeros(2, 2), torch.zeros(3))
