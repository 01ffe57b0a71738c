"""Benchmark: the online fault suite at recommendation scale (kill -9 and SIGTERM at 26 M rows).

The heavy cases of ``tests/faults`` run here instead of in ``make test``. A worker process
trains the scale axis's Wide&Deep of ``python -m bench.online`` (26 x ``--vocab`` hashed rows,
sparse gradients, LazyAdam) with ``RecModel.online_train`` from a ``DirectorySource`` that deletes
consumed files, background checkpoints every ``--ckpt-every`` s and delta publishes every 2 s
(a background full snapshot every ``--full-every`` publishes). A producer process writes
Criteo-like one-batch ``.npz`` files at ``--rate`` records/s; every 50th file holds a poison
row (label 7 or a NaN count). In a seeded random order the worker is killed with SIGKILL
at a random step, SIGKILL while a background checkpoint is being written, SIGKILL while a
full snapshot is being published, and stopped with SIGTERM; a last run then trains until
the stream is idle. Checked, and the run fails otherwise:

- every run resumes from the newest durable checkpoint; no torn checkpoint is ever listed;
- nothing is lost (every valid record trained), no poison row trained, all dead-lettered;
- duplicates are exactly the records trained after the checkpoint a kill -9 rolled back to,
  and none after SIGTERM;
- after every kill a server loads a whole version (never part of a delta), the newest or the
  one just after the newest the trainer reported; at the end it serves exactly the trained
  weights (CRC32 of every tensor).

    .venv/bin/python -m bench.online.faults                   # 26 x 10^6 rows, ~6 min
    .venv/bin/python -m bench.online.faults --vocab 10000     # a quick look
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import logging
import multiprocessing as mp
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bench._common import parser, write_result
from bench.online.workload import CriteoLike, scale_model
from lit_amp.callbacks import Callback
from lit_amp.rec import CheckpointOptions, PublishOptions, RecModel
from lit_amp.rec.online.checkpoint_files import list_checkpoints
from lit_amp.rec.serving.reader import load_published
from lit_amp.rec.sources import DirectorySource, write_shard

POISON_EVERY = 50
KINDS = ("step", "checkpoint", "publish", "sigterm")


# ---------------------------------------------------------------------------- the worker
class LogIds(Callback):
    """After every step appends ``step unix-time id id ...`` to the log."""

    def __init__(self, path: str) -> None:
        self.f = open(path, "a", buffering=1)

    def on_train_step_end(self, run_context) -> None:
        cb = run_context.original_args()
        ids = cb.train_dataset_element[0]["record_id"].tolist()
        self.f.write(f"{cb.cur_step_num} {time.time():.3f} {' '.join(map(str, ids))}\n")


def crcs(state: dict) -> dict:
    """CRC32 of the bytes of every tensor of a state dict."""
    out = {}
    for k, t in state.items():
        b = t.detach().contiguous().reshape(-1).view(torch.uint8)
        c = 0
        for at in range(0, len(b), 1 << 26):
            c = zlib.crc32(memoryview(b[at:at + (1 << 26)].numpy()), c)
        out[k] = c
    return out


def worker(a: argparse.Namespace) -> None:
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    net, opt = scale_model(a.vocab, "lazyadam", collisionless=False)
    model = RecModel(net, nn.BCEWithLogitsLoss(), opt)
    src = DirectorySource(a.data, batch_size=a.batch, max_idle_s=a.idle, poll_interval=0.01,
                          delete_consumed=True)
    publog = open(a.publog, "a", buffering=1)

    def hook(info: dict) -> None:
        version = int(re.findall(r"\d+", os.path.basename(info["path"]))[-1])
        publog.write(f"{version} {info['kind']} {info['step']}\n")

    summary = model.online_train(
        src, callbacks=[LogIds(a.log)], dataset_sink_mode=False,
        checkpoint=CheckpointOptions(a.ckpt, ckpt_every_n_seconds=a.ckpt_every,
                                     keep_checkpoint_max=2,
                                     full_every_n_checkpoints=int(a.ckpt_full_every)),
        publish=PublishOptions(a.publish, publish_every_n_seconds=2.0, delta=True,
                               full_every_n_publishes=a.full_every, keep_published_max=2,
                               publish_hook=hook),
    )
    out = {**dataclasses.asdict(summary), "crcs": crcs(net.state_dict())}
    print("SUMMARY " + json.dumps(out, default=str), flush=True)


# ---------------------------------------------------------------------------- the producer
def poison_ids(files: int, batch: int) -> set[int]:
    """The record ids the producer made poison in its first ``files`` files."""
    return {i * batch + i % batch for i in range(files) if i % POISON_EVERY == 7}


def produce(data: str, batch: int, rate: float, stop: Any, written: Any) -> None:
    """One-batch Criteo-like files at ``rate`` records/s until ``stop``; every
    ``POISON_EVERY``-th file has one poison row (label 7 or a NaN count)."""
    torch.set_num_threads(1)
    gen = CriteoLike(batch, new_frac=0.02)
    t0, i = time.monotonic(), 0
    while not stop.is_set():
        wait = t0 + i * batch / rate - time.monotonic()
        if wait > 0:
            stop.wait(wait)
            continue
        cols = gen.columns(i)
        if i % POISON_EVERY == 7:
            j = i % batch
            if (i // POISON_EVERY) % 2:
                cols["label"][j] = 7.0
            else:
                cols["dense"][j, 3] = np.nan
        write_shard(data, f"part-{i:09d}", cols, "npz")
        i += 1
        written.value = i


# ---------------------------------------------------------------------------- the driver
@dataclasses.dataclass
class Dirs:
    root: Path

    def __post_init__(self) -> None:
        for name in ("data", "ckpt", "publish"):
            (self.root / name).mkdir(parents=True, exist_ok=True)
        self.data, self.ckpt, self.publish = (self.root / n for n in ("data", "ckpt", "publish"))
        self.log, self.publog = self.root / "trained.log", self.root / "published.log"


def ckpt_step(path: str | None) -> int:
    return int(re.findall(r"\d+", os.path.basename(path))[-1]) if path else 0


def temp_bytes(folder: Path, prefix: str) -> int:
    """Size of the biggest temp file ``.tmp-lit_amp-{prefix}*`` in ``folder`` (0: none)."""
    sizes = [0]
    for e in os.scandir(folder):
        if e.name.startswith(f".tmp-lit_amp-{prefix}"):
            try:
                sizes.append(e.stat().st_size)
            except FileNotFoundError:
                pass
    return max(sizes)


class Tail:
    """Counts the complete lines appended to the trained log since it was made."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.lines, self._part = path, 0, 0, b""
        if path.exists():
            self.offset = path.stat().st_size

    def poll(self) -> int:
        if self.path.exists():
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
            self.offset += len(chunk)
            data = self._part + chunk
            self.lines += data.count(b"\n")
            self._part = data[data.rfind(b"\n") + 1:]
        return self.lines


