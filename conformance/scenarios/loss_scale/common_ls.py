"""Loss-scale managers, update cells, TrainOneStepWithLossScaleCell with injected overflows.

K: net() (no BatchNorm), opt(n), loss_fn(), WithLossCell, TOSWLS (the TrainOneStepWithLossScaleCell
class), Fixed, Dynamic (managers), StaticLossScaler, DynamicLossScaler, all_finite, tensor(np),
scalar(t) -> float, boolv(t) -> bool, exc_name, guard, params(n) -> dict fc2.weight etc,
cell_kind(cell) -> class name or None.
"""

import numpy as np

from conformance import _common as C

OVERFLOW_AT = (3, 4, 8)  # 0-based steps whose batch holds an inf
N_STEPS = 10


def batches():
    x, y = C.data(n=4 * N_STEPS, seed=5)
    out = []
    for i, (bx, by) in enumerate(C.batches(x, y)):
        bx = bx.copy()
        if i in OVERFLOW_AT:
            bx[0, 0] = np.inf
        out.append((bx, by))
    return out


def trajectory(K, make_cell):
    net = K.net()
    cell = make_cell(net)
    rows = []
    for bx, by in batches():
        loss, ovf, scale = cell(K.tensor(bx), K.tensor(by))
        rows.append([K.scalar(loss), K.boolv(ovf), K.scalar(scale)])
    w = K.fc2_weight(net)
    return {
        "loss": [r[0] for r in rows],
        "overflow": [r[1] for r in rows],
        "scale_out": [r[2] for r in rows],
        "final_fc2_weight": w,
    }


