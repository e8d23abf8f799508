"""The fused LayerNorm kernels of kernels/layer_norm.py, run by Triton's interpreter on the CPU
(TRITON_INTERPRET=1), against PyTorch: F.layer_norm forward and backward through autograd, as
eager PyTorch runs it under autocast for fp16/bf16 activations (the input cast to fp32, the norm
in fp32, the output cast back; the gradients the same way round), and in fp32 as is.

Per tensor, relative to that tensor's largest magnitude in an fp64 reference, with the bounds of
the fused BatchNorm test (tests/py/fused_bn_act.py) and the GPU battery: in fp32 both within
FUSED_FP32 of fp64; in fp16/bf16 the kernels at most twice as far from fp64 as eager PyTorch plus a
quarter of the dtype's unit roundoff; each row's mean and 1/std within FUSED_STATS.
Shapes are odd on purpose: channel counts below, at and between the tile widths (16 to 2048), row
counts that leave a ragged last tile and a ragged last reduction part, one part and many.

Prints one JSON line: {"cases": N, "max_parts": P, "worst": {...}}; exits non-zero with the
failing case. With `--battery-check DIR` it checks the GPU battery's reading of `ringtrain
fused-check`'s LayerNorm cases (battery_check below). With `--plan M C DTYPE SM_COUNT` it
prints instead the launches layer_norm.forward and layer_norm.backward make for that shape
(nothing runs), as csrc/fused_norm.cpp records its own (tests/fused_norm.rs compares the two).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# Sets TRITON_INTERPRET=1 and the interpreter's bf16 rounding before triton is imported.
from fused_bn_act import Tally, aligned, battery_reading, launch_line, rel  # noqa: E402

import torch  # noqa: E402

import layer_norm  # noqa: E402
from launch import check_args  # noqa: E402
from gpu_battery import FUSED_FP32, FUSED_STATS, eager_layer_norm, fused_bound  # noqa: E402

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}


def case(m, c, dtype, sm_count, seed):
    g = torch.Generator().manual_seed(seed)
    # A mean far from each row's spread (ConvNeXt's inputs are not centred).
    x = (torch.randn(m, c, generator=g) * 0.5 + 3.0).to(dtype)
    dy = torch.randn(m, c, generator=g).to(dtype)
    w, b = torch.rand(c, generator=g) + 0.5, torch.randn(c, generator=g) * 0.1
    eps = 1e-6
    ref = eager_layer_norm(x.double(), w.double(), b.double(), dy.double(), eps)
    twin = eager_layer_norm(x, w, b, dy, eps)
    y, mean, rstd = layer_norm.forward(x, w, b, eps)
    dx, dw, db = layer_norm.backward(dy, x, w, mean, rstd, sm_count)
    out = {}
    for name, f, t, r in zip(["y", "dx", "dw", "db"], (y, dx, dw, db), twin, ref):
        assert f.dtype == t.dtype, (name, f.dtype, t.dtype)
        ef, et = rel(f, r), rel(t, r)
        out[name] = ef
        if not (ef <= fused_bound(dtype, et) and (dtype != torch.float32 or et <= FUSED_FP32)):
            raise AssertionError(f"[{m}, {c}] {dtype} sm={sm_count}: {name} fused {ef:.3g} "
                                 f"vs PyTorch {et:.3g} of the fp64 reference")
    xd = x.double()
    stats = {"mean": (mean, xd.mean(dim=1)), "rstd": (rstd, 1.0 / torch.sqrt(xd.var(dim=1, unbiased=False) + eps))}
    for name, (f, r) in stats.items():
        out[name] = e = rel(f, r)
        if e > FUSED_STATS:
            raise AssertionError(f"[{m}, {c}] {dtype} sm={sm_count}: {name} {e:.3g} from fp64")
    return out, layer_norm.reduction_plan(m, c, sm_count)[0]


def variant(kernel, dtype_key, c, args, constexprs):
    """The table's name of a launch, as csrc/fused_norm.cpp picks it."""
    if "W" not in constexprs:
        return kernel
    return f"{kernel}.{dtype_key}.w{constexprs['W']}" + (".a16" if aligned(c, args) else "")


def plan(m, c, dtype_key, sm_count):
    dtype = DTYPES[dtype_key]
    lines = []

    def record(kernel, grid, args, **constexprs):
        check_args(kernel, args)
        lines.append(launch_line(variant(kernel.fn.__name__, dtype_key, c, args, constexprs), grid, args))

    x, dy = torch.empty(m, c, dtype=dtype), torch.empty(m, c, dtype=dtype)
    w = torch.empty(c)
    _, mean, rstd = layer_norm.forward(x, w, w, 1e-6, launch=record)
    layer_norm.backward(dy, x, w, mean, rstd, sm_count, launch=record)
    print("\n".join(lines))


def battery_check(out_dir):
    """The GPU battery's reading of `ringtrain fused-check`'s LayerNorm cases ("ln0.x", ...) on a
    file made by the interpreted kernels: it must pass it, and fail it once dx is off by a few
    units in the last place of its largest element."""
    tensors = {}
    for i, (shape, dtype) in enumerate([((2, 5, 7, 67), torch.float16), ((3, 4, 4, 96), torch.bfloat16),
                                        ((2, 3, 3, 130), torch.float32)]):
        g = torch.Generator().manual_seed(i)
        c = shape[-1]
        x, dy = (torch.randn(shape, generator=g) * 0.5 + 3.0).to(dtype), torch.randn(shape, generator=g).to(dtype)
        w, b = torch.rand(c, generator=g) + 0.5, torch.randn(c, generator=g) * 0.1
        y, mean, rstd = layer_norm.forward(x.view(-1, c), w, b, 1e-6)
        dx, dw, db = layer_norm.backward(dy.view(-1, c), x.view(-1, c), w, mean, rstd, 4)
        case = {"x": x, "dy": dy, "w": w, "b": b, "y": y.view(shape), "dx": dx.view(shape), "dw": dw, "db": db}
        tensors.update({f"ln{i}.{k}": v.contiguous() for k, v in case.items()})
    battery_reading(tensors, "ln0.dx", out_dir)


def main():
    if sys.argv[1:2] == ["--battery-check"]:
        return battery_check(sys.argv[2])
    if sys.argv[1:2] == ["--plan"]:
        m, c, dtype_key, sm_count = sys.argv[2:6]
        return plan(int(m), int(c), dtype_key, int(sm_count))
    shapes = [
        (70, 67),    # C between widths (128), a ragged row tile
        (243, 96),   # ConvNeXt-T's first stage width
        (33, 130),   # just above a width (256)
        (884, 16),   # C below the smallest width, many row tiles per part
        (9, 768),    # ConvNeXt-T's last stage width (1024)
        (5, 1536),   # ConvNeXt-L's (2048), two rows a tile
    ]
    tally = Tally()
    for i, (m, c) in enumerate(shapes):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for sm_count in (1, 3):
                tally.add(*case(m, c, dtype, sm_count, seed=100 * i + tally.cases), dtype)
    # 2700 rows over 6 multiprocessors: 43 parts of 64 rows, the last of 12.
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        tally.add(*case(2700, 67, dtype, 6, seed=900 + tally.cases), dtype)
    tally.report()


if __name__ == "__main__":
    main()
