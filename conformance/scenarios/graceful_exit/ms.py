"""OnRequestExit and MS_ENABLE_GRACEFUL_EXIT (MindSpore side)."""

import types

from mindspore import train as T

from conformance import _common as C
from conformance import _ms as S
from conformance.scenarios.graceful_exit.common_exit import scenario


def run():
    K = types.SimpleNamespace(
        Model=T.Model, Callback=T.Callback, OnRequestExit=T.OnRequestExit, S=S
    )
    return {"mindspore": S.VERSION, **scenario(K)}


if __name__ == "__main__":
    C.main(run)
