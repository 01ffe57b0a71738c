"""The exception type of argument checks (Model, callbacks, metrics), framework-neutral.

Each observable is 'ok' (accepted) or the exception class name. K: the side's classes and
helpers (Model, callbacks, net(), loss_fn(), opt(n), train_ds(), valid_ds(), empty_ds(),
Fixed (FixedLossScaleManager), get_metric_fn, RunContext, Callback, fp16, exc_name).
"""

import signal
import tempfile


def scenario(K):
    S = K.S

    def M(**kw):
        n = S.net()
        args = dict(loss_fn=S.loss_fn(), optimizer=S.opt(n))
        args.update(kw)
        return K.Model(n, **args)

    def legacy_cb():
        class Legacy(K.Callback):
            def step_end(self, rc):
                pass

        return Legacy()

    tmp = tempfile.mkdtemp()
    cases = {
        # Model constructor
        "model.network_not_cell": lambda: K.Model(object(), S.loss_fn()),
        "model.metrics_list": lambda: M(metrics=["acc"]),
        "model.metrics_str": lambda: M(metrics="acc"),
        "model.metrics_unknown_name": lambda: M(metrics={"nope"}),
        "model.eval_indexes_two": lambda: M(eval_network=S.net(), eval_indexes=[0, 1]),
        "model.amp_without_optimizer": lambda: M(optimizer=None, amp_level="O2"),
        "model.lsm_without_optimizer": lambda: M(optimizer=None, loss_scale_manager=K.Fixed()),
        "model.metrics_without_loss_or_eval_network": lambda: M(
            loss_fn=None, optimizer=None, metrics={"acc"}
        ),
        "model.unknown_kwarg": lambda: M(foo=1),
        "model.cast_model_type_kwarg": lambda: M(cast_model_type=K.fp16),
        "model.amp_level_O5": lambda: M(amp_level="O5"),
        "model.amp_level_int": lambda: M(amp_level=2),
        "model.boost_level_O3": lambda: M(boost_level="O3"),
        "model.keep_batchnorm_fp32_O2": lambda: M(
            amp_level="O2", keep_batchnorm_fp32=False, loss_scale_manager=None
        ),
        # train / fit / eval
        "train.epoch_negative": lambda: M().train(-1, S.train_ds()),
        "train.epoch_zero": lambda: M().train(0, S.train_ds()),
        "train.epoch_float": lambda: M().train(1.5, S.train_ds()),
        "train.initial_epoch_ge_epoch": lambda: M().train(2, S.train_ds(), initial_epoch=2),
        "train.initial_epoch_negative": lambda: M().train(2, S.train_ds(), initial_epoch=-1),
        "train.sink_size_zero": lambda: M().train(
            1, S.train_ds(), dataset_sink_mode=True, sink_size=0
        ),
        "train.sink_size_minus_2": lambda: M().train(
            1, S.train_ds(), dataset_sink_mode=True, sink_size=-2
        ),
        "train.sink_mode_str": lambda: M().train(1, S.train_ds(), dataset_sink_mode="yes"),
        "train.callbacks_not_callback": lambda: M().train(1, S.train_ds(), callbacks=[object()]),
        "train.callbacks_single": lambda: M().train(1, S.train_ds(), callbacks=K.History()),
        "train.empty_dataset": lambda: M().train(1, K.empty_ds()),
        "train.legacy_callback": lambda: M().train(1, S.train_ds(), callbacks=[legacy_cb()]),
        "fit.legacy_callback": lambda: M(metrics={"acc"}).fit(
            1, S.train_ds(), S.valid_ds(), callbacks=[legacy_cb()]
        ),
        "fit.valid_frequency_str": lambda: M(metrics={"acc"}).fit(
            1, S.train_ds(), S.valid_ds(), valid_frequency="1"
        ),
        "fit.valid_frequency_zero": lambda: M(metrics={"acc"}).fit(
            1, S.train_ds(), S.valid_ds(), valid_frequency=0
        ),
        "fit.valid_without_metrics": lambda: M().fit(1, S.train_ds(), S.valid_ds()),
        "eval.without_metrics": lambda: M().eval(S.valid_ds()),
        "eval.sink_mode_str": lambda: M(metrics={"acc"}).eval(
            S.valid_ds(), dataset_sink_mode="yes"
        ),
        "build.both_none": lambda: M().build(),
        # callbacks
        "LossMonitor.negative": lambda: K.LossMonitor(-1),
        "LossMonitor.float": lambda: K.LossMonitor(1.5),
        "TimeMonitor.data_size_zero": lambda: K.TimeMonitor(data_size=0),
        "TimeMonitor.data_size_str": lambda: K.TimeMonitor(data_size="3"),
        "TimeMonitor.data_time_int": lambda: K.TimeMonitor(data_time=1),
        "CheckpointConfig.steps_negative": lambda: K.CheckpointConfig(save_checkpoint_steps=-1),
        "CheckpointConfig.all_zero": lambda: K.CheckpointConfig(0, 0, 0, 0),
        "CheckpointConfig.steps_float": lambda: K.CheckpointConfig(save_checkpoint_steps=1.5),
        "CheckpointConfig.append_info_bad": lambda: K.CheckpointConfig(append_info=["nope"]),
        "CheckpointConfig.keep_max_str": lambda: K.CheckpointConfig(keep_checkpoint_max="5"),
        "ModelCheckpoint.prefix_int": lambda: K.ModelCheckpoint(prefix=1, directory=tmp),
        "ModelCheckpoint.prefix_slash": lambda: K.ModelCheckpoint(prefix="a/b", directory=tmp),
        "ModelCheckpoint.config_wrong_type": lambda: K.ModelCheckpoint("p", tmp, config=1),
        "EarlyStopping.mode_bad": lambda: K.EarlyStopping(mode="bigger"),
        "EarlyStopping.patience_negative": lambda: K.EarlyStopping(patience=-1),
        "EarlyStopping.min_delta_negative": lambda: K.EarlyStopping(min_delta=-1.0),
        "EarlyStopping.monitor_int": lambda: K.EarlyStopping(monitor=1),
        "ReduceLROnPlateau.factor_1": lambda: K.ReduceLROnPlateau(factor=1.0),
        "ReduceLROnPlateau.factor_0": lambda: K.ReduceLROnPlateau(factor=0.0),
        "ReduceLROnPlateau.patience_negative": lambda: K.ReduceLROnPlateau(patience=-1),
        "ReduceLROnPlateau.cooldown_negative": lambda: K.ReduceLROnPlateau(cooldown=-1),
        "ReduceLROnPlateau.mode_bad": lambda: K.ReduceLROnPlateau(mode="bigger"),
        "ReduceLROnPlateau.min_lr_negative": lambda: K.ReduceLROnPlateau(min_lr=-1.0),
        "LearningRateScheduler.not_callable": lambda: K.LearningRateScheduler(1),
        "LambdaCallback.not_callable": lambda: K.LambdaCallback(on_train_begin=1),
        "BackupAndRestore.dir_int": lambda: K.BackupAndRestore(1),
        "BackupAndRestore.save_freq_str": lambda: K.BackupAndRestore(tmp, save_freq="step"),
        "BackupAndRestore.save_freq_zero": lambda: K.BackupAndRestore(tmp, save_freq=0),
        "BackupAndRestore.delete_int": lambda: K.BackupAndRestore(tmp, delete_checkpoint=1),
        "OnRequestExit.sigkill": lambda: K.OnRequestExit(sig=signal.SIGKILL),
        "OnRequestExit.file_name_int": lambda: K.OnRequestExit(file_name=1),
        "OnRequestExit.save_ckpt_int": lambda: K.OnRequestExit(save_ckpt=1),
        "RunContext.not_dict": lambda: K.RunContext(1),
        # metrics
        "get_metric_fn.int": lambda: K.get_metric_fn(1),
        "get_metric_fn.unknown": lambda: K.get_metric_fn("nope"),
        "Accuracy.eval_type_bad": lambda: K.metric_cls("Accuracy")("multiclass"),
        "Fbeta.beta_zero": lambda: K.metric_cls("Fbeta")(0),
        "TopK.k_zero": lambda: K.metric_cls("TopKCategoricalAccuracy")(0),
        "Loss.update_2d": lambda: K.metric_cls("Loss")().update(K.tensor2d()),
    }
    return {f"exc.{k}": K.exc_name(fn) for k, fn in cases.items()}
