"""The fused BatchNorm + (add) + ReLU kernels of kernels/bn_act.py, run by Triton's interpreter on
the CPU (TRITON_INTERPRET=1, set before triton is imported), against PyTorch's unfused operations:
F.batch_norm in training mode, the residual add and ReLU, forward and backward through autograd.

Each case draws x, the residual, weight, bias, running statistics and the upstream gradient, then
compares, per tensor, relative to that tensor's largest magnitude in an fp64 reference:
  - fp32: the fused kernels and PyTorch's fp32 ops both within 2e-5 of fp64 (FUSED_FP32);
  - fp16/bf16: the fused kernels (fp32 inside, one rounding at the store) at most twice as far
    from the fp64 reference as PyTorch's own unfused ops in that dtype (which round after every
    op), plus a quarter of the dtype's unit roundoff for ties.
The mean, invstd and running statistics (fp32 on both sides) are held to 1e-5 in every dtype
(FUSED_STATS). The reference and the bounds are the GPU battery's (bench/gpu_battery.py), which
holds the compiled kernels to them on a GPU.
Shapes are odd on purpose: channel counts that are no multiple of the channel blocks (64, 128), row
counts that leave a ragged last tile and a ragged last reduction part, and several reduction
plans (one part, many parts) for the same shape.

Prints one JSON line: {"cases": N, "worst": {...}}; exits non-zero with the failing case.

With `--battery-check DIR` it checks the GPU battery's reading of `ringtrain fused-check`
(battery_check below). With `--plan N C H W DTYPE RES SM_COUNT` it prints instead the launches bn_act.forward and
bn_act.backward make for that shape (nothing runs), one line each, as csrc/fused_norm.cpp
records its own (tests/fused_norm.rs compares the two).
"""
import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path[:0] = [os.path.join(ROOT, "kernels"), os.path.join(ROOT, "bench")]

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

import bn_act  # noqa: E402
import launch  # noqa: E402
from launch import check_args  # noqa: E402
# The GPU battery's reference and bounds, so that its check of the compiled kernels and this one
# of the interpreted kernels are the same check.
from gpu_battery import FUSED_FP32, FUSED_STATS, fused_bound, unfused_bn_relu  # noqa: E402


def _interpreter_bf16_rounds_to_nearest_even():
    """The interpreter turns fp32 into bf16 by cutting the low 16 bits (and its round-to-nearest
    mode forgets the carry into the exponent), where a GPU's cvt.rn.bf16.f32 rounds to nearest
    even: that alone made the fused bf16 outputs look 2-3 units off. This gives the interpreter
    the GPU's rounding for that one conversion; every other one is left as it is."""
    convert = interpreter._convert_float

    def rne(x, src, dst, rounding_mode):
        if src == tl.float32 and dst == tl.bfloat16:
            bits = np.frombuffer(np.ascontiguousarray(x).tobytes(), dtype=np.uint32).reshape(np.shape(x))
            bits = bits.astype(np.uint64)
            return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        return convert(x, src, dst, rounding_mode)

    interpreter._convert_float = rne


_interpreter_bf16_rounds_to_nearest_even()

def channels_last_2d(t):
    """[N, C, H, W] channels_last → its [M, C] matrix (a view, no copy)."""
    n, c, h, w = t.shape
    return t.permute(0, 2, 3, 1).reshape(n * h * w, c)


def from_2d(t2d, shape):
    n, c, h, w = shape
    return t2d.reshape(n, h, w, c).permute(0, 3, 1, 2)


def rel(got, want):
    scale = want.abs().max().item()
    return (got.double() - want.double()).abs().max().item() / max(scale, 1e-30)


