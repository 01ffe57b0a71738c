"""DDP over a stream (2 CPU processes, gloo): ranks whose shards hold different numbers of
batches step the same number of times (a dry rank on zero-weight fillers) until every record
is trained, without the known hang; consumed files are deleted per shard once a checkpoint
covers them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lit_amp.rec.online.checkpoint_files import list_checkpoints
from lit_amp.rec.serving.reader import load_published
from lit_amp.rec.sources import SyntheticClickSource, shard_of, write_shard
from lit_amp.serialization import load_checkpoint
from tests.helpers.dist import free_port

pytestmark = pytest.mark.slow  # two trainer processes: ~10-30 s on a shared 2-core machine

WORKER = str(Path(__file__).with_name("_online_worker.py"))


def _uneven_files(directory: Path, per_shard: tuple[int, int], per_file: int) -> dict[int, list]:
    """Files whose names put ``per_shard[r]`` of them in rank r's shard; returns names by rank."""
    gen = SyntheticClickSource(batch_size=per_file, seed=0)
    names: dict[int, list[str]] = {0: [], 1: []}
    i = 0
    while any(len(names[r]) < per_shard[r] for r in (0, 1)):
        name = f"part-{i:06d}"
        r = shard_of(f"{name}.npz", 2)
        if len(names[r]) < per_shard[r]:
            write_shard(directory, name, gen.columns(i), "npz")
            names[r].append(f"{name}.npz")
        i += 1
    return names


def _reference(data: Path, lr: float, accumulate: int = 1) -> dict[str, torch.Tensor]:
    """The weights SGD reaches when each step averages the real batches of that step only
    (rank r's s-th batch is its shard's s-th; a dry rank adds nothing)."""
    from torch.nn.functional import binary_cross_entropy_with_logits as bce

    from lit_amp.rec import WideDeep
    from lit_amp.rec.sources import DirectorySource

    shards = [list(DirectorySource(data, batch_size=10, rank=r, world_size=2, max_idle_s=0))
              for r in (0, 1)]
    torch.manual_seed(0)
    net = WideDeep(vocab_size=64, embed_dim=4, hidden=(16,))
    opt = torch.optim.SGD(net.parameters(), lr)
    steps = max(len(b) for b in shards)
    for s in range(steps):
        if s % accumulate == 0:
            opt.zero_grad()
        real = [b[s] for b in shards if s < len(b)]
        loss = sum(bce(net(x), y) for x, y in real) / len(real)
        (loss / accumulate).backward()
        if s % accumulate == accumulate - 1 or s == steps - 1:
            if s % accumulate != accumulate - 1:  # the open window at the stream's end
                for p in net.parameters():
                    if p.grad is not None:
                        p.grad *= accumulate / (s % accumulate + 1)
            opt.step()
    return net.state_dict()


