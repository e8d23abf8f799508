"""The end of a ConvNeXt block as one kernel each way: out = stream + keep[n]·γ[c]·z, the layer
scale γ, stochastic depth's per-sample factor keep (0 or 1/(1-p); 1 when nothing is dropped) and
the residual add.

z is the block's last Linear output ([N, H, W, C] rows, in the activations' dtype), stream the
block's input (channels_last, so the same [M, C] rows; fp32 under autocast, since the previous
block's γ promoted it, or the activations' dtype after a downsampling), out fp32 as eager's type
promotion makes it. Counted in bytes per element with a bf16 z and an fp32 stream:
  forward   eager: γ·z (2 read, 4 written), ·keep (4, 4), + stream (8, 4): 26.
            here: z and stream read, out written: 10.
  backward  eager: ·keep (4, 4), γ's product (4, 4), the cast of dz to bf16 (4, 2), γ's gradient
            (6 read, 4 written, then 4 read): 36. here: dout and z read, dz written: 8. The
            stream's gradient is dout itself in both.
The tiles and the two-stage reduction of γ's gradient are kernels/bn_act.py's (its tile and
reduction_plan; the second stage kernels/launch.py's sum_parts): deterministic, no
atomics.

Compiled ahead of time like the other kernels (build_support/compile_kernels.py) and launched
from csrc/fused_norm.cpp, which repeats `forward` and `backward` below; the test suite runs them
under TRITON_INTERPRET=1 against PyTorch (tests/py/fused_scale_add.py).
"""
import triton
import triton.language as tl

from bn_act import reduction_plan, run, tile
from launch import BLOCK_P, cdiv, row_tile, sum_parts


@triton.jit
def scale_add_forward(z_ptr, stream_ptr, gamma_ptr, keep_ptr, out_ptr, M, C, rows_per_sample,
                      BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    """out = stream + (γ·z)·keep, in fp32, the products in eager's order."""
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    rows, rmask, mask, offs = row_tile(tl.program_id(0) * BLOCK_M, M, cols, cmask, C, BLOCK_M)
    z = tl.load(z_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(stream_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    gamma = tl.load(gamma_ptr + cols, mask=cmask, other=0.0)
    keep = tl.load(keep_ptr + rows // rows_per_sample, mask=rmask, other=0.0)
    out = (gamma[None, :] * z) * keep[:, None] + s
    tl.store(out_ptr + offs, out, mask=mask)


@triton.jit
def scale_add_backward_partial(dout_ptr, z_ptr, gamma_ptr, keep_ptr, dz_ptr, part_dgamma_ptr, M, C,
                               rows_per_sample, rows_per_prog, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    """dz = dout·keep·γ over a program's rows, and Σ dout·keep·z per column."""
    pid_m = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    gamma = tl.load(gamma_ptr + cols, mask=cmask, other=0.0)
    row0 = pid_m * rows_per_prog
    row_end = tl.minimum(row0 + rows_per_prog, M)
    acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    for start in range(0, rows_per_prog, BLOCK_M):
        rows, rmask, mask, offs = row_tile(row0 + start, row_end, cols, cmask, C, BLOCK_M)
        g = tl.load(dout_ptr + offs, mask=mask, other=0.0) * tl.load(keep_ptr + rows // rows_per_sample, mask=rmask,
                                                                       other=0.0)[:, None]
        z = tl.load(z_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(dz_ptr + offs, (g * gamma[None, :]).to(dz_ptr.dtype.element_ty), mask=mask)
        acc += tl.sum(g * z, axis=0)
    tl.store(part_dgamma_ptr + pid_m * C + cols, acc, mask=cmask)


# ---- the orchestration (csrc/fused_norm.cpp does the same with the compiled kernels) ----------
# `run` is kernels/bn_act.py's: it launches each kernel in its tile.
def forward(z2d, stream2d, gamma, keep, rows_per_sample, launch=run):
    """z2d, stream2d: [M, C] rows; gamma [C] and keep [N] fp32. Returns out [M, C], fp32."""
    import torch
    M, C = z2d.shape
    out = torch.empty(M, C, dtype=torch.float32, device=z2d.device)
    block_m, block_c = tile("scale_add_forward")
    launch(scale_add_forward, (cdiv(M, block_m), cdiv(C, block_c)),
           [("z", z2d), ("stream", stream2d), ("gamma", gamma), ("keep", keep), ("out", out), ("M", M), ("C", C),
            ("rows_per_sample", rows_per_sample)])
    return out


def backward(dout2d, z2d, gamma, keep, rows_per_sample, sm_count, launch=run):
    """Returns dz (z2d's dtype) and dγ [C] (fp32); the stream's gradient is dout2d itself."""
    import torch
    M, C = z2d.shape
    parts, rows = reduction_plan(M, C, sm_count, "scale_add_backward_partial")
    part = torch.empty(parts, C, dtype=torch.float32, device=z2d.device)
    dgamma = torch.empty(C, dtype=torch.float32, device=z2d.device)
    dz = torch.empty_like(z2d)
    launch(scale_add_backward_partial, (parts, cdiv(C, tile("scale_add_backward_partial")[1])),
           [("dout", dout2d), ("z", z2d), ("gamma", gamma), ("keep", keep), ("dz", dz), ("part_dgamma", part),
            ("M", M), ("C", C), ("rows_per_sample", rows_per_sample), ("rows_per_prog", rows)])
    launch(sum_parts, (cdiv(C, tile("sum_parts")[1]), 1),
           [("part", part), ("num_parts", parts), ("C", C), ("out", dgamma)], BLOCK_P=BLOCK_P)
    return dz, dgamma