def vm_hwm(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Due:
    """Whether a run's fault is due. First this run writes ``own`` durable checkpoints of its
    own (its first is whole; with row increments the second is one); then ``steps`` more
    steps, or a checkpoint (a full snapshot) a quarter written."""

    def __init__(self, kind: str, d: Dirs, steps: int, sizes: dict, durable: list,
                 own: int = 1) -> None:
        self.kind, self.d, self.steps, self.sizes, self.own = kind, d, steps, sizes, own
        self.durable, self.tail, self.base = set(durable), Tail(d.log), None

    def __call__(self) -> bool:
        lines = self.tail.poll()
        if self.base is None:
            if len(set(list_checkpoints(self.d.ckpt)) - self.durable) >= self.own:
                self.base = lines
            return False
        if self.kind == "checkpoint":
            # a quarter of a whole checkpoint, or 256 MB: a row increment may be smaller
            return temp_bytes(self.d.ckpt, "online-") >= min(self.sizes["ckpt"] // 4, 256 << 20)
        if self.kind == "publish":
            return temp_bytes(self.d.publish, "full-") >= self.sizes["full"] // 4
        return lines - self.base >= self.steps


def fault_run(kind: str, d: Dirs, cmd: list[str], steps: int, sizes: dict,
              before: int | None, own: int = 1, timeout: float = 600.0) -> dict:
    """Start the worker, deliver ``kind``'s fault once due; what was on disk at that moment."""
    durable = list_checkpoints(d.ckpt)
    due = Due(kind, d, steps, sizes, durable, own)
    start = {"log": due.tail.offset, "publog": d.publog.stat().st_size if d.publog.exists() else 0,
             "time": time.time()}
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        while not due():
            if proc.poll() is not None:
                raise RuntimeError(f"the worker exited before the {kind} fault:\n"
                                   + proc.stdout.read().decode()[-3000:])
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"the {kind} fault was not due within {timeout:.0f} s")
            time.sleep(0.005)
        at = {"ckpt_temp_bytes": temp_bytes(d.ckpt, "online-"),
              "full_temp_bytes": temp_bytes(d.publish, "full-")}
        hwm = vm_hwm(proc.pid)
        proc.send_signal(signal.SIGTERM if kind == "sigterm" else signal.SIGKILL)
        out = proc.communicate(timeout=300)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
    if kind == "sigterm":
        summary = json.loads(out.split("SUMMARY ", 1)[1].splitlines()[0])
        if proc.returncode != 0 or summary["stop_reason"] != "signal:SIGTERM":
            raise RuntimeError(f"SIGTERM did not stop the run cleanly:\n{out[-3000:]}")
    cut_partial_line(d.log)  # a kill -9 may cut the last line: it is not a trained batch
    return {"kind": kind, "wall_s": time.monotonic() - t0, "durable_before": durable,
            "durable_after": list_checkpoints(d.ckpt), "peak_rss_bytes": hwm, **at,
            "start": start, "served": served(d, start["publog"], before)}


def cut_partial_line(log: Path) -> None:
    if log.exists():
        raw = log.read_bytes()
        with open(log, "r+b") as f:
            f.truncate(raw.rfind(b"\n") + 1)


def served(d: Dirs, publog_start: int, before: int | None) -> dict:
    """What a server loads now. The newest version the trainer reported in this run (or the
    one after it, written but not reported), unless a version whose full snapshot was being
    written (it has no delta) is newer: ``LATEST`` waits under it, so the version before it
    (``before``, what was served at the start, when it starts this run's chain)."""
    p = load_published(d.publish)
    if p["refused"] is not None:
        raise RuntimeError(f"the server refused a published file: {p['refused']}")
    lines = [x.split() for x in d.publog.read_bytes()[publog_start:].decode().splitlines()]
    logged = [(int(x[0]), x[1]) for x in lines if len(x) == 3]
    v, newest = p["version"], max((n for n, _ in logged), default=None)
    full = max((n for n, kind in logged if kind == "full"), default=None)
    if newest is None:
        want = [before]
    elif full is not None and v < full:
        want = [before if full == logged[0][0] else full - 1]
    else:
        want = [newest, newest + 1]
    if v not in want:
        raise RuntimeError(f"the server loads version {v}, not {want}: the trainer reported "
                           f"{logged[-3:]} last, and {before} was served before this run")
    return {"version": v, "full": p["full"], "logged_max": newest, "before": before}


def read_runs(log: Path, offsets: list[int]) -> list[list[tuple[int, float, list[int]]]]:
    """The trained log cut into runs at the byte ``offsets`` where each run started."""
    raw = log.read_bytes()
    bounds = [*offsets, len(raw)]
    runs = []
    for a, b in zip(bounds, bounds[1:]):
        run = []
        for line in raw[a:b].decode().splitlines(keepends=True):
            if line.endswith("\n"):
                step, t, *ids = line.split()
                run.append((int(step), float(t), [int(i) for i in ids]))
        runs.append(run)
    return runs


def check_resumes(results: list[dict], runs: list) -> list[int]:
    """Every run resumed from the newest durable checkpoint of its start; the resumed steps."""
    resumed = []
    for r, run in zip(results, runs):
        want = ckpt_step(r["durable_before"][-1] if r["durable_before"] else None)
        got = run[0][0] - 1
        if got != want:
            raise RuntimeError(f"a {r['kind']} run resumed at step {got}, not at the newest "
                               f"durable checkpoint's step {want}")
        r["resumed_step"], r["first_step_s"] = got, run[0][1] - r["start"]["time"]
        r["resumed_from_increment"] = bool(r["durable_before"]) and \
            r["durable_before"][-1].endswith("-rows.ckpt")
        resumed.append(got)
    return resumed


def check_records(results: list[dict], runs: list, files: int, batch: int, d: Dirs) -> dict:
    """Nothing lost, no poison trained, duplicates exactly the rolled-back records."""
    resumed = check_resumes(results, runs)
    redone = 0
    for i, r in enumerate(results[:-1]):
        back = resumed[i + 1]
        r["redone_records"] = sum(len(ids) for s, _, ids in runs[i] if s > back)
        r["steps"] = len(runs[i])
        if r["kind"] == "sigterm" and back != runs[i][-1][0]:
            raise RuntimeError("the run after SIGTERM did not resume at its last step")
        redone += r["redone_records"]
    counts = collections.Counter(i for run in runs for _, _, ids in run for i in ids)
    poison = poison_ids(files, batch)
    valid = set(range(files * batch)) - poison
    lost, bad = valid - set(counts), poison & set(counts)
    unknown = set(counts) - valid - poison
    dup = sum(c - 1 for c in counts.values())
    if lost or bad or unknown or dup != redone:
        raise RuntimeError(f"lost {len(lost)}, poison trained {len(bad)}, unknown "
                           f"{len(unknown)}, duplicated {dup} (rolled back: {redone})")
    dead = [json.loads(x) for x in (d.data / "_dead_letter.jsonl").read_text().splitlines()]
    got = {(e["position"]["file"], e["position"]["row"]) for e in dead}
    want = {(f"part-{i // batch:09d}.npz", i % batch) for i in poison}
    if got != want:
        raise RuntimeError(f"dead letters {sorted(got ^ want)[:5]} differ from the poison rows")
    return {"records_produced": files * batch, "records_trained": sum(counts.values()),
            "distinct_trained": len(counts), "poison_rows": len(poison),
            "dead_letters": len(dead), "duplicated": dup, "rolled_back": redone}


def final_run(d: Dirs, cmd: list[str]) -> dict:
    """The last run, until the stream is idle; the server must serve its weights exactly."""
    start = {"log": d.log.stat().st_size, "publog": d.publog.stat().st_size, "time": time.time()}
    before = list_checkpoints(d.ckpt)
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, timeout=1800)
    out = (done.stdout + done.stderr).decode()
    if done.returncode != 0 or "SUMMARY " not in out:
        raise RuntimeError(f"the last run failed:\n{out[-3000:]}")
    summary = json.loads(out.split("SUMMARY ", 1)[1].splitlines()[0])
    if summary["stop_reason"] != "idle_timeout":
        raise RuntimeError(f"the last run stopped on {summary['stop_reason']}")
    p = load_published(d.publish)
    got = crcs(p["network"])
    differ = sorted(k for k in summary["crcs"] if got.get(k) != summary["crcs"][k])
    if differ or set(got) != set(summary["crcs"]):
        raise RuntimeError(f"the served weights differ from the trained ones: {differ[:5]}")
    return {"kind": "final", "wall_s": time.monotonic() - t0, "durable_before": before,
            "start": start, "served": {"version": p["version"], "full": p["full"]},
            "tensors_served_equal": len(got), "steps_total": summary["total_steps"]}


