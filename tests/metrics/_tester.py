"""One harness for every metric of ``lit_amp.metrics`` (torchmetrics' ``MetricTester`` idea).

A test module lists its metrics as :class:`MetricCase` objects in a module-level ``CASES``
and subclasses :class:`MetricTester`, parametrised over them::

    CASES = [MetricCase("mae", MAE, regression_batches, mae_reference)]

    @pytest.mark.parametrize("case", CASES, ids=case_id)
    class TestRegression(MetricTester):
        pass

Each case then goes through:

(a) the class on several seeded batches against a hand-written numpy reference;
(b) ``reset()`` back to a fresh state (compute fails, the same batches give the same value);
(c) numpy inputs giving exactly what tensor inputs give;
(d) ``forward`` returning the batch value while accumulating;
(e) DDP: :func:`ddp_results` runs the cases of the given modules in ONE pair of gloo
    processes, each updating with half of the batches (and once with every batch on rank 0,
    rank 1 seeing nothing); ``tests/metrics/test_ddp.py`` compares them with one process.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from torchmetrics import Metric

from lit_amp.metrics import metric_value_to_python

__all__ = ["MetricCase", "MetricTester", "case_id", "ddp_results", "value", "DDP_MODES"]

Batch = tuple[np.ndarray, ...]
DDP_MODES = ("split", "rank0_only")


@dataclass(frozen=True)
class MetricCase:
    """One metric configuration with its data and its reference.

    Attributes:
        id: a test id, unique across ``tests/metrics``.
        make: a fresh metric (a class or a zero-argument function).
        batches: the seeded numpy batches, each a tuple of ``update`` inputs.
        reference: the expected value over all batches, computed by hand with numpy.
        rtol: tolerance of class vs reference.
        per_sample: the value has one entry per sample, which under DDP comes rank by rank
            (not in batch order), so DDP results are compared sorted.
    """

    id: str
    make: Callable[[], Metric]
    batches: Callable[[], list[Batch]]
    reference: Callable[[list[Batch]], Any]
    rtol: float = 1e-10
    per_sample: bool = False


def case_id(case: MetricCase) -> str:
    return case.id


def value(metric: Metric) -> Any:
    """``compute()`` as MindSpore reports it (float / numpy array)."""
    return metric_value_to_python(metric.compute())


def _tensors(batch: Batch) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(np.asarray(x)) for x in batch)


def run(case: MetricCase, batches: Sequence[Batch] | None = None, numpy: bool = False) -> Metric:
    """A fresh metric updated with ``batches`` (default: all of the case's)."""
    metric = case.make()
    for batch in case.batches() if batches is None else batches:
        metric.update(*(batch if numpy else _tensors(batch)))
    return metric


def assert_close(actual: Any, expected: Any, rtol: float, msg: str = "") -> None:
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=rtol, atol=0,
                               err_msg=msg)


@pytest.mark.filterwarnings("ignore:The ``compute`` method of metric")
class MetricTester:
    """The shared checks (a)-(d); subclass it and parametrise ``case`` over ``CASES``."""

    def test_class_vs_reference(self, case: MetricCase) -> None:
        batches = case.batches()
        assert len(batches) >= 3, "use several batches"
        assert_close(value(run(case, batches)), case.reference(batches), case.rtol, case.id)

    def test_reset_returns_to_fresh_state(self, case: MetricCase) -> None:
        metric = run(case)
        first = value(metric)
        metric.reset()
        with pytest.raises(RuntimeError, match="number of samples is 0"):
            metric.compute()
        for batch in case.batches():
            metric.update(*_tensors(batch))
        np.testing.assert_array_equal(value(metric), first)

    def test_numpy_input_equals_tensor_input(self, case: MetricCase) -> None:
        np.testing.assert_array_equal(value(run(case, numpy=True)), value(run(case)))

    def test_forward_returns_batch_value_and_accumulates(self, case: MetricCase) -> None:
        metric = case.make()
        batches = case.batches()
        for batch in batches:
            got = metric_value_to_python(metric(*_tensors(batch)))
            assert_close(got, value(run(case, [batch])), 1e-12, case.id)
        assert_close(value(metric), case.reference(batches), case.rtol, case.id)


def _ddp_worker(rank: int, world: int, modules: Sequence[str]) -> dict[str, Any]:
    """Every case of ``modules`` in both DDP modes, computed (synced) on this rank."""
    out: dict[str, Any] = {}
    for module in modules:
        for case in importlib.import_module(module).CASES:
            for mode in DDP_MODES:
                metric = case.make()
                for i, batch in enumerate(case.batches()):
                    if (i % world if mode == "split" else 0) == rank:
                        metric.update(*_tensors(batch))
                out[f"{case.id}/{mode}"] = value(metric)
    return out


def ddp_results(modules: Sequence[str]) -> list[dict[str, Any]]:
    """Per-rank ``{"<case id>/<mode>": value}`` from one 2-process gloo run."""
    from tests.helpers.dist import run_distributed

    return run_distributed(_ddp_worker, world=2, args=(tuple(modules),))


def cases_of(modules: Sequence[str]) -> list[MetricCase]:
    return [c for m in modules for c in importlib.import_module(m).CASES]
