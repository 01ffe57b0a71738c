"""The exception type of argument checks (MindSpore side)."""

import types

import mindspore as ms
import numpy as np
from mindspore import Tensor
from mindspore import train as T
from mindspore.train import metrics as MET

from conformance import _common as C
from conformance import _ms as S
from conformance.scenarios.arg_checks.common_args import scenario


def run():
    def empty():
        from mindspore import dataset as ds

        x, y = C.data()
        return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(64, drop_remainder=True)

    K = types.SimpleNamespace(
        S=S,
        Model=T.Model,
        Callback=T.Callback,
        History=T.History,
        LossMonitor=T.LossMonitor,
        TimeMonitor=T.TimeMonitor,
        CheckpointConfig=T.CheckpointConfig,
        ModelCheckpoint=T.ModelCheckpoint,
        EarlyStopping=T.EarlyStopping,
        ReduceLROnPlateau=T.ReduceLROnPlateau,
        LearningRateScheduler=T.LearningRateScheduler,
        LambdaCallback=T.LambdaCallback,
        BackupAndRestore=T.BackupAndRestore,
        OnRequestExit=T.OnRequestExit,
        RunContext=T.RunContext,
        Fixed=T.FixedLossScaleManager,
        get_metric_fn=MET.get_metric_fn,
        metric_cls=lambda n: getattr(MET, n),
        fp16=ms.float16,
        empty_ds=empty,
        exc_name=C.exc_name,
        tensor2d=lambda: Tensor(np.ones((2, 2), np.float32)),
    )
    return {"mindspore": S.VERSION, **scenario(K)}


if __name__ == "__main__":
    C.main(run)