def run_suite(a: argparse.Namespace) -> dict:
    root = Path(tempfile.mkdtemp(prefix="lit_amp_bench_faults_"))
    d = Dirs(root)
    cmd = [sys.executable, "-m", "bench.online.faults", "--worker", "--vocab", str(a.vocab),
           "--batch", str(a.batch), "--ckpt-every", str(a.ckpt_every), "--full-every",
           str(a.full_every), "--ckpt-full-every", str(a.ckpt_full_every),
           "--idle", str(a.idle), "--data", str(d.data), "--ckpt",
           str(d.ckpt), "--publish", str(d.publish), "--log", str(d.log), "--publog",
           str(d.publog)]
    table = 26 * a.vocab * 17 * 4
    sizes = {"full": table, "ckpt": 3 * table}
    rng = random.Random(a.seed)
    kinds = list(KINDS)
    rng.shuffle(kinds)
    ctx = mp.get_context("spawn")
    stop, written = ctx.Event(), ctx.Value("q", 0)
    prod = ctx.Process(target=produce, args=(str(d.data), a.batch, a.rate, stop, written))
    prod.start()
    try:
        results = []
        for kind in kinds:
            steps = rng.randint(a.min_steps, 2 * a.min_steps)
            print(f"run {len(results) + 1}: {kind} ...", flush=True)
            before = results[-1]["served"]["version"] if results else None
            results.append(fault_run(kind, d, cmd, steps, sizes, before, a.own_checkpoints))
        stop.set()
        prod.join()
        print("last run, until the stream is idle ...", flush=True)
        results.append(final_run(d, cmd))
        runs = read_runs(d.log, [r["start"]["log"] for r in results])
        totals = check_records(results, runs, written.value, a.batch, d)
    finally:
        stop.set()
        prod.join(timeout=30)
        shutil.rmtree(root, ignore_errors=True)
    through = sum(r["resumed_from_increment"] for r in results)
    if a.own_checkpoints > 1 and a.ckpt_full_every > 1 and not through:
        raise RuntimeError("no run resumed from a row increment: the increments were not tested")
    for r in results:
        r["durable_before"] = [os.path.basename(p) for p in r["durable_before"]]
        r["durable_after"] = [os.path.basename(p) for p in r.get("durable_after", [])]
    return {"vocab": a.vocab, "rows": 26 * a.vocab, "seed": a.seed,
            "ckpt_full_every": a.ckpt_full_every, "own_checkpoints": a.own_checkpoints,
            "resumed_from_increment": through, "order": kinds,
            "runs": results, **totals}


