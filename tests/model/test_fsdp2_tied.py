"""FSDP2 and tied weights (issue #28, item 18): a language-model head that shares the
embedding's weight (``head.weight = emb.weight``) trains under ``strategy="fsdp2"`` with the tie
kept, exactly like one process; an optimizer that misses a trainable parameter is refused.

Two gloo processes (``tests.helpers.dist.run_distributed``); Lightning joins their group.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers.dist import run_distributed

VOCAB, DIM, N, STEPS, LR = 12, 6, 16, 3, 0.5


class TiedLM(nn.Module):
    """Embedding -> Linear -> head, the head's weight tied to the embedding's."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(VOCAB, DIM)
        self.body = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(self.emb(x))))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, VOCAB, (N,), generator=g)
    return x, (x * 5 + 3) % VOCAB  # a "next token" to learn


def _model(net: nn.Module, params, **trainer):
    from lit_amp import Model

    return Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(params, LR),
                 trainer={"accelerator": "cpu", "devices": 2, "strategy": "fsdp2", **trainer})


def _worker(rank: int, world: int) -> dict:
    x, y = _data()
    # each rank gets half of one full batch per step: the mean gradient over the ranks is
    # the one-process gradient of the whole batch
    net = TiedLM()
    _model(net, net.parameters()).train(STEPS, DataLoader(TensorDataset(x, y), batch_size=N))
    full = {k: v.full_tensor() if hasattr(v, "full_tensor") else v
            for k, v in net.state_dict().items()}
    out = {"tied": net.head.weight is net.emb.weight, "weights": full}
    partial = TiedLM()  # the optimizer leaves out the tied embedding/head weight
    try:
        _model(partial, partial.body.parameters()).train(1, DataLoader(TensorDataset(x, y),
                                                                       batch_size=N))
        out["partial"] = None
    except ValueError as err:
        out["partial"] = str(err)
    return out


def _one_process() -> dict:
    x, y = _data()
    net = TiedLM()
    opt = torch.optim.SGD(net.parameters(), LR)
    for _ in range(STEPS):
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return net.state_dict()


def test_tied_weights_stay_tied_and_train_like_one_process_under_fsdp2():
    ref = _one_process()
    start = TiedLM().state_dict()
    for res in run_distributed(_worker, world=2, init_group=False):
        w = res["weights"]
        assert res["tied"], "head.weight is no longer emb.weight after sharding"
        torch.testing.assert_close(w["head.weight"], w["emb.weight"])  # still one tensor
        assert not torch.allclose(w["head.weight"], start["head.weight"])  # it trained
        for name, want in ref.items():  # the tie's two gradients summed, as in one process
            torch.testing.assert_close(w[name], want, rtol=1e-4, atol=1e-5, msg=name)
        # the other direction of ownership: every trainable parameter must be the optimizer's
        err = res["partial"]
        assert err is not None, "an optimizer without emb.weight/head.weight trained silently"
        assert "'optimizer'" in err and "emb.weight" in err and "not in the optimizer" in err
