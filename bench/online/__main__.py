"""Benchmark: RecModel.online_train of Wide&Deep from a DirectorySource on CPU.

A producer process writes Criteo-like ``.npz`` files (``SyntheticClickSource`` records, one
file = one batch of ``--batch`` records) into a folder with write-then-rename; the trainer
(this process) tails it with ``DirectorySource`` and runs ``RecModel.online_train``
(checkpoint every 30 s, publish every ``--publish-every`` s). Three phases:

1. **baseline** — the same train step (forward, loss, backward, LazyAdam) in a hand-written
   loop over batches already in memory: what the model costs on this CPU share.
2. **throughput** — the producer writes as fast as it can, at most 20 files ahead of the
   trainer: sustained records/s trained (warm-up excluded), and its ratio to the baseline.
3. **freshness** — the producer writes at a fixed rate (``--rate``; default half the measured
   throughput, at most 20,000 records/s, so that the trainer keeps up even when its CPU share
   drops): for every record, the time from its file landing (the rename) to the first
   published weights whose training covered it. Median and p90 over the run, and the backlog
   left at the end (a growing backlog means the trainer did not keep up and freshness grows
   with the run's length).

Targets: >= 20,000 records/s on 2 cores at batch 1,000; median freshness <= 5 s
with a 2 s publish cadence.

    .venv/bin/python -m bench.online                 # 60 s per phase
    .venv/bin/python -m bench.online --seconds 20    # a quicker look

The machine load (``os.getloadavg``) and the trainer's CPU share are recorded with the
figures: on a shared machine they explain most of the variation.

``--scale``: the same Wide&Deep with 26 x {10^4, 10^5, 10^6} hashed rows (``--sizes``), sparse
gradients and a row-sparse optimizer (``--optimizer``: LazyAdam or Adagrad), on a Criteo-like
stream (:class:`CriteoLike`: power-law id frequencies, new ids appearing over time), each size
in its own process: the bare step, a throughput phase, the bare step again (the ratio is to the
faster of the two; ``python -m bench.online.paired`` measures it in alternation instead, which
the drift does not move) and a freshness phase as above, batches of 4096 records, with
background checkpoints every ``--ckpt-every`` s (one in ``--full-every`` whole, the others row
increments) and delta publishes every ``--publish-every`` s. Per size: records/s and its ratio
to the bare step, peak RSS over the parameter + optimizer bytes, checkpoint write time and
training stall per checkpoint, publish time and bytes, freshness. ``--soak``:
``--soak-minutes`` at the largest size on a stream of ever new ids, RSS sampled every second.

    .venv/bin/python -m bench.online --scale --seconds 150     # 3 sizes, 150 s per phase
    .venv/bin/python -m bench.online --scale --sizes 10000 --seconds 10 --no-doc  # a smoke run
    .venv/bin/python -m bench.online --soak                    # 10 minutes at 26 x 10^6 rows
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import textwrap
import time
import warnings
from pathlib import Path

import torch

from bench._common import check_targets, machine, parser, splice, write_result
from bench.online.scale import in_process
from bench.online.workload import (
    MODEL,
    SCALE_BATCH,
    SCALE_TARGETS,
    TARGET_FRESHNESS,
    TARGET_RATE,
    TARGETS,
    run_baseline,
    run_online,
)


def update_doc(result: dict) -> None:
    """Replace (or append) this benchmark's section of docs/benchmarks.md."""
    thr, fr, base = result["throughput"], result["freshness"], result["baseline"]
    m = result["machine"]
    ok_rate, ok_fresh = (t.check(v)["met"] for t, v in zip(
        TARGETS, (thr["sustained_records_per_s"], fr["freshness_median_s"])))
    med = fr["freshness_median_s"]

    def mark(ok: bool) -> str:
        return "met" if ok else "**missed**"

    rate_fr = fr["producer_rate"]
    rows = [
        ("bare train step, in-memory batches (records/s)", f"{base['records_per_s']:,.0f}", "", ""),
        (
            "bare train step per CPU-second (a dedicated core)",
            f"{base['records_per_cpu_s']:,.0f}",
            "",
            "",
        ),
        (
            "sustained records/s trained (producer as fast as the trainer)",
            f"{thr['sustained_records_per_s']:,.0f}",
            ">= 20,000",
            mark(ok_rate),
        ),
        (
            "ratio to the bare step",
            f"{thr['sustained_records_per_s'] / base['records_per_s']:.2f}",
            "",
            "",
        ),
        (
            "online_train records per trainer CPU-second (a dedicated core)",
            f"{thr['records_per_cpu_s']:,.0f}",
            "",
            "",
        ),
        ("trainer CPU share (CPU s / wall s)", f"{thr['trainer_cpu_share']:.2f}", "", ""),
        (
            f"freshness median at {rate_fr:,.0f} records/s, publish every "
            f"{result['publish_every']} s",
            _s(med),
            "<= 5 s",
            mark(ok_fresh),
        ),
        (
            "freshness p90 / max",
            f"{_s(fr['freshness_p90_s'])} / {_s(fr['freshness_max_s'])}",
            "",
            "",
        ),
        (
            "records/s trained in the freshness phase; backlog at its end (records)",
            f"{fr['sustained_records_per_s']:,.0f}; {fr['backlog_end_records']:,}",
            "",
            "",
        ),
    ]
    table = "| measure | value | target | |\n|---|---:|---:|---|\n" + "\n".join(
        f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows
    )
    section = f"""## Online training (`python -m bench.online`, issue #7)

{MODEL}; batch {result["batch"]}; a producer process writes one `.npz` file per batch,
`DirectorySource` tails them, `RecModel.online_train` checkpoints every 30 s and publishes every
{result["publish_every"]} s; {result["threads"]} torch thread(s) in the trainer;
{result["seconds"]:.0f} s per phase. Freshness: from a file's rename to the first published
weights trained on it, per record. The per-CPU-second rows show what a dedicated core gives.

Machine: {m["cpu"]}, {m["cores"]} cores, torch {m["torch"]}, shared with other jobs (load
average {thr["loadavg_start"][0]:.1f} at the start of the throughput phase); {result["date"]}.

{table}

Reproduce: `.venv/bin/python -m bench.online` (raw numbers in `bench/results/online.json`).
"""
    splice("online", section)


