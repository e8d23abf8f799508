"""Fused BatchNorm (+ residual add) + ReLU for channels_last training, as Triton kernels.

A channels_last activation [N, C, H, W] is, in memory, a row-major matrix [M, C] with
M = N·H·W rows and C contiguous: every kernel here reads and writes that matrix. Counted in
passes over an activation-sized tensor, with a residual:
  forward   eager PyTorch: statistics (1 read), normalise (1 read, 1 write), add (2 reads,
            1 write), ReLU (1 read, 1 write): 5 reads, 3 writes.
            here: statistics (1 read), normalise + add + clamp (2 reads, 1 write): 3 reads, 1 write.
  backward  eager: ReLU's gradient g (2 reads, 1 write; the residual takes g as its gradient),
            BatchNorm's two passes (2 reads, then 2 reads and 1 write): 6 reads, 2 writes.
            here: Σg and Σg·(x-mean), storing g as the residual's gradient (3 reads, 1 write), then
            dx from g and x (2 reads, 1 write): 5 reads, 2 writes.
Without a residual: forward 2 reads and 1 write (eager 3 and 2), backward 6 reads and 1 write
(eager 6 and 2). Plus two tiny kernels each way that combine per-channel partial sums.

Reductions run in two stages with no atomics, so results are deterministic: each program reduces
`rows_per_prog` rows of a block of channels into partial results, and one small kernel combines
them. The statistics use Welford/Chan merges of (count, mean, M2), not Σx and Σx², which lose the
variance to cancellation when |mean| ≫ std.

These kernels are compiled ahead of time, for sm_80, sm_90 and sm_100, when ringtrain is built
(build_support/compile_kernels.py), and launched from csrc/fused_norm.cpp, which repeats the
orchestration of `forward` and `backward` below. The test suite runs this file's kernels under
TRITON_INTERPRET=1 on the CPU against PyTorch's unfused operations (tests/py/fused_bn_act.py).
"""
import inspect

import triton
import triton.language as tl

from launch import BLOCK_P, cdiv, check_args, parts_tile, row_tile

# Tile of the [M, C] matrix one program handles per iteration: 64 channels (128 bytes of fp16 per
# row, one coalesced segment) by 64 rows, for every kernel here and in scale_add.py but those of
# TILES. The build writes each kernel's tile into the kernel table, where the C++ side reads it.
BLOCK_M = 64
BLOCK_C = 64
NUM_WARPS = 4
# Programs per multiprocessor of the reductions' first stages (the C++ launcher's too).
PROGRAMS_PER_SM = 4
# (BLOCK_M, BLOCK_C) where another tile was faster: bench/fused_tiles.py timed ten tiles at
# ResNet-50's shapes on an H200 (docs/BENCHMARKS.md). The statistics' pass reads 128 rows per
# iteration (1.6x as fast over a step), the two pointwise kernels 32 rows of 128 channels
# (forward 11 %, backward 8 % faster).
TILES = {"bn_stats_partial": (128, 64), "bn_act_forward": (32, 128), "bn_act_backward": (32, 128)}


def tile(kernel):
    """(BLOCK_M, BLOCK_C) of the kernel named `kernel`."""
    return TILES.get(kernel, (BLOCK_M, BLOCK_C))


