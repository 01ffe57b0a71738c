"""One harness for multi-process tests: gloo on CPU, forked workers, results gathered.

``run_distributed(worker, world=2, args=(...))`` spawns ``world`` processes; each calls
``worker(rank, world, *args)`` inside an initialised gloo process group (torch-level; for
Lightning-level tests the worker builds its own ``Trainer`` with ``strategy="ddp"`` and the
group is already there) and returns a picklable value. The values come back as a list
indexed by rank. A worker that raises fails the test with the worker's traceback. Every rank
barriers before the group is destroyed, so no rank tears gloo down while another still talks.

Workers are forked from a forkserver that imported torch and Lightning once for the whole
session (a spawned worker spent ~5 s of CPU importing them: most of a small test's time);
each worker takes the caller's environment, so ``monkeypatch.setenv`` reaches it as with
``spawn``.

Example::

    def _worker(rank, world, scale):
        t = torch.tensor([float(rank)]) * scale
        torch.distributed.all_reduce(t)
        return t.item()

    assert run_distributed(_worker, args=(2.0,)) == [2.0, 2.0]
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["free_port", "run_distributed"]

#: what the forkserver imports once (the workers fork from it with these loaded)
PRELOAD = ["torch", "lightning.pytorch", "tests.helpers.dist"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, worker: Callable[..., Any], args: tuple,
           out_dir: str, init_group: bool, env: dict[str, str]) -> None:
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    result: Any
    try:
        if init_group:
            dist.init_process_group("gloo", rank=rank, world_size=world)
        result = ("ok", worker(rank, world, *args))
    except BaseException:  # noqa: BLE001 - reported to the parent
        result = ("error", traceback.format_exc())
    finally:
        if dist.is_available() and dist.is_initialized():
            try:
                dist.barrier()
            finally:
                dist.destroy_process_group()
    import pickle

    with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)
    # leave without the interpreter's teardown: a gloo/c10d thread still joinable at static
    # destruction aborts the process ("terminate called without an active exception", seen
    # intermittently on this 2-core VM) after the result is already written
    os._exit(0)


def run_distributed(worker: Callable[..., Any], world: int = 2, args: tuple = (), *,
                    init_group: bool = True) -> list[Any]:
    """Run ``worker(rank, world, *args)`` on ``world`` processes; return per-rank values.

    Args:
        worker: a module-level (picklable) function.
        world: the number of processes.
        args: extra picklable arguments.
        init_group: initialise a gloo group before calling ``worker`` (False for workers that
            let Lightning create the group; ``MASTER_ADDR/PORT``, ``RANK``, ``WORLD_SIZE`` and
            ``LOCAL_RANK`` are set either way).
    """
    import pickle

    port = free_port()
    with tempfile.TemporaryDirectory() as out_dir:
        multiprocessing.set_forkserver_preload(PRELOAD)  # used when the server starts
        mp.start_processes(
            _entry, args=(world, port, worker, args, out_dir, init_group, dict(os.environ)),
            nprocs=world, join=True, start_method="forkserver")
        results = []
        for rank in range(world):
            with open(os.path.join(out_dir, f"rank{rank}.pkl"), "rb") as f:
                results.append(pickle.load(f))
    errors = [f"rank {r}:\n{v}" for r, (kind, v) in enumerate(results) if kind == "error"]
    if errors:
        raise AssertionError("a distributed worker failed:\n" + "\n".join(errors))
    return [v for _, v in results]


def write_rank_result(out: str, name: str, res: dict) -> None:
    """Write this rank's ``res`` to ``out/<name><rank>.json``; then leave the process group.

    For worker scripts that Lightning's launcher runs once per rank. Both ranks tear gloo down
    together: a rank exiting while the other still holds the group aborted now and then
    ("terminate called without an active exception").
    """
    import json

    rank = dist.get_rank() if dist.is_initialized() else 0
    with open(os.path.join(out, f"{name}{rank}.json"), "w") as f:
        json.dump(res, f)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
