"""MindSpore's built-in callbacks driven through small simulated runs (spec §1.4-1.7).

Each run follows MindSpore's ``_train_process`` / ``_eval_process`` hook order with a real
``nn.Linear``, a real SGD optimizer and real losses.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from lit_amp.callbacks._callback import CallbackList, InternalCallbackParam, RunContext
from lit_amp.callbacks.backup_and_restore import BackupAndRestore
from lit_amp.callbacks.checkpoint import CheckpointConfig, ModelCheckpoint
from lit_amp.callbacks.early_stopping import EarlyStopping
from lit_amp.callbacks.history import History
from lit_amp.callbacks.lambda_callback import LambdaCallback
from lit_amp.callbacks.loss_monitor import LossMonitor
from lit_amp.callbacks.lr_scheduler import LearningRateScheduler
from lit_amp.callbacks.on_request_exit import OnRequestExit
from lit_amp.callbacks.reduce_lr_on_plateau import ReduceLROnPlateau
from lit_amp.callbacks.time_monitor import TimeMonitor
from lit_amp.checkpoint_io import load_checkpoint

# --------------------------------------------------------------------------- simulated runs


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
        return {"network": self.net.state_dict(), "optimizer": self.opt.state_dict()}

    def load_checkpoint_state(self, state: dict) -> None:
        self.net.load_state_dict(state["network"])
        if "optimizer" in state:
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
    """MindSpore's ``_train_process`` / ``_train_dataset_sink_process`` hook order (spec §1.4).

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
    """MindSpore's ``_eval_process`` hook order (spec §1.4)."""
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


# --------------------------------------------------------------------------- LossMonitor


def test_loss_monitor_prints_every_n_steps_exact_format(capsys: pytest.CaptureFixture) -> None:
    run = simulate_train([LossMonitor(per_print_times=2)], epochs=2, batches=3)
    lines = capsys.readouterr().out.splitlines()
    # global steps 2, 4, 6 -> (epoch 1, step 2), (epoch 2, step 1), (epoch 2, step 3)
    expected = [
        f"epoch: {e} step: {s}, loss is {loss}"
        for e, s, loss in [run.step_end_losses[i] for i in (1, 3, 5)]
    ]
    assert lines == expected
    assert [(e, s) for e, s, _ in [run.step_end_losses[i] for i in (1, 3, 5)]] == [
        (1, 2),
        (2, 1),
        (2, 3),
    ]


def test_loss_monitor_zero_never_prints_and_other_ranks_are_silent(
    capsys: pytest.CaptureFixture,
) -> None:
    simulate_train([LossMonitor(0)], epochs=1, batches=3)
    simulate_train([LossMonitor(1)], epochs=1, batches=3, rank=1)
    assert capsys.readouterr().out == ""


def test_loss_monitor_tuple_outputs_print_the_loss_float(capsys: pytest.CaptureFixture) -> None:
    run = simulate_train(
        [LossMonitor()],
        epochs=1,
        batches=2,
        outputs=lambda e, s, loss: (loss, torch.tensor(False), torch.tensor(1024.0)),
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"epoch: 1 step: {s}, loss is {loss}" for _, s, loss in run.step_end_losses]


@pytest.mark.parametrize(
    "make_out",
    [
        lambda loss: torch.tensor(float("nan")),
        lambda loss: torch.tensor(float("inf")),
        # under loss scaling MindSpore skips the check; lit_amp does not
        lambda loss: (torch.tensor(float("nan")), torch.tensor(True), torch.tensor(2.0**24)),
    ],
)
def test_loss_monitor_stops_on_invalid_loss(make_out: Callable) -> None:
    def outputs(e: int, s: int, loss: torch.Tensor) -> Any:
        return make_out(loss) if (e, s) == (2, 2) else loss

    with pytest.raises(ValueError, match=r"epoch: 2 step: 2\. Invalid loss (nan|inf)"):
        simulate_train([LossMonitor()], epochs=3, batches=3, outputs=outputs)


def test_loss_monitor_prints_fit_metrics(capsys: pytest.CaptureFixture) -> None:
    simulate_train(
        [LossMonitor(per_print_times=0)],
        epochs=2,
        batches=1,
        eval_results=lambda e: {"acc": 0.5 * e, "eval_loss": 1.0},
    )
    assert capsys.readouterr().out.splitlines() == [
        "Eval result: epoch 1, metrics: {'acc': 0.5}",
        "Eval result: epoch 2, metrics: {'acc': 1.0}",
    ]


def test_loss_monitor_sink_mode_prints_once_per_sink(capsys: pytest.CaptureFixture) -> None:
    run = simulate_train([LossMonitor(per_print_times=3)], epochs=3, sink_size=4)
    lines = capsys.readouterr().out.splitlines()
    # cur_step_num 4, 8, 12: each is >= 3 steps after the last print
    assert lines == [f"epoch: {e} step: 4, loss is {loss}" for e, _, loss in run.step_end_losses]
    assert len(lines) == 3


def test_loss_monitor_new_run_restarts_counter(capsys: pytest.CaptureFixture) -> None:
    lm = LossMonitor(per_print_times=2)
    simulate_train([lm], epochs=1, batches=4)
    simulate_train([lm], epochs=1, batches=4)
    assert len(capsys.readouterr().out.splitlines()) == 4


@pytest.mark.parametrize(
    ("value", "exc"), [(-1, ValueError), (1.5, TypeError), (True, TypeError), ("2", TypeError)]
)
def test_loss_monitor_bad_argument(value: Any, exc: type) -> None:
    with pytest.raises(exc, match="per_print_times"):
        LossMonitor(value)


