"""MindSpore's built-in lists (``lit_amp.amp.lists``, docs/semantics.md §2.1): entries, copies."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lit_amp.amp.lists import get_black_list, get_white_list


def test_lists_are_copies_with_the_mindspore_entries():
    wl, bl = get_white_list(), get_black_list()
    for cls in (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
                nn.ConvTranspose3d, nn.Linear, nn.LSTMCell, nn.RNNCell, nn.GRUCell, nn.PReLU,
                nn.ReLU):
        assert cls in wl
    for fn in (torch.matmul, torch.bmm, torch.conv2d, F.conv1d, F.prelu, F.relu, torch.outer,
               torch.Tensor.__matmul__, F.linear):
        assert fn in wl
    assert bl[:4] == [nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm]
    assert nn.SyncBatchNorm in bl and nn.GroupNorm in bl
    wl.clear()
    bl.append(nn.Dropout)
    assert nn.Linear in get_white_list() and nn.Dropout not in get_black_list()
