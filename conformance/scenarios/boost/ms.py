"""Boost level tables and boost_config_dict handling (MindSpore side)."""

import copy
import types

from mindspore.boost import AutoBoost
from mindspore.boost import boost as _boost_mod

from conformance import _common as C
from conformance import _ms as S
from conformance.scenarios.boost.common_boost import scenario

_LEVELS = copy.deepcopy(_boost_mod._boost_config_level)


def reset():
    """AutoBoost is a process-wide singleton and mode 'manual' edits the module's level table
    in place: undo both so that each case starts fresh (the quirks have their own cases)."""
    AutoBoost._instance = None
    _boost_mod._boost_config_level.clear()
    _boost_mod._boost_config_level.update(copy.deepcopy(_LEVELS))


def make(level, cfg):
    reset()
    return AutoBoost(level, cfg)


def make_default():
    reset()
    return AutoBoost()


def manual_mutates_table():
    make("O1", {"boost": {"mode": "manual", "adasum": True}})
    AutoBoost._instance = None  # a fresh instance, but the level table is left as 'manual' made it
    return flags(AutoBoost("O1", ""))


def second_instance():
    make("O1", "")
    return flags(AutoBoost("O2", ""))


def flags(ab):
    return {k: bool(v) for k, v in ab.boost_config.items()}


def settings(ab):
    return {
        "less_bn.fn_flag": ab._fn_flag,
        "less_bn.gc_flag": ab._gc_flag,
        "grad_freeze.param_groups": ab._param_groups,
        "grad_freeze.freeze_type": ab._freeze_type,
        "grad_freeze.freeze_p": ab._freeze_p,
        "grad_freeze.total_steps": ab._total_steps,
        "common.device_number": ab.device_number,
        "grad_accumulation.grad_accumulation_step": ab.grad_accumulation_step,
        "dim_reduce.rho": ab.rho,
        "dim_reduce.n_components": ab.n_components,
    }


def run():
    K = types.SimpleNamespace(
        make=make,
        make_default=make_default,
        flags=flags,
        settings=settings,
        exc_name=C.exc_name,
        guard=C.guard,
        second_instance=second_instance,
        manual_mutates_table=manual_mutates_table,
    )
    return {"mindspore": S.VERSION, **scenario(K)}


if __name__ == "__main__":
    C.main(run)