# --------------------------------------------------------------------------- TimeMonitor

TIME_RE = r"Train epoch time: \d+\.\d{3} ms, per step time: \d+\.\d{3} ms"


def test_time_monitor_train_lines(capsys: pytest.CaptureFixture) -> None:
    simulate_train([TimeMonitor()], epochs=2, batches=3)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert all(re.fullmatch(TIME_RE, line) for line in lines)


def test_time_monitor_per_step_is_epoch_over_batch_num(capsys: pytest.CaptureFixture) -> None:
    simulate_train([TimeMonitor()], epochs=1, batches=4)
    line = capsys.readouterr().out.strip()
    epoch_ms, step_ms = (float(v) for v in re.findall(r"(\d+\.\d{3}) ms", line))
    assert step_ms == pytest.approx(epoch_ms / 4, abs=1e-3)


def test_time_monitor_data_time_measures_host_fetch(capsys: pytest.CaptureFixture) -> None:
    tm = TimeMonitor(data_time=True)
    rc = RunContext(InternalCallbackParam(mode="train", batch_num=3, dataset_sink_mode=False))
    tm.on_train_epoch_begin(rc)
    for _ in range(3):
        time.sleep(0.02)  # fetching the batch
        tm.on_train_step_begin(rc)
        tm.on_train_step_end(rc)
    tm.on_train_epoch_end(rc)
    line = capsys.readouterr().out.strip()
    m = re.fullmatch(TIME_RE + r", per step data time: (\d+\.\d{3}) ms", line)
    assert m is not None, line
    assert 15.0 <= float(m.group(1)) < 200.0


def test_time_monitor_eval_and_fit_eval(capsys: pytest.CaptureFixture) -> None:
    simulate_eval([TimeMonitor()], batches=2)
    simulate_train([TimeMonitor(), LossMonitor(0)], epochs=1, batches=2, fit_eval_batches=2)
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"Eval epoch time: .* ms, per step time: .* ms", lines[0])
    # during fit only TimeMonitor (of the built-ins) sees the eval hooks: Eval line, then Train
    assert lines[1].startswith("Eval epoch time:")
    assert re.fullmatch(TIME_RE, lines[2])
    # the train clock was not restarted by the evaluation inside the epoch
    train_ms = float(re.findall(r"(\d+\.\d{3}) ms", lines[2])[0])
    eval_ms = float(re.findall(r"(\d+\.\d{3}) ms", lines[1])[0])
    assert train_ms > eval_ms


def test_time_monitor_needs_a_step_count() -> None:
    tm = TimeMonitor()
    rc = RunContext({"mode": "train", "batch_num": 0})
    tm.on_train_epoch_begin(rc)
    with pytest.raises(ValueError, match="data_size"):
        tm.on_train_epoch_end(rc)
    tm = TimeMonitor(data_size=5)
    tm.on_train_epoch_begin(rc)
    tm.on_train_epoch_end(rc)


@pytest.mark.parametrize(
    ("kwargs", "exc", "name"),
    [
        ({"data_size": 0}, ValueError, "data_size"),
        ({"data_size": 2.0}, TypeError, "data_size"),
        ({"data_time": 1}, TypeError, "data_time"),
    ],
)
def test_time_monitor_bad_arguments(kwargs: dict, exc: type, name: str) -> None:
    with pytest.raises(exc, match=name):
        TimeMonitor(**kwargs)


# --------------------------------------------------------------------------- ModelCheckpoint


def ckpts(directory: Any) -> set[str]:
    return {f for f in os.listdir(directory) if f.endswith(".ckpt")}


def test_checkpoint_default_saves_every_step_keeps_five(tmp_path: Any) -> None:
    mc = ModelCheckpoint(directory=tmp_path)
    run = simulate_train([mc], epochs=2, batches=3)
    assert ckpts(tmp_path) == {
        f"CKP-{e}_{s}.ckpt" for e, s in [(1, 2), (1, 3), (2, 1), (2, 2), (2, 3)]
    }
    latest = os.path.join(tmp_path, "CKP-2_3.ckpt")
    assert mc.latest_ckpt_file_name == latest
    assert run.cb.latest_ckpt_file == latest
    assert run.cb.last_save_ckpt_step == 6
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp")]


