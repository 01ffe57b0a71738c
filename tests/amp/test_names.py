"""The level names have one home (``lit_amp.amp.names``): the CLI's enums, the argument checks
and the level tables are built from it, and the CLI reads it without importing torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lit_amp.amp.levels import LEVEL_TABLE
from lit_amp.amp.names import AMP_LEVELS, BOOST_LEVELS
from lit_amp.boost.config import LEVEL_TABLE as BOOST_TABLE
from lit_amp.cli.schema import AmpLevel, BoostLevel


def test_the_cli_enums_are_the_level_names():
    assert [m.value for m in AmpLevel] == list(AMP_LEVELS)
    assert [m.value for m in BoostLevel] == list(BOOST_LEVELS)


def test_the_level_tables_cover_exactly_the_names():
    assert set(LEVEL_TABLE) | {"auto"} == set(AMP_LEVELS)
    assert set(BOOST_TABLE) == set(BOOST_LEVELS)


@pytest.mark.parametrize("level", [*AMP_LEVELS, "O4"])
def test_model_accepts_exactly_the_amp_level_names(level):
    import torch

    from lit_amp import Model

    net = torch.nn.Linear(2, 2)
    make = lambda: Model(net, torch.nn.MSELoss(), torch.optim.SGD(net.parameters(), 0.1),  # noqa: E731
                         amp_level=level)
    if level in AMP_LEVELS:
        make()
    else:
        with pytest.raises(ValueError, match="amp_level"):
            make()


def test_the_names_import_no_torch():
    code = ("import sys, lit_amp.amp.names, lit_amp.cli.schema; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
