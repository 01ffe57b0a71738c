"""LitModel's checkpoint state (``lit_amp.model.lit_state``): every lit_amp checkpoint is a
Lightning checkpoint.

(a) a lit_amp ``ModelCheckpoint`` file of ``Model.train`` resumes with Lightning's own
``Trainer.fit(ckpt_path=...)``; (b) a Lightning ``ModelCheckpoint`` file of a ``LitModel``
loads with ``lit_amp.load_checkpoint`` and resumes ``Model.train``; (c)
``LitModel.load_from_checkpoint`` reads lit_amp's files; (f) ``LitModel.checkpoint_state``
gathers FSDP2-sharded state (2 processes).
The 2-process DDP run of ``ModelCheckpoint`` (d) is in tests/model/test_ddp_model.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint as LightningModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lit_amp import DynamicLossScaleManager, LitModel, Model, load_checkpoint
from lit_amp.callbacks import CheckpointConfig, ModelCheckpoint
from lit_amp.serialization import CHECKPOINT_FORMAT, FORMAT_KEY, LOSS_SCALE_KEY
from tests.helpers.data import make_batches, make_net
from tests.helpers.dist import run_distributed

BATCHES = 4
QUIET = {"accelerator": "cpu", "devices": 1, "logger": False, "enable_progress_bar": False,
         "enable_model_summary": False, "enable_checkpointing": False}


def _loader() -> DataLoader:
    """``make_batches(BATCHES)`` as a DataLoader (the same batches, in order)."""
    batches = make_batches(BATCHES)
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    return DataLoader(TensorDataset(x, y), batch_size=len(batches[0][0]))


def _parts(seed: int = 0):
    torch.manual_seed(seed)
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    return net, opt


def _scaler() -> DynamicLossScaleManager:
    return DynamicLossScaleManager(init_loss_scale=2.0**10, scale_factor=2, scale_window=3)


def _model(seed: int = 0) -> tuple[Model, nn.Module, torch.optim.Optimizer]:
    net, opt = _parts(seed)
    return Model(net, nn.CrossEntropyLoss(), opt, loss_scale_manager=_scaler()), net, opt


def _lit(seed: int = 0) -> LitModel:
    net, opt = _parts(seed)
    return LitModel(net, nn.CrossEntropyLoss(), opt, loss_scale_manager=_scaler())


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _momenta(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [s["momentum_buffer"] for s in opt.state_dict()["state"].values()]


@pytest.fixture(scope="module")
def lit_amp_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """``Model.train`` for 2 epochs with lit_amp's ModelCheckpoint at each epoch end."""
    tmp = tmp_path_factory.mktemp("litamp")
    model, net, opt = _model()
    ckpt = ModelCheckpoint("net", str(tmp), CheckpointConfig(save_checkpoint_steps=BATCHES))
    later = ModelCheckpoint("net", str(tmp / "async"),
                            CheckpointConfig(save_checkpoint_steps=BATCHES, async_save=True))
    model.train(2, make_batches(BATCHES), callbacks=[ckpt, later])
    return {"dir": tmp, "net": net, "opt": opt,
            "scale": model.lit_model.loss_scale.state_dict()}


def test_a_lit_amp_file_is_lightnings_checkpoint_dict(lit_amp_run: dict) -> None:
    state = torch.load(lit_amp_run["dir"] / "net-1_4.ckpt", weights_only=True)
    for key in ("state_dict", "optimizer_states", "lr_schedulers", "epoch", "global_step",
                "loops", "callbacks", "pytorch-lightning_version", "append_info"):
        assert key in state, key
    assert state[FORMAT_KEY] == CHECKPOINT_FORMAT
    assert state["global_step"] == BATCHES
    assert "network.0.weight" in state["state_dict"]  # the LightningModule's names
    assert state[LOSS_SCALE_KEY]["scale"] > 0


def test_lightning_fit_resumes_a_lit_amp_file_exactly(lit_amp_run: dict) -> None:
    """(a) epoch 2 resumed by Lightning's own Trainer equals the uninterrupted run."""
    lit = _lit(seed=5)  # other initial weights: everything must come from the file
    trainer = L.Trainer(max_epochs=2, **QUIET)
    trainer.fit(lit, _loader(), ckpt_path=str(lit_amp_run["dir"] / "net-1_4.ckpt"))
    assert trainer.global_step == 2 * BATCHES
    assert trainer.current_epoch == 2
    assert _same(lit.network.state_dict(), lit_amp_run["net"].state_dict())
    assert all(torch.equal(a, b) for a, b in zip(_momenta(lit.optimizer),
                                                 _momenta(lit_amp_run["opt"])))
    assert lit.loss_scale.state_dict() == lit_amp_run["scale"]


def test_async_save_writes_the_same_checkpoint(lit_amp_run: dict) -> None:
    for name in ("net-1_4.ckpt", "net-2_4.ckpt"):
        sync = load_checkpoint(str(lit_amp_run["dir"] / name))
        done = load_checkpoint(str(lit_amp_run["dir"] / "async" / name))
        assert _same(sync["state_dict"], done["state_dict"])
        assert all(torch.equal(a["momentum_buffer"], b["momentum_buffer"]) for a, b in
                   zip(sync["optimizer"]["state"].values(), done["optimizer"]["state"].values()))
        assert sync["loops"] == done["loops"] and sync["loss_scale"] == done["loss_scale"]