def test_checkpoint_reload_into_fresh_net(tmp_path: Any) -> None:
    net, opt = make_net(0)
    mc = ModelCheckpoint(prefix="net", directory=tmp_path, config=CheckpointConfig(3))
    simulate_train([mc], epochs=2, batches=3, net=net, opt=opt)
    assert ckpts(tmp_path) == {"net-1_3.ckpt", "net-2_3.ckpt"}
    fresh, fresh_opt = make_net(seed=7)
    assert not same(weights(fresh), weights(net))
    load_checkpoint(mc.latest_ckpt_file_name, net=TrainNet(fresh, fresh_opt))
    assert same(weights(fresh), weights(net))
    mom = opt.state_dict()["state"][0]["momentum_buffer"]
    assert torch.equal(fresh_opt.state_dict()["state"][0]["momentum_buffer"], mom)
    # a plain module loads the network part
    plain = nn.Linear(3, 1)
    load_checkpoint(mc.latest_ckpt_file_name, net=plain)
    assert same(weights(plain), weights(net))


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        (2, {"CKP-1_2.ckpt", "CKP-2_1.ckpt", "CKP-2_3.ckpt"}),  # 2, 4, 6; end: 6 already saved
        (4, {"CKP-2_1.ckpt", "CKP-2_3.ckpt"}),  # 4; end forces 6
        (100, {"CKP-2_3.ckpt"}),  # only the final save
    ],
)
def test_checkpoint_steps_and_final_save(tmp_path: Any, steps: int, expected: set[str]) -> None:
    config = CheckpointConfig(save_checkpoint_steps=steps, keep_checkpoint_max=10)
    simulate_train([ModelCheckpoint(directory=tmp_path, config=config)], epochs=2, batches=3)
    assert ckpts(tmp_path) == expected


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        (1, {"CKP-1_4.ckpt", "CKP-2_4.ckpt", "CKP-3_4.ckpt"}),
        (6, {"CKP-2_4.ckpt", "CKP-3_4.ckpt"}),  # cur_step 4, 8 (>= 6: save), 12 (< 14); end: 12
    ],
)
def test_checkpoint_sink_mode(tmp_path: Any, steps: int, expected: set[str]) -> None:
    config = CheckpointConfig(save_checkpoint_steps=steps)
    simulate_train([ModelCheckpoint(directory=tmp_path, config=config)], epochs=3, sink_size=4)
    assert ckpts(tmp_path) == expected


def test_checkpoint_prefix_changes_when_files_exist(tmp_path: Any) -> None:
    (tmp_path / "CKP-1_1.ckpt").write_bytes(b"")
    mc = ModelCheckpoint(directory=tmp_path)
    assert mc.prefix == "CKP_1"
    simulate_train([mc], epochs=1, batches=1)
    assert "CKP_1-1_1.ckpt" in ckpts(tmp_path)
    assert ModelCheckpoint(directory=tmp_path).prefix == "CKP_2"
    assert ModelCheckpoint(prefix="CKPX", directory=tmp_path).prefix == "CKPX"


def test_checkpoint_keep_max_deletes_oldest_only_own_prefix(tmp_path: Any) -> None:
    (tmp_path / "other-1_1.ckpt").write_bytes(b"")
    config = CheckpointConfig(keep_checkpoint_max=2)
    simulate_train([ModelCheckpoint(directory=tmp_path, config=config)], epochs=1, batches=5)
    assert ckpts(tmp_path) == {"other-1_1.ckpt", "CKP-1_4.ckpt", "CKP-1_5.ckpt"}


def test_checkpoint_keep_per_n_minutes(tmp_path: Any) -> None:
    config = CheckpointConfig(keep_checkpoint_max=0, keep_checkpoint_per_n_minutes=1)
    assert config.keep_checkpoint_max == 0
    simulate_train([ModelCheckpoint(directory=tmp_path, config=config)], epochs=1, batches=4)
    # all saves fall in the same minute: the oldest of that minute and the newest remain
    assert ckpts(tmp_path) == {"CKP-1_1.ckpt", "CKP-1_4.ckpt"}