def _s(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f} s"


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--seconds", type=float, default=60.0, help="per online phase")
    ap.add_argument("--batch", type=int, default=None,
                    help="records per batch and per file (default: 4096 for --scale, the batch "
                    "of training at recommendation scale; 1000 otherwise)")
    ap.add_argument("--rate", type=float, default=None, help="freshness-phase records/s")
    ap.add_argument(
        "--rate-fraction",
        type=float,
        default=0.5,
        help="without --rate: this fraction of the measured throughput (at most 20,000/s; "
        "--scale: at most --rate-cap)",
    )
    ap.add_argument("--publish-every", type=float, default=2.0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the trainer")
    ap.add_argument("--scale", action="store_true", help="the scale axis (see the docstring)")
    ap.add_argument("--soak", action="store_true", help="the memory soak at the largest size")
    ap.add_argument("--ckpt-check", action="store_true",
                    help="one background checkpoint per size while training, checked byte "
                    "for byte, against a checkpoint written by the loop")
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000],
                    help="--scale / --soak: rows per feature")
    ap.add_argument("--optimizer", choices=("lazyadam", "adagrad"), default="lazyadam")
    ap.add_argument("--amp", choices=("O0", "O1", "O2"), default="O0",
                    help="--scale/--soak: auto_mixed_precision of the network (bf16 on the CPU), "
                         "for the bare step and the online phases alike")
    ap.add_argument("--collisionless", action="store_true",
                    help="--scale / --soak: IdEmbedding tables (one row per id) instead of hashed")
    ap.add_argument("--ckpt-every", type=float, default=60.0, help="--scale: seconds")
    ap.add_argument("--full-every", type=int, default=10,
                    help="--scale / --soak: one checkpoint in this many whole, the others row "
                    "increments (CheckpointOptions.full_every_n_checkpoints); 1: all whole")
    ap.add_argument("--full-publishes", action="store_true",
                    help="--scale: full publishes instead of deltas")
    ap.add_argument("--new-frac", type=float, default=0.02,
                    help="--scale: fraction of ids never seen before")
    ap.add_argument("--rate-cap", type=float, default=40_000.0)
    ap.add_argument("--bare-seconds", type=float, default=20.0)
    ap.add_argument("--soak-minutes", type=float, default=10.0)
    ap.add_argument("--soak-rate", type=float, default=20_000.0)
    ap.add_argument("--soak-new-frac", type=float, default=0.1)
    args = ap.parse_args()
    if args.batch is None:
        args.batch = SCALE_BATCH if args.scale else 1000
    if args.scale or args.soak or args.ckpt_check:
        run_scale_or_soak(args)
    else:
        run_legacy(args)


