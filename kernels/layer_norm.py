"""LayerNorm over the last dimension, in the activations' own dtype in and out, as Triton kernels:
ConvNeXt's block norm (NHWC after the depthwise convolution, then a Linear).

Under autocast eager PyTorch runs LayerNorm in fp32: a cast of the fp16/bf16 input to fp32, the
norm (fp32 out), then the Linear's cast back to fp16/bf16; backward the same in reverse. Counted
in passes over an activation-sized tensor, with 2-byte activations taken as one unit and fp32 ones
as two:
  forward   eager: cast (1 read, 2 written), norm (2 read, 2 written), cast (2 read, 1 written):
            5 read, 5 written. here: 1 read, 1 written.
  backward  eager: cast of dy (1 read, 2 written), the input gradient (4 read, 2 written), the
            weight gradient (4 read), cast of dx (2 read, 1 written): 11 read, 5 written.
            here: dy and x read once for dx and the partial weight gradients: 2 read, 1 written.
The arithmetic is fp32 throughout and rounds once at each store, as eager's last cast does.

Each program holds whole rows, W columns (the channel count rounded up to a power of two) by
BLOCK_M rows (W·BLOCK_M = TILE elements), so a row's mean and variance never leave registers and
are taken in two passes over them (no Σx² cancellation). The weight gradient reduces over rows in
two stages with no atomics (the second is kernels/launch.py's sum_parts): deterministic results.

Compiled ahead of time like kernels/bn_act.py (build_support/compile_kernels.py) and launched from
csrc/fused_norm.cpp, which repeats `forward` and `backward` below; the test suite runs this file's
kernels under TRITON_INTERPRET=1 against PyTorch (tests/py/fused_layer_norm.py).
"""
import triton
import triton.language as tl

from bn_act import tile
from launch import BLOCK_P, cdiv, check_args, row_tile, sum_parts

# Elements of one program's tile; its widths, W, are the powers of two from WIDTHS[0] to
# WIDTHS[-1] (channel counts above that run the unfused LayerNorm).
TILE = 4096
WIDTHS = (64, 128, 256, 512, 1024, 2048)
# Programs per multiprocessor of the backward's first stage.
PROGRAMS_PER_SM = 8


def num_warps(width):
    return 4 if width <= 512 else 8


@triton.jit
def ln_forward(x_ptr, weight_ptr, bias_ptr, y_ptr, mean_ptr, rstd_ptr, M, C, eps,
               BLOCK_M: tl.constexpr, W: tl.constexpr):
    """y = (x - mean)·rstd·w + b per row, with each row's mean and rstd kept for backward."""
    cols = tl.arange(0, W)
    cmask = cols < C
    rows, rmask, mask, offs = row_tile(tl.program_id(0) * BLOCK_M, M, cols, cmask, C, BLOCK_M)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / C
    d = tl.where(mask, x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=1) / C + eps)
    w = tl.load(weight_ptr + cols, mask=cmask, other=0.0)
    b = tl.load(bias_ptr + cols, mask=cmask, other=0.0)
    y = d * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + rows, mean, mask=rmask)
    tl.store(rstd_ptr + rows, rstd, mask=rmask)


