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


#: fixture scopes wide enough to share a set-up between tests, narrowest first
_SHARED = {"module": 1, "package": 2, "session": 3}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``make gpu-check`` runs ``-n <cores> --dist loadgroup``; ``make test``
    is serial): tests that share a module-, package- or session-scoped fixture of the suite run
    on one worker, so that the fixture (a SLURM cluster, a wheel build, the README's command
    session) is set up once, not once per worker. The group is the home (conftest folder or
    module) of the widest such fixture: every fixture of that scope there shares the worker."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        shared = [d for defs in (info.name2fixturedefs.values() if info else ())
                  for d in defs[-1:]
                  if d.scope in _SHARED and getattr(d.func, "__module__", "").startswith("tests")]
        if shared:
            widest = max(shared, key=lambda d: (_SHARED[d.scope], d.baseid))
            item.add_marker(pytest.mark.xdist_group(f"{widest.scope}:{widest.baseid}"))

