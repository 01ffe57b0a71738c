"""A short run validates: the CLI's default validates every epoch; a run whose epochs hold no
validation epoch says so in one line at its start."""

from __future__ import annotations

import csv

from lit_amp.cli import main
from lit_amp.cli.run import no_validation_note

DATA = ["data=synthetic", "data.num_train=200", "data.num_valid=100", "callbacks=minimal",
        "trainer.enable_progress_bar=false"]


def test_a_two_epoch_run_has_a_validation_curve(tmp_path, capsys):
    main(["epochs=2", *DATA, f"hydra.run.dir={tmp_path}"])
    rows = list(csv.DictReader(next(tmp_path.glob("logs/version_*/metrics.csv")).open()))
    validated = sorted({int(r["epoch"]) for r in rows if r.get("val/acc")})
    assert validated == [0, 1]  # Lightning's epoch numbers of MindSpore's epochs 1 and 2
    assert "no validation during training" not in capsys.readouterr().out


def test_epochs_below_valid_frequency_say_so_in_one_line(tmp_path, capsys):
    main(["epochs=2", "valid_frequency=5", "logger=none", *DATA, f"hydra.run.dir={tmp_path}"])
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if "no validation during training" in line]
    assert len(said) == 1 and "valid_frequency=5" in said[0] and "1..2" in said[0]
    assert out.index(said[0]) < out.index("test accuracy:")


def test_the_note_follows_mindspores_rule():
    assert no_validation_note(5, 0, 2) is not None
    assert no_validation_note(5, 3, 5) is None  # a resumed run reaching epoch 5 validates
    assert no_validation_note(3, 3, 5) is not None  # epochs 4 and 5: no multiple of 3
    assert no_validation_note([7], 0, 5) is not None and no_validation_note([4], 0, 5) is None
