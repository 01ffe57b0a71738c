"""The exception type of argument checks (lit_amp port)."""

import types
import warnings

import torch

import lit_amp.metrics as MET
from conformance import _common as C
from conformance import _lit as S
from conformance.scenarios.arg_checks.common_args import scenario
from lit_amp import FixedLossScaleManager, Model
from lit_amp import callbacks as T


def run():
    K = types.SimpleNamespace(
        S=S,
        Model=Model,
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
        Fixed=FixedLossScaleManager,
        get_metric_fn=MET.get_metric_fn,
        metric_cls=lambda n: getattr(MET, n),
        fp16=torch.float16,
        empty_ds=lambda: [],
        exc_name=C.exc_name,
        tensor2d=lambda: torch.ones(2, 2),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return scenario(K)


if __name__ == "__main__":
    C.main(run)