def test_checkpoint_seconds_mode(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import lit_amp.callbacks.checkpoint as ckpt_mod

    clock = {"t": 1000.0}

    class FakeTime:
        @staticmethod
        def time() -> float:
            return clock["t"]

    monkeypatch.setattr(ckpt_mod, "time", FakeTime)
    config = CheckpointConfig(save_checkpoint_steps=0, save_checkpoint_seconds=10)
    assert config.save_checkpoint_seconds == 10

    def tick(rc: RunContext) -> None:
        clock["t"] += 4.0

    simulate_train(
        [
            LambdaCallback(on_train_step_begin=tick),
            ModelCheckpoint(directory=tmp_path, config=config),
        ],
        epochs=1,
        batches=6,
    )
    # t = 1004, 1008, 1012 (>10 s: save), 1016, 1020, 1024 (save); end: step 6 already saved
    assert ckpts(tmp_path) == {"CKP-1_3.ckpt", "CKP-1_6.ckpt"}


def test_checkpoint_append_info(tmp_path: Any) -> None:
    config = CheckpointConfig(
        save_checkpoint_steps=3, append_info=["epoch_num", "step_num", {"lr": 0.1, "tag": "a"}]
    )
    mc = ModelCheckpoint(directory=tmp_path, config=config)
    simulate_train([mc], epochs=2, batches=3)
    info = load_checkpoint(mc.latest_ckpt_file_name)["append_info"]
    assert info == {"epoch_num": 2, "step_num": 6, "lr": 0.1, "tag": "a"}


def test_checkpoint_saved_network(tmp_path: Any) -> None:
    net, opt = make_net()
    config = CheckpointConfig(save_checkpoint_steps=100, saved_network=net)
    mc = ModelCheckpoint(directory=tmp_path, config=config)
    simulate_train([mc], epochs=1, batches=2, net=net, opt=opt)
    state = load_checkpoint(mc.latest_ckpt_file_name)
    assert "optimizer" not in state
    assert same(state["network"], weights(net))


def test_checkpoint_only_rank_zero_writes(tmp_path: Any) -> None:
    mc = ModelCheckpoint(directory=tmp_path)
    run = simulate_train([mc], epochs=1, batches=2, rank=1)
    assert ckpts(tmp_path) == set()
    assert run.cb.last_save_ckpt_step == 2


def test_checkpoint_async_save_snapshots_state(tmp_path: Any) -> None:
    net, opt = make_net()
    config = CheckpointConfig(save_checkpoint_steps=2, async_save=True, keep_checkpoint_max=10)
    mc = ModelCheckpoint(directory=tmp_path, config=config)
    seen: dict[int, dict] = {}

    def record(rc: RunContext) -> None:
        seen[rc.original_args().cur_step_num] = weights(net)

    simulate_train(
        [mc, LambdaCallback(on_train_step_end=record)], epochs=1, batches=4, net=net, opt=opt
    )
    assert ckpts(tmp_path) == {"CKP-1_2.ckpt", "CKP-1_4.ckpt"}
    assert same(load_checkpoint(os.path.join(tmp_path, "CKP-1_2.ckpt"))["network"], seen[2])
    assert same(load_checkpoint(os.path.join(tmp_path, "CKP-1_4.ckpt"))["network"], seen[4])


def test_checkpoint_save_breakpoint(tmp_path: Any) -> None:
    net, opt = make_net()
    mc = ModelCheckpoint(
        prefix="bp", directory=tmp_path, config=CheckpointConfig(exception_save=True)
    )
    assert mc.config.exception_save is True

    def boom(rc: RunContext) -> None:
        if rc.original_args().cur_step_num == 5:
            raise RuntimeError("device lost")

    run_cb: dict = {}

    def keep(rc: RunContext) -> None:
        run_cb["cb"] = rc.original_args()

    with pytest.raises(RuntimeError, match="device lost"):
        simulate_train(
            [LambdaCallback(on_train_begin=keep, on_train_step_end=boom), mc],
            epochs=2,
            batches=3,
            net=net,
            opt=opt,
        )
    path = mc.save_breakpoint(run_cb["cb"])
    assert path == os.path.join(tmp_path, "bp-2_2_breakpoint.ckpt")
    assert same(load_checkpoint(path)["network"], weights(net))
    # breakpoint files don't count as regular checkpoints of the prefix
    assert ModelCheckpoint(prefix="bp", directory=tmp_path).prefix == "bp_1"
    assert mc.save_breakpoint(InternalCallbackParam(run_cb["cb"], rank=1)) is None


def test_checkpoint_config_normalisation() -> None:
    c = CheckpointConfig(save_checkpoint_steps=5, save_checkpoint_seconds=7)
    assert (c.save_checkpoint_steps, c.save_checkpoint_seconds) == (5, None)
    c = CheckpointConfig(keep_checkpoint_max=3, keep_checkpoint_per_n_minutes=2)
    assert (c.keep_checkpoint_max, c.keep_checkpoint_per_n_minutes) == (3, None)
    c = CheckpointConfig(keep_checkpoint_max=0, keep_checkpoint_per_n_minutes=0)
    assert c.keep_checkpoint_max == 1
    assert CheckpointConfig().append_dict is None
    assert CheckpointConfig(incremental=True).map_param_inc is True
    assert CheckpointConfig().get_checkpoint_policy()["save_checkpoint_steps"] == 1


@pytest.mark.parametrize(
    ("kwargs", "exc", "pattern"),
    [
        ({"save_checkpoint_steps": -1}, ValueError, "save_checkpoint_steps.*-1"),
        ({"save_checkpoint_seconds": 1.5}, TypeError, "save_checkpoint_seconds"),
        ({"keep_checkpoint_max": -2}, ValueError, "keep_checkpoint_max"),
        ({"keep_checkpoint_per_n_minutes": "1"}, TypeError, "keep_checkpoint_per_n_minutes"),
        (
            {
                "save_checkpoint_steps": 0,
                "save_checkpoint_seconds": 0,
                "keep_checkpoint_max": 0,
                "keep_checkpoint_per_n_minutes": None,
            },
            ValueError,
            "can't all be None or 0",
        ),
        ({"integrated_save": 1}, TypeError, "integrated_save"),
        ({"async_save": "no"}, TypeError, "async_save"),
        ({"exception_save": None}, TypeError, "exception_save"),
        ({"saved_network": {"w": 1}}, TypeError, "saved_network"),
        ({"append_info": "epoch_num"}, TypeError, "append_info"),
        ({"append_info": ["epoch"]}, ValueError, "append_info.*'epoch'"),
        ({"append_info": [3]}, TypeError, "append_info"),
        ({"append_info": [{"a": 1}, {"b": 2}]}, TypeError, "at most one dict"),
        ({"append_info": [{1: 1}]}, TypeError, "append_info"),
        ({"append_info": [{"a": [1]}]}, TypeError, "append_info"),
        ({"enc_key": "secret"}, TypeError, "enc_key"),
        ({"enc_key": b"0123456789abcdef"}, ValueError, "enc_key"),
        ({"enc_mode": "ROT13"}, ValueError, "enc_mode.*ROT13"),
        ({"enc_mode": 1}, TypeError, "enc_mode"),
        ({"format": "safetensors"}, ValueError, "format"),
        ({"incremental": "yes"}, TypeError, "incremental"),
        ({"bogus": 1}, TypeError, "bogus"),
    ],
)
def test_checkpoint_config_bad_arguments(kwargs: dict, exc: type, pattern: str) -> None:
    with pytest.raises(exc, match=pattern):
        CheckpointConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "exc", "name"),
    [
        ({"prefix": "a/b"}, ValueError, "prefix"),
        ({"prefix": 3}, ValueError, "prefix"),
        ({"prefix": ""}, ValueError, "prefix"),
        ({"directory": 3}, ValueError, "directory"),
        ({"config": {"save_checkpoint_steps": 1}}, TypeError, "config"),
    ],
)
def test_model_checkpoint_bad_arguments(tmp_path: Any, kwargs: dict, exc: type, name: str) -> None:
    kwargs.setdefault("directory", tmp_path)
    with pytest.raises(exc, match=name):
        ModelCheckpoint(**kwargs)


