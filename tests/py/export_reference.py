"""PyTorch reading the files `ringtrain export` wrote, for the Rust tests (tests/export.rs).

    export_reference.py check DIR NAME...   for each NAME, torch.jit.load(DIR/NAME.pt) (with its
                                            extra files) in eval mode on DIR/NAME-io.safetensors'
                                            inputs (x1: batch 1, x7: batch 7); JSON per NAME: its
                                            largest difference from ringtrain's outputs (y1, y7)
                                            relative to their largest magnitude, the largest
                                            difference of its state_dict from
                                            DIR/NAME-weights.safetensors and the names either
                                            lacks, and its extra files
                                            With DIR/NAME.onnx (or DIR/NAME@OPSET.onnx) beside
                                            it, the same of ONNX Runtime on that file, and what
                                            onnx's full checker says of it
    export_reference.py check-metadata FILE JSON: FILE's extra files (an .onnx file's
                                            metadata_props)
    export_reference.py pixels FILE CROP IMAGE...
                                            the images decoded by PIL, centre-cropped to CROP
                                            (torchvision's CenterCrop), as uint8 [N, H, W, 3]
                                            through FILE (TorchScript, or ONNX in ONNX
                                            Runtime); JSON: its outputs, one row per image, and
                                            whether its graph holds a tensor constant
    export_reference.py resize-crops FILE IMAGE...
                                            FILE (ONNX, --with-resize) on each image at six
                                            sizes: its crops' largest and mean difference in
                                            levels from torchvision's Resize + CenterCrop on
                                            the PIL image
"""
import glob
import os

import json
import sys

import numpy as np
import onnx
from onnx import numpy_helper
import onnxruntime as ort
import torch
import torchvision.transforms.functional as F
from PIL import Image
from safetensors.torch import load_file

KEYS = ["model", "classes", "input", "output", "input_size", "resize_size", "interpolation",
        "jpeg_decode", "softmax", "resize_in_graph", "mean", "std", "checkpoint_sha256", "ringtrain_version"]


def rel(got, want):
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


def check(folder, names):
    out = {}
    for name in names:
        extra = {k: "" for k in KEYS}
        m = torch.jit.load(f"{folder}/{name}.pt", _extra_files=extra).eval()
        io = load_file(f"{folder}/{name}-io.safetensors")
        with torch.no_grad():
            y1, y7 = m(io["x1"]), m(io["x7"])
        sd = m.state_dict()
        want = load_file(f"{folder}/{name}-weights.safetensors")
        common = sorted(set(sd) & set(want))
        # Every tensor is the module's, none a constant of the graph: the whole module moves as
        # .to("cuda") would move it (here to float64, on the CPU).
        m64 = torch.jit.load(f"{folder}/{name}.pt").eval().double()
        with torch.no_grad():
            y7_64 = m64(io["x7"].double())
        out[name] = {
            "batch1": rel(y1, io["y1"]),
            "batch7": rel(y7, io["y7"]),
            "float64": rel(y7_64, io["y7"]),
            "tensor_constants": "CONSTANTS." in m.code,
            "shape7": list(y7.shape),
            "weights": max((sd[k].double() - want[k].double()).abs().max().item() for k in common),
            "only_in_file": sorted(set(sd) - set(want)),
            "only_in_checkpoint": sorted(set(want) - set(sd)),
            "extra": {k: v.decode() for k, v in extra.items()},
            "onnx": {os.path.basename(f)[:-5]: check_onnx(f, io, want)
                     for f in sorted(glob.glob(f"{folder}/{glob.escape(name)}.onnx")
                                     + glob.glob(f"{folder}/{glob.escape(name)}@*.onnx"))},
        }
    print(json.dumps(out))


def run_onnx(file, x):
    s = ort.InferenceSession(file, providers=["CPUExecutionProvider"])
    (y,) = s.run(None, {s.get_inputs()[0].name: x.numpy()})
    return torch.from_numpy(y)


