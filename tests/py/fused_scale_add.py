"""The end of a ConvNeXt block as fused kernels (kernels/scale_add.py: layer scale, stochastic
depth's per-sample factor and the residual add), run by Triton's interpreter on the CPU against
eager PyTorch's ops through autograd (bench/gpu_battery.py's eager_scale_add: type promotion as
eager's, so a bf16 z and an fp32 stream give fp32 out).

Per tensor, relative to its largest magnitude in an fp64 reference, with the bounds of the other
fused kernels' tests: out (fp32) within FUSED_FP32 of fp64; dz and dγ at most twice as far from
fp64 as PyTorch plus a quarter of z's unit roundoff (FUSED_FP32 for fp32 z). The stream's gradient
is the upstream gradient itself in both. Shapes are odd on purpose (ragged tiles and reduction
parts), with samples dropped and kept.

Prints one JSON line: {"cases": N, "max_parts": P, "worst": {...}}; exits non-zero with the
failing case. With `--battery-check DIR` it checks the GPU battery's reading of `ringtrain
fused-check`'s scale-add cases. With `--plan N H W C Z_DTYPE STREAM_DTYPE SM_COUNT` it prints instead the launches
scale_add.forward and scale_add.backward make (nothing runs), as csrc/fused_norm.cpp records its
own (tests/fused_norm.rs compares the two).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# Sets TRITON_INTERPRET=1 and the interpreter's bf16 rounding before triton is imported.
from fused_bn_act import Tally, aligned, battery_reading, launch_line, rel  # noqa: E402

import torch  # noqa: E402

import scale_add  # noqa: E402
from launch import check_args  # noqa: E402
from gpu_battery import FUSED_FP32, eager_scale_add, fused_bound  # noqa: E402

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}


def draw(shape, z_dtype, stream_dtype, drop, seed):
    """z [N, H, W, C], stream (channels_last [N, C, H, W]), gamma [C, 1, 1], keep [N], dout."""
    n, h, w, c = shape
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(shape, generator=g).to(z_dtype)
    stream = torch.randn(n, c, h, w, generator=g).to(stream_dtype).contiguous(memory_format=torch.channels_last)
    gamma = torch.rand(c, 1, 1, generator=g) + 0.5
    # Stochastic depth's factor: each sample dropped (0) or kept and scaled by 1/(1 - p).
    keep = (torch.rand(n, generator=g) > 0.3).float() / 0.7 if drop else torch.ones(n)
    dout = torch.randn(n, c, h, w, generator=g).contiguous(memory_format=torch.channels_last)
    return z, stream, gamma, keep, dout


def rows(t):
    """A channels_last [N, C, H, W] tensor's [M, C] rows (a view)."""
    return t.permute(0, 2, 3, 1).reshape(-1, t.shape[1])


def case(shape, z_dtype, stream_dtype, drop, sm_count, seed):
    n, h, w, c = shape
    z, stream, gamma, keep, dout = draw(shape, z_dtype, stream_dtype, drop, seed)
    ref = eager_scale_add(z.double(), stream.double(), gamma.double(), keep.double(), dout.double())
    twin = eager_scale_add(z, stream, gamma, keep, dout)
    out = scale_add.forward(z.view(-1, c), rows(stream), gamma.view(-1), keep, h * w)
    dz, dgamma = scale_add.backward(rows(dout), z.view(-1, c), gamma.view(-1), keep, h * w, sm_count)
    fused = (out.view(n, h, w, c).permute(0, 3, 1, 2), dz.view(shape), dgamma.view(c, 1, 1))
    found = {}
    for name, f, t, r in zip(("out", "dz", "dgamma"), fused, twin, ref):
        assert f.dtype == t.dtype and f.shape == t.shape, (name, f.dtype, t.dtype, f.shape, t.shape)
        ef, et = rel(f, r), rel(t, r)
        bound = fused_bound(torch.float32 if name == "out" else z_dtype, et)
        found[name] = ef
        if ef > bound or (z_dtype == torch.float32 and et > FUSED_FP32):
            raise AssertionError(f"{shape} z {z_dtype} stream {stream_dtype} drop={drop} sm={sm_count}: {name} "
                                 f"fused {ef:.3g} vs PyTorch {et:.3g} of the fp64 reference")
    return found, scale_add.reduction_plan(n * h * w, c, sm_count, "scale_add_backward_partial")[0]


