"""MindSpore's built-in mixed-precision lists as torch modules/functions (docs/semantics.md §2.1).

The **white list** names what computes in the low dtype at level ``O1``: module classes
(MindSpore's Cells) and torch functions (MindSpore's Primitives). The **black list** names the
module classes that stay in float32 at level ``O2``; matching is by ``isinstance``, so
subclasses are covered. Both getters return new lists, so editing one leaves the defaults
alone. The MindSpore -> PyTorch mapping is in docs/migration.md, "Mixed precision and loss
scaling"; the black list's two additions in docs/differences.md, "Mixed precision".

Example:
    >>> import torch
    >>> from torch import nn
    >>> nn.Linear in get_white_list() and torch.matmul in get_white_list()
    True
    >>> wl = get_white_list(); wl.clear(); nn.Linear in get_white_list()
    True
    >>> nn.LayerNorm in get_black_list()
    True
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "get_white_list",
    "get_black_list",
    "WHITE_LIST_MODULES",
    "WHITE_LIST_FUNCTIONS",
    "BLACK_LIST_MODULES",
    "MINDSPORE_BLACK_LIST_MODULES",
    "FP32_MODULES",
    "AUTOCAST_WHITE_GAPS",
]

#: Module classes computed in the low dtype at ``O1`` (MindSpore's white-listed Cells).
WHITE_LIST_MODULES: tuple[type[nn.Module], ...] = (
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
    nn.Linear,
    nn.LSTMCell,
    nn.RNNCell,
    nn.GRUCell,
    nn.PReLU,
    nn.ReLU,
)

#: Torch functions computed in the low dtype at ``O1`` (MindSpore's white-listed Primitives
#: MatMul, BatchMatMul, Ger, Conv*, PReLU, ReLU, written the ways a PyTorch user writes them).
WHITE_LIST_FUNCTIONS: tuple[Callable, ...] = (
    # MatMul (and Dense's MatMul + BiasAdd)
    torch.matmul,
    torch.mm,
    torch.Tensor.matmul,
    torch.Tensor.mm,
    torch.Tensor.__matmul__,
    torch.Tensor.__rmatmul__,
    F.linear,
    # BatchMatMul
    torch.bmm,
    torch.Tensor.bmm,
    # Ger
    torch.outer,
    torch.ger,
    torch.Tensor.outer,
    torch.Tensor.ger,
    # Conv2D / Conv3D / Conv2DTranspose / Conv3DTranspose / Conv2DBackpropInput (+ 1-D)
    torch.conv1d,
    torch.conv2d,
    torch.conv3d,
    torch.conv_transpose1d,
    torch.conv_transpose2d,
    torch.conv_transpose3d,
    # PReLU, ReLU
    F.prelu,
    torch.prelu,
    F.relu,
    torch.relu,
    torch.Tensor.relu,
)

#: The white-listed module classes that ``torch.autocast`` does not compute in the low dtype on
#: every device (the CPU's autocast runs ``lstm_cell``/``gru_cell``/``rnn_*_cell`` in float32):
#: level O1, which runs on autocast, keeps MindSpore's treatment for these alone (low-precision
#: compute, output cast back to float32; docs/differences.md, Mixed precision).
AUTOCAST_WHITE_GAPS: tuple[type[nn.Module], ...] = (nn.LSTMCell, nn.RNNCell, nn.GRUCell)

#: Module classes kept in float32 at ``O2`` (MindSpore's black list + SyncBatchNorm, GroupNorm).
BLACK_LIST_MODULES: tuple[type[nn.Module], ...] = (
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.LayerNorm,
    nn.SyncBatchNorm,
    nn.GroupNorm,
)

#: MindSpore's own black list, the first four entries of :data:`BLACK_LIST_MODULES`
#: (``custom_mixed_precision`` warns for every entry of the full list left out of a black list).
MINDSPORE_BLACK_LIST_MODULES: tuple[type[nn.Module], ...] = BLACK_LIST_MODULES[:4]

#: Modules that always compute in float32 inside a converted network, at every level: loss
#: modules (the loss is computed in float32, docs/semantics.md §2.4) and torchmetrics metrics.
FP32_MODULES: tuple[type[nn.Module], ...] = (nn.modules.loss._Loss,)


def get_white_list() -> list:
    """The built-in white list: module classes, then torch functions (a new list each call).

    Returns:
        A list of ``nn.Module`` subclasses and torch functions computed in the low dtype at
        level ``O1``.

    Example:
        >>> from torch import nn
        >>> nn.Conv2d in get_white_list()
        True
    """
    return [*WHITE_LIST_MODULES, *WHITE_LIST_FUNCTIONS]


def get_black_list() -> list:
    """The built-in black list of module classes kept in float32 at ``O2`` (a new list each call).

    Returns:
        A list of ``nn.Module`` subclasses: BatchNorm1d/2d/3d, LayerNorm, SyncBatchNorm, GroupNorm.

    Example:
        >>> from torch import nn
        >>> nn.BatchNorm2d in get_black_list()
        True
    """
    return list(BLACK_LIST_MODULES)