@triton.jit
def bn_stats_partial(x_ptr, part_mean_ptr, part_m2_ptr, M, C, rows_per_prog,
                     BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    """(mean, M2) of rows [pid_m·rows_per_prog, +rows_per_prog) for a block of channels."""
    pid_m = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    row0 = pid_m * rows_per_prog
    row_end = tl.minimum(row0 + rows_per_prog, M)
    n = 0.0
    mean = tl.zeros([BLOCK_C], dtype=tl.float32)
    m2 = tl.zeros([BLOCK_C], dtype=tl.float32)
    for start in range(0, rows_per_prog, BLOCK_M):
        _, rmask, mask, offs = row_tile(row0 + start, row_end, cols, cmask, C, BLOCK_M)
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        # The last part's last tiles may be empty (cnt 0): they then change nothing.
        cnt = tl.sum(rmask.to(tl.float32), axis=0)
        tile_mean = tl.sum(x, axis=0) / tl.maximum(cnt, 1.0)
        d = tl.where(mask, x - tile_mean[None, :], 0.0)
        tile_m2 = tl.sum(d * d, axis=0)
        # Chan's merge of (n, mean, m2) with the tile's (cnt, tile_mean, tile_m2). A part's
        # first tile always holds a row, so n_new > 0.
        n_new = n + cnt
        delta = tile_mean - mean
        mean = mean + delta * (cnt / n_new)
        m2 = m2 + tile_m2 + delta * delta * (n * cnt / n_new)
        n = n_new
    tl.store(part_mean_ptr + pid_m * C + cols, mean, mask=cmask)
    tl.store(part_m2_ptr + pid_m * C + cols, m2, mask=cmask)


@triton.jit
def bn_stats_finalize(part_mean_ptr, part_m2_ptr, num_parts, rows_per_prog, M, C,
                      mean_ptr, invstd_ptr, running_mean_ptr, running_var_ptr, momentum, eps,
                      BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr):
    """Combines the partial (mean, M2) into the batch's mean and 1/sqrt(var + eps), and updates
    the running statistics as torch.nn.BatchNorm2d does (the unbiased variance). Chan's merge of
    all parts at once, BLOCK_P at a time: mean = Σ n_p·mean_p / M, then
    M2 = Σ M2_p + n_p·(mean_p - mean)², whose terms are deviations from the final mean (no
    cancellation when |mean| ≫ std)."""
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    n = M.to(tl.float32)
    acc = tl.zeros([BLOCK_P, BLOCK_C], dtype=tl.float32)
    for p0 in range(0, num_parts, BLOCK_P):
        parts = p0 + tl.arange(0, BLOCK_P)
        cnt = tl.where(parts < num_parts, tl.minimum(rows_per_prog, M - parts * rows_per_prog), 0).to(tl.float32)
        mask, offs = parts_tile(parts, num_parts, cols, cmask, C)
        acc += cnt[:, None] * tl.load(part_mean_ptr + offs, mask=mask, other=0.0)
    mean = tl.sum(acc, axis=0) / n
    acc = tl.zeros([BLOCK_P, BLOCK_C], dtype=tl.float32)
    for p0 in range(0, num_parts, BLOCK_P):
        parts = p0 + tl.arange(0, BLOCK_P)
        cnt = tl.where(parts < num_parts, tl.minimum(rows_per_prog, M - parts * rows_per_prog), 0).to(tl.float32)
        mask, offs = parts_tile(parts, num_parts, cols, cmask, C)
        delta = tl.load(part_mean_ptr + offs, mask=mask, other=0.0) - mean[None, :]
        acc += tl.load(part_m2_ptr + offs, mask=mask, other=0.0) + cnt[:, None] * delta * delta
    m2 = tl.sum(acc, axis=0)
    invstd = 1.0 / tl.sqrt(m2 / n + eps)
    tl.store(mean_ptr + cols, mean, mask=cmask)
    tl.store(invstd_ptr + cols, invstd, mask=cmask)
    rm = tl.load(running_mean_ptr + cols, mask=cmask, other=0.0)
    rv = tl.load(running_var_ptr + cols, mask=cmask, other=0.0)
    tl.store(running_mean_ptr + cols, (1.0 - momentum) * rm + momentum * mean, mask=cmask)
    tl.store(running_var_ptr + cols, (1.0 - momentum) * rv + momentum * (m2 / (n - 1.0)), mask=cmask)


@triton.jit
def bn_act_forward(x_ptr, res_ptr, mean_ptr, invstd_ptr, weight_ptr, bias_ptr, y_ptr, M, C,
                   HAS_RES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    """y = relu((x - mean)·invstd·w + b [+ res]), computed in fp32 and rounded once."""
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    _, _, mask, offs = row_tile(tl.program_id(0) * BLOCK_M, M, cols, cmask, C, BLOCK_M)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.load(mean_ptr + cols, mask=cmask, other=0.0)
    scale = tl.load(invstd_ptr + cols, mask=cmask, other=0.0) * tl.load(weight_ptr + cols, mask=cmask, other=0.0)
    b = tl.load(bias_ptr + cols, mask=cmask, other=0.0)
    y = (x - mean[None, :]) * scale[None, :] + b[None, :]
    if HAS_RES:
        y += tl.load(res_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = tl.maximum(y, 0.0)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def bn_act_backward_partial(dy_ptr, y_ptr, x_ptr, mean_ptr, dres_ptr, part_g_ptr, part_gx_ptr, M, C, rows_per_prog,
                            HAS_RES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    """Σg and Σg·(x - mean) over a program's rows, g = dy where y > 0 (ReLU's gradient). With a
    residual, g is its gradient: stored here, so the second pass reads g instead of dy and y."""
    pid_m = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    mean = tl.load(mean_ptr + cols, mask=cmask, other=0.0)
    row0 = pid_m * rows_per_prog
    row_end = tl.minimum(row0 + rows_per_prog, M)
    acc_g = tl.zeros([BLOCK_C], dtype=tl.float32)
    acc_gx = tl.zeros([BLOCK_C], dtype=tl.float32)
    for start in range(0, rows_per_prog, BLOCK_M):
        _, _, mask, offs = row_tile(row0 + start, row_end, cols, cmask, C, BLOCK_M)
        y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.where(y > 0.0, tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32), 0.0)
        if HAS_RES:
            tl.store(dres_ptr + offs, g.to(dres_ptr.dtype.element_ty), mask=mask)
        xc = tl.where(mask, tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32) - mean[None, :], 0.0)
        acc_g += tl.sum(g, axis=0)
        acc_gx += tl.sum(g * xc, axis=0)
    tl.store(part_g_ptr + pid_m * C + cols, acc_g, mask=cmask)
    tl.store(part_gx_ptr + pid_m * C + cols, acc_gx, mask=cmask)


@triton.jit
def bn_act_backward_finalize(part_g_ptr, part_gx_ptr, num_parts, C, invstd_ptr, dw_ptr, db_ptr,
                             BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr):
    """db = Σg, dw = Σg·(x - mean)·invstd, the parts added BLOCK_P at a time as sum_parts does."""
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    acc_g = tl.zeros([BLOCK_P, BLOCK_C], dtype=tl.float32)
    acc_gx = tl.zeros([BLOCK_P, BLOCK_C], dtype=tl.float32)
    for p0 in range(0, num_parts, BLOCK_P):
        mask, offs = parts_tile(p0 + tl.arange(0, BLOCK_P), num_parts, cols, cmask, C)
        acc_g += tl.load(part_g_ptr + offs, mask=mask, other=0.0)
        acc_gx += tl.load(part_gx_ptr + offs, mask=mask, other=0.0)
    tl.store(db_ptr + cols, tl.sum(acc_g, axis=0), mask=cmask)
    tl.store(dw_ptr + cols, tl.sum(acc_gx, axis=0) * tl.load(invstd_ptr + cols, mask=cmask, other=0.0), mask=cmask)


@triton.jit
def bn_act_backward(dy_ptr, y_ptr, x_ptr, mean_ptr, invstd_ptr, weight_ptr, dw_ptr, db_ptr, dx_ptr, dres_ptr, M, C,
                    HAS_RES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    """dx = w·invstd·(g - (db + x̂·dw) / M), x̂ = (x - mean)·invstd; g read back from the
    residual's gradient when there is one, else made again from dy and y."""
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    _, _, mask, offs = row_tile(tl.program_id(0) * BLOCK_M, M, cols, cmask, C, BLOCK_M)
    if HAS_RES:
        g = tl.load(dres_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    else:
        y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.where(y > 0.0, tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32), 0.0)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.load(mean_ptr + cols, mask=cmask, other=0.0)
    invstd = tl.load(invstd_ptr + cols, mask=cmask, other=0.0)
    w = tl.load(weight_ptr + cols, mask=cmask, other=0.0)
    dw = tl.load(dw_ptr + cols, mask=cmask, other=0.0)
    db = tl.load(db_ptr + cols, mask=cmask, other=0.0)
    xhat = (x - mean[None, :]) * invstd[None, :]
    dx = (w * invstd)[None, :] * (g - (db[None, :] + xhat * dw[None, :]) / M)
    tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)


# ---- the orchestration (csrc/fused_norm.cpp does the same with the compiled kernels) ----------
def reduction_plan(M, C, sm_count, kernel):
    """(num_parts, rows_per_prog) of a two-stage reduction whose first stage is `kernel`: about
    PROGRAMS_PER_SM programs per multiprocessor, each a whole number of the kernel's row tiles."""
    return parts_plan(M, C, sm_count, *tile(kernel), PROGRAMS_PER_SM)


def parts_plan(M, C, sm_count, block_m, block_c, programs_per_sm):
    """reduction_plan for any tile and number of programs (bench/fused_tiles.py tries others)."""
    parts = max(1, min(cdiv(M, block_m), cdiv(programs_per_sm * sm_count, cdiv(C, block_c))))
    rows = cdiv(cdiv(M, parts), block_m) * block_m
    return cdiv(M, rows), rows


def tile_constexprs(kernel):
    """The tile's constexprs `kernel` takes (the second stages take only BLOCK_C)."""
    params = inspect.signature(kernel.fn).parameters
    return {n: v for n, v in zip(("BLOCK_M", "BLOCK_C"), tile(kernel.fn.__name__)) if n in params}


def run(kernel, grid, args, **constexprs):
    """Launches `kernel` over `grid` with `args`, a list of (name, value) in its parameters'
    order, named as csrc/fused_norm.cpp names them (the launches its test compares), in the
    kernel's tile."""
    check_args(kernel, args)
    kernel[grid](*[v for _, v in args], num_warps=NUM_WARPS, **tile_constexprs(kernel), **constexprs)


def forward(x2d, res2d, w, b, running_mean, running_var, momentum, eps, sm_count, launch=run):
    """x2d, res2d (or None): [M, C] views of channels_last activations. Returns y, mean, invstd;
    updates the running statistics in place."""
    import torch
    M, C = x2d.shape
    parts, rows = reduction_plan(M, C, sm_count, "bn_stats_partial")
    f32 = dict(dtype=torch.float32, device=x2d.device)
    part_mean, part_m2 = torch.empty(parts, C, **f32), torch.empty(parts, C, **f32)
    mean, invstd = torch.empty(C, **f32), torch.empty(C, **f32)
    launch(bn_stats_partial, (parts, cdiv(C, tile("bn_stats_partial")[1])),
           [("x", x2d), ("part_mean", part_mean), ("part_m2", part_m2), ("M", M), ("C", C), ("rows_per_prog", rows)])
    launch(bn_stats_finalize, (cdiv(C, tile("bn_stats_finalize")[1]), 1),
           [("part_mean", part_mean), ("part_m2", part_m2), ("num_parts", parts), ("rows_per_prog", rows), ("M", M),
            ("C", C), ("mean", mean), ("invstd", invstd), ("running_mean", running_mean),
            ("running_var", running_var), ("momentum", momentum), ("eps", eps)], BLOCK_P=BLOCK_P)
    y = torch.empty_like(x2d)
    has_res = res2d is not None
    block_m, block_c = tile("bn_act_forward")
    launch(bn_act_forward, (cdiv(M, block_m), cdiv(C, block_c)),
           [("x", x2d), ("res", res2d if has_res else x2d), ("mean", mean), ("invstd", invstd),
            ("weight", w), ("bias", b), ("y", y), ("M", M), ("C", C)],
           HAS_RES=has_res)
    return y, mean, invstd


def backward(dy2d, y2d, x2d, mean, invstd, w, has_res, sm_count, launch=run):
    """Returns dx, dw, db and the residual's gradient (None without a residual)."""
    import torch
    M, C = x2d.shape
    parts, rows = reduction_plan(M, C, sm_count, "bn_act_backward_partial")
    f32 = dict(dtype=torch.float32, device=x2d.device)
    part_g, part_gx = torch.empty(parts, C, **f32), torch.empty(parts, C, **f32)
    dw, db = torch.empty(C, **f32), torch.empty(C, **f32)
    dx = torch.empty_like(x2d)
    dres = torch.empty_like(x2d) if has_res else None
    launch(bn_act_backward_partial, (parts, cdiv(C, tile("bn_act_backward_partial")[1])),
           [("dy", dy2d), ("y", y2d), ("x", x2d), ("mean", mean), ("dres", dres if has_res else dx),
            ("part_g", part_g), ("part_gx", part_gx), ("M", M), ("C", C), ("rows_per_prog", rows)],
           HAS_RES=has_res)
    launch(bn_act_backward_finalize, (cdiv(C, tile("bn_act_backward_finalize")[1]), 1),
           [("part_g", part_g), ("part_gx", part_gx), ("num_parts", parts), ("C", C), ("invstd", invstd),
            ("dw", dw), ("db", db)], BLOCK_P=BLOCK_P)
    block_m, block_c = tile("bn_act_backward")
    launch(bn_act_backward, (cdiv(M, block_m), cdiv(C, block_c)),
           [("dy", dy2d), ("y", y2d), ("x", x2d), ("mean", mean), ("invstd", invstd), ("weight", w), ("dw", dw),
            ("db", db), ("dx", dx), ("dres", dres if has_res else dx), ("M", M), ("C", C)],
           HAS_RES=has_res)
    return dx, dw, db, dres
