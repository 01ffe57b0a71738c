"""THOR's optimized step (issue #20) reproduces the parameters of the original implementation.

``golden_thor.bin`` was recorded by the code before the speed-ups (see ``_golden.py``); the
scenarios cover Linear, Conv1d (stride, dilation, no bias), Conv2d (reflect padding, dilation),
Embedding, LayerNorm, the bias column, π damping, the trace rule, block splitting, Nesterov,
clipping, a loss scale and a decay filter.
"""

from __future__ import annotations

import pytest
import torch

from tests.thor._golden import GOLDEN, SCENARIOS, run_scenario


@pytest.fixture
def one_thread():
    """The recording ran at 1 thread; BLAS rounding depends on the thread count."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_same_parameters_as_the_reference_implementation(name, one_thread):
    ref_params, ref_inversions = torch.load(GOLDEN, weights_only=True)[name]
    params, inversions = run_scenario(name)
    assert inversions == ref_inversions
    assert params.keys() == ref_params.keys()
    for k, p in params.items():
        torch.testing.assert_close(p, ref_params[k], rtol=0, atol=1e-6, msg=f"{name}: {k}")
