"""Serve what ``online_train`` publishes as deltas: poll the folder, apply each new version.

The server loads the newest full snapshot and its deltas once, then every ``--interval``
seconds calls ``load_published(folder, net, since=payload)``: only the deltas published since
are read and applied to the serving network, in place (a new full snapshot is loaded whole).
A version is applied whole or not at all; a torn, missing or out-of-order delta is refused
(the log says which) and the server keeps the version before it.

    # train and serve side by side for 20 s (the trainer publishes a delta every second)
    .venv/bin/python examples/serve_published.py --seconds 20
    .venv/bin/python examples/serve_published.py --seconds 20 --collisionless

    # serve a folder another process publishes into (the same network arguments)
    .venv/bin/python examples/serve_published.py --serve-only PUBLISH_DIR
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import threading
import time

import torch
from torch import nn

from lit_amp.rec import LazyAdam, PublishOptions, RecModel, StopOptions, WideDeep
from lit_amp.rec.serving.reader import load_published
from lit_amp.rec.sources import SyntheticClickSource


def make_net(args: argparse.Namespace) -> WideDeep:
    return WideDeep(vocab_size=args.vocab_size, embed_dim=8, hidden=(64, 32), sparse=True,
                    collisionless=args.collisionless)


def serve(publish_dir: str, net: WideDeep, interval: float, stop: threading.Event) -> None:
    """Poll ``publish_dir`` and keep ``net`` at the newest complete version."""
    held_out = SyntheticClickSource(batch_size=2000, seed=1)  # the trained stream's model
    features, label = held_out.schema.to_batch(held_out.columns(10**7))  # never trained on
    payload = None
    while not stop.is_set():
        try:
            t0 = time.perf_counter()
            new = load_published(publish_dir, net, since=payload)
        except ValueError as exc:  # nothing published yet
            print(f"[server] waiting: {exc}")
            stop.wait(interval)
            continue
        if new is not payload:
            how = "loaded whole" if payload is None or new["full"] != payload["full"] \
                else f"{new['version'] - payload['version']} delta(s) applied"
            with torch.no_grad():
                p = torch.sigmoid(net.eval()(features))
            loss = nn.functional.binary_cross_entropy(p, label).item()
            lag = time.time() - new["published_at"]
            print(f"[server] version {new['version']} (step {new['step']}, full snapshot "
                  f"{new['full']}): {how} in {1e3 * (time.perf_counter() - t0):.0f} ms, "
                  f"{lag:.1f} s after publishing; held-out log loss {loss:.4f}"
                  + (f"; refused: {new['refused']}" if new.get("refused") else ""))
            payload = new
        stop.wait(interval)


def sizes(publish_dir: str) -> str:
    files = sorted(n for n in os.listdir(publish_dir) if n.endswith(".pt"))
    full = [os.path.getsize(os.path.join(publish_dir, n)) for n in files if n[0] == "f"]
    delta = [os.path.getsize(os.path.join(publish_dir, n)) for n in files if n[0] == "d"]
    mean = sum(delta) / len(delta) if delta else 0
    return (f"{len(full)} full snapshot(s) of {max(full, default=0) / 1e6:.1f} MB, "
            f"{len(delta)} delta(s) of {mean / 1e6:.2f} MB on average")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="training time")
    ap.add_argument("--interval", type=float, default=0.5, help="server poll interval (s)")
    ap.add_argument("--vocab-size", type=int, default=20_000, help="rows per feature")
    ap.add_argument("--collisionless", action="store_true", help="one row per distinct id")
    ap.add_argument("--serve-only", metavar="PUBLISH_DIR", help="only serve this folder")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    if args.serve_only:
        try:
            serve(args.serve_only, make_net(args), args.interval, stop)
        except KeyboardInterrupt:
            pass
        return
    publish_dir = tempfile.mkdtemp(prefix="serve_published-")
    torch.manual_seed(0)
    net = make_net(args)
    server = threading.Thread(target=serve, args=(publish_dir, make_net(args), args.interval,
                                                  stop), daemon=True)
    server.start()
    model = RecModel(net, nn.BCEWithLogitsLoss(), LazyAdam(net.parameters(), lr=1e-3))
    try:
        summary = model.online_train(
            SyntheticClickSource(batch_size=500, vocab_size=1_000_000, rate=5_000, seed=1),
            stop=StopOptions(max_time=args.seconds),
            publish=PublishOptions(publish_dir, publish_every_n_seconds=1.0, delta=True,
                                   full_every_n_publishes=10),
        )
    finally:
        time.sleep(2 * args.interval)  # let the server see the final version
        stop.set()
        server.join()
    print(f"trained {summary.records:,} records in {summary.steps} steps; published into "
          f"{publish_dir}: {sizes(publish_dir)}")


if __name__ == "__main__":
    main()
