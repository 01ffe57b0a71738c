"""Tests map to modules: where the tests of a ``lit_amp`` module live is found from its path.

Every module of ``lit_amp/`` (not ``__init__.py``, not the YAML tree ``cli/conf/``) has
``tests/<pkg>/test_<module>.py`` (a private module ``_x.py``: ``test_x.py``), or a folder
``tests/<pkg>/<module>/`` of tests, e.g. ``lit_amp/model/model.py`` ->
``tests/model/test_model.py``. A module whose tests live elsewhere is listed in
:data:`ELSEWHERE`, the one table of exceptions, with the test files that exercise it and why.
Other test files (faults, conformance, CUDA, a feature across modules) may exist beside these;
shared test helpers live in ``tests/helpers/`` or a package's ``_helpers.py`` / ``conftest.py``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "lit_amp"
TESTS = REPO / "tests"

#: module (path under ``lit_amp/``) -> (the test files, ``path::test`` for one test, and why)
ELSEWHERE: dict[str, tuple[tuple[str, ...], str]] = {
    "__main__.py": (
        ("tests/cli/test_console.py", "tests/cli/test_run.py"),
        "`python -m lit_amp` is the `lit-amp` command (an import and a call): the CLI tests run "
        "it that way",
    ),
    "_lazy.py": (
        ("tests/test_public_api.py",),
        "the lazy exports: every package's table resolves there, an unknown name is an "
        "AttributeError",
    ),
    "_validation.py": (
        ("tests/faults/test_fuzz_arguments.py",),
        "the argument checks' one message format: every public constructor and method gets bad "
        "arguments there; each module's own tests check its messages",
    ),
    "amp/hooks.py": (
        ("tests/amp/test_convert.py",),
        "the module hooks are what auto_/custom_mixed_precision install: every per-layer dtype "
        "test observes them",
    ),
    "boost/base.py": (
        ("tests/boost/test_contract.py",),
        "BoostAlgorithm, the shape every algorithm shares: the contract tester runs each "
        "algorithm through it",
    ),
    "callbacks/_resume.py": (
        ("tests/callbacks/test_backup_and_restore.py", "tests/faults/test_resume_exactly_once.py"),
        "BackupAndRestore's resume loader: a resumed run trains every batch exactly once",
    ),
    "callbacks/bridge.py": (
        ("tests/model/test_model.py",),
        "MindSpore's callback order and counters in Model.train / fit / eval "
        "(docs/semantics.md §1.4)",
    ),
    "cli/build.py": (
        ("tests/cli/test_conf.py::test_option_composes_and_instantiates",
         "tests/cli/test_conf.py::test_experiment_builds"),
        "every option of every config group, and every experiment, is built there",
    ),
    "demos/data.py": (
        ("tests/cli/test_run.py", "tests/model/test_lit_model.py"),
        "example data: the CLI runs train on it, the demo test reaches 85 % on MNIST-1D",
    ),
    "demos/nets.py": (
        ("tests/cli/test_conf.py", "tests/boost/test_auto_boost.py"),
        "example networks: every model= option is built; ResNet1D carries the boost tests",
    ),
    "rec/online/stream.py": (
        ("tests/rec/online/test_checkpoints.py", "tests/rec/online/test_crash_recovery.py"),
        "what Lightning iterates in online_train: a cursor is committed only for batches "
        "trained (resume without loss)",
    ),
    "rec/online/gc_freeze.py": (
        ("tests/rec/online/test_loop.py::"
         "test_the_objects_alive_at_the_start_are_frozen_for_the_loop_and_handed_back",),
        "the online loop freezes the objects alive at its start and unfreezes them at its end",
    ),
    "rec/online/ranks.py": (
        ("tests/rec/online/test_ddp_stream.py",),
        "online_train's collectives (no-ops in one process, its doctest): the 2-process "
        "stream tests",
    ),
    "thor/_second_order.py": (
        ("tests/thor/test_optimizer.py", "tests/thor/test_factors.py",
         "tests/thor/test_thor_ddp.py"),
        "THOR's refresh of the factors' inverses runs inside THOR.step",
    ),
    "thor/_sgd.py": (
        ("tests/thor/test_optimizer.py", "tests/thor/test_step_overhead.py"),
        "THOR's momentum-SGD update runs inside THOR.step: weight decay, decay_filter, clipping "
        "and momentum against a hand-written SGD there, the flat momentum buffers in "
        "test_step_overhead",
    ),
}


def _modules() -> list[str]:
    """Every module of ``lit_amp/`` as a path under it (``model/model.py``)."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if path.name == "__init__.py" or rel.parts[:2] == ("cli", "conf"):
            continue
        out.append(rel.as_posix())
    return out


