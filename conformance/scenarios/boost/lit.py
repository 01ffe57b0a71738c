"""Boost level tables and boost_config_dict handling (lit_amp port)."""

import types

from conformance import _common as C
from conformance.scenarios.boost.common_boost import scenario
from lit_amp import AutoBoost


def make(level, cfg):
    return AutoBoost(level, cfg)


def second_instance():
    make("O1", "")
    return flags(AutoBoost("O2", ""))


def manual_mutates_table():
    make("O1", {"boost": {"mode": "manual", "adasum": True}})
    return flags(AutoBoost("O1", ""))


def flags(ab):
    return {k: bool(v) for k, v in ab.config.flags.items()}


def settings(ab):
    s = ab.config.sections
    names = [
        "less_bn.fn_flag",
        "less_bn.gc_flag",
        "grad_freeze.param_groups",
        "grad_freeze.freeze_type",
        "grad_freeze.freeze_p",
        "grad_freeze.total_steps",
        "common.device_number",
        "grad_accumulation.grad_accumulation_step",
        "dim_reduce.rho",
        "dim_reduce.n_components",
    ]
    out = {}
    for n in names:
        sec, key = n.split(".")
        out[n] = s.get(sec, {}).get(key)
    return out


def run():
    K = types.SimpleNamespace(
        make=make,
        make_default=AutoBoost,
        flags=flags,
        settings=settings,
        exc_name=C.exc_name,
        guard=C.guard,
        second_instance=second_instance,
        manual_mutates_table=manual_mutates_table,
    )
    return scenario(K)


if __name__ == "__main__":
    C.main(run)
