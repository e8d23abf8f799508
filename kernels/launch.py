"""What every kernel module here shares: the kernels' parameters typed by name, the checks that
hold each launch, interpreted or compiled, to the kernel's own parameter list, the tiles of a
row-major [M, C] matrix (`row_tile`) and of a matrix of partial results (`parts_tile`), and the
second stage of the two-stage column sums (`sum_parts`).

build_support/compile_kernels.py types the compiled signatures from these sets: activations take
the variant's dtype, STREAMS the variant's second dtype (a residual stream that may be fp32 where
the activations are not), every other pointer is fp32; INTS are int32 and FLOATS float32.
"""
import inspect

import triton
import triton.language as tl

ACTIVATIONS = {"x_ptr", "res_ptr", "y_ptr", "dy_ptr", "dx_ptr", "dres_ptr", "z_ptr", "dz_ptr"}
STREAMS = {"stream_ptr"}
INTS = {"M", "C", "rows_per_prog", "num_parts", "rows_per_sample"}
FLOATS = {"momentum", "eps"}


def cdiv(a, b):
    return (a + b - 1) // b


def runtime_params(kernel):
    """The kernel's parameter names that are not tl.constexpr, in order (compiled or interpreted)."""
    return [n for n, p in inspect.signature(kernel.fn).parameters.items() if p.annotation is not tl.constexpr]


def check_args(kernel, args):
    """`args`, (name, value) pairs, are the kernel's parameters in order, each named as the
    parameter (pointers without "_ptr") and of its kind."""
    import torch
    params = runtime_params(kernel)
    names = [n if not torch.is_tensor(v) else n + "_ptr" for n, v in args]
    assert names == params, (kernel.fn.__name__, names, params)
    for n, v in args:
        ok = torch.is_tensor(v) if n + "_ptr" in params else isinstance(v, int) if n in INTS else isinstance(v, float)
        assert ok, (kernel.fn.__name__, n, type(v))


@triton.jit
def row_tile(first, end, cols, cmask, C, BLOCK_M: tl.constexpr):
    """Rows first … first + BLOCK_M - 1 of a row-major [M, C] matrix, those below `end`, at
    columns `cols` (valid where `cmask`): the rows, their mask, the tile's mask and its element
    offsets (int64: M·C may pass 2^31)."""
    rows = first + tl.arange(0, BLOCK_M)
    rmask = rows < end
    return rows, rmask, rmask[:, None] & cmask[None, :], rows[:, None].to(tl.int64) * C + cols[None, :]


@triton.jit
def parts_tile(parts, num_parts, cols, cmask, C):
    """Rows `parts` of a [num_parts, C] matrix of partial results at columns `cols`: the tile's
    mask and its element offsets."""
    return (parts < num_parts)[:, None] & cmask[None, :], parts[:, None] * C + cols[None, :]


# Partial rows one program of a second stage reads per iteration: the first stages write some
# hundreds of rows (a few programs per multiprocessor), which one row at a time left the second
# stage waiting on memory latency (2.5 ms of ConvNeXt-T's 46 ms step on an H200, 54 launches).
BLOCK_P = 32


@triton.jit
def sum_parts(part_ptr, num_parts, C, out_ptr, BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr):
    """out[c] = Σ_p part[p, c]: the second stage of a column sum whose first stage wrote one row
    of partial sums per program, added in a fixed order (deterministic, no atomics): BLOCK_P
    rows at a time into a tile, then the tile's rows. Launched in kernels/bn_act.py's tile for
    it, which the build writes into the kernel table."""
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    acc = tl.zeros([BLOCK_P, BLOCK_C], dtype=tl.float32)
    for p0 in range(0, num_parts, BLOCK_P):
        mask, offs = parts_tile(p0 + tl.arange(0, BLOCK_P), num_parts, cols, cmask, C)
        acc += tl.load(part_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + cols, tl.sum(acc, axis=0), mask=cmask)