def check_onnx(file, io, weights):
    """ONNX Runtime on `file` against ringtrain's outputs; what the checker and the file hold."""
    try:
        onnx.checker.check_model(file, full_check=True)
        checker = "ok"
    except Exception as e:  # the checker's message is the finding
        checker = str(e).splitlines()[0]
    m = onnx.load(file)
    g = m.graph
    y1, y7 = run_onnx(file, io["x1"]), run_onnx(file, io["x7"])
    init = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    named = sorted(set(init) & set(weights))
    return {
        "checker": checker,
        "batch1": rel(y1, io["y1"]),
        "batch7": rel(y7, io["y7"]),
        "shape7": list(y7.shape),
        "opset": [(o.domain, o.version) for o in m.opset_import],
        "domains": sorted({n.domain for n in g.node}),
        "ops": sorted({n.op_type for n in g.node}),
        "batch_dims": [i.type.tensor_type.shape.dim[0].dim_param for i in list(g.input) + list(g.output)],
        # The weights are the checkpoint's, under its names.
        "named_weights": len(named),
        "unused_initializers": sorted(set(init) - {i for n in g.node for i in n.input}),
        "weights": max((np.abs(init[k].astype(np.float64) - weights[k].double().numpy()).max() for k in named),
                       default=-1.0),
        "metadata": {p.key: p.value for p in m.metadata_props},
    }


def check_metadata(file):
    if file.endswith(".onnx"):
        print(json.dumps({p.key: p.value for p in onnx.load(file).metadata_props}))
        return
    extra = {k: "" for k in KEYS}
    torch.jit.load(file, _extra_files=extra)
    print(json.dumps({k: v.decode() for k, v in extra.items()}))


def center_crop(img, size):
    # torchvision's F.center_crop on an image at least `size` on each side.
    w, h = img.size
    top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
    return img.crop((left, top, left + size, top + size))


def pixels(file, crop, images):
    x = np.stack([np.array(center_crop(Image.open(p).convert("RGB"), crop)) for p in images])
    if file.endswith(".onnx"):
        y = run_onnx(file, torch.from_numpy(x))
        print(json.dumps({"dtype": str(y.dtype), "rows": y.float().tolist(), "tensor_constants": False}))
        return
    m = torch.jit.load(file).eval()
    with torch.no_grad():
        y = m(torch.from_numpy(x))
    print(json.dumps({"dtype": str(y.dtype), "rows": y.float().tolist(), "tensor_constants": "CONSTANTS." in m.code}))


def resize_crops(file, images):
    """The crops an ONNX file made with --with-resize gives its model (the value
    resize.cropped), against torchvision's Resize + CenterCrop on the PIL image, for each image
    at its own size and stretched to five others (wide, tall, odd, smaller than the resize)."""
    m = onnx.load(file)
    onnx.checker.check_model(m, full_check=True)
    meta = {p.key: p.value for p in m.metadata_props}
    resize, crop = int(meta["resize_size"]), int(meta["input_size"])
    filt = F.InterpolationMode[meta["interpolation"].upper()]
    m.graph.output.append(onnx.helper.make_tensor_value_info("resize.cropped", onnx.TensorProto.UINT8, None))
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    worst, total, count = 0, 0.0, 0
    for p in images:
        img = Image.open(p).convert("RGB")
        for size in [img.size, (150, 150), (151, 97), (64, 203), (resize + 1, resize), (crop + 3, crop + 2)]:
            im = img.resize(size, Image.Resampling.BICUBIC)
            want = np.array(F.center_crop(F.resize(im, resize, interpolation=filt), crop)).astype(int)
            got = session.run(None, {"input": np.array(im)[None]})[1][0].astype(int)
            assert got.shape == want.shape, (got.shape, want.shape)
            d = np.abs(got - want)
            worst, total, count = max(worst, int(d.max())), total + float(d.sum()), count + d.size
    print(json.dumps({"worst": worst, "mean": total / count, "crops": len(images) * 6}))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "check":
        check(sys.argv[2], sys.argv[3:])
    elif cmd == "check-metadata":
        check_metadata(sys.argv[2])
    elif cmd == "pixels":
        pixels(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
    elif cmd == "resize-crops":
        resize_crops(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(f"unknown command {cmd}")
