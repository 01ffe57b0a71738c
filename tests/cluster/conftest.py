"""Fixtures of the cluster tests: one SLURM cluster for the package's tests, and the runs on it.

``slurm_cluster`` starts :class:`tests.cluster.slurm_cluster.SlurmCluster` once (a test that
needs it skips, naming the reason, where SLURM is not installed or the tests do not run as
root). ``campaign`` starts, at the first test that asks for any of them, every run
(:mod:`tests.cluster.runs`) that the collected tests ask for, so that they share the wall
time; each run's fixture hands its :class:`~tests.cluster.campaign.Part` to the tests.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import runs
from tests.cluster.slurm_cluster import SlurmCluster, missing_reason


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    names = set()
    for item in items:
        if here in Path(str(item.path)).parents:
            names.update(getattr(item, "fixturenames", ()))
    config.stash[runs.WANTED] = [name for name in runs.STARTERS if name in names]


@pytest.fixture(scope="package")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    reason = missing_reason()
    if reason is None and importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") \
            is None:
        reason = "hydra-submitit-launcher is not installed (pip install lit_amp[slurm])"
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="package")
def campaign(request: pytest.FixtureRequest, slurm_cluster: SlurmCluster,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[runs.Campaign]:
    camp = runs.Campaign(slurm_cluster, tmp_path_factory.mktemp("runs"))
    t0 = time.monotonic()
    for name in request.config.stash.get(runs.WANTED, []):
        camp.start(name)
    try:
        yield camp
    finally:
        camp.stop()
        print(f"\ncluster runs: {time.monotonic() - t0:.1f} s wall; {camp.timings()}")


def _part(name: str) -> Any:
    @pytest.fixture(scope="package", name=name)
    def fixture(campaign: runs.Campaign) -> Any:
        return campaign.start(name)

    return fixture


amp_sweep = _part("amp_sweep")
amp_local = _part("amp_local")
faults = _part("faults")
lost_job = _part("lost_job")
time_limit = _part("time_limit")
optuna_slurm = _part("optuna_slurm")
sbatch_example = _part("sbatch_example")
bad_inputs = _part("bad_inputs")