def run_legacy(args: argparse.Namespace) -> None:
    """The Wide&Deep at 26 x 10,000 rows on SyntheticClickSource: bare step, throughput,
    freshness (``docs/benchmarks.md``'s "Online training" section)."""
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    warmup = min(5.0, args.seconds / 4)

    root = Path(tempfile.mkdtemp(prefix="lit_amp_bench_online_"))
    try:
        print(f"baseline: bare train step for {min(args.seconds, 20):.0f} s ...", flush=True)
        base = run_baseline(min(args.seconds, 20.0), args.batch)
        print(f"  {base['records_per_s']:,.0f} records/s", flush=True)
        print(f"throughput: {args.seconds:.0f} s ...", flush=True)
        thr = run_online(
            root / "throughput",
            seconds=args.seconds,
            batch=args.batch,
            rate=0.0,
            publish_every=args.publish_every,
            warmup=warmup,
        )
        print(f"  {thr['sustained_records_per_s']:,.0f} records/s", flush=True)
        rate = args.rate or min(TARGET_RATE, args.rate_fraction * thr["sustained_records_per_s"])
        rate = max(rate, float(args.batch))
        print(f"freshness: {args.seconds:.0f} s at {rate:,.0f} records/s ...", flush=True)
        fr = run_online(
            root / "freshness",
            seconds=args.seconds,
            batch=args.batch,
            rate=rate,
            publish_every=args.publish_every,
            warmup=warmup,
        )
        print(f"  median {_s(fr['freshness_median_s'])}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    result = {
        "model": MODEL,
        "batch": args.batch,
        "seconds": args.seconds,
        "publish_every": args.publish_every,
        "threads": args.threads,
        "targets": {"records_per_s": TARGET_RATE, "freshness_median_s": TARGET_FRESHNESS},
        "baseline": base,
        "throughput": thr,
        "freshness": fr,
        "ratio_to_bare_step": thr["sustained_records_per_s"] / base["records_per_s"],
        "targets_met": check_targets(TARGETS, {
            "records_per_s": thr["sustained_records_per_s"],
            "freshness_median_s": fr["freshness_median_s"]}),
    }
    path = write_result("online", result)
    result = {**result, "machine": machine(), "date": time.strftime("%Y-%m-%d")}
    print(f"\n{'measure':52s} {'value':>12s}  target")
    print(f"{'bare train step (records/s)':52s} {base['records_per_s']:12,.0f}")
    print(f"{'sustained records/s trained':52s} {thr['sustained_records_per_s']:12,.0f}  >= 20,000")
    print(f"{'ratio to the bare step':52s} {result['ratio_to_bare_step']:12.2f}")
    print(
        f"{'records per trainer CPU-second (bare / online)':52s} "
        f"{base['records_per_cpu_s']:12,.0f} / {thr['records_per_cpu_s'] or 0:,.0f}"
    )
    print(
        f"{'freshness median (s) at ' + format(rate, ',.0f') + ' rec/s':52s} "
        f"{_s(fr['freshness_median_s']):>12s}  <= 5 s"
    )
    print(f"{'freshness p90 (s)':52s} {_s(fr['freshness_p90_s']):>12s}")
    print(
        f"{'backlog at the end of the freshness phase (records)':52s} "
        f"{fr['backlog_end_records']:12,}"
    )
    print(f"load average during the run: {thr['loadavg_start']} -> {fr['loadavg_end']}")
    print("written:", path)
    if not args.no_doc:
        update_doc(result)



# ---------------------------------------------------------------------------- scale axis

