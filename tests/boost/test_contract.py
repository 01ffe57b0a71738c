"""Every algorithm of lit_amp.boost.registry through the boost contract (tests/boost/contract.py).

Parametrized over the registry: a new entry is trained, resumed, run under DDP and under AMP
O1/O2 without a line added here. One 2-process DDP launch covers every algorithm and level.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lit_amp.amp.names import BOOST_LEVELS
from lit_amp.boost import AutoBoost
from lit_amp.boost.registry import ALGORITHMS
from tests.boost import contract as C
from tests.helpers.dist import run_distributed

NAMES = [a.name for a in ALGORITHMS]
LEVELS = [lv for lv in BOOST_LEVELS if lv != "O0"]
_RUNS: dict[tuple, C.Run] = {}


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("contract")


def _runs(name: str, tmp: Path, amp: str = "O0") -> tuple[C.Run, C.Run]:
    """(the run with ``name`` on, the same run without boost), each trained once."""
    keys = {("base", C.baseline_key(name), amp): dict(name=None, net_of=name),
            (name, amp): dict(name=name)}
    for key, kw in keys.items():
        if key not in _RUNS:
            _RUNS[key] = C.run(tmp=tmp, amp=amp, **kw)
    run, base = (_RUNS[k] for k in reversed(list(keys)))
    return run, base


@pytest.mark.parametrize("name", NAMES)
def test_a_short_run_shows_the_algorithms_effect(name: str, tmp: Path) -> None:
    run, base = _runs(name, tmp)
    C.case(name).effect(run, base)


@pytest.mark.parametrize("name", NAMES)
def test_a_checkpoint_resumes_identically(name: str, tmp: Path) -> None:
    """Epoch 1, ``lit_amp.save_checkpoint``; a fresh model loads it and trains epoch 2: the
    same losses, weights and boost state as the uninterrupted run."""
    full, _ = _runs(name, tmp)
    path = str(tmp / f"{name}.ckpt")
    first = C.run(name, tmp, epochs=1, save_to=path)
    second = C.run(name, tmp, epochs=1, load_from=path)
    assert first.losses + second.losses == full.losses
    assert torch.equal(second.weights, full.weights)
    assert C.states_equal(second.boost_state, full.boost_state)


@pytest.mark.parametrize("amp", ["O1", "O2"])
@pytest.mark.parametrize("name", NAMES)
def test_composes_with_amp(name: str, amp: str, tmp: Path) -> None:
    run, base = _runs(name, tmp, amp)
    C.case(name).effect(run, base)


@pytest.fixture(scope="module")
def ddp(tmp: Path) -> list[dict[str, C.Run]]:
    return run_distributed(C.ddp_worker, world=2, args=(str(tmp / "ddp"), NAMES, LEVELS))


@pytest.mark.parametrize("name", NAMES)
def test_trains_under_ddp(name: str, ddp: list[dict[str, C.Run]]) -> None:
    runs = [per_rank[name] for per_rank in ddp]
    bases = [per_rank[f"baseline:{name}"] for per_rank in ddp]
    assert all(r.facts["algorithms"] == [name] for r in runs)
    C.case(name).ddp_effect(runs, bases)


@pytest.mark.parametrize("level", LEVELS)
def test_a_level_composes_its_algorithms_under_ddp(level: str, ddp: list[dict[str, C.Run]]):
    runs = [per_rank[f"level:{level}"] for per_rank in ddp]
    C.ranks_agree(runs, [])
    algos = AutoBoost(level).algorithms
    assert runs[0].facts["algorithms"] == [a.name for a in algos]
    # DDP searches for unused parameters only when an algorithm needs it and none switches
    # DDP's gradient synchronisation off (AdaSum at O2)
    search = any(a.requires_find_unused_parameters for a in algos) and not any(
        a.unsyncs_ddp(2) for a in algos)
    assert all((r.facts["find_unused"] is True) == search for r in runs)