def case(shape, dtype, has_res, sm_count, seed):
    g = torch.Generator().manual_seed(seed)
    n, c, h, w_ = shape
    # A mean far from zero against a small spread: Σx² − (Σx)² would lose the variance here.
    x32 = torch.randn(shape, generator=g) * 0.5 + 3.0
    res32 = torch.randn(shape, generator=g) if has_res else None
    dy32 = torch.randn(shape, generator=g)
    w = torch.rand(c, generator=g) + 0.5
    b = torch.randn(c, generator=g) * 0.1
    rm0, rv0 = torch.randn(c, generator=g), torch.rand(c, generator=g) + 0.5
    momentum, eps = 0.1, 1e-5
    cl = lambda t: t.to(dtype).contiguous(memory_format=torch.channels_last)  # noqa: E731
    x, res, dy = cl(x32), (cl(res32) if has_res else None), cl(dy32)

    # fp64 reference from the very inputs the kernels see (already rounded to dtype).
    rm64, rv64 = rm0.double().clone(), rv0.double().clone()
    ref = unfused_bn_relu(x.double(), res.double() if has_res else None, w.double(), b.double(), rm64, rv64,
                          dy.double(), momentum, eps)
    # PyTorch's own ops in dtype (autocast keeps BatchNorm's parameters in fp32).
    rm_t, rv_t = rm0.clone(), rv0.clone()
    twin = unfused_bn_relu(x, res, w, b, rm_t, rv_t, dy, momentum, eps)

    rm_f, rv_f = rm0.clone(), rv0.clone()
    y2d, mean, invstd = bn_act.forward(channels_last_2d(x), channels_last_2d(res) if has_res else None, w, b,
                                       rm_f, rv_f, momentum, eps, sm_count)
    dx2d, dw, db, dres2d = bn_act.backward(channels_last_2d(dy), y2d, channels_last_2d(x), mean, invstd, w,
                                           has_res, sm_count)
    fused = (from_2d(y2d, shape), from_2d(dx2d, shape), dw, db, from_2d(dres2d, shape) if has_res else None)

    out = {}
    names = ["y", "dx", "dw", "db", "dres"]
    for name, f, t, r in zip(names, fused, twin, ref):
        if r is None:
            continue
        assert f.dtype == t.dtype, (name, f.dtype, t.dtype)
        ef, et = rel(f, r), rel(t, r)
        # In fp32 PyTorch's own ops must meet the bound too.
        ok = ef <= fused_bound(dtype, et) and (dtype != torch.float32 or et <= FUSED_FP32)
        out[name] = ef
        if not ok:
            raise AssertionError(f"{shape} {dtype} res={has_res} sm={sm_count}: {name} fused {ef:.3g} "
                                 f"vs PyTorch {et:.3g} of the fp64 reference")
    xd = x.double()
    var = xd.var(dim=(0, 2, 3), unbiased=False)
    stats = {
        "mean": (mean, xd.mean(dim=(0, 2, 3))),
        "invstd": (invstd, 1.0 / torch.sqrt(var + eps)),
        "running_mean": (rm_f, rm64),
        "running_var": (rv_f, rv64),
    }
    for name, (f, r) in stats.items():
        out[name] = e = rel(f, r)
        if e > FUSED_STATS:
            raise AssertionError(f"{shape} {dtype} sm={sm_count}: {name} {e:.3g} from fp64")
    # The parts really were several where the plan says so (the test would not cover merges else):
    # the fewer of the statistics' and the backward's.
    return out, min(bn_act.reduction_plan(n * h * w_, c, sm_count, k)[0]
                    for k in ("bn_stats_partial", "bn_act_backward_partial"))


class Tally:
    """The cases run, the most reduction parts any of them took, and the worst error per tensor
    and dtype; `report` prints them as the one JSON line the Rust test reads."""

    def __init__(self):
        self.cases, self.max_parts, self.worst = 0, 0, {}

    def add(self, errors, parts, dtype):
        self.cases += 1
        self.max_parts = max(self.max_parts, parts)
        for name, e in errors.items():
            key = f"{name}_{str(dtype).split('.')[-1]}"
            self.worst[key] = max(self.worst.get(key, 0.0), e)

    def report(self):
        # The second stage's merges covered more parts than it reads at a time (launch.BLOCK_P),
        # so its loop ran more than once, with a ragged last tile.
        assert self.max_parts > launch.BLOCK_P, self.max_parts
        print(json.dumps({"cases": self.cases, "max_parts": self.max_parts, "worst": self.worst}))


def launch_line(variant, grid, args):
    """One launch as csrc/fused_norm.cpp records it: the variant, the grid, pointers by name and
    scalars with their type and value."""
    words = [f"{variant} grid=({grid[0]},{grid[1]})"]
    for k, v in args:
        words.append(k if torch.is_tensor(v) else f"{k}:f32={v:.9g}" if isinstance(v, float) else f"{k}:i32={v}")
    return " ".join(words)


def aligned(c, args):
    """The ".a16" variants: C a multiple of 16 and every pointer 16-byte aligned."""
    return c % 16 == 0 and all(v.data_ptr() % 16 == 0 for _, v in args if torch.is_tensor(v))


def plan(n, c, h, w, dtype, has_res, sm_count):
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[dtype]
    dtype_key = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}[dtype]
    lines = []

    def record(kernel, grid, args, **constexprs):
        name = kernel.fn.__name__
        if name not in ("bn_stats_finalize", "bn_act_backward_finalize"):
            res = ".res" if constexprs.get("HAS_RES") else ""
            name += "." + dtype_key + res + (".a16" if aligned(c, args) else "")
        check_args(kernel, args)
        lines.append(launch_line(name, grid, args))

    m = n * h * w
    x2d, dy2d = torch.empty(m, c, dtype=dtype), torch.empty(m, c, dtype=dtype)
    res2d = torch.empty(m, c, dtype=dtype) if has_res else None
    wt, bs, rm, rv = (torch.empty(c) for _ in range(4))
    y2d, mean, invstd = bn_act.forward(x2d, res2d, wt, bs, rm, rv, 0.1, 1e-5, sm_count, launch=record)
    bn_act.backward(dy2d, y2d, x2d, mean, invstd, wt, has_res, sm_count, launch=record)
    print("\n".join(lines))


