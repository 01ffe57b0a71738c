"""Per-layer dtypes at O0-O3 and build_train_network override combinations, framework-neutral.

K: net(), opt(n), loss_fn(), x (input batch), y (labels), amp (module-like with
auto_mixed_precision / build_train_network / get_white_list / get_black_list),
fp16, fp32, bf16 (the side's dtypes), hook(cell_iter, record) registers output-dtype hooks,
out_np(t), exc_name.
"""

LAYERS = ("fc1", "bn", "relu", "fc2")


def norm_dtype(d):
    s = str(d).lower().replace("torch.", "")
    return s


def layer_dtypes(K, net, run):
    seen = {}

    def record(name, dt):
        seen.setdefault(name, norm_dtype(dt))  # first call only (wrapper and inner cell)

    K.hook(net, record, LAYERS)
    y = run()
    return {k: seen.get(k) for k in LAYERS}, y


def scenario(K, bf16_ok=True):
    out = {}
    for lvl in ("O0", "O1", "O2", "O3"):
        net = K.net()
        conv = K.amp.auto_mixed_precision(net, lvl, dtype=K.fp16)
        K.infer(conv)
        dts, y = layer_dtypes(K, conv, lambda conv=conv: conv(K.x))
        out[f"auto.{lvl}.fp16.layer_out_dtype"] = dts
        out[f"auto.{lvl}.fp16.output_dtype"] = norm_dtype(y.dtype)
        out[f"auto.{lvl}.fp16.param_dtypes"] = sorted({norm_dtype(p.dtype) for p in K.params(conv)})
        out[f"auto.{lvl}.fp16.output_loss"] = K.out_np(y)
    out["lists.white_cells"] = sorted(
        K.cell_name(c) for c in K.amp.get_white_list() if K.is_cell(c)
    )
    out["lists.black"] = [c.__name__ for c in K.amp.get_black_list()]
    out["lists.white_is_copy"] = K.amp.get_white_list() is not K.amp.get_white_list()
    # build_train_network: every override combination (loss_scale_manager=None: CPU-safe)
    for lvl in ("O0", "O1", "O2", "O3"):
        for cmt in (None, "fp16", "fp32"):
            for kbn in (None, True, False):
                kw = {"loss_scale_manager": None}
                if cmt:
                    kw["cast_model_type"] = K.fp16 if cmt == "fp16" else K.fp32
                if kbn is not None:
                    kw["keep_batchnorm_fp32"] = kbn
                key = f"build.{lvl}.cast={cmt}.keepbn={kbn}"
                net = K.net()
                try:
                    step = K.amp.build_train_network(net, K.opt(net), K.loss_fn(), level=lvl, **kw)
                except Exception as e:  # noqa: BLE001
                    out[key + ".layer_out_dtype"] = f"raises {type(e).__name__}"
                    continue
                dts, loss = layer_dtypes(K, step, lambda step=step: step(K.x, K.y))
                out[key + ".layer_out_dtype"] = dts
                out[key + ".loss_loss"] = K.loss_value(loss)
    # the level's default loss-scale manager on CPU, and argument errors
    for lvl in ("O0", "O1", "O2", "O3"):
        net = K.net()
        out[f"build.{lvl}.default_manager"] = K.exc_name(
            lambda net=net, lvl=lvl: K.amp.build_train_network(
                net, K.opt(net), K.loss_fn(), level=lvl
            )
        )
    net = K.net()
    out["build.bad_kwarg"] = K.exc_name(
        lambda: K.amp.build_train_network(net, K.opt(net), K.loss_fn(), level="O2", foo=1)
    )
    out["build.level_int"] = K.exc_name(
        lambda: K.amp.build_train_network(net, K.opt(net), K.loss_fn(), level=2)
    )
    out["build.level_O4"] = K.exc_name(
        lambda: K.amp.build_train_network(net, K.opt(net), K.loss_fn(), level="O4")
    )
    out["build.boost_O3"] = K.exc_name(
        lambda: K.amp.build_train_network(net, K.opt(net), K.loss_fn(), boost_level="O3")
    )
    out["build.cast_bf16_kwarg"] = K.exc_name(
        lambda: K.amp.build_train_network(
            K.net(),
            K.opt(net),
            K.loss_fn(),
            level="O3",
            cast_model_type=K.bf16,
            loss_scale_manager=None,
        )
    )
    out["build.keepbn_str"] = K.exc_name(
        lambda: K.amp.build_train_network(
            net,
            K.opt(net),
            K.loss_fn(),
            level="O2",
            keep_batchnorm_fp32="yes",
            loss_scale_manager=None,
        )
    )
    out["build.lsm_wrong_type"] = K.exc_name(
        lambda: K.amp.build_train_network(
            net, K.opt(net), K.loss_fn(), level="O2", loss_scale_manager=3
        )
    )
    out["build.optimizer_wrong_type"] = K.exc_name(
        lambda: K.amp.build_train_network(net, object(), K.loss_fn(), level="O0")
    )
    out["auto.network_wrong_type"] = K.exc_name(lambda: K.amp.auto_mixed_precision(object(), "O1"))
    out["auto.level_O5"] = K.exc_name(lambda: K.amp.auto_mixed_precision(K.net(), "O5"))
    out["auto.dtype_fp32"] = K.exc_name(
        lambda: K.amp.auto_mixed_precision(K.net(), "O2", dtype=K.fp32)
    )
    out["custom.neither_list"] = K.exc_name(lambda: K.amp.custom_mixed_precision(K.net()))
    out["custom.both_lists"] = K.exc_name(
        lambda: K.amp.custom_mixed_precision(
            K.net(), white_list=K.amp.get_white_list(), black_list=K.amp.get_black_list()
        )
    )
    out["custom.white_not_class"] = K.exc_name(
        lambda: K.amp.custom_mixed_precision(K.net(), white_list=[1])
    )
    # custom lists: white list = Dense only; black list = default black list
    net = K.net()
    conv = K.amp.custom_mixed_precision(net, white_list=[K.dense_cls])
    K.infer(conv)
    out["custom.white_dense.layer_out_dtype"], y = layer_dtypes(K, conv, lambda: conv(K.x))
    out["custom.white_dense.output_dtype"] = norm_dtype(y.dtype)
    net = K.net()
    conv = K.amp.custom_mixed_precision(net, black_list=K.amp.get_black_list())
    K.infer(conv)
    out["custom.black_default.layer_out_dtype"], y = layer_dtypes(K, conv, lambda: conv(K.x))
    out["custom.black_default.output_dtype"] = norm_dtype(y.dtype)
    return out
