"""Per-layer dtypes at O0-O3 and build_train_network combinations (MindSpore side).

bfloat16 cannot run here: MindSpore's CPU MatMul kernel has no bf16 (TypeError "Select CPU
operator[MatMul] fail! Unsupported data type!"). The bf16 per-layer dtypes are derived from the
source rule instead (auto_mixed_precision applies the given dtype exactly where it applies
float16: same to_float/_OutputTo16 placement), recorded as {"__derived__": ...}.
"""

import types

import mindspore as ms
from mindspore import Tensor, amp, nn

from conformance import _common as C
from conformance import _ms as S
from conformance.scenarios.amp_dtypes.common_amp import scenario


def hook(net, record, layers):
    for name, cell in net.cells_and_names():
        last = name.split(".")[-1] if name else ""
        if last in layers:
            cell.register_forward_hook(
                (lambda nm: lambda c, i, o: record(nm, o.dtype) and None)(last)
            )


def loss_value(out):
    if isinstance(out, (tuple, list)):
        out = out[0]
    return float(out.asnumpy())


def run():
    x, y = C.data()
    K = types.SimpleNamespace(
        net=S.net,
        opt=S.opt,
        loss_fn=S.loss_fn,
        x=Tensor(x[:4]),
        y=Tensor(y[:4]),
        amp=amp,
        fp16=ms.float16,
        fp32=ms.float32,
        bf16=ms.bfloat16,
        hook=hook,
        params=lambda n: n.get_parameters(),
        out_np=lambda t: t.astype(ms.float32).asnumpy(),
        loss_value=loss_value,
        exc_name=C.exc_name,
        dense_cls=nn.Dense,
        infer=lambda n: n.set_train(False),
        is_cell=lambda c: issubclass(c, nn.Cell),
        cell_name=lambda c: c.__name__,
    )
    out = {"mindspore": S.VERSION, **scenario(K)}
    for lvl in ("O1", "O2", "O3"):
        err = C.exc_name(
            lambda lvl=lvl: amp.auto_mixed_precision(S.net(), lvl, dtype=ms.bfloat16)(K.x)
        )
        out[f"auto.{lvl}.bf16.ms_cpu_run"] = {
            "__ms_unsupported__": f"{err}: MindSpore's CPU MatMul kernel has no bfloat16"
        }
        fp16 = out[f"auto.{lvl}.fp16.layer_out_dtype"]
        out[f"auto.{lvl}.bf16.layer_out_dtype"] = {
            "__derived__": {k: ("bfloat16" if v == "float16" else v) for k, v in fp16.items()},
            "why": "source rule: the level applies dtype where it applies float16 (fp16 run above)",
        }
    return out


if __name__ == "__main__":
    C.main(run)