def battery_check(out_dir):
    """The GPU battery's reading of `ringtrain fused-check` (bench/gpu_battery.py's fused_cases),
    given a file in that format made by the interpreted kernels: it must pass it, and fail it
    once one gradient is off by a few units in the last place of its largest element."""
    tensors = {}
    for i, (shape, dtype, has_res) in enumerate([((2, 67, 5, 7), torch.float16, True),
                                                 ((3, 64, 9, 9), torch.bfloat16, False),
                                                 ((2, 16, 6, 5), torch.float32, True)]):
        g = torch.Generator().manual_seed(i)
        c = shape[1]
        cl = lambda t: t.to(dtype).contiguous(memory_format=torch.channels_last)  # noqa: E731
        x, dy = cl(torch.randn(shape, generator=g) * 0.5 + 3.0), cl(torch.randn(shape, generator=g))
        res = cl(torch.randn(shape, generator=g)) if has_res else None
        w, b = torch.rand(c, generator=g) + 0.5, torch.randn(c, generator=g) * 0.1
        rm0, rv0 = torch.randn(c, generator=g), torch.rand(c, generator=g) + 0.5
        rm, rv = rm0.clone(), rv0.clone()
        y2d, mean, invstd = bn_act.forward(channels_last_2d(x), channels_last_2d(res) if has_res else None, w, b,
                                           rm, rv, 0.1, 1e-5, 4)
        dx2d, dw, db, dres2d = bn_act.backward(channels_last_2d(dy), y2d, channels_last_2d(x), mean, invstd, w,
                                               has_res, 4)
        case = {"x": x, "dy": dy, "w": w, "b": b, "rm0": rm0, "rv0": rv0, "y": from_2d(y2d, shape),
                "rm": rm, "rv": rv, "dx": from_2d(dx2d, shape), "dw": dw, "db": db}
        if has_res:
            case.update(res=res, dres=from_2d(dres2d, shape))
        tensors.update({f"{i}.{k}": v.contiguous() for k, v in case.items()})
    battery_reading(tensors, "0.dx", out_dir)


def battery_reading(tensors, spoiled, out_dir):
    """Writes `tensors` as `ringtrain fused-check` would and has the battery read them (it must
    pass), then again with `spoiled`'s largest element 8 units of fp16's last place off (it must
    fail). Prints {"cases": N, "caught": the failure's message or null}."""
    from safetensors.torch import save_file
    import gpu_battery

    good = os.path.join(out_dir, "good.safetensors")
    save_file(tensors, good)
    found = gpu_battery.fused_cases(good, "cpu")
    t = tensors[spoiled].clone()
    flat = t.view(-1)
    k = flat.float().abs().argmax()
    flat[k] = flat[k] * (1 + 8 * 2.0**-11)
    bad = os.path.join(out_dir, "bad.safetensors")
    save_file({**tensors, spoiled: t}, bad)
    try:
        gpu_battery.fused_cases(bad, "cpu")
        caught = None
    except gpu_battery.Failed as e:
        caught = str(e)
    print(json.dumps({"cases": len(found), "caught": caught}))


def main():
    if sys.argv[1:2] == ["--battery-check"]:
        return battery_check(sys.argv[2])
    if sys.argv[1:2] == ["--plan"]:
        n, c, h, w, dtype, has_res, sm_count = sys.argv[2:9]
        return plan(int(n), int(c), int(h), int(w), dtype, has_res == "1", int(sm_count))
    shapes = [
        (2, 67, 5, 7),    # C not a multiple of 64, M = 70: a ragged tile
        (3, 64, 9, 9),    # C exactly one block, M = 243
        (1, 130, 3, 11),  # three channel blocks, the last of 2
        (4, 16, 17, 13),  # M = 884: many row tiles per part
    ]
    tally = Tally()
    for i, shape in enumerate(shapes):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for has_res in (False, True):
                for sm_count in (1, 7):
                    tally.add(*case(shape, dtype, has_res, sm_count, seed=100 * i + tally.cases), dtype)
    # M = 5476 over 25 multiprocessors: 43 parts of 128 rows each way (the statistics' tiles of
    # 128 rows, the backward's 2 of 64), the last of 100.
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        tally.add(*case((4, 67, 37, 37), dtype, True, 25, seed=900 + tally.cases), dtype)
    tally.report()


if __name__ == "__main__":
    main()