# --------------------------------------------------------------------------- EarlyStopping


def seq(values: list[float], key: str) -> Callable[[int], dict]:
    return lambda epoch: (
        {key: values[epoch - 1], "eval_loss": 0.0}
        if key != "eval_loss"
        else {"eval_loss": values[epoch - 1]}
    )


@pytest.mark.parametrize(
    ("values", "patience", "stopped"),
    [
        ([0.5, 0.6, 0.6, 0.6, 0.6, 0.6], 2, 4),  # epochs 3, 4 don't improve
        ([0.5, 0.6, 0.7, 0.8, 0.9, 1.0], 0, 0),  # patience 0: improving epochs never stop
        ([0.5, 0.6, 0.6, 0.9, 1.0, 1.0], 0, 3),  # patience 0: the first stall stops
        ([0.0, 0.0, 0.0, 0.0, 0.0, 0.0], 1, 2),  # 0 is a real value
    ],
)
def test_early_stopping_stops_at_the_right_epoch(
    values: list[float], patience: int, stopped: int
) -> None:
    es = EarlyStopping(monitor="acc", patience=patience)
    run = simulate_train([es], epochs=6, batches=1, eval_results=seq(values, "acc"))
    assert es.stopped_epoch == stopped
    assert run.epochs_run[-1] == (stopped or 6)
    assert es.best == max(values[: run.epochs_run[-1]])


def test_early_stopping_baseline_must_be_beaten() -> None:
    values = [0.9, 0.8, 0.7, 0.6, 0.5]
    es = EarlyStopping(patience=2, baseline=0.5)  # eval_loss: min mode
    run = simulate_train([es], epochs=5, batches=1, eval_results=seq(values, "eval_loss"))
    assert es.stopped_epoch == 2 and run.epochs_run == [1, 2]
    assert es.best == 0.8
    es = EarlyStopping(patience=2)
    simulate_train([es], epochs=5, batches=1, eval_results=seq(values, "eval_loss"))
    assert es.stopped_epoch == 0
    # baseline 0 is a real baseline too
    es = EarlyStopping(monitor="acc", patience=1, baseline=0)
    simulate_train([es], epochs=3, batches=1, eval_results=seq([-1.0, -0.5, -0.2], "acc"))
    assert es.stopped_epoch == 1


def test_early_stopping_min_delta() -> None:
    es = EarlyStopping(monitor="eval_loss", patience=1, min_delta=-0.1)  # abs() is used
    simulate_train([es], epochs=4, batches=1, eval_results=seq([1.0, 0.95, 0.5, 0.45], "eval_loss"))
    assert es.stopped_epoch == 2


def test_early_stopping_restores_best_weights_at_stop() -> None:
    net, opt = make_net()
    es = EarlyStopping(patience=2, restore_best_weights=True)
    values = [1.0, 0.5, 0.7, 0.8, 0.9]
    run = simulate_train(
        [es], epochs=5, batches=2, net=net, opt=opt, eval_results=seq(values, "eval_loss")
    )
    assert es.stopped_epoch == 4
    # epoch_weights[4] was recorded after the callbacks ran, i.e. after the restore
    assert same(weights(net), run.epoch_weights[2])
    assert same(run.epoch_weights[4], run.epoch_weights[2])
    assert not same(run.epoch_weights[3], run.epoch_weights[2])


def test_early_stopping_restores_best_weights_at_train_end(capsys: pytest.CaptureFixture) -> None:
    net, opt = make_net()
    es = EarlyStopping(patience=10, restore_best_weights=True, verbose=True)
    run = simulate_train(
        [es], epochs=3, batches=2, net=net, opt=opt, eval_results=seq([1.0, 0.5, 0.7], "eval_loss")
    )
    assert es.stopped_epoch == 0
    assert not same(run.epoch_weights[3], run.epoch_weights[2])
    assert same(weights(net), run.epoch_weights[2])
    assert "Restoring model weights" in capsys.readouterr().out


def test_early_stopping_on_train_loss_with_tuple_outputs() -> None:
    losses = {1: 3.0, 2: 2.0, 3: 2.5, 4: 2.6}
    es = EarlyStopping(monitor="loss", patience=1)
    simulate_train(
        [es],
        epochs=4,
        batches=1,
        outputs=lambda e, s, loss: (
            torch.tensor(losses[e]),
            torch.tensor(False),
            torch.tensor(1.0),
        ),
    )
    assert es.stopped_epoch == 3 and es.best == 2.0


def test_early_stopping_missing_monitor_warns(caplog: pytest.LogCaptureFixture) -> None:
    es = EarlyStopping(monitor="acc", patience=0)
    with caplog.at_level(logging.WARNING):
        run = simulate_train([es], epochs=2, batches=1)
    assert es.stopped_epoch == 0 and run.epochs_run == [1, 2]
    assert "conditioned on 'acc'" in caplog.text


def test_early_stopping_rejects_non_scalar_monitor() -> None:
    es = EarlyStopping(monitor="acc")
    with pytest.raises(ValueError, match="scalar"):
        simulate_train([es], epochs=1, batches=1, eval_results=lambda e: {"acc": [0.1, 0.2]})


