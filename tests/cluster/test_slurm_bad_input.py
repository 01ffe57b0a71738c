"""What SLURM cannot run fails at once with one message naming the argument and what is
allowed; a job that stays pending is cancelled after ``max_pending_min``: never an endless
wait. The four commands run at the same time (``bad_inputs``)."""

from __future__ import annotations

import pytest

from tests.cluster.campaign import slurm

pytestmark = pytest.mark.slurm

EXPECTED = {
    "devices_over_cpus": ["trainer.devices=3", "at most 2", "allowed: trainer.devices <= 2"],
    "no_such_partition": ["hydra.launcher.partition='nope'", "allowed: debug, down"],
    "devices_auto": ["trainer.devices=<GPUs per node> as an int", "trainer.devices='auto'"],
    "stays_pending": ["stayed pending", "reason: PartitionDown",
                      "hydra.launcher.max_pending_min=0.1", "it was cancelled"],
}
#: seconds within which each command must have failed (the pending one waits 6 s)
BOUND_S = 90


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_bad_input_is_one_clear_error_in_bounded_time(bad_inputs, campaign, case):
    part = bad_inputs[case]
    rc, out = part.wait(BOUND_S)
    assert rc == 1 and not part.errors, out[-3000:]
    for text in EXPECTED[case]:
        assert text in out, out[-3000:]
    assert "Traceback" not in out
    submitted = list((part.dir / "sweep" / ".submitit").glob("*"))
    if case == "stays_pending":  # submitted, then cancelled: nothing left in the queue
        assert submitted and not slurm(campaign.env, "squeue", "-h", "-p", "down").strip()
    else:
        assert not submitted  # refused before anything was submitted