def run_scale_or_soak(args: argparse.Namespace) -> None:
    o = {k: getattr(args, k) for k in (
        "seconds", "batch", "rate", "rate_fraction", "rate_cap", "publish_every", "threads",
        "optimizer", "collisionless", "amp", "ckpt_every", "full_every", "full_publishes",
        "new_frac",
        "bare_seconds", "soak_minutes", "soak_rate", "soak_new_frac")}
    model = (f"WideDeep(13 dense, 26 cat, embed 16 + 1 wide, MLP 256-128), sparse, "
             f"{'LazyAdam' if args.optimizer == 'lazyadam' else 'Adagrad'}, "
             f"{'IdEmbedding (collision-free)' if args.collisionless else 'hashed'} tables"
             + ("" if args.amp == "O0" else f", auto_mixed_precision {args.amp} bfloat16"))
    common = {"model": model, "batch": args.batch, "threads": args.threads,
              "publish_every": args.publish_every, "ckpt_every": args.ckpt_every,
              "full_every": args.full_every,
              "delta_publishes": not args.full_publishes, "loadavg_start": os.getloadavg(),
              "targets": SCALE_TARGETS}
    if args.ckpt_check:
        rows = [in_process("ckpt", vocab, o) for vocab in args.sizes]
        path = write_result("online_checkpoint", {**common, "sizes": rows, "options": o})
        for r in rows:
            print(f"[{r['vocab']:,}] stall {1e3 * r['stall_s']:.0f} ms, write {r['write_s']:.1f} s "
                  f"(in the loop: {r['in_loop_write_s']:.1f} s), peak RSS "
                  f"{r['rss_over_state']:.2f} x state, {len(r['tensors_differing'])} of "
                  f"{r['tensors_checked']} tensors differ")
        print("written:", path)
        if not args.no_doc:
            update_scale_doc(None, None, rows)
        return
    if args.soak:
        soak = in_process("soak", max(args.sizes), o)
        path = write_result("online_soak", {**common, "soak": soak, "options": o})
        print(f"peak RSS {soak['peak_rss_bytes'] / 2**30:.2f} GiB = "
              f"{soak['rss_over_state']:.2f} x parameters + optimizer state; slope over the "
              f"last half {(soak['rss_slope_bytes_per_min_last_half'] or 0) / 2**20:+.1f} MiB/min")
        print("written:", path)
        if not args.no_doc:
            update_scale_doc(None, soak)
        return
    rows = []
    for vocab in args.sizes:
        rows.append(in_process("size", vocab, o))
        r = rows[-1]
        print(f"[{vocab:,}] {r['throughput']['sustained_records_per_s']:,.0f} records/s "
              f"({r['ratio_to_bare']:.2f} x bare), peak RSS {r['rss_over_state']:.2f} x state, "
              f"stall {1e3 * (r['checkpoint']['stall_s_max'] or 0):.0f} ms", flush=True)
    result = {**common, "sizes": rows, "options": o, "loadavg_end": os.getloadavg()}
    path = write_result("online_scale", result)
    print("written:", path)
    if not args.no_doc:
        update_scale_doc(result, None)


def _gb(b: float | None) -> str:
    return "n/a" if b is None else f"{b / 1e9:.2f} GB" if b >= 1e8 else f"{b / 1e6:.1f} MB"


def _ms(s: float | None) -> str:
    return "n/a" if s is None else f"{1e3 * s:.0f} ms"


def _scale_table(result: dict) -> str:
    head = ("| rows per feature (total) | params + optimizer | bare step | sustained | ratio "
            "| peak RSS / state | checkpoint write | stall per checkpoint (median / max) | "
            "in-loop checkpoint | publish (median) | bytes per publish: full / delta | "
            "freshness median / p90 |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
            "---:|\n")
    lines = []
    for r in result["sizes"]:
        c, p, fr = r["checkpoint"], r["publish"], r["freshness"]
        lines.append(
            f"| {r['vocab']:,} ({r['rows'] / 1e6:g} M) "
            f"| {_gb(r['param_bytes'] + r['optimizer_bytes'])} "
            f"| {r['bare']['records_per_s']:,.0f}/s "
            f"| {r['throughput']['sustained_records_per_s']:,.0f}/s "
            f"| {r['ratio_to_bare']:.2f} | {r['rss_over_state']:.2f} "
            f"| {c['write_s_median'] or 0:.1f} s | {_ms(c['stall_s_median'])} / "
            f"{_ms(c['stall_s_max'])} | {c['in_loop_stall_s'] or 0:.1f} s "
            f"| {_ms(p['publish_s_median'])} | {_gb(p['full_bytes'])} / "
            f"{_gb(p['delta_bytes_median'])} "
            f"| {_s(fr['freshness_median_s'])} / {_s(fr['freshness_p90_s'])} |")
    return head + "\n".join(lines)


