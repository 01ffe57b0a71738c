"""README's command line runs: the ```bash blocks marked ``<!-- run-test: ... -->``.

A user types those lines one after the other in one folder, so that is how they run here: line
by line (a line ending in ``\\`` continues on the next; ``#`` comment lines are skipped), each
through ``bash -c`` in ONE fresh empty temporary folder, in order, ``lit-amp`` resolving to this
environment's console script (its ``bin/`` first on ``PATH``), with a timeout per line. Every
line must exit 0; then the outcomes a user would look at are checked (the checkpoint the resume
line names, the epochs the resumed run trained, the accuracy ``mode=eval`` prints, the sweep's
mean ± std). ```bash blocks without the marker (``make demo``, ``make test``) are not run, and
every ```bash block under the "From the command line" heading must carry it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers.docs import fenced_blocks

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
RUN_RE = re.compile(r"^<!--\s*run-test(?::\s*(?P<note>.*?))?\s*-->$")
CLI_HEADING = "### From the command line"
LINE_TIMEOUT_S = 240
#: environment variables that would move runs elsewhere or fake a launcher
_SCRUB = ("LIT_AMP_LOG_DIR", "LIT_AMP_RUN_ID", "SLURM_JOB_ID", "LOCAL_RANK", "RANK",
          "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "TORCHELASTIC_RUN_ID",
          "PYTHONPATH")


@dataclass(frozen=True)
class BashBlock:
    """One ```bash block: its first line number, its section, commands and run marker."""

    line: int
    heading: str
    commands: tuple[str, ...]
    run: bool


def bash_blocks(text: str) -> list[BashBlock]:
    """The ```bash blocks of a Markdown text, with the commands of each (comments dropped)."""
    return [BashBlock(b.line, b.heading, tuple(_commands(list(b.body))),
                      RUN_RE.match(b.marker) is not None)
            for b in fenced_blocks(text) if b.lang == "bash"]


def _commands(body: list[str]) -> list[str]:
    out, pending = [], ""
    for raw in body:
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        out.append(pending + line)
        pending = ""
    if pending:
        out.append(pending.strip())
    return out


@dataclass
class Session:
    """What running a block's lines in one folder gave: per line, exit status and output."""

    cwd: Path
    done: list[tuple[str, int, str, str]] = field(default_factory=list)

    def line(self, *words: str) -> tuple[str, int, str, str]:
        """The one run line containing every word of ``words`` (README must keep it)."""
        hits = [d for d in self.done if all(w in d[0] for w in words)]
        assert len(hits) == 1, f"README's command block has {len(hits)} lines with {words}"
        return hits[0]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    return env


def run_lines(commands: tuple[str, ...], cwd: Path) -> Session:
    """Run ``commands`` one by one in ``cwd``; stop at the first that fails."""
    session, env = Session(cwd), _env()
    for cmd in commands:
        proc = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, text=True,
                              capture_output=True, timeout=LINE_TIMEOUT_S)
        session.done.append((cmd, proc.returncode, proc.stdout, proc.stderr))
        if proc.returncode != 0:
            break
    return session


RUN_BLOCKS = [b for b in bash_blocks(README.read_text(encoding="utf-8")) if b.run]


def test_extractor_runs_only_marked_blocks_and_joins_continued_lines():
    text = ("## Two\n```bash\nmake demo\n```\n```python\n# not a heading\n```\n"
            "### From the command line\n"
            "<!-- run-test: in order -->\n\n```bash\n# a comment\nlit-amp a=1 \\\n  b=2\n\n"
            "cat x\n```\n")
    blocks = bash_blocks(text)
    assert [(b.commands, b.run, b.heading) for b in blocks] == [
        (("make demo",), False, "## Two"),
        (("lit-amp a=1 b=2", "cat x"), True, "### From the command line")]


def test_readme_command_blocks_are_marked_to_run():
    blocks = bash_blocks(README.read_text(encoding="utf-8"))
    cli = [b for b in blocks if b.heading.startswith(CLI_HEADING)]
    assert cli, f"README.md has no ```bash block under {CLI_HEADING!r}"
    assert all(b.run for b in cli), [b.line for b in cli if not b.run]
    # make demo / make test are not run here (make test would run this test again)
    assert not any(b.run and any(c.startswith("make ") for c in b.commands) for b in blocks)


def test_a_failing_line_stops_the_session(tmp_path):
    session = run_lines(("lit-amp no_such_key=1", "echo never"), tmp_path)
    assert len(session.done) == 1 and session.done[0][1] != 0
    assert "no_such_key" in session.done[0][3]


@pytest.fixture(scope="module")
def readme_session(tmp_path_factory) -> Session:
    assert len(RUN_BLOCKS) == 1, "README.md should have one run-test block (the command line)"
    return run_lines(RUN_BLOCKS[0].commands, tmp_path_factory.mktemp("readme_cli"))


