"""Compiles ringtrain's Triton kernels (kernels/*.py) ahead of time, for the GPUs ringtrain ships
kernels for, without a GPU: Triton's own compiler and the ptxas it carries, called by build.rs.

Usage: compile_kernels.py OUT_DIR
Writes OUT_DIR/<name>.<arch>.{cubin,ptx}.gz and OUT_DIR/fused_kernels.rs, the table the binary
embeds (src/model/fused.rs includes it): each entry names the kernel variant, the GPU
architecture (80, 90, 100 as cubins; 80 also as PTX, which the driver compiles for any newer GPU
none of the cubins fits), the function's symbol, its launch width and shared memory, and the
number of parameters the launcher passes (the kernel's own, then Triton's two scratch pointers).

A variant is one dtype of the activations (fp16, bf16, fp32), with or without the residual
(BatchNorm), of one residual stream dtype (ConvNeXt's scale-add), of one tile width (LayerNorm),
and "a16": pointers 16-byte aligned and C a multiple of 16 (what ResNets and ConvNeXts give;
Triton then emits vector loads), or not (any shape). Prints one line of what it built; exits 3
when Triton cannot be imported (the build then goes on without fused kernels).
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

def variants():
    """Every kernel variant the table holds: dicts of its name, module, kernel, dtype key (None
    for kernels that see only fp32), alignment, constexpr values, launch width and the residual
    stream's dtype key.

    bn_act: one per activation dtype, with or without the residual, aligned or not; its two
    finalize kernels once. scale_add: one per dtype and alignment, forward also per dtype of the
    residual stream (the activations' or fp32). layer_norm: one per dtype, tile width W and
    alignment. launch.py's sum_parts once."""
    import bn_act
    import launch
    import layer_norm as ln
    out = []

    def add(name, module, kernel, dt, aligned, constexprs, warps, stream_dt=None):
        out.append(dict(name=name, module=module, kernel=kernel, dt=dt, aligned=aligned, constexprs=constexprs,
                        num_warps=warps, stream_dt=stream_dt))

    def bn(kernel):  # the kernel's tile (kernels/bn_act.py's tile)
        return dict(zip(("BLOCK_M", "BLOCK_C"), bn_act.tile(kernel)))

    for kernel in ("bn_stats_finalize", "bn_act_backward_finalize"):
        add(kernel, "bn_act", kernel, None, False, dict(BLOCK_C=bn(kernel)["BLOCK_C"], BLOCK_P=launch.BLOCK_P),
            bn_act.NUM_WARPS)
    for kernel in ("bn_stats_partial", "bn_act_backward_partial", "bn_act_forward", "bn_act_backward"):
        with_res = kernel != "bn_stats_partial"
        for dt in DTYPES:
            for res in ((False, True) if with_res else (None,)):
                for aligned in (False, True):
                    name = kernel + "." + dt + (".res" if res else "") + (".a16" if aligned else "")
                    constexprs = dict(bn(kernel), HAS_RES=bool(res)) if with_res else bn(kernel)
                    add(name, "bn_act", kernel, dt, aligned, constexprs, bn_act.NUM_WARPS)
    add("sum_parts", "launch", "sum_parts", None, False, dict(BLOCK_C=bn("sum_parts")["BLOCK_C"],
                                                              BLOCK_P=launch.BLOCK_P), bn_act.NUM_WARPS)
    for dt in DTYPES:
        for aligned in (False, True):
            a16 = ".a16" if aligned else ""
            kernel = "scale_add_backward_partial"
            add(f"{kernel}.{dt}{a16}", "scale_add", kernel, dt, aligned, bn(kernel), bn_act.NUM_WARPS)
            # The residual stream: in the activations' dtype, or fp32.
            for stream in sorted({dt, "f32"}):
                kernel = "scale_add_forward"
                add(f"{kernel}.{dt}.{stream}{a16}", "scale_add", kernel, dt, aligned, bn(kernel), bn_act.NUM_WARPS,
                    stream)
    for kernel in ("ln_forward", "ln_backward_partial"):
        for dt in DTYPES:
            for w in ln.WIDTHS:
                for aligned in (False, True):
                    name = f"{kernel}.{dt}.w{w}" + (".a16" if aligned else "")
                    add(name, "layer_norm", kernel, dt, aligned, dict(BLOCK_M=ln.TILE // w, W=w), ln.num_warps(w))
    return out


def signature(fn, v):
    """Triton's signature of `fn` for variant `v`, each parameter typed by its name (launch.py's
    ACTIVATIONS, INTS, FLOATS; any other pointer fp32), with the alignment hints of "a16"."""
    import launch
    sig, attrs, constexprs = {}, {}, {}
    runtime = launch.runtime_params(fn)
    for i, name in enumerate(fn.arg_names):
        if name not in runtime:
            sig[name] = "constexpr"
            constexprs[name] = v["constexprs"][name]
            continue
        if name in launch.ACTIVATIONS:
            sig[name] = "*" + DTYPES[v["dt"]]
        elif name in launch.STREAMS:
            sig[name] = "*" + DTYPES[v["stream_dt"]]
        elif name.endswith("_ptr"):
            sig[name] = "*fp32"
        elif name in launch.INTS:
            sig[name] = "i32"
        elif name in launch.FLOATS:
            sig[name] = "fp32"
        else:
            raise SystemExit(f"{fn.fn.__name__}: parameter {name} has no type "
                             "(kernels/launch.py's ACTIVATIONS, STREAMS, INTS, FLOATS)")
        # Hints: 16-byte aligned pointers and a multiple-of-16 channel count.
        if v["aligned"] and (name.endswith("_ptr") or name == "C"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs, constexprs


def compile_one(job):
    v, arch, out_dir = job
    name = v["name"]
    sys.path.insert(0, KERNELS_DIR)
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import launch
    fn = getattr(importlib.import_module(v["module"]), v["kernel"])
    sig, attrs, constexprs = signature(fn, v)
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": v["num_warps"]})
    params = len(re.search(r"\.entry\s+\w+\s*\((.*?)\)", k.asm["ptx"], re.S).group(1).split(","))
    expected = len(launch.runtime_params(fn)) + 2  # + Triton's two scratch pointers
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
    tile = (v["constexprs"].get("BLOCK_M", 0), v["constexprs"].get("BLOCK_C", 0))
    return [(name, arch, form, path, k.metadata.name, k.metadata.num_warps, k.metadata.shared, expected, *tile)
            for form, path in files]


def main(out_dir):
    try:
        import triton
    except ImportError as e:
        print(f"Triton is not importable ({e}): no fused kernels", file=sys.stderr)
        return 3
    sys.path.insert(0, KERNELS_DIR)
    import bn_act
    import launch
    import layer_norm as ln
    os.makedirs(out_dir, exist_ok=True)
    jobs = [(v, arch, out_dir) for v in variants() for arch in CUBIN_ARCHS]
    with ProcessPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
        built = [e for batch in pool.map(compile_one, jobs) for e in batch]
    built.sort()
    lines = [
        "// Written by build_support/compile_kernels.py when ringtrain was built; do not edit.",
        f"pub const TRITON_VERSION: &str = {triton.__version__!r};".replace("'", '"'),
        f"pub const LN_PLAN: LayerNormPlan = LayerNormPlan {{ tile: {ln.TILE}, programs_per_sm: {ln.PROGRAMS_PER_SM}, "
        f"min_width: {ln.WIDTHS[0]}, max_width: {ln.WIDTHS[-1]} }};",
        "pub static KERNELS: &[KernelImage] = &[",
    ]
    for name, arch, form, path, symbol, warps, shared, params, block_m, block_c in built:
        lines.append(
            f'    KernelImage {{ variant: "{name}", arch: {arch}, ptx: {str(form == "ptx").lower()}, '
            f'symbol: "{symbol}", num_warps: {warps}, shared_bytes: {shared}, params: {params}, '
            f'block_m: {block_m}, block_c: {block_c}, image_gz: include_bytes!({path!r}) }},'.replace("'", '"'))
    lines.append("];")
    with open(os.path.join(out_dir, "fused_kernels.rs"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{len(variants())} kernel variants, {len(built)} images (sm_{'/'.join(map(str, CUBIN_ARCHS))} cubins, "
          f"sm_{PTX_ARCH} PTX) with Triton {triton.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