def test_load_from_checkpoint_reads_a_lit_amp_file(lit_amp_run: dict) -> None:
    """(c) ``LitModel.load_from_checkpoint`` on lit_amp's ModelCheckpoint file."""
    net, _ = _parts(seed=7)
    lit = LitModel.load_from_checkpoint(str(lit_amp_run["dir"] / "net-2_4.ckpt"), network=net,
                                        loss_fn=nn.CrossEntropyLoss())
    assert _same(lit.network.state_dict(), lit_amp_run["net"].state_dict())


def test_load_checkpoint_restores_a_lit_model_strictly(lit_amp_run: dict) -> None:
    lit = _lit(seed=3)
    lit.apply_amp()  # creates the loss-scale controller
    state = load_checkpoint(str(lit_amp_run["dir"] / "net-2_4.ckpt"), net=lit)
    assert _same(lit.network.state_dict(), lit_amp_run["net"].state_dict())
    assert _same(state["network"], lit_amp_run["net"].state_dict())  # the derived view
    assert state["loss_scale"] == lit_amp_run["scale"] == lit.loss_scale.state_dict()
    other = LitModel(nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3)))
    with pytest.raises(RuntimeError, match="(?s)net-2_4.ckpt.*size mismatch"):
        load_checkpoint(str(lit_amp_run["dir"] / "net-2_4.ckpt"), net=other)


def test_a_lightning_file_resumes_model_train(tmp_path: Path) -> None:
    """(b) Lightning's ModelCheckpoint file of a LitModel -> lit_amp, then Model.train."""
    ref, ref_net, ref_opt = _model()
    ref.train(2, make_batches(BATCHES))

    lit = _lit()
    saver = LightningModelCheckpoint(dirpath=str(tmp_path), save_last=True)
    trainer = L.Trainer(max_epochs=1, callbacks=[saver], **{**QUIET, "enable_checkpointing": True})
    trainer.fit(lit, _loader())
    path = str(tmp_path / "last.ckpt")
    for target in ("train_network", "lit_model"):  # the train cell; what callbacks get
        model, net, opt = _model(seed=9)
        state = load_checkpoint(path, net=getattr(model, target))  # weights and optimizer
        assert _same(net.state_dict(), lit.network.state_dict())
        assert state["optimizer"] is not None and state["append_info"] == {}
        model.train(2, make_batches(BATCHES), initial_epoch=1)
        assert _same(net.state_dict(), ref_net.state_dict())
        assert all(torch.equal(a, b) for a, b in zip(_momenta(opt), _momenta(ref_opt)))


def test_a_loaded_loss_scale_reaches_the_controller_created_later(lit_amp_run: dict) -> None:
    model, _, _ = _model(seed=9)
    load_checkpoint(str(lit_amp_run["dir"] / "net-1_4.ckpt"), net=model.lit_model)
    model.train(2, make_batches(BATCHES), initial_epoch=1)
    assert model.lit_model.loss_scale.state_dict() == lit_amp_run["scale"]


def _fsdp_worker(rank: int, world: int, out: str) -> dict:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from lit_amp.serialization import checkpoint_payload, write_checkpoint

    torch.manual_seed(0)
    reference = {k: v.clone() for k, v in make_net().state_dict().items()}
    net = make_net()
    for layer in (net[0], net[2]):
        fully_shard(layer)
    fully_shard(net)
    lit = LitModel(net, nn.CrossEntropyLoss(), torch.optim.Adam(net.parameters(), 1e-2))
    x, y = make_batches(1, seed=rank)[0]
    nn.functional.cross_entropy(net(x), y).backward()
    lit.optimizer.step()
    payload = checkpoint_payload(lit)  # a collective: every rank; the full dicts on rank 0
    path = os.path.join(out, "fsdp.ckpt")
    if rank == 0:
        write_checkpoint(payload, path)
    dist.barrier()
    res: dict = {"rank1_empty": not payload["state_dict"]}
    fresh = LitModel(net, nn.CrossEntropyLoss(), lit.optimizer)
    fresh.load_checkpoint_state({"network": reference, "optimizer": None})  # other weights
    reset = fresh.checkpoint_state()["state_dict"]
    load_checkpoint(path, net=fresh)  # every rank reads the file, the shards are set
    back = fresh.checkpoint_state()
    if rank == 0:
        saved = load_checkpoint(path)
        sd = saved["state_dict"]
        res["shapes"] = {k: tuple(v.shape) for k, v in sd.items() if k.startswith("network.")}
        res["plain"] = all(type(v) is torch.Tensor and v.device.type == "cpu"
                           for v in sd.values())
        res["reset_ok"] = all(torch.equal(reset["network." + k], v) for k, v in reference.items())
        res["trained"] = not torch.equal(sd["network.0.weight"], reference["0.weight"])
        res["back_ok"] = all(torch.equal(back["state_dict"][k], v) for k, v in sd.items())
        res["opt_ok"] = all(
            torch.equal(back["optimizer_states"][0]["state"][n]["exp_avg"], s["exp_avg"])
            for n, s in saved["optimizer"]["state"].items())
        res["opt_keys"] = len(saved["optimizer"]["state"])
    return res