@pytest.mark.parametrize(
    ("kwargs", "exc", "name"),
    [
        ({"mode": "maximum"}, ValueError, "mode.*maximum"),
        ({"mode": 1}, TypeError, "mode"),
        ({"monitor": 1}, TypeError, "monitor"),
        ({"patience": -1}, ValueError, "patience"),
        ({"patience": 1.0}, TypeError, "patience"),
        ({"min_delta": "0.1"}, TypeError, "min_delta"),
        ({"baseline": "0.1"}, TypeError, "baseline"),
        ({"verbose": 1}, TypeError, "verbose"),
        ({"restore_best_weights": None}, TypeError, "restore_best_weights"),
    ],
)
def test_early_stopping_bad_arguments(kwargs: dict, exc: type, name: str) -> None:
    with pytest.raises(exc, match=name):
        EarlyStopping(**kwargs)


# --------------------------------------------------------------------------- ReduceLROnPlateau


def test_reduce_lr_on_plateau_trajectory() -> None:
    torch.manual_seed(0)
    net = nn.Linear(3, 1)
    opt = torch.optim.SGD(
        [{"params": [net.weight], "lr": 0.1}, {"params": [net.bias], "lr": 0.2}], lr=0.1
    )
    values = [1.0] * 6 + [0.5] * 7
    cb = ReduceLROnPlateau(factor=0.5, patience=2, cooldown=1, min_lr=0.01, min_delta=0)
    trajectory: list[tuple[float, float]] = []

    def rec(rc: RunContext) -> None:
        trajectory.append(tuple(g["lr"] for g in opt.param_groups))

    simulate_train(
        [cb, LambdaCallback(on_train_epoch_end=rec)],
        epochs=13,
        batches=1,
        net=net,
        opt=opt,
        eval_results=seq(values, "eval_loss"),
    )
    # hand computation of MindSpore's rule (wait, cooldown_counter per epoch):
    # e1 best=1; e2 wait1; e3 wait2 -> x0.5, cd=1; e4 cd->0, wait1; e5 wait2 -> x0.5, cd=1;
    # e6 cd->0, wait1; e7 best=.5; e8 wait1; e9 wait2 -> x0.5; e10 wait1; e11 wait2 -> floor .01
    # e12 wait1; e13 wait2 -> group0 already at min_lr, group1 .0125 -> .01
    g0 = [0.1, 0.1, 0.05, 0.05, 0.025, 0.025, 0.025, 0.025, 0.0125, 0.0125, 0.01, 0.01, 0.01]
    g1 = [0.2, 0.2, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05, 0.025, 0.025, 0.0125, 0.0125, 0.01]
    assert [t[0] for t in trajectory] == pytest.approx(g0)
    assert [t[1] for t in trajectory] == pytest.approx(g1)


def test_reduce_lr_on_plateau_max_mode_and_verbose(capsys: pytest.CaptureFixture) -> None:
    net, opt = make_net(lr=1.0)
    cb = ReduceLROnPlateau(monitor="acc", factor=0.5, patience=1, verbose=True)
    simulate_train(
        [cb], epochs=3, batches=1, net=net, opt=opt, eval_results=seq([0.5, 0.4, 0.9], "acc")
    )
    assert opt.param_groups[0]["lr"] == 0.5
    assert capsys.readouterr().out.strip() == (
        "Epoch 00002: ReduceLROnPlateau reducing learning rate to 0.5."
    )


def test_reduce_lr_on_plateau_needs_optimizer() -> None:
    cb = ReduceLROnPlateau(monitor="loss")
    with pytest.raises(ValueError, match="optimizer"):
        cb.on_train_epoch_end(RunContext({"optimizer": None, "net_outputs": torch.tensor(1.0)}))


@pytest.mark.parametrize(
    ("kwargs", "exc", "name"),
    [
        ({"factor": 1.0}, ValueError, r"factor.*\(0, 1\)"),
        ({"factor": 0}, ValueError, "factor"),
        ({"factor": 1.5}, ValueError, "factor"),
        ({"factor": "0.1"}, TypeError, "factor"),
        ({"mode": "up"}, ValueError, "mode"),
        ({"patience": -1}, ValueError, "patience"),
        ({"cooldown": -1}, ValueError, "cooldown"),
        ({"cooldown": 0.5}, TypeError, "cooldown"),
        ({"min_lr": -0.1}, ValueError, "min_lr"),
        ({"min_delta": None}, TypeError, "min_delta"),
        ({"monitor": None}, TypeError, "monitor"),
        ({"verbose": "yes"}, TypeError, "verbose"),
    ],
)
def test_reduce_lr_on_plateau_bad_arguments(kwargs: dict, exc: type, name: str) -> None:
    with pytest.raises(exc, match=name):
        ReduceLROnPlateau(**kwargs)


# --------------------------------------------------------------------------- LearningRateScheduler


def test_lr_scheduler_changes_every_group() -> None:
    torch.manual_seed(0)
    net = nn.Linear(3, 1)
    opt = torch.optim.SGD(
        [{"params": [net.weight], "lr": 0.1}, {"params": [net.bias], "lr": 0.3}], lr=0.1
    )
    calls: list[tuple[float, int]] = []

    def fn(lr: float, step: int) -> float:
        calls.append((lr, step))
        return lr * 0.5 if step % 2 == 0 else lr

    simulate_train([LearningRateScheduler(fn)], epochs=2, batches=2, net=net, opt=opt)
    assert [s for _, s in calls] == [1, 2, 3, 4]
    assert calls[0][0] == pytest.approx(0.1)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.025, 0.025])


