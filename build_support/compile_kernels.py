"""Compiles ringtrain's Triton kernels (kernels/*.py) ahead of time, for the GPUs ringtrain ships
kernels for, without a GPU: Triton's own compiler and the ptxas it carries, called by build.rs.

Usage: compile_kernels.py OUT_DIR
Writes OUT_DIR/<name>.<arch>.{cubin,ptx}.gz and OUT_DIR/fused_kernels.rs, the table the binary
embeds (src/model/fused/kernels.rs includes it): each entry names the kernel variant, the GPU
architecture (80, 90, 100 as cubins; 80 also as PTX, which the driver compiles for any newer GPU
none of the cubins fits), the function's symbol, its launch width and shared memory, and the
number of parameters the launcher passes (the kernel's own, then Triton's two scratch pointers).

A variant is one dtype of the activations (fp16, bf16, fp32), with or without the residual, and
"a16": pointers 16-byte aligned and C a multiple of 16 (what ResNets give; Triton then emits
vector loads), or not (any shape). Prints one line of what it built; exits 3 when Triton cannot
be imported (the build then goes on without fused kernels).
"""
import gzip
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor

KERNELS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kernels")
CUBIN_ARCHS = (80, 90, 100)
PTX_ARCH = 80
DTYPES = {"f16": "fp16", "bf16": "bf16", "f32": "fp32"}

KERNELS = ("bn_stats_partial", "bn_stats_finalize", "bn_act_forward", "bn_act_backward_partial",
           "bn_act_backward_finalize", "bn_act_backward")
# The ones that exist per activation dtype (the finalize kernels see only fp32 statistics), and
# among them those with a residual variant.
TYPED = ("bn_stats_partial", "bn_act_backward_partial", "bn_act_forward", "bn_act_backward")
WITH_RES = ("bn_act_forward", "bn_act_backward_partial", "bn_act_backward")


def variants():
    """(variant name, kernel, dtype key or None, has_res or None, aligned)."""
    out = [(k, k, None, None, False) for k in KERNELS if k not in TYPED]
    for kernel in TYPED:
        for dt in DTYPES:
            for res in ((False, True) if kernel in WITH_RES else (None,)):
                for aligned in (False, True):
                    name = kernel + "." + dt + (".res" if res else "") + (".a16" if aligned else "")
                    out.append((name, kernel, dt, res, aligned))
    return out


def signature(fn, dt, res, aligned):
    """Triton's signature of `fn` for a variant, each parameter typed by its name (bn_act's
    ACTIVATIONS, INTS, FLOATS; any other pointer fp32), with the alignment hints of "a16"."""
    import bn_act
    sig, attrs, constexprs = {}, {}, {}
    runtime = bn_act.runtime_params(fn)
    for i, name in enumerate(fn.arg_names):
        if name not in runtime:
            sig[name] = "constexpr"
            constexprs[name] = {"BLOCK_M": bn_act.BLOCK_M, "BLOCK_C": bn_act.BLOCK_C, "HAS_RES": bool(res)}[name]
            continue
        if name in bn_act.ACTIVATIONS:
            sig[name] = "*" + DTYPES[dt]
        elif name.endswith("_ptr"):
            sig[name] = "*fp32"
        elif name in bn_act.INTS:
            sig[name] = "i32"
        elif name in bn_act.FLOATS:
            sig[name] = "fp32"
        else:
            raise SystemExit(f"{fn.fn.__name__}: parameter {name} has no type (kernels/bn_act.py's ACTIVATIONS, INTS, FLOATS)")
        # Hints: 16-byte aligned pointers and a multiple-of-16 channel count.
        if aligned and (name.endswith("_ptr") or name == "C"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs, constexprs


def compile_one(job):
    name, kernel, dt, res, aligned, arch, out_dir = job
    sys.path.insert(0, KERNELS_DIR)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import bn_act
    fn = getattr(bn_act, kernel)
    sig, attrs, constexprs = signature(fn, dt, res, aligned)
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": bn_act.NUM_WARPS})
    params = len(re.search(r"\.entry\s+\w+\s*\((.*?)\)", k.asm["ptx"], re.S).group(1).split(","))
    expected = len(bn_act.runtime_params(fn)) + 2  # + Triton's two scratch pointers
    if params != expected:
        raise SystemExit(f"{name} sm_{arch}: the kernel takes {params} parameters, the launcher passes {expected}")
    if k.metadata.global_scratch_size or k.metadata.profile_scratch_size:
        raise SystemExit(f"{name} sm_{arch}: needs scratch memory, which the launcher does not give")
    # gzip-compressed (the binary unpacks them once): a fifth of their size.
    files = []
    if arch in CUBIN_ARCHS:
        path = os.path.join(out_dir, f"{name}.sm{arch}.cubin.gz")
        with open(path, "wb") as f:
            f.write(gzip.compress(k.asm["cubin"], mtime=0))
        files.append(("cubin", path))
    if arch == PTX_ARCH:
        path = os.path.join(out_dir, f"{name}.sm{arch}.ptx.gz")
        with open(path, "wb") as f:
            # cuModuleLoadData reads PTX as a C string
            f.write(gzip.compress(k.asm["ptx"].encode() + b"\0", mtime=0))
        files.append(("ptx", path))
    return [(name, arch, form, path, k.metadata.name, k.metadata.num_warps, k.metadata.shared, expected)
            for form, path in files]


def main(out_dir):
    try:
        import triton
    except ImportError as e:
        print(f"Triton is not importable ({e}): no fused kernels", file=sys.stderr)
        return 3
    sys.path.insert(0, KERNELS_DIR)
    import bn_act
    os.makedirs(out_dir, exist_ok=True)
    jobs = [(n, k, d, r, a, arch, out_dir) for (n, k, d, r, a) in variants() for arch in CUBIN_ARCHS]
    with ProcessPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
        built = [e for batch in pool.map(compile_one, jobs) for e in batch]
    built.sort()
    lines = [
        "// Written by build_support/compile_kernels.py when ringtrain was built; do not edit.",
        f"pub const TRITON_VERSION: &str = {triton.__version__!r};".replace("'", '"'),
        f"pub const BLOCK_M: i64 = {bn_act.BLOCK_M};",
        f"pub const BLOCK_C: i64 = {bn_act.BLOCK_C};",
        "pub static KERNELS: &[KernelImage] = &[",
    ]
    for name, arch, form, path, symbol, warps, shared, params in built:
        lines.append(
            f'    KernelImage {{ variant: "{name}", arch: {arch}, ptx: {str(form == "ptx").lower()}, '
            f'symbol: "{symbol}", num_warps: {warps}, shared_bytes: {shared}, params: {params}, '
            f'image_gz: include_bytes!({path!r}) }},'.replace("'", '"'))
    lines.append("];")
    with open(os.path.join(out_dir, "fused_kernels.rs"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{len(variants())} kernel variants, {len(built)} images (sm_{'/'.join(map(str, CUBIN_ARCHS))} cubins, "
          f"sm_{PTX_ARCH} PTX) with Triton {triton.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