def test_fsdp2_checkpoint_is_full_on_rank_0_and_loads_back(tmp_path: Path) -> None:
    """(f) FSDP2: full CPU state dicts gathered to rank 0, written, set back into the shards."""
    r0, r1 = run_distributed(_fsdp_worker, world=2, args=(str(tmp_path),))
    full = {"network." + k: tuple(v.shape) for k, v in make_net().state_dict().items()}
    assert r0["shapes"] == full
    assert r0["plain"] and r0["reset_ok"] and r0["trained"] and r0["back_ok"] and r0["opt_ok"]
    assert r0["opt_keys"] == 4
    assert r1["rank1_empty"]  # torch gathers the full state to rank 0 only


def _ddp_main(out: str) -> None:
    """(d) the script side: ``Model.train`` under Lightning's DDP (2 CPU processes)."""
    import json

    import torch.distributed as dist

    net, opt = _parts()
    model = Model(net, nn.CrossEntropyLoss(), opt,
                  trainer={"accelerator": "cpu", "devices": 2, "strategy": "ddp"})
    ckdir = os.path.join(out, "ck")  # the same folder for both ranks
    ckpt = ModelCheckpoint("net", ckdir, CheckpointConfig(save_checkpoint_steps=2))
    model.train(2, _loader(), callbacks=[ckpt])  # 4 batches: 2 steps per rank and epoch
    rank = dist.get_rank()
    res = {"latest": ckpt.latest_ckpt_file_name,
           "weights": {k: v.tolist() for k, v in net.state_dict().items()}}
    with open(os.path.join(out, f"ddp{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.barrier()


def test_ddp_model_checkpoint_writes_one_lightning_file_on_rank_0(tmp_path: Path) -> None:
    """(d) 2-process DDP: rank 0 alone writes each file, in the same (Lightning) format."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "tests.model.test_lit_state", "ddp",
                           str(tmp_path)], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r0, r1 = (json.loads((tmp_path / f"ddp{r}.json").read_text()) for r in (0, 1))
    assert sorted(os.listdir(tmp_path / "ck")) == ["net-1_2.ckpt", "net-2_2.ckpt"]
    assert r0["latest"] == r1["latest"] == str(tmp_path / "ck" / "net-2_2.ckpt")
    state = load_checkpoint(r0["latest"])
    assert state[FORMAT_KEY] == CHECKPOINT_FORMAT and state["global_step"] == 4
    assert {"loops", "optimizer_states", "callbacks"} <= set(state)
    for k, v in state["network"].items():
        assert v.tolist() == r0["weights"][k] == r1["weights"][k]
    net, _ = _parts(seed=3)
    lit = LitModel.load_from_checkpoint(r0["latest"], network=net)
    assert all(v.tolist() == r0["weights"][k] for k, v in lit.network.state_dict().items())


if __name__ == "__main__":
    import sys

    if sys.argv[1] == "ddp":
        _ddp_main(sys.argv[2])


def test_a_file_from_a_resumed_model_train_resumes_in_lightning_at_its_absolute_epoch(tmp_path):
    """Model.train(4, initial_epoch=2) writes a file at epoch 4; Lightning's own resume of it
    to max_epochs=5 trains exactly one more epoch (before: the file said epoch 2, so Lightning
    trained epochs 3-5 again, 3 epochs more than the user asked for)."""
    import lightning as L

    from lit_amp import Model
    from lit_amp.callbacks import CheckpointConfig, ModelCheckpoint

    torch.manual_seed(0)
    net = nn.Linear(4, 2)
    x, y = torch.randn(32, 4), torch.randint(0, 2, (32,))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    model = Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.1),
                  trainer={"accelerator": "cpu", "enable_progress_bar": False})
    model.train(2, data)
    ckpt = ModelCheckpoint("net", str(tmp_path), CheckpointConfig(save_checkpoint_steps=4))
    model.train(4, data, callbacks=[ckpt], initial_epoch=2)
    path = tmp_path / "net-4_4.ckpt"
    state = torch.load(path, weights_only=True)
    # saved at the epoch's last batch end: Lightning's counters say epoch index 3 (0-based,
    # not yet completed) and 16 optimizer steps, counted from the start of training
    assert state["epoch"] == 3 and state["global_step"] == 16
    assert state["loops"]["fit_loop"]["epoch_progress"]["total"]["started"] == 4
    steps: list[int] = []

    class Count(L.Callback):
        def on_train_batch_end(self, *args) -> None:
            steps.append(1)

    trainer = L.Trainer(max_epochs=5, accelerator="cpu", logger=False, callbacks=[Count()],
                        enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False)
    trainer.fit(model.lit_model, data, ckpt_path=str(path))
    assert len(steps) == 4 and trainer.current_epoch == 5 and trainer.global_step == 20
    assert model.lit_model.epoch_offset == 0  # the offset ended with Model.train's run
