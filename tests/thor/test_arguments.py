"""THOR's argument checks (``lit_amp.thor._arguments``): every bad argument of ``thor(...)`` is
refused with MindSpore's exception type, naming the argument."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_amp.thor.optimizer import thor


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"net": "net"}, TypeError, "'net'"),
        ({"learning_rate": "0.1"}, TypeError, "'learning_rate'"),
        ({"learning_rate": True}, TypeError, "'learning_rate'"),
        ({"learning_rate": torch.zeros(2, 2)}, ValueError, "'learning_rate'"),
        ({"learning_rate": torch.zeros(0)}, ValueError, "'learning_rate'"),
        ({"learning_rate": -0.1}, ValueError, "'learning_rate'"),
        ({"damping": None}, TypeError, "'damping'"),
        ({"momentum": "0.9"}, TypeError, "'momentum'"),
        ({"momentum": -0.1}, ValueError, "'momentum'"),
        ({"weight_decay": -1.0}, ValueError, "'weight_decay'"),
        ({"loss_scale": 0.0}, ValueError, "'loss_scale'"),
        ({"loss_scale": "1"}, TypeError, "'loss_scale'"),
        ({"batch_size": 0}, ValueError, "'batch_size'"),
        ({"use_nesterov": 1}, TypeError, "'use_nesterov'"),
        ({"enable_clip_grad": None}, TypeError, "'enable_clip_grad'"),
        ({"frequency": 1}, ValueError, "'frequency' must be an int >= 2, but got 1"),
        ({"frequency": 2.0}, TypeError, "'frequency'"),
        ({"decay_filter": 3}, TypeError, "'decay_filter'"),
        ({"split_indices": [3, 1]}, ValueError, "'split_indices'"),
        ({"split_indices": "0"}, TypeError, "'split_indices'"),
        ({"split_dim": 0}, ValueError, "'split_dim'"),
        ({"factor_decay": 1.0}, ValueError, "'factor_decay'"),
        ({"trace_thresholds": (0.0, 0.1)}, ValueError, "'trace_thresholds'"),
        ({"trace_thresholds": 0.1}, TypeError, "'trace_thresholds'"),
        ({"pi_damping": 1}, TypeError, "'pi_damping'"),
        ({"bias_in_a": "yes"}, TypeError, "'bias_in_a'"),
    ],
)
def test_bad_arguments(kwargs, exc, match):
    net = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))
    args = {"net": net, "learning_rate": 0.1, "damping": 0.03, "momentum": 0.9, **kwargs}
    with pytest.raises(exc, match=match):
        thor(**args)


def test_sparse_embedding_is_refused():
    with pytest.raises(ValueError, match="sparse"):
        thor(nn.Embedding(5, 3, sparse=True), 0.1, 0.03, 0.9)