def _assert_same_weights(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k in want:
        assert torch.allclose(got[k], want[k], rtol=1e-5, atol=1e-6), (
            k, (got[k] - want[k]).abs().max().item())


def _run_two_ranks(tmp_path: Path, extra: list[str]) -> list[dict]:
    """Both ranks of ``_online_worker.py`` under DDP; returns their summaries."""
    outs = _two_ranks(tmp_path, extra)
    assert all(rc == 0 for rc, _, _ in outs), "\n".join(
        f"--- rank {r} (exit {rc}):\n{(out + err)[-3000:]}" for r, (rc, out, err) in enumerate(outs)
    )
    return [json.loads(out.split("SUMMARY ", 1)[1].splitlines()[0]) for _, out, _ in outs]


def _two_ranks(tmp_path: Path, extra: list[str]) -> list[tuple[int, str, str]]:
    """Both ranks of ``_online_worker.py`` under DDP: ``(exit status, stdout, stderr)`` each."""
    data, ckpt, log = tmp_path / "data", tmp_path / "ckpt", tmp_path / "trained.log"
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "LOCAL_RANK": str(rank),
            "NODE_RANK": "0",
            "WORLD_SIZE": "2",
            "OMP_NUM_THREADS": "1",
        }
        cmd = [
            sys.executable,
            WORKER,
            "--data",
            str(data),
            "--ckpt",
            str(ckpt),
            "--log",
            str(log),
            "--batch",
            "10",
            "--ckpt-every",
            "1",
            "--max-idle",
            "0.5",
            "--ddp",
            "2",
            *extra,
        ]
        procs.append(
            subprocess.Popen(
                cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        )
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=150)  # a hang fails here
            outs.append((p.returncode, out.decode(), err.decode()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return outs


def test_ddp_on_an_uneven_finite_stream_trains_every_record_once(tmp_path):
    """#18 item 12: rank 1's shard (2 files) runs dry first; it steps on zero-weight fillers
    until rank 0's 5 files are trained, so every record is trained exactly once and both
    ranks end with the stream exhausted (before: rank 0's last 3 files were never trained and
    a restart trained 0 steps)."""
    data, ckpt = tmp_path / "data", tmp_path / "ckpt"
    names = _uneven_files(data, per_shard=(5, 2), per_file=10)
    summaries = _run_two_ranks(tmp_path, ["--delete-consumed"])
    assert [s["steps"] for s in summaries] == [5, 5]  # equal steps: fillers on rank 1
    assert [s["records"] for s in summaries] == [50, 20]
    assert [s["stop_reason"] for s in summaries] == ["idle_timeout"] * 2
    logs = [[line.split()[1:] for line in (tmp_path / f"trained.log.rank{r}").read_text()
             .splitlines()] for r in (0, 1)]
    assert [len(x) for x in logs] == [5, 5]
    assert [len(ids) for ids in logs[1]] == [10, 10, 0, 0, 0]  # callbacks see empty fillers
    trained = [int(i) for rank in logs for ids in rank for i in ids]
    assert len(trained) == len(set(trained)) == 70  # every record once
    state = torch.load(list_checkpoints(ckpt)[-1], weights_only=False)
    cursors = state["online"]["cursors"]
    assert state["online"]["world_size"] == 2 and state["online"]["step"] == 5
    assert cursors[0]["done"] == sorted(names[0])
    assert cursors[1]["done"] == sorted(names[1])
    # delete_consumed under DDP: each rank deleted the files of its shard once a checkpoint
    # counted them as consumed: all of them
    assert sorted(p.name for p in data.iterdir() if p.name.startswith("part-")) == []


def test_ddp_validation_on_held_out_windows_of_an_uneven_stream(tmp_path):
    """Every step validates on the next batch of each rank's shard; rank 1's shard runs dry
    first, so at some validation it has no batch to hold out while rank 0 has one: both
    must still evaluate together (metrics and loss are reduced across ranks) and finish."""
    names = _uneven_files(tmp_path / "data", per_shard=(5, 2), per_file=10)
    assert len(names[1]) == 2
    summaries = _run_two_ranks(tmp_path, ["--valid-every", "1"])
    assert [s["steps"] for s in summaries] == [5, 5]  # rank 1 steps on fillers after 2
    evals = [(tmp_path / f"trained.log.rank{r}.eval").read_text().splitlines() for r in (0, 1)]
    # one validation per step on both ranks, with the same (reduced) values on both; each
    # line starts with the number of batches that rank evaluated
    assert len(evals[0]) == len(evals[1]) == 4  # at step 5 no rank has a batch to hold out
    counts = [[int(line.split()[0]) for line in e] for e in evals]
    assert counts == [[1, 1, 1, 1], [1, 0, 0, 0]]  # rank 1 ran dry after its first step
    values = [[line.split(None, 1)[1] for line in e] for e in evals]
    assert values[0] == values[1]
    assert all("auc=" in v and "loss=" in v for v in values[0])


@pytest.mark.parametrize("loss", ["module", "function"])
def test_ddp_filler_steps_do_not_dilute_the_real_gradient(tmp_path, loss):
    """#18: while rank 1 steps on fillers, rank 0's real loss is scaled by world / ranks with
    data, so the update is the mean over the real batches (before: DDP averaged rank 0's
    gradient with the filler's zero, and steps 3-5 trained with half the gradient)."""
    data = tmp_path / "data"
    _uneven_files(data, per_shard=(5, 2), per_file=10)
    want = _reference(data, lr=0.5)
    extra = ["--sgd", "0.5", "--save-weights", str(tmp_path / "final.pt")]
    summaries = _run_two_ranks(tmp_path, extra + (["--loss-function"] if loss == "function"
                                                  else []))
    assert [s["steps"] for s in summaries] == [5, 5]
    assert [s["records"] for s in summaries] == [50, 20]
    _assert_same_weights(torch.load(tmp_path / "final.pt", weights_only=True), want)


def test_ddp_a_rank_with_no_data_lets_the_others_train_everything(tmp_path):
    """#18: rank 1's part of the stream is empty from the start; it steps on fillers shaped
    like rank 0's batches, so rank 0 trains all its records, once (before: both ranks stopped
    at once, 0 steps, every record left untrained)."""
    data = tmp_path / "data"
    names = _uneven_files(data, per_shard=(4, 0), per_file=10)
    want = _reference(data, lr=0.5)
    summaries = _run_two_ranks(tmp_path, ["--sgd", "0.5", "--save-weights",
                                          str(tmp_path / "final.pt")])
    assert [s["steps"] for s in summaries] == [4, 4]
    assert [s["records"] for s in summaries] == [40, 0]
    assert [s["stop_reason"] for s in summaries] == ["idle_timeout"] * 2
    ids = [int(i) for line in (tmp_path / "trained.log.rank0").read_text().splitlines()
           for i in line.split()[1:]]
    assert len(ids) == len(set(ids)) == 40  # every record of rank 0's part, once
    assert all(len(line.split()) == 1 for line in
               (tmp_path / "trained.log.rank1").read_text().splitlines())  # fillers: 0 rows
    _assert_same_weights(torch.load(tmp_path / "final.pt", weights_only=True), want)
    state = torch.load(list_checkpoints(tmp_path / "ckpt")[-1], weights_only=False)
    assert state["online"]["cursors"][0]["done"] == sorted(names[0])


def test_ddp_an_open_accumulation_window_at_the_stream_end_is_applied_on_every_rank(tmp_path):
    """#18: grad_accumulation_step=2 over shards of 3 and 2 files: windows [1, 2] and [3];
    at the stream's end the open window (rank 0's third batch, rank 1 on a filler) is
    averaged over the ranks, scaled by 2/1 and applied on both ranks, and its records count
    (before: rank 0's third batch was neither applied nor counted: records [20, 20])."""
    data = tmp_path / "data"
    _uneven_files(data, per_shard=(3, 2), per_file=10)
    want = _reference(data, lr=0.5, accumulate=2)
    summaries = _run_two_ranks(tmp_path, ["--sgd", "0.5", "--accumulate", "2",
                                          "--save-weights", str(tmp_path / "final.pt")])
    assert [s["steps"] for s in summaries] == [3, 3]
    assert [s["records"] for s in summaries] == [30, 20]  # rank 0's third batch counted
    _assert_same_weights(torch.load(tmp_path / "final.pt", weights_only=True), want)


def test_ddp_delta_publishing_serves_exactly_the_trained_weights(tmp_path):
    """Under DDP, rank 0 publishes full snapshots (in the background) and deltas of the rows
    every rank's gradients changed (DDP averages them, so rank 0's tables hold every rank's
    updates); a reader replaying them gets the final weights bit for bit. Its checkpoint of
    step 8 is a row increment of the rows every rank's gradients changed: read through its
    chain it holds rank 0's weights of step 8."""
    _uneven_files(tmp_path / "data", per_shard=(5, 4), per_file=20)
    pub = tmp_path / "pub"
    summaries = _run_two_ranks(tmp_path, ["--delta-publish", str(pub), "--save-weights",
                                          str(tmp_path / "w.pt"), "--full-every", "2",
                                          "--save-weights-at", "8"])
    increment = tmp_path / "ckpt" / "online-000000000008-rows.ckpt"
    at8, state = torch.load(tmp_path / "w.pt.step"), load_checkpoint(str(increment))
    assert at8.keys() == state["network"].keys()
    assert all(torch.equal(state["network"][k], at8[k]) for k in at8)
    assert [s["steps"] for s in summaries] == [10, 10]  # 5 files of 2 batches on rank 0
    served, trained = load_published(pub), torch.load(tmp_path / "w.pt")
    assert served["step"] == 10 and served["refused"] is None
    assert served["version"] > served["full"]  # the newest version is a delta on a full one
    assert served["network"].keys() == trained.keys()
    assert all(torch.equal(served["network"][k], trained[k]) for k in trained)
    names = sorted(p.name for p in pub.iterdir())
    assert any(n.startswith("delta-") for n in names) and any(n.startswith("full-") for n in names)


def test_ddp_a_failed_publish_on_rank_0_stops_every_rank(tmp_path):
    """Rank 0's disk fills up: after the first full snapshot and a delta, the next delta's
    write (by the thread) fails. Both ranks stop with an error that says so, at the same step,
    instead of rank 1 waiting for rank 0 in a collective."""
    _uneven_files(tmp_path / "data", per_shard=(5, 4), per_file=20)
    outs = _two_ranks(tmp_path, ["--delta-publish", str(tmp_path / "pub"),
                                 "--fail-publish-after", "2"])
    (rc0, out0, err0), (rc1, out1, err1) = outs
    assert rc0 != 0 and rc1 != 0, (out0 + err0)[-2000:] + (out1 + err1)[-2000:]
    assert "No space left on device (the test's full disk)" in err0
    assert "another rank failed to publish" in err1
    assert "SUMMARY" not in out0 + out1
    trained = [len(Path(f"{tmp_path}/trained.log.rank{r}").read_text().splitlines())
               for r in (0, 1)]
    assert trained[0] == trained[1] < 10  # the ranks stopped at the same step, early