def _result(session: Session, run: str) -> dict:
    return json.loads((session.cwd / run / "result.json").read_text())


@pytest.mark.slow
def test_every_readme_command_exits_zero(readme_session):
    failed = [d for d in readme_session.done if d[1] != 0]
    assert not failed, (f"README command failed (exit {failed[0][1]}): {failed[0][0]}\n"
                        f"{failed[0][3][-3000:]}")
    assert len(readme_session.done) == len(RUN_BLOCKS[0].commands)


@pytest.mark.slow
def test_help_lists_the_groups_and_cfg_job_runs_nothing(readme_session):
    _, _, out, _ = readme_session.line("--help")
    assert "amp: O0, O1, O2, O3, auto" in out and "debug: default, fdr" in out
    _, _, out, err = readme_session.line("--cfg job")
    assert re.search(r"^epochs: 2$", out, re.M) and "running with epochs=2" in err


@pytest.mark.slow
def test_train_with_template_keys_writes_the_checkpoint_the_resume_line_names(readme_session):
    train = readme_session.line("hydra.run.dir=runs/quickstart")[0]
    resume = readme_session.line("ckpt_path=runs/quickstart/")[0]
    result = _result(readme_session, "runs/quickstart")
    assert result["status"] == "ok" and result["tags"] == ["quickstart", "cnn"]
    assert "optimizer.lr=0.005" in result["overrides"] and "epochs=2" in result["overrides"]
    named = re.search(r"ckpt_path=(\S+)", resume).group(1)
    assert Path(result["latest_ckpt"]) == readme_session.cwd / named, train
    run = readme_session.cwd / "runs/quickstart"
    assert list(run.glob("logs/version_*/metrics.csv"))
    assert (run / ".hydra/config.yaml").exists()
    assert "test accuracy:" in (run / "lit_amp.log").read_text()  # the whole console output


@pytest.mark.slow
def test_resume_continues_from_the_checkpoints_epoch(readme_session):
    _, _, out, err = readme_session.line("ckpt_path=runs/quickstart/")
    result = _result(readme_session, "runs/resumed")
    assert result["initial_epoch"] == 2
    assert "Resuming from runs/quickstart/checkpoints/mnist1d_cnn-2_40.ckpt after epoch 2" in (
        out + err)
    trained = re.findall(r"^epoch (\d+)/4:", out, re.M)
    assert trained == ["3", "4"]  # epochs 1-2 are not trained again
    assert result["latest_ckpt"].endswith("mnist1d_cnn-4_40.ckpt")


@pytest.mark.slow
def test_eval_prints_the_accuracy_of_the_checkpoint(readme_session):
    _, _, out, _ = readme_session.line("mode=eval")
    printed = float(re.search(r"^test accuracy: ([0-9.]+)$", out, re.M).group(1))
    # the resumed run evaluated the same weights at its end
    assert printed == pytest.approx(_result(readme_session, "runs/resumed")["metrics"]["acc"],
                                    abs=1e-4)
    assert _result(readme_session, "runs/eval")["mode"] == "eval"


@pytest.mark.slow
def test_debug_runs_go_under_runs_debug(readme_session):
    runs = sorted((readme_session.cwd / "runs" / "debug").glob("*/result.json"))
    results = [json.loads(p.read_text()) for p in runs]
    assert len(results) == 2 and all(r["status"] == "ok" for r in results)
    fdr = next(r for r in results if "debug=fdr" in r["overrides"])
    assert fdr.get("latest_ckpt") is None  # a one-batch check leaves nothing to resume from


@pytest.mark.slow
def test_ddp_sim_line_trains_on_two_processes(readme_session):
    runs = [p.parent for p in (readme_session.cwd / "runs" / "train").glob("*/result.json")]
    ddp = [r for r in runs if "trainer=ddp_sim" in json.loads((r / "result.json").read_text())
           ["overrides"]]
    assert len(ddp) == 1 and (ddp[0] / "lit_amp_ddp_process_1.log").exists()
    result = json.loads((ddp[0] / "result.json").read_text())
    assert result["status"] == "ok" and (result["amp"], result["boost"]) == ("O2", "O1")


@pytest.mark.slow
def test_sweep_summarizes_mean_and_std_over_seeds(readme_session):
    summary = (readme_session.cwd / "runs/sweep/summary.md").read_text()
    assert sorted(p.name for p in (readme_session.cwd / "runs/sweep").glob("[0-9]")) == \
        ["0", "1", "2", "3"]
    assert "mean ± std over seed" in summary
    for level in ("O0", "O2"):
        assert re.search(rf"^\| {level} \| [0-9.]+ ± [0-9.]+ \| 2 \| 0 \|$", summary, re.M)
    assert readme_session.line("cat runs/sweep/summary.md")[2] == summary
