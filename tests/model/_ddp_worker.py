"""Worker script for tests/model/test_ddp_*.py: ``Model`` under Lightning's DDP on 2 CPU processes.

A script, because Lightning's launcher re-runs it (same argv) for rank 1. Each rank writes
``OUT/<mode><rank>.json``.

Modes:
    train OUT   - sink mode over a list and over a DataLoader (which samples each rank
                  trains on), cb_params step counts and checkpoint names (non-sink), BatchNorm
                  buffers after training, eval on 7 samples (every sample counted once).
    layout OUT  - infer_train_layout with a Strategy object, then the Model is used again.
    accum OUT   - Trainer(accumulate_grad_batches=4): DDP all-reduces (counted by a comm hook)
                  and the weights under 'ddp' and 'fsdp2'.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch import nn

from tests.helpers.dist import write_rank_result  # noqa: E402

TRAINER = {"accelerator": "cpu", "devices": 2, "strategy": "ddp"}


class Recorder(nn.Module):
    """A small BN net whose forward records the sample ids (``x[:, 0]``) it trained on."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
        self.seen: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.seen.extend(int(v) for v in x[:, 0].tolist())
        return self.body(x)


def _samples(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` samples whose first feature is the sample id (0..n-1)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    x[:, 0] = torch.arange(n, dtype=torch.float32)
    return x, (x[:, 1] > 0).long()


def _model(net: nn.Module, **kw):
    from lit_amp import Model

    return Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.05),
                 trainer=dict(TRAINER), **kw)


def _gather(obj):
    objs = [None] * dist.get_world_size()
    dist.all_gather_object(objs, obj)
    return objs


def _sink_ids(out: str, res: dict) -> None:
    """Item 1: which samples each rank trains on in sink mode (list; DataLoader)."""
    from torch.utils.data import DataLoader, TensorDataset

    x, y = _samples(20)
    batches = [(x[i:i + 2], y[i:i + 2]) for i in range(0, 20, 2)]  # 10 batches
    net = Recorder()
    # 2 epochs of 3 steps per rank: 12 batches of the stream in all (it wraps after 10)
    _model(net).train(2, batches, dataset_sink_mode=True, sink_size=3)
    res["sink_list"] = net.seen
    net = Recorder()
    dl = DataLoader(TensorDataset(x[:16], y[:16]), batch_size=2)  # 8 batches; 4 per rank
    _model(net).train(1, dl, dataset_sink_mode=True, sink_size=4)
    res["sink_loader"] = net.seen
    net = Recorder()
    _model(net).train(1, batches[:5])  # non-sink, a plain list of 5 batches: 3 steps per rank
    res["plain_list"] = net.seen


def _steps_and_bn(out: str, res: dict) -> None:
    """Items 3 and 5: per-rank step counts in cb_params / checkpoint names; BN buffers."""
    from torch.utils.data import DataLoader, TensorDataset

    from lit_amp.callbacks import Callback, CheckpointConfig, ModelCheckpoint

    class Steps(Callback):
        def __init__(self) -> None:
            self.batch_num, self.steps = [], []

        def on_train_step_end(self, run_context):
            p = run_context.original_args()
            self.batch_num.append(p.batch_num)
            self.steps.append(p.cur_step_num)

    x, y = _samples(32, seed=1)
    x[:, 1:] += 3.0  # BN statistics far from (0, 1): drift shows
    dl = DataLoader(TensorDataset(x, y), batch_size=2)  # 16 batches; 8 per rank
    net = Recorder()
    steps = Steps()
    ckdir = os.path.join(out, f"ck{int(os.environ.get('LOCAL_RANK', 0))}")
    ck = ModelCheckpoint("net", ckdir, CheckpointConfig(save_checkpoint_steps=4))
    _model(net).train(1, dl, callbacks=[steps, ck])
    res["batch_num"], res["cur_steps"] = steps.batch_num, steps.steps
    res["ckpts"] = sorted(f for f in os.listdir(ckdir) if f.endswith(".ckpt"))
    bn = net.body[1]
    res["bn"] = _gather([bn.running_mean.tolist(), bn.running_var.tolist()])
    res["weights"] = _gather([p.detach().flatten().tolist()[:8] for p in net.parameters()])


def _eval(out: str, res: dict) -> None:
    """Item 2: 7 samples on 2 ranks: every sample counted once (metrics and eval_loss)."""
    from torch.utils.data import DataLoader, TensorDataset

    from lit_amp.callbacks import Callback
    from lit_amp.metrics import get_metrics

    x, y = _samples(7, seed=2)
    y = torch.tensor([0, 1, 1, 0, 1, 0, 0])
    net = Recorder()
    net.eval()
    with torch.no_grad():
        logits = net(x)
    # the single-process answer, computed by hand
    ce = nn.CrossEntropyLoss()
    ref = {"acc": float((logits.argmax(1) == y).float().mean()),
           "loss": float(ce(logits, y)),  # batch_size 1: the mean over samples
           # batch_size 2: the mean of the 4 batch means, as one process computes it
           "loss_bs2": sum(float(ce(logits[i:i + 2], y[i:i + 2])) for i in (0, 2, 4, 6)) / 4}
    names = {"acc", "loss", "precision", "recall"}
    single = {}
    for name, m in get_metrics(names).items():
        from lit_amp.metrics import metric_value_to_python, update_metrics

        update_metrics({name: m}, (torch.tensor(0.0), logits, y), [0, 1, 2])
        single[name] = metric_value_to_python(m.compute())
    model = _model(net, metrics=names)
    for bs in (1, 2):
        dl = DataLoader(TensorDataset(x, y), batch_size=bs)
        got = model.eval(dl)
        res[f"eval_bs{bs}"] = {k: (v.tolist() if hasattr(v, "tolist") else v)
                               for k, v in got.items()}
        res[f"eval_loss_bs{bs}"] = model.lit_model.last_eval_results.get("eval_loss")
    # fit's validation under DDP: uneven batches per rank (4 and 3), exact results, no hang
    seen = []

    class Keep(Callback):
        def on_train_epoch_end(self, run_context):
            seen.append(dict(run_context.original_args().eval_results))

    net2 = Recorder()
    fit_model = _model(net2, metrics={"acc", "loss"})
    xt, yt = _samples(8, seed=3)
    fit_model.fit(1, DataLoader(TensorDataset(xt, yt), batch_size=2),
                  DataLoader(TensorDataset(x, y), batch_size=1), callbacks=[Keep()])
    net2.eval()
    with torch.no_grad():
        logits2 = net2(x)
    res["fit_eval"] = seen[0]
    res["fit_ref"] = {"acc": float((logits2.argmax(1) == y).float().mean()),
                      "loss": float(nn.CrossEntropyLoss()(logits2, y))}
    res["ref"] = ref
    res["single"] = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in single.items()}


def _train(out: str) -> None:
    res: dict = {}
    _sink_ids(out, res)
    _steps_and_bn(out, res)
    _eval(out, res)
    write_rank_result(out, "train", res)


def _layout(out: str) -> None:
    """Item 7: infer_*_layout with a Strategy object leaves the Model usable."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    from lit_amp import Model

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
    model = Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.1),
                  metrics={"acc"},
                  trainer={"accelerator": "cpu", "devices": 2, "strategy": strategy})
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g))]
    res: dict = {"errors": []}
    calls = [("train_layout", lambda: model.infer_train_layout(data)),
             ("predict_layout", lambda: model.infer_predict_layout(data[0][0])),
             ("train_layout_again", lambda: model.infer_train_layout(data)),
             ("eval", lambda: model.eval(data))]
    for name, fn in calls:
        try:
            value = fn()
            res[name] = sorted(value) if isinstance(value, dict) else value
        except Exception as err:  # noqa: BLE001 - reported to the test
            res["errors"].append(f"{name}: {type(err).__name__}: {err}"[:300])
    write_rank_result(out, "layout", res)


def _accum(out: str) -> None:
    """Item 9: accumulation reduces once per optimizer step (not per micro-step)."""
    import lightning as L
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from lit_amp import Model

    calls = []

    class Count(L.Callback):
        def on_train_start(self, trainer, pl_module):
            def hook(state, bucket):
                calls.append(1)
                return allreduce_hook(state, bucket)

            trainer.strategy.model.register_comm_hook(None, hook)

    g = torch.Generator().manual_seed(5)
    batches = [(torch.randn(4, 4, generator=g), torch.randint(0, 2, (4,), generator=g))
               for _ in range(16)]
    res: dict = {}
    for strategy in ("ddp", "fsdp2"):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        model = Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.1),
                      trainer={"accelerator": "cpu", "devices": 2, "strategy": strategy,
                               "accumulate_grad_batches": 4})
        model.train(1, batches, callbacks=[Count()] if strategy == "ddp" else None)
        res[strategy] = [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach()
                         .flatten().tolist() for p in net.parameters()]
    res["allreduce_calls"] = len(calls)
    write_rank_result(out, "accum", res)


if __name__ == "__main__":
    mode, out_dir = sys.argv[1], sys.argv[2]
    {"train": _train, "layout": _layout, "accum": _accum}[mode](out_dir)