def update_scale_doc(result: dict | None, soak: dict | None,
                     ckpt: list[dict] | None = None) -> None:
    """Replace (or append) the scale axis' sections of docs/benchmarks.md (those given)."""
    m = machine()
    if ckpt:
        splice("online-checkpoint", _ckpt_section(ckpt, m))
    if result is not None:
        o = result["options"]
        intro = textwrap.fill(
            f"{result['model']}; batch {result['batch']}; a Criteo-like stream (power-law ids "
            f"hashed over 62 bits, {o['new_frac']:.0%} new ids); producer process + "
            f"`DirectorySource` as in the section above; "
            f"{'delta' if result['delta_publishes'] else 'full'} publishes every "
            f"{result['publish_every']} s; background checkpoints every "
            f"{result['ckpt_every']:.0f} s (one in {o.get('full_every', 1)} whole, the others "
            f"row increments); {o['seconds']:.0f} s per phase. \"State\" is "
            "parameter + optimizer-state bytes. \"Stall per checkpoint\": how long the training "
            "loop was blocked by a background checkpoint (a wait for the previous write "
            "included); \"in-loop checkpoint\": the final checkpoint, written by the loop as "
            "every checkpoint was before background writes (what each one stalled). Freshness "
            f"at {o['rate_fraction']:.0%} of the throughput (at most {o['rate_cap']:,.0f} "
            f"records/s). Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}; load "
            f"average {result['loadavg_start'][0]:.1f} at the start; "
            f"{time.strftime('%Y-%m-%d')}.", 92)
        body = f"""## Online training at scale (`python -m bench.online --scale`)

{intro}

{_scale_table(result)}

Targets at 26 M rows: sustained >= 0.9 x the bare step and >= 40,000 records/s; peak RSS <=
1.5 x state; stall per checkpoint <= 100 ms; publish bytes per 2 s <= 5 % of a full publish;
freshness median <= 2 s, p90 <= 4 s. Raw numbers: `bench/results/online_scale.json`.
"""
        splice("online-scale", body)
    if soak is not None:
        ck = soak["checkpoint"]
        body = f"""## Memory soak (`python -m bench.online --soak`)

{soak["rows"] / 1e6:g} M rows, {soak["seconds"] / 60:.0f} minutes, {soak["records_trained"]:,}
records trained (about {soak["distinct_new_ids_seen"]:,} ids never seen before), background
checkpoints and publishes as above. Peak RSS {_gb(soak["peak_rss_bytes"])} =
{soak["rss_over_state"]:.2f} x state ({_gb(soak["param_bytes"] + soak["optimizer_bytes"])});
budget 1.5 x state = {_gb(soak["budget_bytes"])}; RSS slope over the last half
{(soak["rss_slope_bytes_per_min_last_half"] or 0) / 2**20:+.1f} MiB/min. Evictions
{soak["evictions"]:,}, overflows {soak["overflows"]:,}. Checkpoints: {ck["background"]} in the
background, {ck["increments"]} of them row increments (median {_gb(ck["increment_bytes_median"])},
written in {_s(ck["increment_write_s_median"])}; whole: {_gb(ck["bytes"])} in
{_s(ck["whole_write_s_median"])}); stall per checkpoint median {_ms(ck["stall_s_median"])}, max
{_ms(ck["stall_s_max"])}. Machine: {m["cpu"]};
{time.strftime("%Y-%m-%d")}. Raw samples: `bench/results/online_soak.json`.
"""
        splice("online-soak", body)


_CKPT_HEAD = (
    "| rows per feature (total) | state | loop stall (background) | in-loop write (before) "
    "| background write | rows copied on write | speed during the write | peak RSS / state "
    "| tensors differing | load average |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def _ckpt_section(rows: list[dict], m: dict) -> str:
    lines = "\n".join(
        f"| {r['vocab']:,} ({r['rows'] / 1e6:g} M) | {_gb(r['param_bytes'] + r['optimizer_bytes'])}"
        f" | {_ms(r['stall_s'])} | {r['in_loop_write_s']:.1f} s | {r['write_s']:.1f} s "
        f"({r['writer_cpu_s']:.1f} s CPU) | {r['cow_rows']:,} ({_gb(r['cow_bytes'])}) "
        f"| {r['records_per_s_during_write'] / r['bare_records_per_s']:.2f} "
        f"| {r['rss_over_state']:.2f} | {len(r['tensors_differing'])} of {r['tensors_checked']} "
        f"| {r['loadavg'][0]:.1f} |" for r in rows)
    return f"""## A background checkpoint at scale (`python -m bench.online --ckpt-check`)

Wide&Deep as in the scale axis, LazyAdam, batch 1000, the train step in a plain loop (no
producer): one checkpoint taken as `online_train` takes it in the background (snapshot,
copy-on-write of the table and its optimizer state, a writer thread) while
the loop keeps stepping, then the same dict written by the loop with `torch.save` (what
every checkpoint stalled before), then the file compared byte for byte (CRC32 per tensor)
with the state at the snapshot. "Speed during the write": records/s while the file was
being written over records/s before.

{_CKPT_HEAD}
{lines}

Machine: {m["cpu"]}, {m["cores"]} cores, shared with other jobs (the load average column);
{time.strftime("%Y-%m-%d")}. Raw numbers: `bench/results/online_checkpoint.json`.
"""


if __name__ == "__main__":
    main()

