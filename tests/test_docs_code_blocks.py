"""The documentation runs: every ```python block of README.md and docs/*.md, and every name.

- Each ```python block is run as a user would paste it: alone, in a fresh subprocess whose
  working directory is an empty temporary folder (``PYTHONPATH`` = the repository root), with a
  timeout. A block that depends on another block's variables fails with ``NameError``.
  A block preceded by ``<!-- skip-test: reason -->`` is not run; skips must be few and give a
  reason.
- README's command block (```bash marked ``<!-- run-test: ... -->``) runs line by line in one
  folder in ``tests/test_readme_commands.py``; other ```bash blocks (``make demo``) are not run.
- Every dotted ``lit_amp.X.Y`` name in docs/migration.md resolves (import + getattr).
- docs/migration.md has a row for every MindSpore name the MindSpore API pages this project
  follows mention (``SEED_NAMES`` below, read from those pages).
- ``mkdocs build --strict`` builds the API reference (only where mkdocs is installed).
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.docs import fenced_blocks

REPO = Path(__file__).resolve().parents[1]
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MIGRATION = REPO / "docs" / "migration.md"
SKIP_RE = re.compile(r"^<!--\s*skip-test:\s*(?P<reason>.*?)\s*-->$")
MAX_SKIPS = 3
BLOCK_TIMEOUT_S = 240

# Every MindSpore name (classes, functions, methods, arguments, dtypes) mentioned by the API
# pages this project follows: ConvertModelUtils.convert_to_thor_model, amp.build_train_network,
# train.Model, amp.auto_mixed_precision and mindspore_rec.RecModel.
SEED_NAMES = [
    # mindspore.train.Model and its methods / properties / arguments
    "mindspore.train.Model", "loss_fn", "optimizer", "metrics", "eval_network", "eval_indexes",
    "amp_level", "boost_level", "keep_batchnorm_fp32", "loss_scale_manager", "boost_config_dict",
    "model.train", "model.fit", "model.eval", "model.predict", "model.build",
    "infer_train_layout", "infer_predict_layout", "train_network", "predict_network",
    "valid_frequency", "dataset_sink_mode", "valid_dataset_sink_mode", "sink_size",
    "initial_epoch", "Metric.set_indexes", "load_distributed_checkpoint", "global_step",
    "cur_step_num", "GRAPH_MODE", "PYNATIVE_MODE", "AUTO_PARALLEL", "SEMI_AUTO_PARALLEL",
    "step_end", "Cell", "Dataset",
    # mindspore.amp
    "build_train_network", "auto_mixed_precision", "custom_mixed_precision", "cast_model_type",
    "LossScaleManager", "FixedLossScaleManager", "drop_overflow_update", "nn.Optimizer",
    "mstype.float16", "mstype.bfloat16", "mstype.float32", "Tensor",
    # the white / black lists
    "nn.Conv1d", "nn.Conv2d", "nn.Conv3d", "nn.Conv1dTranspose", "nn.Conv2dTranspose",
    "nn.Conv3dTranspose", "nn.Dense", "nn.LSTMCell", "nn.RNNCell", "nn.GRUCell",
    "ops.Conv2D", "ops.Conv3D", "ops.Conv2DTranspose", "ops.Conv3DTranspose", "ops.MatMul",
    "ops.BatchMatMul", "ops.PReLU", "ops.ReLU", "ops.Ger", "nn.BatchNorm1d", "nn.BatchNorm2d",
    "nn.BatchNorm3d", "nn.LayerNorm",
    # losses, optimizers, THOR
    "nn.SoftmaxCrossEntropyWithLogits", "sparse=True", "reduction", "nn.Momentum",
    "trainable_params", "ConvertModelUtils", "convert_to_thor_model", "nn.thor", "damping",
    "frequency", "LossMonitor", "mindspore.boost",
    # mindspore_rec
    "mindspore_rec.RecModel", "online_train",
]


@dataclass(frozen=True)
class Block:
    """One ```python block: where it is, its code, and its skip reason (None: run it)."""

    path: Path
    line: int
    code: str
    skip: str | None

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def python_blocks(path: Path) -> list[Block]:
    """The ```python blocks of ``path``, each with the skip reason of the comment before it."""
    blocks = []
    for b in fenced_blocks(path.read_text(encoding="utf-8")):
        if b.lang == "python":
            m = SKIP_RE.match(b.marker)
            blocks.append(Block(path, b.line, "\n".join(b.body) + "\n",
                                m.group("reason") if m else None))
    return blocks


ALL_BLOCKS = [b for f in DOC_FILES for b in python_blocks(f)]


def test_extractor_finds_blocks_and_skip_comments(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("text\n```python\na = 1\n```\n<!-- skip-test: runs for an hour -->\n\n"
                   "```python\nb = 2\n```\n```bash\nls\n```\n")
    blocks = python_blocks(doc)
    assert [(b.code, b.skip) for b in blocks] == [("a = 1\n", None),
                                                  ("b = 2\n", "runs for an hour")]


def test_skips_are_few_and_give_a_reason():
    assert len(ALL_BLOCKS) >= 2, "README.md's python blocks were not found"
    skipped = [b for b in ALL_BLOCKS if b.skip is not None]
    assert len(skipped) <= MAX_SKIPS, [b.id for b in skipped]
    for b in skipped:
        assert len(b.skip) >= 10, f"{b.id}: give a reason in <!-- skip-test: reason -->"


def _run_block(block: Block, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONDONTWRITEBYTECODE="1")
    script = cwd / "block.py"
    script.write_text(block.code, encoding="utf-8")
    return subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=BLOCK_TIMEOUT_S)


@pytest.mark.slow
@pytest.mark.parametrize("block", ALL_BLOCKS, ids=lambda b: b.id)
def test_code_block_runs_standalone(block, tmp_path):
    if block.skip is not None:
        pytest.skip(block.skip)
    proc = _run_block(block, tmp_path)
    assert proc.returncode == 0, (
        f"{block.id} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def test_a_block_that_needs_another_block_fails(tmp_path):
    # the harness must not share state between blocks (README's second block once needed the
    # first block's `net`)
    proc = _run_block(Block(REPO / "README.md", 0, "print(net)\n", None), tmp_path)
    assert proc.returncode != 0 and "NameError" in proc.stderr


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def _lit_amp_names(text: str) -> set[str]:
    return set(re.findall(r"\blit_amp(?:\.[A-Za-z_]\w*)+", text))


def test_migration_lit_amp_names_resolve():
    names = _lit_amp_names(MIGRATION.read_text(encoding="utf-8"))
    assert len(names) > 40
    missing = []
    for name in sorted(names):
        try:
            _resolve(name)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{name}: {exc!r}")
    assert not missing, "docs/migration.md cites names that do not exist:\n" + "\n".join(missing)


def test_name_check_catches_a_wrong_name():
    with pytest.raises(AttributeError):
        _resolve("lit_amp.callbacks.NoSuchCallback")
    assert _lit_amp_names("use `lit_amp.rec.StopOptions(...)`") == {"lit_amp.rec.StopOptions"}


def test_migration_covers_every_seed_name():
    text = MIGRATION.read_text(encoding="utf-8")
    missing = [n for n in SEED_NAMES if n not in text]
    assert not missing, f"docs/migration.md has no row for: {missing}"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None,
                    reason="mkdocs not installed (pip install -e '.[docs]')")
def test_api_reference_builds(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([mkdocs, "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=REPO, env=env, text=True, capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    pages = sorted(p.stem for p in (REPO / "docs" / "api").glob("*.md"))
    assert len(pages) >= 10
    for page in pages:
        assert (tmp_path / "site" / "api" / (page if page != "index" else "")).is_dir(), page
    html = (tmp_path / "site" / "api" / "model" / "index.html").read_text(encoding="utf-8")
    # the Model's methods are documented, and doctests ("Example:") render as code
    assert 'id="lit_amp.model.model.Model.fit"' in html
    assert '<span class="gp">&gt;&gt;&gt; </span>' in html
