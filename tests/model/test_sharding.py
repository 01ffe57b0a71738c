"""``Model``/``LitModel`` under FSDP2 (``lit_amp.model.sharding``: ``strategy="fsdp2"`` /
``ModelParallelStrategy``).

One 2-process run (CPU, gloo) of ``_fsdp2_worker.py`` (Lightning's launcher re-runs it for
rank 1) covers every item; the tests check what each rank wrote, and load the checkpoints it
wrote in this single process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("_fsdp2_worker.py")
sys.path.insert(0, str(WORKER.parent))

from _fsdp2_worker import _net  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[list[dict], Path]:
    out = tmp_path_factory.mktemp("fsdp2")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(WORKER), "main", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = [json.loads((out / f"main{r}.json").read_text()) for r in (0, 1)]
    for r in res:
        assert r["errors"] == [], r["errors"]
    return res, out


def test_fsdp2_trains_like_ddp(run):
    # same data, fp32, SGD + gradient clipping by norm: the eval loss (1e-4 relative) and the
    # gathered weights agree with DDP's, after the first and after a second train call
    res, _ = run
    for r in res:
        ddp, fs = r["ddp"], r["fsdp2"]
        assert fs["sharded"] == "FSDPSequential" and ddp["sharded"] == "Sequential"
        assert fs["eval_first"] == pytest.approx(ddp["eval_first"], rel=1e-4)
        assert fs["eval"] == pytest.approx(ddp["eval"], rel=1e-4)
        assert fs["eval"] != pytest.approx(fs["eval_first"], rel=1e-4)  # the 2nd call trained
        for name, w in ddp["weights"].items():
            assert fs["weights"][name] == pytest.approx(w, abs=1e-5), name
        assert r["opt_is_user_opt"]  # the user's optimizer object, re-pointed
        assert fs["predict"] == pytest.approx(ddp["predict"], abs=1e-5)  # Model.predict
    # each rank holds about half of the parameters
    assert res[0]["local_numel"] + res[1]["local_numel"] == res[0]["numel"]
    assert abs(res[0]["local_numel"] - res[1]["local_numel"]) < 0.1 * res[0]["numel"]


def test_overflow_in_one_ranks_shard_skips_the_step_everywhere(run):
    res, _ = run
    for r in res:
        ovf = r["overflow"]
        assert ovf["steps"] == 2 and ovf["skipped"] == 1 and ovf["scale"] == 512.0
        assert ovf["finite"]


def test_fully_shard_after_building_the_optimizer_is_refused(run):
    res, _ = run
    for r in res:
        err = r["user_sharded"]
        assert err and "'optimizer'" in err and "nothing would train" in err
        assert "build the optimizer after it" in err


def test_bf16_o2_trains_with_fp32_batchnorm(run):
    res, _ = run
    for r in res:
        b = r["bf16"]
        assert b["after"] < 0.8 * b["before"]
        assert b["compute"] == ["torch.bfloat16"]  # the Linear computed in bf16
        assert b["bn_dtypes"] == ["torch.float32", "torch.float32"]
        assert b["param_dtype"] == "torch.float32"  # fp32 shards (master weights)


def test_litmodel_in_a_plain_trainer_with_model_parallel_strategy(run):
    res, _ = run
    for r in res:
        p = r["plain"]
        assert p["sharded"] == "FSDPSequential"
        assert p["after"] < 0.8 * p["before"]
    assert res[0]["plain"] == res[1]["plain"]


def _load(path: Path) -> nn.Module:
    from lit_amp import load_checkpoint, load_param_into_net

    net = _net(seed=1)  # other initial weights: everything must come from the file
    missing, _ = load_param_into_net(net, load_checkpoint(str(path)), strict_load=True)
    assert not missing
    return net


def _flat(net: nn.Module) -> dict:
    return {k: v.detach().float().flatten().tolist() for k, v in net.state_dict().items()}


def test_fsdp2_checkpoints_load_into_a_plain_network_in_one_process(run):
    res, out = run
    fs = res[0]["fsdp2"]
    # lit_amp's ModelCheckpoint (rank 0 writes; every rank gathers): after epoch 1's 4 steps
    files = sorted(os.listdir(out / "ck"))
    assert "fs-1_4.ckpt" in files, files
    got = _flat(_load(out / "ck" / "fs-1_4.ckpt"))
    assert got == fs["first_weights"]
    # Lightning's own Trainer.save_checkpoint (save_distributed_checkpoint=False): one file
    got = _flat(_load(out / "ck" / "trainer.ckpt"))
    assert got == fs["weights"]
    assert torch.load(out / "ck" / "trainer.ckpt", weights_only=True)["optimizer_states"]


@pytest.mark.slow
def test_cli_trainer_fsdp_trains_on_two_cpu_processes(tmp_path):
    # the command trainer=fsdp's comments give (the CLI's demo task, 1 epoch, ~20 s)
    exe = Path(sys.executable).with_name("lit-amp")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(exe), "trainer=fsdp", "trainer.accelerator=cpu",
                           "trainer.devices=2", "epochs=1"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (result,) = tmp_path.glob("runs/train/*/result.json")
    res = json.loads(result.read_text())
    assert res["status"] == "ok" and res["metrics"]["acc"] > 0.2  # 10 classes: chance is 0.1
    assert Path(res["latest_ckpt"]).is_file()


def test_fsdp2_is_a_registered_strategy_name():
    import lightning as L

    from lit_amp.model.sharding import FSDP2Strategy

    trainer = L.Trainer(strategy="fsdp2", accelerator="cpu", devices=1, logger=False)
    assert isinstance(trainer.strategy, FSDP2Strategy)
    assert trainer.strategy._save_distributed_checkpoint is False


@pytest.mark.parametrize("what", ["thor", "boost"])
def test_thor_and_boost_are_refused_under_fsdp2_naming_ddp(what):
    # what LitModel.configure_model runs under a ModelParallelStrategy, before any sharding
    from lit_amp import LitModel
    from lit_amp.model.sharding import prepare_sharded
    from lit_amp.thor.optimizer import thor

    net = _net()
    if what == "thor":
        lit = LitModel(net, nn.CrossEntropyLoss(), thor(net, 0.05, 0.03, 0.9, frequency=2))
        arg = "'optimizer'"
    else:
        lit = LitModel(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.1),
                       metrics={"acc"}, boost_level="O1")
        arg = "'boost_level'"
    with pytest.raises(ValueError, match=arg) as err:
        prepare_sharded(lit, None, fitting=True)
    assert "'ddp'" in str(err.value)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_backup_and_restore_resumes_sharded_training_exactly(run, strategy):
    # 2 epochs with BackupAndRestore, then a new Model (other initial weights) resumes to 4:
    # it trains epochs 3-4 only and ends with the weights of 4 uninterrupted epochs
    res, _ = run
    for r in res:
        b = r[f"backup_{strategy}"]
        assert b["epochs"] == [3, 4]
        for name, w in b["ref"].items():
            assert b["resumed"][name] == pytest.approx(w, abs=1e-6), name


def test_sink_mode_under_fsdp2_learns_what_ddp_learns(run):
    res, _ = run
    for r in res:
        ddp, fs = r["sink_ddp"], r["sink_fsdp2"]
        assert fs["eval"] == pytest.approx(ddp["eval"], rel=1e-4)
        for name, w in ddp["weights"].items():
            assert fs["weights"][name] == pytest.approx(w, abs=1e-5), name
