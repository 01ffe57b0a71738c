"""Metric names and metric objects, framework-neutral.

K: get_metric_fn(name, *a, **kw), cls(name) -> metric class by MindSpore class name,
tensor(np_array), value(metric) -> python value (MindSpore: eval(); lit_amp: compute()),
exc_name, Model, S (side helpers).
"""

import numpy as np

NAMES = [
    "accuracy",
    "acc",
    "precision",
    "recall",
    "F1",
    "f1",
    "mae",
    "mse",
    "loss",
    "top_1_accuracy",
    "top_5_accuracy",
    "topk",
    "auc",
    "roc",
    "dice",
    "perplexity",
    "confusion_matrix",
    "bleu_score",
    "cosine_similarity",
    "occlusion_sensitivity",
    "hausdorff_distance",
    "mean_surface_distance",
    "root_mean_square_distance",
    "confusion_matrix_metric",
]


def inputs():
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((6, 6)).astype(np.float32)
    prob = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    y = np.array([0, 1, 2, 3, 4, 5], np.int32)
    y2 = np.array([1, 1, 2, 0, 4, 5], np.int32)
    reg_p = rng.standard_normal((6, 2)).astype(np.float32)
    reg_y = rng.standard_normal((6, 2)).astype(np.float32)
    seg_p = (rng.random((2, 8)) > 0.5).astype(np.float32)
    seg_y = (rng.random((2, 8)) > 0.5).astype(np.float32)
    return {
        "clf": [(prob, y), (prob[::-1].copy(), y2)],
        "reg": [(reg_p, reg_y), (reg_y, reg_p)],
        "loss": [(np.float32(0.5),), (np.array([1.0, 2.0], np.float32),)],
        "seg": [(seg_p, seg_y), (seg_y, seg_p)],
    }


def kind(name):
    return {"mae": "reg", "mse": "reg", "loss": "loss", "dice": "seg"}.get(name, "clf")


def feed(K, m, batches):
    for b in batches:
        m.update(*[K.tensor(np.asarray(a)) for a in b])


def scenario(K):
    out = {}
    data = inputs()
    for name in NAMES:
        try:
            m = K.get_metric_fn(name)
        except Exception as e:  # noqa: BLE001
            out[f"by_name.{name}"] = f"construct raises {type(e).__name__}"
            continue
        try:
            feed(K, m, data[kind(name)])
            out[f"by_name.{name}"] = K.value(m)
        except Exception as e:  # noqa: BLE001
            out[f"by_name.{name}"] = f"update/eval raises {type(e).__name__}"
    out["by_name.topk_k3"] = K.guard(lambda: _val(K, K.get_metric_fn("topk", k=3), data["clf"]))
    out["by_name.confusion_matrix_6"] = K.guard(
        lambda: _val(K, K.get_metric_fn("confusion_matrix", num_classes=6), data["clf"])
    )
    # metric objects, the MindSpore way: clear(), update(...), eval()
    for cname, args, d in [
        ("Accuracy", (), "clf"),
        ("Precision", (), "clf"),
        ("Recall", (), "clf"),
        ("F1", (), "clf"),
        ("Fbeta", (2.0,), "clf"),
        ("MAE", (), "reg"),
        ("MSE", (), "reg"),
        ("Loss", (), "loss"),
        ("Top1CategoricalAccuracy", (), "clf"),
        ("TopKCategoricalAccuracy", (2,), "clf"),
        ("Perplexity", (), "clf"),
        ("Dice", (), "seg"),
    ]:

        def ms_way(cname=cname, args=args, d=d):
            m = K.cls(cname)(*args)
            m.clear()
            feed(K, m, data[d])
            first = K.py(m.eval())
            m.clear()
            feed(K, m, data[d][:1])
            return [first, K.py(m.eval())]

        out[f"object_ms_api.{cname}"] = K.guard(ms_way)
    out["object.precision_average"] = K.guard(lambda: _avg(K, "Precision", data["clf"]))
    out["object.recall_average"] = K.guard(lambda: _avg(K, "Recall", data["clf"]))
    out["object.accuracy_empty_eval"] = K.exc_name(lambda: K.cls("Accuracy")().eval())
    # metrics through Model.eval
    S = K.S
    n = S.net()
    mets = {"acc", "precision", "recall", "F1", "top_1_accuracy", "loss"}
    res = K.Model(n, S.loss_fn(), S.opt(n), metrics=mets).eval(S.valid_ds())
    for k, v in res.items():
        out[f"model_eval.{k}"] = K.py(v)
    return out


def _val(K, m, batches):
    feed(K, m, batches)
    return K.value(m)


def _avg(K, cname, batches):
    m = K.cls(cname)()
    feed(K, m, batches)
    return K.py(m.eval(average=True))
