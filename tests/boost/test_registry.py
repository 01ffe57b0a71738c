"""The boost registry is the one list of algorithms: the schema, AutoBoost, the level YAMLs and
the docs tables all agree with it."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lit_amp.amp.names import BOOST_LEVELS
from lit_amp.boost import AutoBoost
from lit_amp.boost.base import BoostAlgorithm
from lit_amp.boost.config import BOOST_FEATURES, DEFAULT_SECTIONS, LEVEL_TABLE, parse_boost_config
from lit_amp.boost.registry import (
    ALGORITHMS,
    COMMON,
    Algorithm,
    Setting,
    algorithm_table,
    get,
    level_table,
)
from lit_amp.cli import CONF_DIR

REPO = Path(__file__).resolve().parents[2]
NAMES = [a.name for a in ALGORITHMS]


@pytest.mark.parametrize("algo", ALGORITHMS, ids=NAMES)
def test_entry_names_a_callback_and_its_functional_core(algo: Algorithm):
    cls = algo.load()
    assert issubclass(cls, BoostAlgorithm)
    assert cls.name == algo.name  # AutoBoost.get_algorithm and the saved state use it
    module = importlib.import_module(algo.module)
    missing = [f for f in algo.functional if not hasattr(module, f)]
    assert not missing, f"{algo.module} has no {missing}"
    for key, setting in algo.settings.items():
        assert setting.type_ok(setting.default) and setting.value_ok(setting.default), key


def test_schema_and_level_table_come_from_the_registry():
    assert BOOST_FEATURES == tuple(NAMES)
    for level in BOOST_LEVELS:
        assert {f for f, on in LEVEL_TABLE[level].items() if on} == {
            a.name for a in ALGORITHMS if level in a.levels
        }
    expected = {"common": {k: s.default for k, s in COMMON.items()}}
    expected.update({a.name: {k: s.default for k, s in a.settings.items()}
                     for a in ALGORITHMS if a.settings})
    assert {k: dict(v) for k, v in DEFAULT_SECTIONS.items()} == expected


def test_enable_all_builds_every_algorithm_that_composes():
    """Each registered algorithm is built when its flag is on (alone), and ``composes_with``
    decides what stays on beside it."""
    for algo in ALGORITHMS:
        cfg = {"boost": {"mode": "manual", **dict.fromkeys(NAMES, False), algo.name: True}}
        if algo.name == "dim_reduce":
            cfg["dim_reduce"] = {"pca_mat_path": "pca.npy"}
        if algo.name == "grad_accumulation":
            cfg["grad_accumulation"] = {"grad_accumulation_step": 2}
        assert [a.name for a in AutoBoost("O0", cfg).algorithms] == [algo.name]
    everything = AutoBoost("O0", {"boost": {"mode": "enable_all"},
                                  "dim_reduce": {"pca_mat_path": "pca.npy"}})
    assert [a.name for a in everything.algorithms] == [
        a.name for a in ALGORITHMS if get("dim_reduce").composes(a.name)
    ]


def test_setting_and_get_errors():
    with pytest.raises(ValueError, match="'kind' must be one of"):
        Setting(1, "integer")
    with pytest.raises(ValueError, match="'name' must be one of .*'less_bn'"):
        get("less_bm")
    s = get("grad_freeze").settings["freeze_type"]
    assert s.type_name == "an int" and not s.value_ok(2)
    with pytest.raises(ValueError, match=r"freeze_type'\] must be 0 or 1, but got 2"):
        parse_boost_config("O1", {"grad_freeze": {"freeze_type": 2}})


def test_level_yamls_hold_every_section_with_the_registry_defaults():
    o1 = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "boost" / "O1.yaml"))
    sections = {k: v for k, v in o1["config"].items() if k != "boost"}
    assert sections == {k: dict(v) for k, v in DEFAULT_SECTIONS.items()}, (
        "lit_amp/cli/conf/boost/O1.yaml must hold one section per registry entry with settings, "
        "with the registry's defaults"
    )
    assert o1["level"] == "O1" and o1["config"]["boost"] == {"mode": "auto"}
    o2 = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "boost" / "O2.yaml"))
    assert o2 == {"defaults": ["O1", "_self_"], "level": "O2"}  # O1's config, O2's level
    o0 = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "boost" / "O0.yaml"))
    assert o0 == {"level": "O0", "config": None}


@pytest.mark.parametrize("table", [level_table, algorithm_table], ids=lambda f: f.__name__)
def test_docs_tables_are_the_registry(table):
    text = (REPO / "docs" / "semantics.md").read_text(encoding="utf-8")
    assert table() in text, (
        f"docs/semantics.md must hold lit_amp.boost.registry.{table.__name__}() verbatim:\n"
        f"{table()}"
    )
