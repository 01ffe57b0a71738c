"""GPU benchmark (b), issue #24: a host-bound model, where the framework's per-step cost shows.

MNIST-1D's MLP (``lit_amp.demos.MLP(40, 100, 100, 10)``), batch 100, synthetic data (4000
samples: 40 batches an epoch) moved to the device once, SGD(lr=0.05, momentum=0.9; capture-safe),
cross-entropy, fp32. Every variant reads the same batches through the same
``DataLoader(batches, batch_size=None)`` and starts from the same weights:

=============================  ================================================================
hand loop                      ``for x, y in loader: loss(net(x), y).backward(); opt.step()``
plain Lightning                LightningModule with automatic optimization, ``Trainer.fit``
Model.train (non-sink)         ``Model(net, loss, opt, trainer={gpu, 1}).train(epochs, loader)``
Model.train (sink, no graph)   ``dataset_sink_mode=True, sink_size=40``, ``lit_model.sink_graph
                               = False``
Model.train (sink, graph)      the same with ``sink_graph = "auto"`` (CUDA-graph capture of the
                               sink's step where allowed); ``sink_graph_status`` recorded
=============================  ================================================================

Whole epochs are timed (the first epoch / first two sinks of every call excluded), the device
synchronised only at the ends, variants interleaved, median of the rounds. A separate check
trains non-sink, sink without and sink with the graph for 3 epochs from the same weights and
records the final weights' max abs difference (identical computations give 0).

Target: Model.train (sink, graph) >= 2x plain Lightning's steps/s.

``sink_graph`` / ``sink_graph_status`` are read and set only when ``LitModel`` has them (the
graph variant is then the plain sink again, and the JSON says so).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _gpu  # noqa: E402
from lit_amp import Model  # noqa: E402
from lit_amp.demos import MLP  # noqa: E402

LR = 0.05
BATCH = 100
SINK_WARM = 2  # sinks excluded at the start of every sink call
GRAPH = "Model.train (sink, graph)"
PLAIN = "plain Lightning"
HAND = "hand loop"


def make_net() -> nn.Module:
    return MLP(40, 100, 100, 10)


def make_batches(device: torch.device, steps: int, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(steps * BATCH, 40, generator=g)
    y = torch.randint(0, 10, (steps * BATCH,), generator=g)
    return [(x[i:i + BATCH].to(device), y[i:i + BATCH].to(device))
            for i in range(0, steps * BATCH, BATCH)]


class PlainModule(pl.LightningModule):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net
        self.loss_fn = nn.CrossEntropyLoss()
        self._opt = _gpu.sgd(net, LR)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.loss_fn(self.net(x), y)

    def configure_optimizers(self):
        return self._opt


def set_graph(model: Model, value) -> bool:
    """``model.lit_model.sink_graph = value`` when LitModel has it; returns whether it does."""
    lit = model.lit_model
    if not hasattr(lit, "sink_graph"):
        return False
    lit.sink_graph = value
    return True


def graph_status(model: Model) -> dict | None:
    status = getattr(model.lit_model, "sink_graph_status", None)
    if status is None:
        return None
    try:
        return {str(k): (v if isinstance(v, (bool, int, float, str, type(None))) else str(v))
                for k, v in dict(status).items()}
    except (TypeError, ValueError):
        return {"repr": repr(status)}


def new_model(device: torch.device) -> Model:
    net = _gpu.seeded(make_net, device)
    return Model(net, nn.CrossEntropyLoss(), _gpu.sgd(net, LR),
                 trainer={"accelerator": _gpu.trainer_flags(device)["accelerator"], "devices": 1})


def build(batches: list, device: torch.device) -> tuple[dict, dict, dict]:
    spe = len(batches)  # steps per epoch
    dl = _gpu.loader(batches)
    epochs = lambda n: max(1, math.ceil(n / spe))  # noqa: E731
    runners, how, info = {}, {}, {}

    net = _gpu.seeded(make_net, device)
    opt = _gpu.sgd(net, LR)
    ce = nn.CrossEntropyLoss()

    def hand(n):
        def epoch():
            for x, y in dl:
                loss = ce(net(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        epoch()  # warm-up epoch
        _gpu.sync(device)
        t0 = time.perf_counter()
        for _ in range(epochs(n)):
            epoch()
        _gpu.sync(device)
        return time.perf_counter() - t0, epochs(n) * spe

    runners[HAND] = hand
    how[HAND] = "for x, y in loader: forward, loss, zero_grad, backward, step"

    module = PlainModule(_gpu.seeded(make_net, device))

    def plain(n):
        timer = _gpu.StepTimer(spe, device, last=spe * (1 + epochs(n)))
        trainer = pl.Trainer(max_epochs=1 + epochs(n), callbacks=[timer],
                             **_gpu.trainer_flags(device))
        with _gpu.lightning_quiet():
            trainer.fit(module, dl)
        return timer.result()

    runners[PLAIN] = plain
    how[PLAIN] = "LightningModule (automatic optimization), Trainer(accelerator, devices=1, quiet)"

    model = new_model(device)

    def nonsink(n):
        timer = _gpu.StepTimer(spe, device, last=spe * (1 + epochs(n)))
        model.train(1 + epochs(n), dl, callbacks=[timer])
        return timer.result()

    runners["Model.train (non-sink)"] = nonsink
    how["Model.train (non-sink)"] = "Model(net, loss, opt, trainer={accelerator, devices: 1})"

    def sink_runner(graph):
        m = new_model(device)
        supported = set_graph(m, graph)

        def run(n):
            timer = _gpu.StepTimer(SINK_WARM, device, steps_per_batch=spe,
                              last=SINK_WARM + epochs(n))
            m.train(SINK_WARM + epochs(n), dl, callbacks=[timer], dataset_sink_mode=True,
                    sink_size=spe)
            return timer.result()

        def report():
            return {"sink_graph_supported": supported,
                    "sink_graph": getattr(m.lit_model, "sink_graph", None),
                    "sink_graph_status": graph_status(m)}
        return run, report

    for name, graph in (("Model.train (sink, no graph)", False), (GRAPH, "auto")):
        runners[name], info[name] = sink_runner(graph)
        how[name] = (f"Model.train(..., dataset_sink_mode=True, sink_size={spe}), "
                     f"lit_model.sink_graph={graph!r}")
    return runners, how, info


def identity_check(batches: list, device: torch.device, epochs: int = 3) -> dict:
    """Same init, same data: non-sink vs sink (no graph) vs sink (graph); final weights."""
    dl = _gpu.loader(batches)
    spe = len(batches)
    out: dict = {"epochs": epochs, "steps": epochs * spe}
    finals = {}
    for name, sink, graph in (("non-sink", False, None), ("sink, no graph", True, False),
                              ("sink, graph", True, "auto")):
        m = new_model(device)
        if graph is not None:
            set_graph(m, graph)
        try:
            if sink:
                m.train(epochs, dl, dataset_sink_mode=True, sink_size=spe)
            else:
                m.train(epochs, dl)
        except Exception as e:  # noqa: BLE001 - recorded (a dry run re-raises)
            if device.type != "cuda":
                raise
            out[f"error[{name}]"] = f"{type(e).__name__}: {e}"
            continue
        finally:
            if graph is not None:
                out[f"sink_graph_status[{name}]"] = graph_status(m)
        net = m.predict_network  # Lightning leaves it on the CPU after a train call
        finals[name] = [p.detach().cpu().clone() for p in net.parameters()]
        with torch.no_grad():
            x, y = batches[0]
            out[f"loss_on_batch0[{name}]"] = float(
                nn.functional.cross_entropy(net.to(x.device)(x), y))
    for name in ("sink, no graph", "sink, graph"):
        if "non-sink" in finals and name in finals:
            diff = max(float((a - b).abs().max())
                       for a, b in zip(finals["non-sink"], finals[name]))
            out[f"max_abs_weight_diff[non-sink vs {name}]"] = diff
    diffs = [v for k, v in out.items() if k.startswith("max_abs")]
    out["identical"] = len(diffs) == 2 and all(v == 0.0 for v in diffs)
    out["close_1e-5"] = len(diffs) == 2 and all(v <= 1e-5 for v in diffs)
    return out


def markdown(m: dict, r: dict, ident: dict, targets: list, dry: bool, budget: _gpu.Budget) -> list:
    lines = [_gpu.headline("gpu_host_bound: MNIST-1D MLP, batch 100, steps/s", m), ""]
    if dry:
        lines += ["Dry run: CPU, 8 batches an epoch; the numbers mean nothing.", ""]
    lines += [f"Median of {r['rounds']} interleaved rounds (whole epochs, warm-up excluded); "
              f"ratios = median per-round ratio; {budget.elapsed():.0f} s in all.", "",
              "| variant | steps/s | vs hand loop | vs plain Lightning |", "|---|---:|---:|---:|"]
    for n, v in r["median_steps_per_s"].items():
        lines.append(f"| {n} | {v:.0f} | {_gpu.fmt(r['ratio_to_hand_loop'][n])} | "
                     f"{_gpu.fmt(r['ratio_to_plain_lightning'][n])} |")
    lines += [f"| {n} | failed: {e} | | |" for n, e in r["errors"].items()]
    info = r["resolved"].get(GRAPH, {})
    lines += ["", f"sink_graph supported: {info.get('sink_graph_supported')}; status after the "
              f"timed runs: `{info.get('sink_graph_status')}`", "",
              f"Same weights after {ident.get('steps')} steps (non-sink vs sink/graph): "
              f"{ident.get('identical')} "
              + ", ".join(f"{k} = {v:g}" for k, v in ident.items()
                          if k.startswith("max_abs")), "", *_gpu.md_targets(targets)]
    return lines


def main() -> None:
    args, budget, device, m = _gpu.start("gpu_host_bound", __doc__, 45)
    batches = make_batches(device, 8 if args.dry_run else 40)
    try:
        ident = identity_check(batches, device, 2 if args.dry_run else 3)
    except Exception as e:  # noqa: BLE001 - recorded; the timing still runs
        if args.dry_run:
            raise
        ident = {"error": f"{type(e).__name__}: {e}", "identical": False}
    print("identity:", ident, flush=True)
    runners, how, info = build(batches, device)
    res = _gpu.measure(runners, budget, budget.left() - 2.0, dry_run=args.dry_run, min_rounds=3,
                  dry_rounds=1, n_init=len(batches), n_min=len(batches), n_max=400 * len(batches))
    names = list(res["median_steps_per_s"])
    r = {"title": f"MLP 40-100-100-10, batch {BATCH}, {len(batches)} batches an epoch, fp32, "
                  f"SGD momentum", "how": how, "resolved": {n: f() for n, f in info.items()},
         **res,
         "ratio_to_hand_loop": {n: _gpu.paired_ratio(res, n, HAND) for n in names},
         "ratio_to_plain_lightning": {n: _gpu.paired_ratio(res, n, PLAIN) for n in names}}
    targets = [_gpu.target(f"{GRAPH} / {PLAIN} (steps/s)", _gpu.paired_ratio(res, GRAPH, PLAIN),
                           ">=", 2.0)]
    payload = {"machine": m, "dry_run": args.dry_run, "budget_s": args.budget_s,
               "elapsed_s": budget.elapsed(), "results": r, "identity_check": ident,
               "targets": targets, "all_targets_met": all(t["met"] for t in targets)}
    md = markdown(m, r, ident, targets, args.dry_run, budget)
    jp, mp = _gpu.write_results("host_bound", args.out, payload, md)
    print("\n".join(md))
    print("written:", jp, mp)


if __name__ == "__main__":
    main()