@triton.jit
def ln_backward_partial(dy_ptr, x_ptr, weight_ptr, mean_ptr, rstd_ptr, dx_ptr, part_dw_ptr, part_db_ptr, M, C,
                        rows_per_prog, BLOCK_M: tl.constexpr, W: tl.constexpr):
    """dx = rstd·(g - mean(g) - x̂·mean(g·x̂)) per row, g = dy·w, x̂ = (x - mean)·rstd; and
    Σdy·x̂, Σdy over the program's rows, per column."""
    pid = tl.program_id(0)
    cols = tl.arange(0, W)
    cmask = cols < C
    w = tl.load(weight_ptr + cols, mask=cmask, other=0.0)
    row0 = pid * rows_per_prog
    row_end = tl.minimum(row0 + rows_per_prog, M)
    acc_dw = tl.zeros([W], dtype=tl.float32)
    acc_db = tl.zeros([W], dtype=tl.float32)
    for start in range(0, rows_per_prog, BLOCK_M):
        rows, rmask, mask, offs = row_tile(row0 + start, row_end, cols, cmask, C, BLOCK_M)
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + rows, mask=rmask, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=rmask, other=0.0)
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        g = dy * w[None, :]
        c1 = tl.sum(g * xhat, axis=1) / C
        c2 = tl.sum(g, axis=1) / C
        dx = (g - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        acc_dw += tl.sum(dy * xhat, axis=0)
        acc_db += tl.sum(dy, axis=0)
    tl.store(part_dw_ptr + pid * C + cols, acc_dw, mask=cmask)
    tl.store(part_db_ptr + pid * C + cols, acc_db, mask=cmask)


# ---- the orchestration (csrc/fused_norm.cpp does the same with the compiled kernels) ----------
def width(C):
    """The tile's width for C channels: the power of two of WIDTHS at or above C (None above)."""
    return next((w for w in WIDTHS if w >= C), None)


def reduction_plan(M, C, sm_count):
    """(num_parts, rows_per_prog) of the backward: PROGRAMS_PER_SM programs per multiprocessor,
    each a whole number of BLOCK_M-row tiles."""
    block_m = TILE // width(C)
    parts = max(1, min(cdiv(M, block_m), PROGRAMS_PER_SM * sm_count))
    rows = cdiv(cdiv(M, parts), block_m) * block_m
    return cdiv(M, rows), rows


def run(kernel, grid, args, **constexprs):
    """Launches `kernel` over `grid` with `args`, a list of (name, value) in its parameters'
    order, named as csrc/fused_norm.cpp names them."""
    check_args(kernel, args)
    warps = num_warps(constexprs["W"]) if "W" in constexprs else 4
    kernel[grid](*[v for _, v in args], num_warps=warps, **constexprs)


def forward(x2d, w, b, eps, launch=run):
    """x2d: [M, C] rows, contiguous. Returns y (x2d's dtype), mean, rstd (fp32, one per row)."""
    import torch
    M, C = x2d.shape
    W = width(C)
    f32 = dict(dtype=torch.float32, device=x2d.device)
    y = torch.empty_like(x2d)
    mean, rstd = torch.empty(M, **f32), torch.empty(M, **f32)
    launch(ln_forward, (cdiv(M, TILE // W), 1),
           [("x", x2d), ("weight", w), ("bias", b), ("y", y), ("mean", mean), ("rstd", rstd), ("M", M), ("C", C),
            ("eps", eps)],
           BLOCK_M=TILE // W, W=W)
    return y, mean, rstd


def backward(dy2d, x2d, w, mean, rstd, sm_count, launch=run):
    """Returns dx (x2d's dtype), dw and db (fp32)."""
    import torch
    M, C = x2d.shape
    W = width(C)
    parts, rows = reduction_plan(M, C, sm_count)
    f32 = dict(dtype=torch.float32, device=x2d.device)
    part_dw, part_db = torch.empty(parts, C, **f32), torch.empty(parts, C, **f32)
    dw, db = torch.empty(C, **f32), torch.empty(C, **f32)
    dx = torch.empty_like(x2d)
    launch(ln_backward_partial, (parts, 1),
           [("dy", dy2d), ("x", x2d), ("weight", w), ("mean", mean), ("rstd", rstd), ("dx", dx),
            ("part_dw", part_dw), ("part_db", part_db), ("M", M), ("C", C), ("rows_per_prog", rows)],
           BLOCK_M=TILE // W, W=W)
    block_c = tile("sum_parts")[1]
    for part, out in ((part_dw, dw), (part_db, db)):
        launch(sum_parts, (cdiv(C, block_c), 1), [("part", part), ("num_parts", parts), ("C", C), ("out", out)],
               BLOCK_C=block_c, BLOCK_P=BLOCK_P)
    return dx, dw, db