def plan(n, h, w, c, z_key, stream_key, sm_count):
    lines = []

    def record(kernel, grid, args, **constexprs):
        check_args(kernel, args)
        name = kernel.fn.__name__
        a16 = ".a16" if aligned(c, args) else ""
        if name == "scale_add_forward":
            name += f".{z_key}.{stream_key}{a16}"
        elif name == "scale_add_backward_partial":
            name += f".{z_key}{a16}"
        lines.append(launch_line(name, grid, args))

    m = n * h * w
    z = torch.empty(m, c, dtype=DTYPES[z_key])
    stream = torch.empty(m, c, dtype=DTYPES[stream_key])
    gamma, keep = torch.empty(c), torch.empty(n)
    scale_add.forward(z, stream, gamma, keep, h * w, launch=record)
    scale_add.backward(torch.empty(m, c), z, gamma, keep, h * w, sm_count, launch=record)
    print("\n".join(lines))


def battery_check(out_dir):
    """The GPU battery's reading of `ringtrain fused-check`'s scale-add cases ("sa0.z", ...) on a
    file made by the interpreted kernels: it must pass it, and fail it once dz is off by a few
    units in the last place of its largest element."""
    tensors = {}
    for i, (shape, z_dtype, stream_dtype) in enumerate([((2, 5, 7, 67), torch.float16, torch.float32),
                                                        ((3, 4, 4, 96), torch.bfloat16, torch.bfloat16),
                                                        ((2, 3, 3, 130), torch.float32, torch.float32)]):
        n, h, w, c = shape
        z, stream, gamma, keep, dout = draw(shape, z_dtype, stream_dtype, True, i)
        out = scale_add.forward(z.view(-1, c), rows(stream), gamma.view(-1), keep, h * w)
        dz, dgamma = scale_add.backward(rows(dout), z.view(-1, c), gamma.view(-1), keep, h * w, 4)
        case = {"z": z, "stream": stream, "gamma": gamma, "keep": keep, "dout": dout,
                "out": out.view(n, h, w, c).permute(0, 3, 1, 2), "dz": dz.view(shape), "dgamma": dgamma.view(c, 1, 1)}
        tensors.update({f"sa{i}.{k}": v.contiguous() for k, v in case.items()})
    battery_reading(tensors, "sa0.dz", out_dir)


def main():
    if sys.argv[1:2] == ["--battery-check"]:
        return battery_check(sys.argv[2])
    if sys.argv[1:2] == ["--plan"]:
        n, h, w, c, z_key, stream_key, sm_count = sys.argv[2:9]
        return plan(int(n), int(h), int(w), int(c), z_key, stream_key, int(sm_count))
    shapes = [(2, 5, 7, 67), (3, 4, 4, 96), (1, 3, 11, 130), (4, 13, 17, 16)]
    tally = Tally()
    for i, shape in enumerate(shapes):
        for z_dtype in (torch.float32, torch.float16, torch.bfloat16):
            for stream_dtype in sorted({z_dtype, torch.float32}, key=str):
                for drop, sm_count in ((True, 1), (False, 7)):
                    tally.add(*case(shape, z_dtype, stream_dtype, drop, sm_count, seed=100 * i + tally.cases), z_dtype)
    # M = 2700 over 25 multiprocessors: 43 parts of 64 rows, the last of 12.
    for z_dtype in (torch.float32, torch.float16, torch.bfloat16):
        tally.add(*case((4, 25, 27, 67), z_dtype, torch.float32, True, 25, seed=900 + tally.cases), z_dtype)
    tally.report()


if __name__ == "__main__":
    main()
