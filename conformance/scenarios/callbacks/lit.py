"""Built-in callbacks (lit_amp port)."""

import types

from conformance import _common as C
from conformance import _lit as S
from conformance.scenarios.callbacks.common_cb import scenario
from lit_amp import Model
from lit_amp import callbacks as T


def run():
    K = types.SimpleNamespace(
        Model=Model,
        Callback=T.Callback,
        History=T.History,
        LambdaCallback=T.LambdaCallback,
        EarlyStopping=T.EarlyStopping,
        ReduceLROnPlateau=T.ReduceLROnPlateau,
        ModelCheckpoint=T.ModelCheckpoint,
        CheckpointConfig=T.CheckpointConfig,
        LossMonitor=T.LossMonitor,
        TimeMonitor=T.TimeMonitor,
        LearningRateScheduler=T.LearningRateScheduler,
        S=S,
        get_lr=lambda cb: float(cb.optimizer.param_groups[0]["lr"]),
    )
    return scenario(K)


if __name__ == "__main__":
    C.main(run)
