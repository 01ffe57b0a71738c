"""``make gpu-report GPU_OUT=<dir>``: a ``make gpu-check`` run's results into the repository.

``GPU_OUT`` is the folder the GPU machine's results came back to (``gpu_results.tgz`` and
``gpu_summary.md``, or the unpacked files). The benchmarks' JSON and ``gpu_check.json`` go into
``bench/results/``, each on top of its file with the run it replaces kept under ``"history"``
(as bench/_common.py's ``write_result`` keeps them); the summary (device, test counts,
benchmark tables) replaces the part of ``docs/benchmarks.md`` between
``<!-- gpu-report:begin -->`` and ``<!-- gpu-report:end -->`` (appended as a section when the
markers are missing).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- gpu-report:begin -->", "<!-- gpu-report:end -->"
KEEP = ("gpu_check.json", "gpu_amp.json", "gpu_host_bound.json", "gpu_loss_scale.json")


def unpack(src: Path, into: Path) -> Path:
    """The results folder: ``src`` itself, or ``src``'s ``gpu_results.tgz`` unpacked."""
    tgz = src if src.suffix == ".tgz" else src / "gpu_results.tgz"
    if tgz.is_file():
        with tarfile.open(tgz) as tar:
            tar.extractall(into, filter="data")
        for loose in ("gpu_summary.md", "gpu_check.json"):
            if not (into / loose).exists() and (tgz.parent / loose).is_file():
                shutil.copy(tgz.parent / loose, into / loose)
        return into
    if (src / "gpu_summary.md").is_file():
        return src
    raise SystemExit(f"gpu-report: {src} holds neither gpu_results.tgz nor gpu_summary.md "
                     "(GPU_OUT names the folder a `make gpu-check` run wrote)")


def replace_section(doc: str, body: str) -> str:
    """``doc`` with the text between the gpu-report markers replaced by ``body``."""
    block = f"{BEGIN}\n{body.strip()}\n{END}"
    if BEGIN in doc and END in doc:
        head, rest = doc.split(BEGIN, 1)
        return head + block + rest.split(END, 1)[1]
    return doc.rstrip() + "\n\n## On a GPU (make gpu-check)\n\n" + block + "\n"


def keep_history(new: Path, dest: Path) -> None:
    """``new``'s run into ``dest``, the run ``dest`` held moved into its ``"history"``."""
    run = json.loads(new.read_text())
    old = json.loads(dest.read_text()) if dest.is_file() else {}
    history = old.pop("history", [])
    if old:
        history.append(old)
    dest.write_text(json.dumps({**run, "history": history}, indent=2, default=str) + "\n")


def report(src: Path, results: Path, doc: Path) -> list[Path]:
    """Copy the JSON results and rewrite the doc section; returns the files written."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = unpack(src, Path(tmp))
        results.mkdir(parents=True, exist_ok=True)
        written = []
        for name in KEEP:
            if (folder / name).is_file():
                keep_history(folder / name, results / name)
                written.append(results / name)
        summary = (folder / "gpu_summary.md").read_text()
    # the summary's titles (its own and each benchmark's) become sub-headings of the section
    summary = "\n".join("##" + line if line.startswith("# ") else line
                        for line in summary.splitlines())
    doc.write_text(replace_section(doc.read_text() if doc.is_file() else "", summary))
    return [*written, doc]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path, nargs="?", default=REPO / "gpu-out",
                        help="the folder a gpu-check run wrote (GPU_OUT)")
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--doc", type=Path, default=REPO / "docs" / "benchmarks.md")
    args = parser.parse_args(argv)
    for path in report(args.src, args.results, args.doc):
        print(f"gpu-report: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
