"""CPU inference of one checkpoint, side by side, one run each on the same machine: the exported
ONNX file in ONNX Runtime, the checkpoint in `ringtrain predict`, and the same weights in
PyTorch eager (torchvision's model, or timm's for timm's names).

    python bench/export_inference.py RINGTRAIN CHECKPOINT DATA [--batch-size 64] [--threads N]

RINGTRAIN is the binary, CHECKPOINT a checkpoint directory, DATA an ImageFolder tree of its
classes. Each line is one whole pass over DATA at the checkpoint's evaluation transform:
images/s from the first batch asked to the last prediction (end to end), and of the model alone
(its input in, its output back). ringtrain predicts with its own loader (`ringtrain predict`, on
the checkpoint and on the exported file); the Python rows read the images with torchvision's
ImageFolder and the same evaluation transform (Resize, CenterCrop, ToTensor, Normalize) through
a DataLoader with as many workers as threads, and run the model in PyTorch eager
(torch.inference_mode) or in ONNX Runtime's Python package; then the two Python models again on
the batches read beforehand, with no loader beside them. Every model runs with --threads threads
(default: the cores). Prints a Markdown table and the JSON of the figures.
"""
import argparse
import json
import os
import re
import subprocess
import tempfile
import time

import numpy as np
import onnxruntime as ort
import torch
import torchvision
import torchvision.transforms as T
from safetensors.torch import load_file

PIL_FILTERS = {"bilinear": T.InterpolationMode.BILINEAR, "bicubic": T.InterpolationMode.BICUBIC,
               "nearest": T.InterpolationMode.NEAREST}


def ringtrain_predict(binary, model, data, batch, threads, out):
    """One `ringtrain predict` pass: (images, end-to-end s, model s) from its summary line."""
    cmd = [binary, "predict", "--checkpoint", model, data, "--out", out, "--batch-size", str(batch),
           "--workers", str(threads)]
    if not model.endswith(".onnx"):
        cmd += ["--device", "cpu"]
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    n = int(re.search(r"^(\d+) images predicted", text, re.M).group(1))
    m = re.search(r"\(([\d.]+) s\), the model alone [\d.]+ images/s \(([\d.]+) s\)", text)
    acc = re.search(r"accuracy ([\d.]+)%", text)
    return {"images": n, "seconds": float(m.group(1)), "model_seconds": float(m.group(2)),
            "top1": float(acc.group(1)) if acc else None}


def python_pass(loader, run):
    """One pass of `run` (normalised float batch → logits) over `loader`."""
    n = correct = 0
    model_s = 0.0
    start = time.perf_counter()
    for x, y in loader:
        t = time.perf_counter()
        logits = run(x)
        model_s += time.perf_counter() - t
        n += len(y)
        correct += int((torch.as_tensor(logits).argmax(-1) == y).sum())
    return {"images": n, "seconds": time.perf_counter() - start, "model_seconds": model_s,
            "top1": 100.0 * correct / n}


def eager_model(state, weights):
    name, classes = state["model"], len(state["classes"])
    if hasattr(torchvision.models, name):
        m = getattr(torchvision.models, name)(num_classes=classes)
    else:
        import timm
        m = timm.create_model(name, num_classes=classes)
    m.load_state_dict(load_file(weights))
    return m.eval()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ringtrain")
    ap.add_argument("checkpoint")
    ap.add_argument("data")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    state = json.load(open(os.path.join(a.checkpoint, "state.json")))
    crop = state.get("val_crop_size") or state["img_size"]
    tmp = tempfile.mkdtemp(prefix="export-inference-")
    onnx_file = os.path.join(tmp, "model.onnx")
    subprocess.run([a.ringtrain, "export", "--checkpoint", a.checkpoint, "--format", "onnx", "--out", onnx_file],
                   check=True, capture_output=True)
    rows = {}
    csv = os.path.join(tmp, "predictions.csv")
    rows["ringtrain predict, checkpoint (libtorch)"] = ringtrain_predict(
        a.ringtrain, a.checkpoint, a.data, a.batch_size, a.threads, csv)
    rows["ringtrain predict, ONNX file (ONNX Runtime C API)"] = ringtrain_predict(
        a.ringtrain, onnx_file, a.data, a.batch_size, a.threads, csv)

    transform = T.Compose([
        T.Resize(state["eval_resize"], interpolation=PIL_FILTERS[state.get("interpolation", "bilinear")]),
        T.CenterCrop(crop), T.ToTensor(), T.Normalize(state["mean"], state["std"])])
    folder = torchvision.datasets.ImageFolder(a.data, transform)
    assert folder.classes == state["classes"], "DATA's classes are not the checkpoint's"
    loader = torch.utils.data.DataLoader(folder, batch_size=a.batch_size, num_workers=a.threads)
    torch.set_num_threads(a.threads)
    model = eager_model(state, os.path.join(a.checkpoint, "model.safetensors"))

    def eager(x):
        with torch.inference_mode():
            return model(x)

    options = ort.SessionOptions()
    options.intra_op_num_threads = a.threads
    session = ort.InferenceSession(onnx_file, options, providers=["CPUExecutionProvider"])
    rows["PyTorch eager, torchvision DataLoader"] = python_pass(loader, eager)
    rows["ONNX Runtime (Python), ONNX file, torchvision DataLoader"] = python_pass(
        loader, lambda x: session.run(None, {"input": x.numpy()})[0])
    # The models alone with no loader beside them: the batches read beforehand.
    batches = list(loader)
    rows["PyTorch eager, batches in memory"] = python_pass(batches, eager)
    rows["ONNX Runtime (Python), ONNX file, batches in memory"] = python_pass(
        batches, lambda x: session.run(None, {"input": x.numpy()})[0])

    base = rows["PyTorch eager, torchvision DataLoader"]
    base_e2e, base_model = base["images"] / base["seconds"], base["images"] / base["model_seconds"]
    print(f"{state['model']} at {crop} px, {base['images']} images, batch {a.batch_size}, {a.threads} threads; "
          f"torch {torch.__version__}, onnxruntime {ort.__version__}\n")
    print("| path | end to end, images/s | vs PyTorch | the model alone, images/s | vs PyTorch | top-1 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, r in rows.items():
        e2e, alone = r["images"] / r["seconds"], r["images"] / r["model_seconds"]
        top1 = f"{r['top1']:.2f} %" if r["top1"] is not None else "-"
        e2e_cells = "- | -" if name.endswith("in memory") else f"{e2e:.1f} | {e2e / base_e2e:.2f}x"
        print(f"| {name} | {e2e_cells} | {alone:.1f} | {alone / base_model:.2f}x | {top1} |")
    print()
    print(json.dumps({"model": state["model"], "size": crop, "batch": a.batch_size, "threads": a.threads,
                      "rows": rows}))


if __name__ == "__main__":
    main()
