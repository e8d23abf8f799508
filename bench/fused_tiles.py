"""Tiles of the fused BatchNorm + ReLU kernels (kernels/bn_act.py) timed on a GPU at ResNet-50's
shapes: which tile (rows x channels), warps and programs per multiprocessor make each kernel
fastest over one training step's layers, against the tile the build uses (kernels/bn_act.py's
tile).

Usage: fused_tiles.py [--batch 256] [--img 224] [--dtype bf16] [--out tiles.json] [--dry]

Triton compiles each tile just in time here (the same kernels the build compiles ahead of time).
Times come from triton.testing.do_bench (L2 flushed before each launch); a kernel's time over a
step is each layer's time times the layers of that shape. Prints, per kernel, the build's tile,
the best single tile for all shapes and the sum of each shape's best, in ms per step, and the
bandwidth the build's tile reaches per shape (bytes the kernel must move / time). --dry runs the
same path on the CPU under Triton's interpreter (ResNet-50 at batch 1 and 32 px, the build's
tiles and one more, one call each by the wall clock): the battery's dry run.
"""
import argparse
import itertools
import json
import os
import sys
import time

import torch

KERNELS = ("bn_stats_partial", "bn_act_forward", "bn_act_backward_partial", "bn_act_backward")
# (rows, channels, warps) tried; programs per multiprocessor for the reductions' first stages.
TILES = [(32, 64, 4), (64, 64, 4), (64, 64, 8), (128, 64, 4), (128, 64, 8), (64, 128, 4), (64, 128, 8),
         (128, 128, 8), (32, 128, 4), (256, 64, 8)]
PROGRAMS_PER_SM = [2, 4, 8, 16]


def resnet50_layers(batch, img):
    """ResNet-50's BatchNorm + ReLU layers: (M, C, has residual) -> count. torchvision's
    bottleneck strides in its 3x3 convolution, so a stage's first bn1 sees the previous size."""
    layers = {}

    def add(hw, c, res):
        key = (batch * hw * hw, c, res)
        layers[key] = layers.get(key, 0) + 1

    add(img // 2, 64, False)
    prev = img // 4
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512))):
        hw = img // 4 // 2**stage
        for i in range(blocks):
            add(prev if i == 0 else hw, width, False)
            add(hw, width, False)
            add(hw, width * 4, True)
        prev = hw
    return layers


def moved_bytes(kernel, M, C, res, elem):
    """Bytes of activations a kernel must read and write at [M, C]."""
    per = {"bn_stats_partial": 1, "bn_act_forward": 2 + res, "bn_act_backward_partial": 3 + res,
           "bn_act_backward": (1 if res else 2) + 2}[kernel]
    return per * M * C * elem


def launcher(bn_act, kernel, M, C, res, t, tile, ppsm, sms):
    """A function launching `kernel` once at [M, C] in `tile` (the reductions over the plan that
    `ppsm` programs per multiprocessor give)."""
    from launch import cdiv
    bm, bc, warps = tile
    if kernel in ("bn_stats_partial", "bn_act_backward_partial"):
        c_blocks = cdiv(C, bc)
        parts, rows = bn_act.parts_plan(M, C, sms, bm, bc, ppsm)
        pa, pb = t["part_a"][: parts * C], t["part_b"][: parts * C]
        if kernel == "bn_stats_partial":
            return lambda: bn_act.bn_stats_partial[(parts, c_blocks)](
                t["x"], pa, pb, M, C, rows, BLOCK_M=bm, BLOCK_C=bc, num_warps=warps)
        return lambda: bn_act.bn_act_backward_partial[(parts, c_blocks)](
            t["dy"], t["y"], t["x"], t["mean"], t["dres"], pa, pb, M, C, rows, HAS_RES=res, BLOCK_M=bm, BLOCK_C=bc,
            num_warps=warps)
    grid = (cdiv(M, bm), cdiv(C, bc))
    if kernel == "bn_act_forward":
        return lambda: bn_act.bn_act_forward[grid](t["x"], t["res"], t["mean"], t["invstd"], t["w"], t["b"], t["y"],
                                                   M, C, HAS_RES=res, BLOCK_M=bm, BLOCK_C=bc, num_warps=warps)
    return lambda: bn_act.bn_act_backward[grid](t["dy"], t["y"], t["x"], t["mean"], t["invstd"], t["w"], t["dw"],
                                                t["db"], t["dx"], t["dres"], M, C, HAS_RES=res, BLOCK_M=bm,
                                                BLOCK_C=bc, num_warps=warps)