def test_lr_scheduler_affects_the_sgd_step() -> None:
    net, opt = make_net()
    before = weights(net)
    simulate_train(
        [LearningRateScheduler(lambda lr, step: 0.0)], epochs=1, batches=3, net=net, opt=opt
    )
    after_first = weights(net)
    assert not same(before, after_first)  # step 1 used lr 0.1
    frozen = weights(net)
    opt.state.clear()  # drop momentum so lr 0 means no change
    simulate_train([], epochs=1, batches=2, net=net, opt=opt)
    assert same(weights(net), frozen)


def test_lr_scheduler_bad_arguments() -> None:
    with pytest.raises(TypeError, match="learning_rate_function"):
        LearningRateScheduler(0.1)  # type: ignore[arg-type]
    cb = LearningRateScheduler(lambda lr, step: "0.1")
    with pytest.raises(TypeError, match="learning_rate_function"):
        simulate_train([cb], epochs=1, batches=1)


# --------------------------------------------------------------------------- LambdaCallback


def test_lambda_callback_hook_order() -> None:
    calls: list[str] = []
    names = [
        "on_train_begin",
        "on_train_epoch_begin",
        "on_train_step_begin",
        "on_train_step_end",
        "on_train_epoch_end",
        "on_train_end",
        "on_eval_begin",
        "on_eval_epoch_begin",
        "on_eval_step_begin",
        "on_eval_step_end",
        "on_eval_epoch_end",
        "on_eval_end",
    ]
    cb = LambdaCallback(**{n: (lambda rc, n=n: calls.append(n)) for n in names})
    simulate_train([cb], epochs=2, batches=1)
    simulate_eval([cb], batches=1)
    step = ["on_train_step_begin", "on_train_step_end"]
    epoch = ["on_train_epoch_begin", *step, "on_train_epoch_end"]
    ev = ["on_eval_begin", "on_eval_epoch_begin", "on_eval_step_begin", "on_eval_step_end"]
    assert calls == [
        "on_train_begin",
        *epoch,
        *epoch,
        "on_train_end",
        *ev,
        "on_eval_epoch_end",
        "on_eval_end",
    ]
    # unset hooks do nothing
    simulate_train([LambdaCallback()], epochs=1, batches=1)


def test_lambda_callback_receives_run_context_and_can_stop() -> None:
    def stop(rc: RunContext) -> None:
        if rc.original_args().cur_step_num == 2:
            rc.request_stop()

    run = simulate_train([LambdaCallback(on_train_step_end=stop)], epochs=3, batches=3)
    assert run.epochs_run == [1] and len(run.losses) == 2


def test_lambda_callback_bad_argument() -> None:
    with pytest.raises(TypeError, match="on_train_end"):
        LambdaCallback(on_train_end=1)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- History


def test_history_records_net_output_and_metrics() -> None:
    h = History()
    run = simulate_train(
        [h], epochs=3, batches=2, eval_results=lambda e: {"acc": e / 10, "eval_loss": 1.0}
    )
    assert h.epoch == {"epoch": [1, 2, 3]}
    last = [loss for e, s, loss in run.step_end_losses if s == 2]
    assert h.history["net_output"] == pytest.approx(last)
    assert h.history["acc"] == [0.1, 0.2, 0.3]
    assert "eval_loss" not in h.history
    # a tuple output records its first element; a new run starts afresh
    simulate_train(
        [h],
        epochs=1,
        batches=1,
        outputs=lambda e, s, loss: (
            torch.tensor([1.0, 3.0]),
            torch.tensor(False),
            torch.tensor(8.0),
        ),
    )
    assert h.epoch == {"epoch": [1]} and h.history == {"net_output": [2.0]}


def test_history_not_called_by_fit_eval() -> None:
    h = History()
    simulate_train([h], epochs=2, batches=1, fit_eval_batches=2)
    assert h.epoch == {"epoch": [1, 2]}


# --------------------------------------------------------------------------- OnRequestExit


def test_on_request_exit_sigterm_stops_and_saves(tmp_path: Any) -> None:
    net, opt = make_net()
    original = signal.getsignal(signal.SIGTERM)
    cb = OnRequestExit(file_name="LeNet", directory=str(tmp_path))

    def send(rc: RunContext) -> None:
        if rc.original_args().cur_step_num == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    run = simulate_train(
        [LambdaCallback(on_train_step_end=send), cb], epochs=3, batches=4, net=net, opt=opt
    )
    assert run.epochs_run == [1] and len(run.losses) == 2  # stopped after the signalled step
    assert signal.getsignal(signal.SIGTERM) == original  # handler restored
    path = tmp_path / "LeNet_train.ckpt"
    assert path.is_file()
    assert same(load_checkpoint(str(path))["network"], weights(net))

    # the next run resumes from that checkpoint at train begin
    fresh, fresh_opt = make_net(seed=5)
    loaded: dict = {}

    def grab(rc: RunContext) -> None:
        loaded.update(weights(fresh))

    cb2 = OnRequestExit(file_name="LeNet", directory=str(tmp_path))
    run2 = simulate_train(
        [cb2, LambdaCallback(on_train_begin=grab)], epochs=1, batches=1, net=fresh, opt=fresh_opt
    )
    assert same(loaded, run.epoch_weights[1])
    assert run2.epochs_run == [1] and cb2.exit is False


def test_on_request_exit_without_signal_saves_nothing(tmp_path: Any) -> None:
    run = simulate_train([OnRequestExit(directory=str(tmp_path))], epochs=2, batches=2)
    assert run.epochs_run == [1, 2] and not os.listdir(tmp_path)


