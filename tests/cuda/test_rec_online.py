"""``RecModel.online_train`` on the device: a short stream of files with one malformed row.

A ``DirectorySource`` over three shards of synthetic clicks, one row with an impossible label:
every good record is trained exactly once, in order, on the device, in sink mode (each batch one
epoch, MindSpore Rec's rule off the CPU); the bad row is counted and written to the dead-letter
file with its position; the stream ends after its idle timeout.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from lit_amp.callbacks import Callback
from lit_amp.rec import RecModel, WideDeep
from lit_amp.rec.sources import DirectorySource, SyntheticClickSource, write_shard

pytestmark = pytest.mark.cuda


PER_FILE = 8


class _Steps(Callback):
    def __init__(self, net: nn.Module) -> None:
        self.net = net
        self.ids: list[int] = []
        self.where: set[tuple[str, str]] = set()
        self.losses: list[float] = []
        self.epochs: list[int] = []

    def on_train_epoch_end(self, run_context) -> None:
        self.epochs.append(int(run_context.original_args().cur_epoch_num))

    def on_train_step_end(self, run_context) -> None:
        cb = run_context.original_args()
        self.ids.extend(cb.train_dataset_element[0]["record_id"].tolist())
        loss = cb.net_outputs
        param = next(self.net.parameters())
        self.where.add((loss.device.type, param.device.type))
        self.losses.append(float(loss))


def test_online_train_on_the_device_dead_letters_a_bad_row(tmp_path, monkeypatch, device,
                                                           on_cuda, accelerator):
    if not on_cuda:  # CPU mode runs the device's path: sink mode (the CPU falls back)
        monkeypatch.setattr(RecModel, "_sink_supported", lambda self: True)
    gen = SyntheticClickSource(batch_size=PER_FILE, seed=1, vocab_size=64)
    for i in range(3):
        cols = gen.columns(i)
        if i == 1:
            cols["label"][2] = 5.0  # record 10: a label that is neither 0 nor 1
        write_shard(tmp_path, f"part-{i:06d}", cols, "npz")
    src = DirectorySource(tmp_path, batch_size=PER_FILE, max_idle_s=0)
    torch.manual_seed(0)
    net = WideDeep(vocab_size=64, embed_dim=4, hidden=(16,))
    model = RecModel(net, nn.BCEWithLogitsLoss(), torch.optim.Adam(net.parameters(), lr=1e-2),
                     trainer=accelerator)
    steps = _Steps(net)
    summary = model.online_train(src, callbacks=steps)  # sink mode: each batch one epoch
    assert steps.epochs == [1, 2, 3]
    good = [i for i in range(3 * PER_FILE) if i != 10]
    assert summary.records == len(good) and summary.steps == 3, summary
    assert summary.stop_reason == "idle_timeout" and summary.skipped_steps == 0
    assert steps.ids == good  # every good record once, in stream order
    assert steps.where == {(device.type, device.type)}  # the step ran on the device
    assert all(torch.isfinite(torch.tensor(v)) for v in steps.losses)
    assert src.malformed == 1
    (line,) = (tmp_path / "_dead_letter.jsonl").read_text().splitlines()
    dead = json.loads(line)
    assert dead["position"] == {"file": "part-000001.npz", "row": 2}
    assert json.loads(dead["record"])["id"] == 10 and "label" in dead["error"]
    assert all(torch.isfinite(p).all() for p in net.parameters())
