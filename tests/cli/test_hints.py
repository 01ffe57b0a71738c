"""Hints for a misspelled group or key (``lit_amp.cli.hints``): one line naming the closest
names (Hydra's eight-line message below it only with HYDRA_FULL_ERROR=1), exit 1."""

from __future__ import annotations

import pytest

from lit_amp.cli import main
from lit_amp.cli.hints import hint


@pytest.mark.parametrize(("typed", "advice", "hydra_says"), [
    ("amps=O2", "lit-amp: no group/key 'amps'; did you mean 'amp'?",
     "Could not override 'amps'."),
    ("optimizer.lrr=0.1", "lit-amp: no group/key 'optimizer.lrr'; did you mean 'optimizer.lr'?",
     "Could not override 'optimizer.lrr'."),
    ("trainer.devces=2", "did you mean 'trainer.devices'?", "Could not override"),
    ("~optimzer", "lit-amp: no group/key 'optimzer'; did you mean 'optimizer'?",
     "Could not delete from config. 'optimzer' does not exist."),
])
def test_a_typo_names_the_closest_group_or_key(typed, advice, hydra_says, tmp_path, capsys,
                                               monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as info:
        main([typed, f"hydra.run.dir={tmp_path}"])
    assert info.value.code == 1
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and advice in lines[0], err  # Hydra's message is not repeated
    assert hydra_says not in err and "HYDRA_FULL_ERROR" not in err


def test_with_hydra_full_error_hydra_s_message_follows_the_hint(tmp_path, monkeypatch):
    from hydra.errors import ConfigCompositionException

    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(ConfigCompositionException) as info:
        main(["amps=O2", f"hydra.run.dir={tmp_path}"])
    text = str(info.value)
    assert text.startswith("lit-amp: no group/key 'amps'; did you mean 'amp'?\n")
    assert "Could not override 'amps'." in text


def test_the_key_of_the_optimizer_actually_chosen(tmp_path, capsys):
    # momentum's keys (not adam's): the advice comes from the config being composed
    with pytest.raises(SystemExit):
        main(["optimizer=momentum", "optimizer.momentun=0.8", f"hydra.run.dir={tmp_path}"])
    assert "did you mean 'optimizer.momentum'?" in capsys.readouterr().err


def test_nothing_close_lists_the_names_there_are():
    line = hint("zzz", ["amp", "boost", "epochs"])
    assert line == "lit-amp: no group/key 'zzz'; at the top level there are: amp, boost, epochs"
