"""Hostile checkpoint files (issue #18 item 4): no loader runs code while reading a file.

Every load path of lit_amp gets a file whose pickle would, when unpickled, create a marker
file (``__reduce__`` -> ``open(marker, "w")``). Each loader must refuse it with an error
naming the file, and the marker must never appear. Both torch's zip format (``torch.save``)
and a raw pickle stream are tried.
"""

from __future__ import annotations

import os
import pickle
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from lit_amp import LitModel, Model, load_checkpoint
from lit_amp.boost.dim_reduce import get_pca_matrix, load_weight_vectors
from lit_amp.callbacks import BackupAndRestore, OnRequestExit
from tests.helpers.data import make_batches, make_net


class _Evil:
    """Unpickling this creates ``marker`` (a stand-in for arbitrary code)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (open, (self.marker, "w"))


FORMATS = ["torch_zip", "raw_pickle"]


def _plant(path: Path, marker: Path, fmt: str) -> Path:
    payload = {"state_dict": {"0.weight": _Evil(str(marker))}, "lit_amp_format": "lit_amp/2",
               "append_info": {"epoch_num": 1}}
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "torch_zip":
        torch.save(payload, path)
    else:
        with open(path, "wb") as f:
            pickle.dump(payload, f)
    return path


@pytest.fixture(params=FORMATS)
def evil(tmp_path: Path, request: Any):
    marker = tmp_path / "PWNED"

    def plant(path: Path) -> Path:
        return _plant(path, marker, request.param)

    yield plant
    assert not marker.exists(), "unpickling ran code from a checkpoint file"


def _model() -> Model:
    torch.manual_seed(0)
    net = make_net()
    return Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.1),
                 trainer={"logger": False, "enable_checkpointing": False})


def test_load_checkpoint_refuses(tmp_path: Path, evil: Any) -> None:
    path = evil(tmp_path / "a.ckpt")
    with pytest.raises(ValueError, match=str(path)):
        load_checkpoint(str(path))
    with pytest.raises(ValueError, match=str(path)):
        load_checkpoint(str(path), make_net())


def test_backup_and_restore_refuses(tmp_path: Path, evil: Any) -> None:
    evil(tmp_path / "bk" / "backup.ckpt")
    cb = BackupAndRestore(str(tmp_path / "bk"))
    with pytest.raises(ValueError, match="backup.ckpt"):
        cb.restore(make_net())
    with pytest.raises(ValueError, match="backup.ckpt"):  # the way users run it
        _model().train(2, make_batches(2), callbacks=[BackupAndRestore(str(tmp_path / "bk"))])


def test_on_request_exit_refuses(tmp_path: Path, evil: Any) -> None:
    before = signal.getsignal(signal.SIGTERM)
    evil(tmp_path / "ore" / "Net_train.ckpt")
    cb = OnRequestExit(directory=str(tmp_path / "ore"))
    with pytest.raises(ValueError, match="Net_train.ckpt"):
        _model().train(2, make_batches(2), callbacks=[cb])
    cb._uninstall()
    signal.signal(signal.SIGTERM, before)
    evil(tmp_path / "ore" / "Net_eval.ckpt")
    evaluator = Model(make_net(), nn.CrossEntropyLoss(), metrics={"acc"},
                      trainer={"logger": False})
    with pytest.raises(ValueError, match="Net_eval.ckpt"):
        evaluator.eval(make_batches(2), callbacks=[OnRequestExit(directory=str(tmp_path / "ore"))])
    signal.signal(signal.SIGTERM, before)


def test_dim_reduce_weight_dir_refuses(tmp_path: Path, evil: Any) -> None:
    net = make_net()
    (tmp_path / "w").mkdir()
    torch.save({"network": net.state_dict()}, tmp_path / "w" / "a.ckpt")  # a good one first
    path = evil(tmp_path / "w" / "b.ckpt")
    with pytest.raises(ValueError, match="b.ckpt"):
        load_weight_vectors(tmp_path / "w", net)
    with pytest.raises(ValueError, match="b.ckpt"):
        get_pca_matrix(net, 2, weight_load_dir=tmp_path / "w")
    assert path.is_file()


def test_dim_reduce_pca_npy_refuses_object_arrays(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    path = tmp_path / "pca.npy"
    np.save(path, np.array([_Evil(str(marker))], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="pca.npy"):
        get_pca_matrix(make_net(), 2, pca_mat_path=path)
    assert not marker.exists()


def test_load_published_refuses(tmp_path: Path, evil: Any) -> None:
    from lit_amp.rec.serving.reader import load_published

    evil(tmp_path / "pub" / "weights-1.pt")
    (tmp_path / "pub" / "LATEST").write_text("weights-1.pt")
    with pytest.raises(ValueError, match="weights-1.pt"):
        load_published(tmp_path / "pub", make_net())


def test_lightning_checkpoint_paths_refuse(tmp_path: Path, evil: Any) -> None:
    import lightning as L

    path = evil(tmp_path / "lit.ckpt")
    net = make_net()
    lit = LitModel(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.1))
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(Exception, match="weights_only|Unsupported global|GLOBAL"):
        trainer.fit(lit, make_batches(2), ckpt_path=str(path))
    with pytest.raises(Exception, match="weights_only|Unsupported global|GLOBAL"):
        LitModel.load_from_checkpoint(str(path), network=make_net())


def test_trusted_lit_amp_checkpoints_still_load(tmp_path: Path) -> None:
    """The safe loaders still read what lit_amp itself writes (no false refusals)."""
    from lit_amp import save_checkpoint

    m = _model()
    m.train(1, make_batches(2))
    p = save_checkpoint(m.train_network, str(tmp_path / "ok"))
    fresh = _model()
    load_checkpoint(p, fresh.train_network)
    a = {k: v for k, v in m.train_network.state_dict().items()}
    b = fresh.train_network.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert os.path.isfile(p)
