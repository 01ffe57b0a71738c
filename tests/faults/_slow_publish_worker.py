"""A trainer publishing deltas whose background full snapshots are slow, for the kill -9 test.

Trains one sparse embedding table (SparseAdam: its rows copied on write) and publishes every
step with ``DeltaPublisher(background=True)`` (deltas written by a thread too, landed by
``poll`` between steps, as ``online_train`` does); after each publish appends ``version crc``
to ``--log`` (the CRC32 of the table's bytes at that version). With ``--slow S``, every full
snapshot after the first writes its path to ``--marker`` as it starts writing tensor bytes and
then sleeps ``S`` seconds. Prints ``SUMMARY {json}`` at the end.
"""

from __future__ import annotations

import argparse
import json
import time
import zlib
from pathlib import Path

import torch

from lit_amp._io import remove_stale_temps
from lit_amp.rec.serving import full_snapshots
from lit_amp.rec.serving.writer import DeltaPublisher

ROWS = 20_000


def slow_fulls(seconds: float, marker: str) -> None:
    checksum = full_snapshots._StreamChecksum.__call__
    fulls = []

    def slow(self, storage, chunk):
        if id(self) not in fulls:
            fulls.append(id(self))
            if len(fulls) >= 2:
                Path(marker).write_text(str(len(fulls)))
                time.sleep(seconds)
        return checksum(self, storage, chunk)

    full_snapshots._StreamChecksum.__call__ = slow


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--slow", type=float, default=0.0)
    ap.add_argument("--marker", default="")
    args = ap.parse_args()
    if args.slow:
        slow_fulls(args.slow, args.marker)
    torch.manual_seed(args.seed)
    emb = torch.nn.Embedding(ROWS, 8, sparse=True)
    opt = torch.optim.SparseAdam(emb.parameters(), lr=0.1)
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    removed = remove_stale_temps(args.dir)  # as online_train's publisher does at its start
    pub = DeltaPublisher(emb, args.dir, full_every_n_publishes=3, background=True)
    pub.attach(opt)
    with open(args.log, "a", buffering=1) as log:
        for step in range(1, args.steps + 1):
            opt.zero_grad()
            emb(torch.randint(0, ROWS, (64,))).pow(2).sum().backward()
            opt.step()
            pub.publish(step)
            crc = zlib.crc32(emb.weight.detach().numpy().tobytes())
            log.write(f"{pub.version} {crc}\n")
            time.sleep(0.02)
            pub.poll()
    pub.close()
    print("SUMMARY " + json.dumps({"version": pub.version, "removed": len(removed)}))


if __name__ == "__main__":
    main()