def _test_name(module: str) -> str:
    """``model/_checks.py`` -> ``checks`` (one leading underscore of a private module dropped)."""
    stem = Path(module).stem
    return stem[1:] if stem.startswith("_") and not stem.startswith("__") else stem


def _expected(module: str) -> str:
    """The test file ``module`` maps to, as a path from the repository root."""
    parent = Path(module).parent
    return (Path("tests") / parent / f"test_{_test_name(module)}.py").as_posix()


def _own_tests(module: str) -> list[Path]:
    """The places ``module``'s own tests may live: ``tests/<pkg>/test_<name>.py`` or the folder
    ``tests/<pkg>/<name>/``, where they exist."""
    folder = TESTS / Path(module).parent
    name = _test_name(module)
    places = [folder / f"test_{name}.py", folder / name]
    return [p for p in places if p.is_file() or (p.is_dir() and any(p.glob("test_*.py")))]


def test_every_module_has_its_test_file_or_an_entry_in_the_table() -> None:
    missing = [m for m in _modules() if not _own_tests(m) and m not in ELSEWHERE]
    assert not missing, (
        "write tests/<pkg>/test_<module>.py for these modules (or, where their tests live "
        "elsewhere, list them in ELSEWHERE with the test files and why): "
        + ", ".join(f"lit_amp/{m} -> {_expected(m)}" for m in missing)
    )


def test_the_table_names_modules_that_exist_and_have_no_test_file_of_their_own() -> None:
    modules = set(_modules())
    gone = [m for m in ELSEWHERE if m not in modules]
    assert not gone, f"ELSEWHERE names modules that do not exist: {gone}"
    mapped = {m: [p.relative_to(REPO).as_posix() for p in _own_tests(m)] for m in ELSEWHERE}
    stale = {m: places for m, places in mapped.items() if places}
    assert not stale, f"these modules have test files of their own now; drop them: {stale}"


def test_the_table_names_test_files_and_tests_that_exist() -> None:
    missing = []
    for module, (places, why) in ELSEWHERE.items():
        assert places and why.strip(), f"{module}: name the test files and say why"
        for place in places:
            path, _, func = place.partition("::")
            file = REPO / path
            if not (path.startswith("tests/") and file.is_file()):
                missing.append(f"{module}: {path}")
            elif func and not re.search(rf"^def {func}\(", file.read_text(), re.MULTILINE):
                missing.append(f"{module}: {place}")
    assert not missing, f"ELSEWHERE names tests that do not exist: {missing}"


def test_no_two_modules_claim_one_test_file() -> None:
    seen: dict[tuple[str, str], str] = {}
    clashes = []
    for m in _modules():
        key = (Path(m).parent.as_posix(), _test_name(m))
        if key in seen:
            clashes.append((seen[key], m))
        seen[key] = m
    assert not clashes, f"these modules would share one tests/<pkg>/test_<module>.py: {clashes}"


def test_the_map_finds_a_missing_test_file(tmp_path, monkeypatch) -> None:
    """The check can fail: a module without tests and without an entry is reported."""
    (tmp_path / "lit_amp" / "pkg").mkdir(parents=True)
    (tmp_path / "lit_amp" / "pkg" / "_thing.py").write_text("X = 1\n")
    (tmp_path / "tests" / "pkg").mkdir(parents=True)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "lit_amp")
    monkeypatch.setattr(sys.modules[__name__], "TESTS", tmp_path / "tests")
    assert _modules() == ["pkg/_thing.py"] and _own_tests("pkg/_thing.py") == []
    assert _expected("pkg/_thing.py") == "tests/pkg/test_thing.py"
    (tmp_path / "tests" / "pkg" / "test_thing.py").write_text("")
    assert _own_tests("pkg/_thing.py") == [tmp_path / "tests" / "pkg" / "test_thing.py"]
