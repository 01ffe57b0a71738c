"""boost_config_dict schema: level table, modes, defaults, validation errors, JSON files."""

from __future__ import annotations

import json
import pickle

import pytest

from lit_amp.boost import AutoBoost
from lit_amp.boost.config import BOOST_FEATURES, LEVEL_TABLE, parse_boost_config


@pytest.mark.parametrize(
    ("level", "expected"),
    [("O0", ()), ("O1", ("less_bn", "grad_freeze")), ("O2", ("less_bn", "grad_freeze", "adasum"))],
)
def test_level_table(level, expected):
    assert parse_boost_config(level).enabled == expected
    assert AutoBoost(level).enabled == expected


def test_modes():
    manual = parse_boost_config(
        "O1", {"boost": {"mode": "manual", "grad_freeze": False, "grad_accumulation": True}}
    )
    assert manual.enabled == ("less_bn", "grad_accumulation")
    # keys of "boost" are ignored outside manual mode (MindSpore)
    assert parse_boost_config("O1", {"boost": {"grad_freeze": False}}).enabled == (
        "less_bn",
        "grad_freeze",
    )
    assert parse_boost_config("O0", {"boost": {"mode": "enable_all"}}).enabled == BOOST_FEATURES
    assert parse_boost_config("O2", {"boost": {"mode": "disable_all"}}).enabled == ()
    assert parse_boost_config("O1", "").enabled == parse_boost_config("O1", {}).enabled


def test_defaults_filled_and_overrides():
    cfg = parse_boost_config(
        "O1", {"grad_freeze": {"freeze_p": 0.5}, "less_bn": {"fn_flag": False}}
    )
    gf = cfg.section("grad_freeze")
    assert gf == {
        "param_groups": 10,
        "freeze_type": 1,
        "freeze_p": 0.5,
        "total_steps": 65536,
        "seed": 0,
    }
    assert cfg.section("less_bn") == {"fn_flag": False, "gc_flag": True}
    assert cfg.section("common") == {"gradient_split_groups": [50, 100], "device_number": 8}
    assert cfg.section("dim_reduce")["n_components"] == 32
    gf["freeze_p"] = 0.1  # a copy
    assert cfg.section("grad_freeze")["freeze_p"] == 0.5


@pytest.mark.parametrize(
    ("cfg", "exc", "words"),
    [
        ({"boots": {}}, ValueError, ["boots", "allowed keys", "grad_freeze"]),
        ({"boost": {"mode": "fast"}}, ValueError, ["mode", "'fast'", "manual"]),
        ({"boost": {"lessbn": True}}, ValueError, ["lessbn", "less_bn"]),
        ({"boost": {"less_bn": 1}}, TypeError, ["less_bn", "bool"]),
        ({"grad_freeze": {"freeze_q": 1}}, ValueError, ["freeze_q", "freeze_p"]),
        ({"grad_freeze": {"freeze_type": 2}}, ValueError, ["freeze_type", "0 or 1", "2"]),
        ({"grad_freeze": {"freeze_p": 1.5}}, ValueError, ["freeze_p", "[0, 1]"]),
        ({"grad_freeze": {"param_groups": "10"}}, TypeError, ["param_groups", "int"]),
        ({"less_bn": []}, TypeError, ["less_bn", "dict"]),
        ({"grad_accumulation": {"grad_accumulation_step": 0}}, ValueError, [">= 1"]),
    ],
)
def test_validation_errors(cfg, exc, words):
    with pytest.raises(exc) as info:
        parse_boost_config("O1", cfg)
    for w in words:
        assert w in str(info.value)


def test_bad_level_and_type():
    with pytest.raises(ValueError, match=r"'level' must be one of \['O0', 'O1', 'O2'\]"):
        AutoBoost("O3")
    with pytest.raises(TypeError, match="'level' must be a str"):
        AutoBoost(1)
    with pytest.raises(TypeError, match="boost_config_dict"):
        AutoBoost("O1", 3)
    with pytest.raises(ValueError, match="is not a file"):
        AutoBoost("O1", "/nonexistent/boost.json")


def test_json_file(tmp_path):
    path = tmp_path / "boost.json"
    path.write_text(json.dumps({"boost": {"mode": "manual", "adasum": True}}))
    assert AutoBoost("O1", str(path)).enabled == ("less_bn", "grad_freeze", "adasum")
    assert AutoBoost("O1", path).enabled == ("less_bn", "grad_freeze", "adasum")
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        AutoBoost("O1", str(bad))


def test_no_singleton_no_global_mutation():
    a = AutoBoost("O1", {"boost": {"mode": "manual", "grad_freeze": False}})
    b = AutoBoost("O2")
    assert a is not b
    assert a.enabled == ("less_bn",)
    assert b.enabled == ("less_bn", "grad_freeze", "adasum")
    assert dict(LEVEL_TABLE["O1"])["grad_freeze"] is True  # manual mode did not edit the table
    with pytest.raises(TypeError):
        LEVEL_TABLE["O1"]["adasum"] = True
    with pytest.raises(TypeError, match="read-only"):
        a.config.flags["adasum"] = True


def test_algorithms_and_order():
    ab = AutoBoost(
        "O2",
        {
            "boost": {"mode": "manual", "grad_accumulation": True},
            "grad_accumulation": {"grad_accumulation_step": 4},
        },
    )
    assert [a.name for a in ab.algorithms] == [
        "less_bn",
        "grad_freeze",
        "adasum",
        "grad_accumulation",
    ]
    assert ab.requires_find_unused_parameters
    # grad_accumulation_step 1 (default): not applied (MindSpore needs step > 1)
    ab = AutoBoost("O0", {"boost": {"mode": "manual", "grad_accumulation": True}})
    assert ab.algorithms == []
    # dim_reduce switches everything else off but the group loss-scale check (MindSpore
    # returns before applying the others; its loss-scale cell still scales per group)
    ab = AutoBoost("O0", {"boost": {"mode": "enable_all"}, "dim_reduce": {"pca_mat_path": "p.npy"}})
    assert [a.name for a in ab.algorithms] == ["dim_reduce", "loss_scale_group"]
    # MindSpore 2.10 accepts this at AutoBoost() and fails later (ValueError, weight_load_dir
    # None) at the network build; lit_amp fails at once and names the mode and the fix
    with pytest.raises(ValueError, match="'enable_all'.*pca_mat_path.*'manual'"):
        AutoBoost("O0", {"boost": {"mode": "enable_all"}})


def test_picklable_for_ddp_spawn():
    ab = pickle.loads(pickle.dumps(AutoBoost("O2", {"grad_freeze": {"seed": 3}})))
    assert ab.enabled == ("less_bn", "grad_freeze", "adasum")
    assert ab.get_algorithm("grad_freeze").seed == 3