def test_on_request_exit_eval(tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    net, _ = make_net()
    cb = OnRequestExit(directory=str(tmp_path), sig=signal.SIGUSR1)

    def send(rc: RunContext) -> None:
        os.kill(os.getpid(), signal.SIGUSR1)

    with caplog.at_level(logging.INFO, logger="lit_amp.callbacks.on_request_exit"):
        rc = simulate_eval([LambdaCallback(on_eval_step_end=send), cb], batches=3, net=net)
    assert rc.get_stop_requested() and rc.original_args().cur_step_num == 1
    assert (tmp_path / "Net_eval.ckpt").is_file()
    assert caplog.text.count("MINDIR") == 1


def test_on_request_exit_off_main_thread_warns(caplog: pytest.LogCaptureFixture) -> None:
    cb = OnRequestExit(save_ckpt=False, save_mindir=False)
    rc = RunContext(InternalCallbackParam(mode="train"))
    with caplog.at_level(logging.WARNING):
        t = threading.Thread(target=cb.on_train_begin, args=(rc,))
        t.start()
        t.join()
    assert "main thread" in caplog.text
    cb.on_train_end(rc)


@pytest.mark.parametrize(
    ("kwargs", "exc", "name"),
    [
        ({"sig": signal.SIGKILL}, ValueError, "sig.*SIGKILL"),
        ({"sig": signal.SIGSTOP}, ValueError, "sig.*SIGSTOP"),
        ({"sig": 10_000}, ValueError, "sig"),
        ({"sig": "SIGTERM"}, TypeError, "sig"),
        ({"save_ckpt": 1}, TypeError, "save_ckpt"),
        ({"save_mindir": "no"}, TypeError, "save_mindir"),
        ({"file_name": 3}, TypeError, "file_name"),
        ({"directory": 3}, TypeError, "directory"),
    ],
)
def test_on_request_exit_bad_arguments(tmp_path: Any, kwargs: dict, exc: type, name: str) -> None:
    kwargs.setdefault("directory", str(tmp_path))
    with pytest.raises(exc, match=name):
        OnRequestExit(**kwargs)


# --------------------------------------------------------------------------- BackupAndRestore


def test_backup_and_restore_resume_after_crash(tmp_path: Any) -> None:
    net, opt = make_net()
    cb = BackupAndRestore(str(tmp_path), save_freq=2)

    def crash(rc: RunContext) -> None:
        cb_params = rc.original_args()
        if cb_params.cur_epoch_num == 3 and cb_params.cur_step_num == 8:
            raise RuntimeError("node failure")

    with pytest.raises(RuntimeError, match="node failure"):
        simulate_train(
            [cb, LambdaCallback(on_train_step_end=crash)], epochs=4, batches=3, net=net, opt=opt
        )
    backup = tmp_path / "backup.ckpt"
    assert backup.is_file()  # train end never ran: the backup survives
    info = load_checkpoint(str(backup))["append_info"]
    assert info == {"epoch_num": 2, "step_num": 6}

    fresh, fresh_opt = make_net(seed=9)
    cb2 = BackupAndRestore(str(tmp_path), save_freq=2)
    train_net = TrainNet(fresh, fresh_opt)
    assert cb2.restore(train_net) == 2
    restored = weights(fresh)
    assert same(restored, load_checkpoint(str(backup))["network"])
    assert fresh_opt.state_dict()["state"]  # momentum restored too
    # on_train_begin must not load a second time: mark the weights and check they survive
    with torch.no_grad():
        fresh.bias.add_(1.0)
    marked = weights(fresh)
    seen: dict = {}
    run = simulate_train(
        [cb2, LambdaCallback(on_train_begin=lambda rc: seen.update(weights(fresh)))],
        epochs=4,
        batches=3,
        initial_epoch=2,
        net=fresh,
        opt=fresh_opt,
    )
    assert same(seen, marked)
    assert run.epochs_run == [3, 4]
    assert not backup.exists()  # deleted at train end


def test_backup_and_restore_train_begin_loads_and_keep(tmp_path: Any) -> None:
    net, opt = make_net()
    run = simulate_train(
        [BackupAndRestore(str(tmp_path), delete_checkpoint=False)],
        epochs=2,
        batches=2,
        net=net,
        opt=opt,
    )
    assert load_checkpoint(str(tmp_path / "backup.ckpt"))["append_info"]["epoch_num"] == 2
    fresh, fresh_opt = make_net(seed=3)
    seen: dict = {}
    simulate_train(
        [
            BackupAndRestore(str(tmp_path)),
            LambdaCallback(on_train_begin=lambda rc: seen.update(weights(fresh))),
        ],
        epochs=1,
        batches=1,
        net=fresh,
        opt=fresh_opt,
    )
    assert same(seen, run.epoch_weights[2])
    assert BackupAndRestore(str(tmp_path)).restore(TrainNet(*make_net())) == 0


@pytest.mark.parametrize(
    ("kwargs", "exc", "name"),
    [
        ({"save_freq": 0}, ValueError, "save_freq"),
        ({"save_freq": "step"}, ValueError, "save_freq.*'step'"),
        ({"save_freq": 1.5}, TypeError, "save_freq"),
        ({"save_freq": True}, TypeError, "save_freq"),
        ({"delete_checkpoint": 1}, TypeError, "delete_checkpoint"),
        ({"backup_dir": 3}, TypeError, "backup_dir"),
    ],
)
def test_backup_and_restore_bad_arguments(
    tmp_path: Any, kwargs: dict, exc: type, name: str
) -> None:
    kwargs.setdefault("backup_dir", str(tmp_path))
    with pytest.raises(exc, match=name):
        BackupAndRestore(**kwargs)
