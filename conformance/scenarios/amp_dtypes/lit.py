"""Per-layer dtypes at O0-O3 and build_train_network combinations (lit_amp port)."""

import types
import warnings

import torch
from torch import nn

import lit_amp
from conformance import _common as C
from conformance import _lit as S
from conformance.scenarios.amp_dtypes.common_amp import scenario

# torch module class -> the MindSpore cell it stands for
TORCH_TO_MS = {
    "Linear": "Dense",
    "ConvTranspose1d": "Conv1dTranspose",
    "ConvTranspose2d": "Conv2dTranspose",
    "ConvTranspose3d": "Conv3dTranspose",
}


def hook(net, record, layers):
    for name, mod in net.named_modules():
        last = name.split(".")[-1] if name else ""
        if last in layers:
            mod.register_forward_hook(
                (lambda nm: lambda m, i, o: record(nm, o.dtype) and None)(last)
            )


def loss_value(out):
    if isinstance(out, (tuple, list)):
        out = out[0]
    return float(out.detach().float())


def run():
    x, y = C.data()
    K = types.SimpleNamespace(
        net=S.net,
        opt=S.opt,
        loss_fn=S.loss_fn,
        x=torch.from_numpy(x[:4]),
        y=torch.from_numpy(y[:4]).long(),
        amp=lit_amp,
        fp16=torch.float16,
        fp32=torch.float32,
        bf16=torch.bfloat16,
        hook=hook,
        params=lambda n: n.parameters(),
        out_np=lambda t: t.detach().float().numpy(),
        loss_value=loss_value,
        exc_name=C.exc_name,
        dense_cls=nn.Linear,
        infer=lambda n: n.eval(),
        cell_name=lambda c: TORCH_TO_MS.get(c.__name__, c.__name__),
        # MindSpore's PReLU/ReLU entries are the primitives (ops.PReLU/ReLU), not cells
        is_cell=lambda c: (
            isinstance(c, type) and issubclass(c, nn.Module) and c.__name__ not in ("PReLU", "ReLU")
        ),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = scenario(K)
        for lvl in ("O1", "O2", "O3"):
            conv = lit_amp.auto_mixed_precision(S.net(), lvl, dtype=torch.bfloat16)
            seen = {}
            hook(
                conv,
                lambda n, d, seen=seen: seen.setdefault(n, str(d).replace("torch.", "")) and None,
                ("fc1", "bn", "relu", "fc2"),
            )
            conv.eval()
            conv(K.x)
            out[f"auto.{lvl}.bf16.layer_out_dtype"] = {
                k: seen.get(k) for k in ("fc1", "bn", "relu", "fc2")
            }
    return out


if __name__ == "__main__":
    C.main(run)
