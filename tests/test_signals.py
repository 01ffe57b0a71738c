"""SignalRecorder: the one "record a signal, act at a step boundary" handler of lit_amp."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from lit_amp._signals import SignalRecorder

SIG = signal.SIGUSR1


@pytest.fixture(autouse=True)
def _own_handler():
    before = signal.getsignal(SIG)
    yield
    signal.signal(SIG, before)


def test_a_signal_is_recorded_and_the_previous_handler_comes_back():
    seen = []
    signal.signal(SIG, lambda s, f: seen.append(s))
    previous = signal.getsignal(SIG)
    calls = []
    rec = SignalRecorder([SIG, SIG], on_signal=calls.append)
    assert rec.signals == (SIG,)  # one handler per signal, so restore finds the true previous
    assert rec.install() and rec.installed and rec.previous(SIG) is previous
    assert rec.install()  # a second install keeps the first previous handler
    os.kill(os.getpid(), SIG)
    assert (rec.received, calls, seen) == (SIG, [SIG], [])
    rec.restore()
    rec.restore()  # safe twice
    assert signal.getsignal(SIG) is previous and not rec.installed
    rec.received = None  # settable: an owner clears it at a new run
    assert rec.received is None


def test_a_handler_from_outside_python_comes_back_as_the_default():
    signal.signal(SIG, signal.SIG_DFL)
    rec = SignalRecorder([SIG])
    rec.install()
    rec._previous[SIG] = None  # what signal.signal returns for a handler not set from Python
    rec.restore()
    assert signal.getsignal(SIG) == signal.SIG_DFL


def test_only_the_main_thread_installs():
    rec = SignalRecorder([SIG])
    before = signal.getsignal(SIG)
    out = []
    t = threading.Thread(target=lambda: out.append(rec.install()))
    t.start()
    t.join()
    assert out == [False] and not rec.installed and signal.getsignal(SIG) is before


def test_over_defaults_only_keeps_a_handler_someone_installed():
    def theirs(s, f):
        pass

    signal.signal(SIG, theirs)
    rec = SignalRecorder([SIG])
    assert rec.install(over_defaults_only=True) and not rec.installed
    assert signal.getsignal(SIG) is theirs
    signal.signal(SIG, signal.SIG_DFL)
    rec.install(over_defaults_only=True)
    assert rec.installed
    rec.restore()
    assert signal.getsignal(SIG) == signal.SIG_DFL


def test_on_signal_may_raise_at_once():
    def stop(signum):
        raise KeyboardInterrupt(signum)

    rec = SignalRecorder([SIG], on_signal=stop)
    rec.install()
    try:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), SIG)
        assert rec.received == SIG
    finally:
        rec.restore()
