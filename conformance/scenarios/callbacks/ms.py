"""Built-in callbacks (MindSpore side)."""

import types

from mindspore import train as T

from conformance import _common as C
from conformance import _ms as S
from conformance.scenarios.callbacks.common_cb import scenario


def run():
    K = types.SimpleNamespace(
        Model=T.Model,
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
        get_lr=lambda cb: float(cb.optimizer.learning_rate.asnumpy()),
    )
    return {"mindspore": S.VERSION, **scenario(K)}


if __name__ == "__main__":
    C.main(run)