def scenario(K):
    out = {}
    # managers
    f = K.Fixed()
    out["fixed.default"] = [
        K.scalar(f.get_loss_scale()),
        f.get_drop_overflow_update(),
        K.cell_kind(f.get_update_cell()),
    ]
    f = K.Fixed(64.0, drop_overflow_update=False)
    out["fixed.no_drop"] = [
        K.scalar(f.get_loss_scale()),
        f.get_drop_overflow_update(),
        K.cell_kind(f.get_update_cell()),
    ]
    d = K.Dynamic()
    out["dynamic.default"] = [
        K.scalar(d.get_loss_scale()),
        d.get_drop_overflow_update(),
        K.cell_kind(d.get_update_cell()),
    ]
    d = K.Dynamic(init_loss_scale=16, scale_factor=2, scale_window=3)
    seq = []
    for ovf in [False, False, False, True, False, False, False, False, True, True, False]:
        d.update_loss_scale(ovf)
        seq.append(K.scalar(d.get_loss_scale()))
    out["dynamic.host_update_sequence"] = seq
    d = K.Dynamic(init_loss_scale=2, scale_factor=4, scale_window=1)
    seq = []
    for ovf in [True, True, True, False]:
        d.update_loss_scale(ovf)
        seq.append(K.scalar(d.get_loss_scale()))
    out["dynamic.host_floor_at_1"] = seq
    # argument checks
    for key, fn in {
        "fixed.scale_below_1": lambda: K.Fixed(0.5),
        "fixed.scale_str": lambda: K.Fixed("8"),
        "fixed.drop_not_bool": lambda: K.Fixed(8.0, drop_overflow_update=1),
        "dynamic.init_below_1": lambda: K.Dynamic(init_loss_scale=0.5),
        "dynamic.factor_0": lambda: K.Dynamic(scale_factor=0),
        "dynamic.factor_1": lambda: K.Dynamic(scale_factor=1),
        "dynamic.window_0": lambda: K.Dynamic(scale_window=0),
        "dynamic.window_float": lambda: K.Dynamic(scale_window=2.5),
        "static_scaler.below_1": lambda: K.StaticLossScaler(0.5),
        "dynamic_scaler.factor_0": lambda: K.DynamicLossScaler(16, 0, 3),
        "dynamic_scaler.window_0": lambda: K.DynamicLossScaler(16, 2, 0),
    }.items():
        out["args." + key] = K.exc_name(fn)
    # functional scalers
    s = K.StaticLossScaler(8)
    t = K.tensor(np.array([1.0, 2.0], np.float32))
    out["static_scaler.scale_unscale"] = [
        K.np(s.scale(t)).tolist(),
        K.np(s.unscale(t)).tolist(),
        K.boolv(s.adjust(K.tensor(np.array(True)))),
    ]
    ds = K.DynamicLossScaler(16, 2, 3)
    seq = []
    for finite in [True, True, True, False, True, True, True, True]:
        ds.adjust(K.tensor(np.array(finite)))
        seq.append(K.scalar(ds.scale_value))
    out["dynamic_scaler.adjust_sequence"] = seq
    out["all_finite"] = [
        K.boolv(K.all_finite([t])),
        K.boolv(K.all_finite([K.tensor(np.array([1.0, np.inf], np.float32))])),
    ]

    # TrainOneStepWithLossScaleCell
    def with_update_cell(manager):
        def make(net):
            return K.TOSWLS(
                K.WithLossCell(net, K.loss_fn()), K.opt(net), scale_sense=manager.get_update_cell()
            )

        return make

    def with_tensor(value):
        def make(net):
            return K.TOSWLS(
                K.WithLossCell(net, K.loss_fn()),
                K.opt(net),
                scale_sense=K.tensor(np.array(value, np.float32)),
            )

        return make

    dyn = trajectory_safe(
        K, with_update_cell(K.Dynamic(init_loss_scale=16, scale_factor=2, scale_window=3))
    )
    out.update({f"cell.dynamic_update_cell.{k}": v for k, v in dyn.items()})
    fix = trajectory_safe(K, with_update_cell(K.Fixed(16.0)))
    out.update({f"cell.fixed_update_cell.{k}": v for k, v in fix.items()})

    # the same runs with each side's own way to hand a manager to the cell (MindSpore: the
    # update cell; lit_amp: the manager itself), so the step rule is compared even while
    # scale_sense=<update cell> is refused
    def native(manager):
        def make(net):
            return K.TOSWLS(
                K.WithLossCell(net, K.loss_fn()),
                K.opt(net),
                scale_sense=K.native_scale_sense(manager),
            )

        return make

    dyn = trajectory_safe(K, native(K.Dynamic(init_loss_scale=16, scale_factor=2, scale_window=3)))
    out.update({f"cell.dynamic_native.{k}": v for k, v in dyn.items()})
    fix = trajectory_safe(K, native(K.Fixed(16.0)))
    out.update({f"cell.fixed_native.{k}": v for k, v in fix.items()})
    ten = trajectory_safe(K, with_tensor(16.0))
    out.update({f"cell.tensor_scale.{k}": v for k, v in ten.items()})

    def set_scale():
        net = K.net()
        cell = with_tensor(16.0)(net)
        cell.set_sense_scale(K.tensor(np.array(4.0, np.float32)))
        bx, by = batches()[0]
        return K.scalar(cell(K.tensor(bx), K.tensor(by))[2])

    out["cell.set_sense_scale"] = K.guard(set_scale)
    out["cell.scale_sense_bad_type"] = K.exc_name(
        lambda: K.TOSWLS(K.WithLossCell(K.net(), K.loss_fn()), K.opt(K.net()), scale_sense=3)
    )
    out["cell.scale_sense_bad_shape"] = K.exc_name(
        lambda: K.TOSWLS(
            K.WithLossCell(K.net(), K.loss_fn()),
            K.opt(K.net()),
            scale_sense=K.tensor(np.ones((2, 2), np.float32)),
        )
    )
    return out


def trajectory_safe(K, make):
    try:
        return trajectory(K, make)
    except Exception as e:  # noqa: BLE001
        msg = f"error: {type(e).__name__}"
        return {k: msg for k in ("loss", "overflow", "scale_out", "final_fc2_weight")}
