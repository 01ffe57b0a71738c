"""Small simulated runs for the built-in callback tests (docs/semantics.md §1.4-1.7).

Each run follows MindSpore's ``_train_process`` / ``_eval_process`` hook order with a real
``nn.Linear``, a real SGD optimizer and real losses.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from lit_amp.callbacks.base import CallbackList, InternalCallbackParam, RunContext


class TrainNet:
    """A minimal train network: one SGD step per call, checkpointable with its optimizer."""

    def __init__(self, net: nn.Module, opt: torch.optim.Optimizer) -> None:
        self.net = net
        self.opt = opt

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.opt.zero_grad()
        loss = nn.functional.mse_loss(self.net(x), y)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def checkpoint_state(self) -> dict:
        return {"state_dict": self.net.state_dict(), "lit_amp_network_prefix": "",
                "optimizer_states": [self.opt.state_dict()]}

    def load_checkpoint_state(self, state: dict) -> None:  # load_checkpoint's views
        self.net.load_state_dict(state["network"])
        if state.get("optimizer") is not None:
            self.opt.load_state_dict(state["optimizer"])


def make_net(seed: int = 0, lr: float = 0.1) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    net = nn.Linear(3, 1)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    return net, opt


def data(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(123)
    return [(torch.randn(4, 3, generator=g), torch.randn(4, 1, generator=g)) for _ in range(n)]


def weights(net: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class Run:
    """What a simulated run left behind."""

    def __init__(self) -> None:
        self.losses: list[float] = []  # every step's loss
        self.step_end_losses: list[tuple[int, int, float]] = []  # (epoch, step_in_epoch, loss)
        self.epoch_weights: dict[int, dict[str, torch.Tensor]] = {}
        self.epochs_run: list[int] = []
        self.cb: InternalCallbackParam | None = None
        self.rc: RunContext | None = None


def simulate_train(
    callbacks: Any,
    *,
    epochs: int = 2,
    batches: int = 3,
    net: nn.Module | None = None,
    opt: torch.optim.Optimizer | None = None,
    sink_size: int = 0,
    initial_epoch: int = 0,
    eval_results: Callable[[int], dict] | None = None,
    outputs: Callable[[int, int, torch.Tensor], Any] | None = None,
    rank: int = 0,
    fit_eval_batches: int = 0,
) -> Run:
    """MindSpore's ``_train_process`` / ``_train_dataset_sink_process`` hook order (semantics §1.4).

    ``eval_results(epoch)`` gives fit's metrics + eval_loss; ``outputs(epoch, step, loss)``
    replaces ``net_outputs``; ``fit_eval_batches`` runs fit's evaluation (custom callbacks and
    TimeMonitor only) before each train epoch end.
    """
    if net is None:
        net, opt = make_net()
    assert opt is not None
    tn = TrainNet(net, opt)
    cbl = CallbackList(callbacks)
    sink = sink_size > 0
    batch_num = sink_size if sink else batches
    cb = InternalCallbackParam(
        train_network=tn,
        epoch_num=epochs - initial_epoch,
        batch_num=batch_num,
        mode="train",
        loss_fn=nn.MSELoss(),
        optimizer=opt,
        device_number=1,
        rank=rank,
        network=net,
        list_callback=cbl.callbacks,
        train_dataset_element=None,
        last_save_ckpt_step=None,
        latest_ckpt_file=None,
        dataset_sink_mode=sink,
        cur_step_num=0,
    )
    rc = RunContext(cb)
    run = Run()
    run.cb, run.rc = cb, rc
    stream = iter(data(10_000))
    cbl.enter()
    try:
        cbl.call("on_train_begin", rc)
        for i in range(initial_epoch, epochs):
            cb.cur_epoch_num = i + 1
            run.epochs_run.append(i + 1)
            cbl.call("on_train_epoch_begin", rc)
            for s in range(1 if sink else batches):
                batch = next(stream)
                cb.cur_step_num += sink_size if sink else 1
                cb.train_dataset_element = batch
                cbl.call("on_train_step_begin", rc)
                for _ in range(sink_size if sink else 1):
                    loss = tn(*batch)
                    run.losses.append(float(loss))
                out = outputs(i + 1, s + 1, loss) if outputs else loss
                cb.net_outputs = out
                step_in_epoch = (cb.cur_step_num - 1) % batch_num + 1
                run.step_end_losses.append((i + 1, step_in_epoch, float(loss)))
                cbl.call("on_train_step_end", rc)
                if rc.get_stop_requested():
                    break
            if fit_eval_batches:
                _fit_eval(cbl, cb, fit_eval_batches)
            if eval_results is not None:
                res = eval_results(i + 1)
                cb.metrics = {k: v for k, v in res.items() if k != "eval_loss"}
                cb.eval_results = dict(res)
            cbl.call("on_train_epoch_end", rc)
            run.epoch_weights[i + 1] = weights(net)
            cb.pop("metrics", None)
            cb.pop("eval_results", None)
            if rc.get_stop_requested():
                break
        cbl.call("on_train_end", rc)
    finally:
        cbl.exit()
    return run


def _fit_eval(cbl: CallbackList, cb: InternalCallbackParam, batches: int) -> None:
    saved = {k: cb.get(k) for k in ("mode", "cur_step_num", "batch_num", "net_outputs")}
    sub = cbl.subset_for_eval_during_fit()
    cb.mode, cb.batch_num, cb.cur_step_num = "eval", batches, 0
    rc = RunContext(cb)
    sub.call("on_eval_begin", rc)
    sub.call("on_eval_epoch_begin", rc)
    for _ in range(batches):
        cb.cur_step_num += 1
        sub.call("on_eval_step_begin", rc)
        time.sleep(0.002)
        sub.call("on_eval_step_end", rc)
    sub.call("on_eval_epoch_end", rc)
    sub.call("on_eval_end", rc)
    cb.update(saved)


def simulate_eval(callbacks: Any, *, batches: int = 3, net: nn.Module | None = None) -> RunContext:
    """MindSpore's ``_eval_process`` hook order (docs/semantics.md §1.4)."""
    if net is None:
        net, _ = make_net()
    cbl = CallbackList(callbacks)
    cb = InternalCallbackParam(
        mode="eval",
        batch_num=batches,
        cur_step_num=0,
        network=net,
        eval_network=net,
        dataset_sink_mode=False,
        list_callback=cbl.callbacks,
        rank=0,
    )
    rc = RunContext(cb)
    cbl.enter()
    try:
        cbl.call("on_eval_begin", rc)
        cbl.call("on_eval_epoch_begin", rc)
        for x, y in data(batches):
            cb.cur_step_num += 1
            cb.eval_dataset_element = (x, y)
            cbl.call("on_eval_step_begin", rc)
            with torch.no_grad():
                cb.net_outputs = (nn.functional.mse_loss(net(x), y), net(x), y)
            cbl.call("on_eval_step_end", rc)
            if rc.get_stop_requested():
                break
        cbl.call("on_eval_epoch_end", rc)
        cb.metrics = {"mse": 1.0}
        cbl.call("on_eval_end", rc)
    finally:
        cbl.exit()
    return rc


def seq(values: list[float], key: str) -> Callable[[int], dict]:
    """``eval_results`` per epoch: ``values[epoch - 1]`` under ``key``."""
    return lambda epoch: (
        {key: values[epoch - 1], "eval_loss": 0.0}
        if key != "eval_loss"
        else {"eval_loss": values[epoch - 1]}
    )
