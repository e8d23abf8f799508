"""PyTorch reference for `ringtrain bench --vs-pytorch`: the training step alone on synthetic
inputs, the same way ringtrain measures it (SGD momentum 0.9, cross-entropy, autocast for the
forward pass and the loss, GradScaler for fp16, median images/s over timed windows after warm-up).

MODEL is torchvision's builder name, or timm's for the architectures only timm has (timm's model).

Usage: torch_step.py MODEL BATCH SIZE AMP(off|bf16|fp16) CHANNELS_LAST(0|1) DEVICE STEPS WARMUP WINDOW
Prints one JSON object: {"images_per_s": ..., "peak_memory_bytes": ...}.
With TORCH_STEP_COMPILE=1 in the environment the model is wrapped in torch.compile (PyTorch's
fastest configuration; the warm-up steps then include the compilation), in the mode named by
TORCH_STEP_COMPILE_MODE if set (e.g. reduce-overhead, which replays CUDA graphs, or
max-autotune).
With TORCH_STEP_PROFILE=DIR, TORCH_STEP_PROFILE_STEPS (default 5) more steps run after the timed
ones under torch.profiler, each in a "ProfilerStep#N" scope as `ringtrain bench --profile` marks
its own; the Chrome trace goes to DIR/trace.json and the output gains
"profile": {"trace": ..., "measured_ms": ...} (the clock's milliseconds per profiled step).
"""
import json
import os
import statistics
import sys
import time

import torch
import torchvision


def main(model, batch, size, amp, channels_last, device, steps, warmup, window):
    batch, size, steps, warmup, window = map(int, (batch, size, steps, warmup, window))
    channels_last = channels_last == "1"
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    if model == "resnet18-cifar":
        m = torchvision.models.resnet18(num_classes=1000)
        m.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        m.maxpool = torch.nn.Identity()
    elif model not in torchvision.models.list_models():
        # timm's own architectures (ringtrain's timm names): timm's model.
        import timm
        vit = model.startswith(("vit_", "deit_"))
        m = timm.create_model(model, num_classes=1000, **({"img_size": size} if vit else {}))
    elif model.startswith("vit"):
        # A ViT is built for one image size (its position embeddings).
        m = getattr(torchvision.models, model)(num_classes=1000, image_size=size)
    else:
        m = getattr(torchvision.models, model)(num_classes=1000)
    m = m.to(dev)
    x = torch.randn(batch, 3, size, size, device=dev)
    if channels_last:
        m = m.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device=dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    mode = os.environ.get("TORCH_STEP_COMPILE_MODE") or None
    fwd = torch.compile(m, mode=mode) if os.environ.get("TORCH_STEP_COMPILE") == "1" else m
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)
    scaler = torch.amp.GradScaler(dev.type, enabled=amp == "fp16")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    def step():
        with torch.autocast(dev.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = torch.nn.functional.cross_entropy(fwd(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    rates, t0 = [], None
    for i in range(warmup + steps):
        if i >= warmup and (i - warmup) % window == 0:
            sync()
            now = time.perf_counter()
            if t0 is not None:
                rates.append(window * batch / (now - t0))
            t0 = now
        step()
    sync()
    rates.append(window * batch / (time.perf_counter() - t0)) if (steps % window == 0) else None
    peak = torch.cuda.max_memory_allocated(dev) if cuda else None
    out = {"images_per_s": statistics.median(rates), "peak_memory_bytes": peak}
    if os.environ.get("TORCH_STEP_PROFILE"):
        out["profile"] = profile(step, cuda, sync, os.environ["TORCH_STEP_PROFILE"],
                                 int(os.environ.get("TORCH_STEP_PROFILE_STEPS", "5")))
    print(json.dumps(out))


def profile(step, cuda, sync, out_dir, n):
    """n steps under torch.profiler, as ringtrain bench --profile runs its own; the trace is
    written atomically (a temporary file, fsync, rename)."""
    from torch.profiler import ProfilerActivity, record_function
    os.makedirs(out_dir, exist_ok=True)
    trace, tmp = os.path.join(out_dir, "trace.json"), os.path.join(out_dir, ".trace.json.tmp")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync()
    with torch.profiler.profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for i in range(n):
            with record_function(f"ProfilerStep#{i + 1}"):
                step()
        sync()
        measured_ms = (time.perf_counter() - t0) * 1000 / n
    prof.export_chrome_trace(tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, trace)
    return {"trace": trace, "measured_ms": measured_ms}


if __name__ == "__main__":
    main(*sys.argv[1:])