def summarise(results, build):
    """Per kernel: ms per step in the build's tile, in the best single tile, and with each shape's
    best; the five best tiles."""
    summary = {}
    for kernel in KERNELS:
        rows = [r for r in results if r["kernel"] == kernel]
        total = {}
        for r in rows:
            cfg = (tuple(r["tile"]), r["ppsm"])
            total[cfg] = total.get(cfg, 0.0) + r["ms"] * r["count"]
        best = min(total, key=total.get)
        shapes = {}
        for r in rows:
            key = (r["M"], r["C"], r["res"])
            shapes[key] = min(shapes.get(key, float("inf")), r["ms"] * r["count"])
        summary[kernel] = dict(build_tile=[list(build[kernel][0]), build[kernel][1]],
                               build_tile_ms=total[build[kernel]], best_tile=[list(best[0]), best[1]],
                               best_tile_ms=total[best],
                               per_shape_best_ms=sum(shapes.values()),
                               top5=sorted(([list(c[0]), c[1], round(v, 3)] for c, v in total.items()),
                                           key=lambda x: x[2])[:5])
    return summary


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--img", type=int, default=224)
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--out", default=None)
    p.add_argument("--dry", action="store_true")
    a = p.parse_args()
    if a.dry:
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
        a.batch, a.img = 1, 32
    elif not torch.cuda.is_available():
        sys.exit("fused_tiles.py: needs a CUDA GPU (--dry runs it on the CPU, untimed)")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kernels"))
    import bn_act
    from triton.testing import do_bench

    # Each kernel's build tile, as (tile, programs per multiprocessor or None for pointwise ones).
    build = {k: ((*bn_act.tile(k), bn_act.NUM_WARPS), bn_act.PROGRAMS_PER_SM if k.endswith("_partial") else None)
             for k in KERNELS}
    tiles, programs_per_sm = TILES, PROGRAMS_PER_SM
    if a.dry:
        tiles = sorted({b[0] for b in build.values()} | {TILES[0]})
        programs_per_sm = [bn_act.PROGRAMS_PER_SM]

        def do_bench(fn, **_):  # noqa: F811 (one call, by the wall clock)
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3

    dev = torch.device("cpu" if a.dry else "cuda")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    sms = 4 if a.dry else torch.cuda.get_device_properties(dev).multi_processor_count
    layers = resnet50_layers(a.batch, a.img)
    biggest = max(M * C for M, C, _ in layers)
    max_c = max(C for _, C, _ in layers)
    base = {k: torch.randn(biggest, device=dev, dtype=dtype) for k in ("x", "y", "dy", "res", "dx", "dres")}
    small = {k: torch.rand(max_c, device=dev) + 0.5 for k in ("mean", "invstd", "w", "b", "dw", "db")}
    parts = {k: torch.empty(max(programs_per_sm) * sms * max_c, device=dev) for k in ("part_a", "part_b")}
    results = []
    for (M, C, res), count in sorted(layers.items()):
        t = {k: v[: M * C].view(M, C) for k, v in base.items()} | small | parts
        for kernel in KERNELS:
            reduces = kernel.endswith("_partial")
            for tile, ppsm in itertools.product(tiles, programs_per_sm if reduces else [None]):
                ms = do_bench(launcher(bn_act, kernel, M, C, res, t, tile, ppsm, sms), warmup=5, rep=25)
                results.append(dict(kernel=kernel, M=M, C=C, res=res, count=count, tile=list(tile), ppsm=ppsm, ms=ms,
                                    gbs=moved_bytes(kernel, M, C, res, dtype.itemsize) / ms / 1e6))
        print(f"M={M} C={C} res={res}: timed", file=sys.stderr, flush=True)

    summary = summarise(results, build)
    for kernel, s in summary.items():
        print(f"{kernel:26s} build tile {tuple(s['build_tile'][0])}: {s['build_tile_ms']:6.3f} ms/step   "
              f"best {tuple(s['best_tile'][0])} x{s['best_tile'][1]}: {s['best_tile_ms']:6.3f}   "
              f"per-shape best: {s['per_shape_best_ms']:6.3f}")
        print(f"  top 5: {s['top5']}")
    print("bandwidth in the build's tiles (GB/s):")
    for r in results:
        if (tuple(r["tile"]), r["ppsm"]) == build[r["kernel"]]:
            print(f"  {r['kernel']:26s} M={r['M']:8d} C={r['C']:5d} res={int(r['res'])} x{r['count']:2d} "
                  f"{r['ms'] * 1e3:7.1f} us {r['gbs']:6.0f} GB/s")
    if a.out:
        gpu = "cpu (interpreted)" if a.dry else torch.cuda.get_device_name(dev)
        with open(a.out, "w") as f:
            json.dump(dict(gpu=gpu, sms=sms, dtype=a.dtype, batch=a.batch, img=a.img, summary=summary,
                           results=results), f, indent=1)
    print(json.dumps({k: {n: s[n] for n in ("build_tile_ms", "best_tile", "best_tile_ms")}
                      for k, s in summary.items()}))


if __name__ == "__main__":
    main()
