"""OnRequestExit and MS_ENABLE_GRACEFUL_EXIT (lit_amp port)."""

import types

from conformance import _common as C
from conformance import _lit as S
from conformance.scenarios.graceful_exit.common_exit import scenario
from lit_amp import Model
from lit_amp import callbacks as T


def run():
    K = types.SimpleNamespace(Model=Model, Callback=T.Callback, OnRequestExit=T.OnRequestExit, S=S)
    return scenario(K)


if __name__ == "__main__":
    C.main(run)
