"""Shared fixtures: small real models and data (seeded), quiet Lightning; lit_amp's wheel."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

from tests.helpers.data import make_batches, make_net  # noqa: F401 - re-exported
from tests.helpers.wheel import build_wheel


@pytest.fixture(autouse=True)
def _seed_and_quiet():
    torch.manual_seed(0)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        warnings.filterwarnings("ignore", ".*LeafSpec.*")
        yield


@pytest.fixture
def batches():
    return make_batches()


@pytest.fixture
def net():
    return make_net()


@pytest.fixture(scope="session")
def lit_amp_wheel(tmp_path_factory):
    """``(wheel path, build log)``: built once per session; tests copy or install it, never
    change it."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))