def main() -> None:
    ap = parser(__doc__, doc_option=False)
    ap.add_argument("--vocab", type=int, default=1_000_000, help="rows per feature")
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=20_000.0, help="records/s produced")
    ap.add_argument("--ckpt-every", type=float, default=20.0, help="seconds")
    ap.add_argument("--full-every", type=int, default=5, help="publishes")
    ap.add_argument("--ckpt-full-every", type=int, default=1,
                    help="checkpoints: one in this many whole, the others row increments")
    ap.add_argument("--own-checkpoints", type=int, default=1,
                    help="durable checkpoints a run writes before its fault (2 with "
                    "--ckpt-full-every 3: the next run resumes from a row increment)")
    ap.add_argument("--idle", type=float, default=5.0, help="the worker's max_idle_s")
    ap.add_argument("--min-steps", type=int, default=100, help="a step fault: steps, at least")
    ap.add_argument("--seed", type=int, default=26)
    ap.add_argument("--variant", default=None,
                    help="label a trial run in the history of bench/results/online_faults.json")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for name in ("data", "ckpt", "publish", "log", "publog"):
        ap.add_argument(f"--{name}", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a)
        return
    result = run_suite(a)
    for r in result["runs"]:
        print(f"{r['kind']:>10}: resumed at step {r['resumed_step']}"
              f"{' (a row increment)' if r['resumed_from_increment'] else ''}, first step after "
              f"{r['first_step_s']:.1f} s, rolled back {r.get('redone_records', 0):,} records, "
              f"served version {r['served']['version']}")
    print(f"{result['records_produced']:,} produced, {result['distinct_trained']:,} trained, "
          f"{result['duplicated']:,} duplicated (= rolled back), {result['dead_letters']} "
          f"dead letters for {result['poison_rows']} poison rows")
    print("written:", write_result("online_faults", result, variant=a.variant))


if __name__ == "__main__":
    main()
