"""MindSpore's boost mode on Lightning: ``AutoBoost`` and one module per algorithm.

Each algorithm has a pure-PyTorch functional core and a Lightning callback:

=====================  =====================================  ==================================
module                 callback                               functional core
=====================  =====================================  ==================================
``less_bn``            :class:`LessBN`                        ``remove_residual_bn``,
                                                              ``replace_head_with_fn``,
                                                              ``centralize_gradients_``
``grad_freeze``        :class:`GradientFreeze`                ``split_parameter_groups``,
                                                              ``freeze_schedule``
``grad_accumulation``  :class:`GradientAccumulation`          ``accumulation_boundary``
``adasum``             :class:`AdaSum`                        ``adasum_combine``,
                                                              ``adasum_allreduce_``
``dim_reduce``         :class:`DimReduce`                     ``DimReduceOptimizer``,
                                                              ``compute_pca_matrix``
``group_loss_scale``   (a loss-scale manager)                 :class:`GroupLossScaleManager`
=====================  =====================================  ==================================

``AutoBoost(level, boost_config_dict)`` picks them from MindSpore's level table and config
schema (:mod:`lit_amp.boost.config`). Names are imported lazily (PEP 562).

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
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
