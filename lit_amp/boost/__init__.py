"""MindSpore's boost mode on Lightning: ``AutoBoost`` and one module per algorithm.

Each algorithm has a pure-PyTorch functional core and a Lightning callback
(:class:`~lit_amp.boost.base.BoostAlgorithm`); :mod:`lit_amp.boost.registry` lists them, one
entry each (module, callback, functional core, config section and defaults, levels, what it
composes with): ``less_bn`` (:class:`LessBN`), ``grad_freeze`` (:class:`GradientFreeze`),
``adasum`` (:class:`AdaSum`, the subpackage :mod:`lit_amp.boost.adasum`),
``grad_accumulation`` (:class:`GradientAccumulation`), ``dim_reduce`` (:class:`DimReduce`),
``loss_scale_group`` (:class:`LossScaleGroup` + :class:`GroupLossScaleManager`).

``AutoBoost(level, boost_config_dict)`` picks them from MindSpore's level table and config
schema (:mod:`lit_amp.boost.config`, derived from the registry). Names are imported lazily
(PEP 562).

Example:
    >>> from lit_amp.boost import AutoBoost
    >>> AutoBoost("O2").enabled
    ('less_bn', 'grad_freeze', 'adasum')
"""

from __future__ import annotations

from lit_amp._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "AutoBoost": "lit_amp.boost.auto_boost",
    "BoostAlgorithm": "lit_amp.boost.base",
    "BoostConfig": "lit_amp.boost.config",
    "parse_boost_config": "lit_amp.boost.config",
    "load_boost_config": "lit_amp.boost.config",
    "LessBN": "lit_amp.boost.less_bn",
    "CommonHeadLastFN": "lit_amp.boost.less_bn",
    "GradientFreeze": "lit_amp.boost.grad_freeze",
    "GradientAccumulation": "lit_amp.boost.grad_accumulation",
    "AdaSum": "lit_amp.boost.adasum.callback",
    "DimReduce": "lit_amp.boost.dim_reduce",
    "DimReduceOptimizer": "lit_amp.boost.dim_reduce",
    "GroupLossScaleManager": "lit_amp.boost.group_loss_scale",
    "LossScaleGroup": "lit_amp.boost.group_loss_scale",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
