"""(e) of the shared tester: every metric case under DDP, in ONE pair of gloo processes.

Each case runs twice in the same processes: the batches split between the ranks (uneven:
3 vs 2), and every batch on rank 0 (rank 1 saw nothing: an uneven stream's last
validation; its empty ``"cat"`` states must still gather with rank 0's). Both ranks must
report what one process reports with all batches.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.metrics._tester import DDP_MODES, cases_of, ddp_results, run, value
from tests.metrics.test_registry import FAMILY_MODULES

pytestmark = pytest.mark.filterwarnings("ignore:The ``compute`` method of metric")

MODULES = (*FAMILY_MODULES, "tests.metrics.test_registry")


def test_ddp_sync_equals_single_process_for_every_case():
    per_rank = ddp_results(MODULES)
    cases = cases_of(MODULES)
    assert len(per_rank[0]) == len(cases) * len(DDP_MODES)
    for case in cases:
        order = np.sort if case.per_sample else np.asarray  # per-sample values: rank by rank
        expected = order(value(run(case)))
        for mode in DDP_MODES:
            for rank, got in enumerate(per_rank):
                np.testing.assert_allclose(order(got[f"{case.id}/{mode}"]), expected, rtol=1e-10,
                                           err_msg=f"{case.id}/{mode} on rank {rank}")
