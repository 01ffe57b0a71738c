"""Fixtures for the CLI tests: a clean Hydra state around each test."""

from __future__ import annotations

import pytest
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig


@pytest.fixture(autouse=True)
def _clean_hydra():
    yield
    GlobalHydra.instance().clear()
    HydraConfig.instance().cfg = None
