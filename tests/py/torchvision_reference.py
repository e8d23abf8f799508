"""Independent references from PyTorch/torchvision for ringtrain's tests.

  torchvision_reference.py models OUTDIR NAME...   random-initialised torchvision models:
      OUTDIR/NAME.safetensors (state_dict) and OUTDIR/NAME.io.safetensors (input, eval and
      train-mode logits, stochastic depth and dropout off); OUTDIR/NAME.json: its size and
      parameter count; with --pth first, the state_dict also as torch.save writes it,
      OUTDIR/NAME.pth (zip) and OUTDIR/NAME.legacy.pth (the format before torch 1.6)
  torchvision_reference.py load_strict DIR NAME...   OUTDIR/NAME.ours.safetensors (a ringtrain
      state_dict) loaded strictly into torchvision's NAME; its eval logits on the input of
      DIR/NAME.ours_io.safetensors against the "logits" saved there, as JSON per name
  torchvision_reference.py param_counts NAME...   JSON: parameters of torchvision's NAME at 1000
      classes, and the crop size of its default weights
  torchvision_reference.py interpolate_pos SRC SIZE OUT   torchvision's interpolate_embeddings of
      the ViT-B/16 state_dict SRC for SIZE px, saved to OUT
  torchvision_reference.py evaluate MODEL NUM_CLASSES CKPT ROOT SIZE RESIZE   top-1 in PyTorch
  torchvision_reference.py predict_logits CKPT_DIR CSV   max |logit diff| between `ringtrain predict
      --logits` and torchvision's model with the checkpoint loaded, on the CSV's images
  torchvision_reference.py pil_pixels OUT SIZE RESIZE FILE...   PIL's RGB decode and torchvision's
      Resize(RESIZE) + CenterCrop(SIZE) of each file, as uint8 HWC tensors in OUT (safetensors)
  torchvision_reference.py init_state OUTDIR NAME...   freshly initialised torchvision models
      (torch.manual_seed(0)), OUTDIR/NAME.init.safetensors; NAME+zero_init_residual builds
      NAME with zero_init_residual=True
  torchvision_reference.py crop_boxes OUT N W:H:SCALE_MIN:SCALE_MAX...   N draws of
      RandomResizedCrop.get_params per image size and scale (ratio 3/4 to 4/3), as int64
      (top, left, height, width) rows in OUT (safetensors, one tensor per spec)
  torchvision_reference.py transforms IMAGES JOBS OUT   torchvision's transforms on PIL images
      made from the uint8 HWC tensors in IMAGES (safetensors), one per job of the JSON list JOBS:
      {"image", "box": [top, left, height, width], "size"} is RandomResizedCrop's resized_crop,
      {"image", "resize", "size"} is Resize + CenterCrop, each with the job's "interpolation"
      (bilinear, bicubic or nearest; bilinear when absent; antialiased, as on any PIL image); the
      outputs as uint8 HWC tensors in OUT, keyed by job index
  torchvision_reference.py jpeg_variants SRC OUTDIR   SRC saved by PIL as a grayscale JPEG
      (OUTDIR/gray.jpg) and as a CMYK JPEG (OUTDIR/cmyk.jpg), both at size 96
  torchvision_reference.py sklearn_report JSON     sklearn's classification_report(output_dict=True)
  torchvision_reference.py tensorboard_scalars DIR scalars and texts as TensorBoard's reader sees them
  torchvision_reference.py grad_scaler STEPS BAD    GradScaler's scale and step decisions
  torchvision_reference.py pixel_stats ROOT        per-channel mean/std over all pixels (NumPy)
  torchvision_reference.py imagefolder ROOT        JSON: classes and samples as ImageFolder sees them
  torchvision_reference.py mixup DIR   torchvision.transforms.v2's MixUp or CutMix (train.py's
      RandomChoice of the two) on each case of DIR/cases.json with the tensors of
      DIR/in.safetensors, the Rust side's draws replayed in place of torch's; DIR/out.safetensors:
      the mixed images, the targets smoothed as cross_entropy(label_smoothing) smooths them,
      lambda, the box (y1, y2, x1, x2) and cross_entropy of the case's logits
  torchvision_reference.py optimizer IN OUT KIND IMPL  torch.optim (timm.optim for LARS and LAMB)
      steps on a scripted problem
  torchvision_reference.py plateau METRICS MODE ...  ReduceLROnPlateau's LR after each metric
  torchvision_reference.py ema STATES K DECAY OUT   AveragedModel EMA (use_buffers) of resnet18 states
  torchvision_reference.py sgd_step ROOT SIZE WEIGHTS OPTIM OUT [WD]   one SGD step of resnet18 on
      all of ROOT as one batch, from WEIGHTS (or init:PATH) and momentum buffers OPTIM (or -),
      with weight decay WD (default 5e-4)
"""
import json
import sys

import torch
import torchvision
from safetensors.torch import save_file

NUM_CLASSES = 7


# Stochastic depth and dropout off, so train-mode logits are deterministic.
NO_DROP = {"convnext": dict(stochastic_depth_prob=0.0),
           "efficientnet": dict(stochastic_depth_prob=0.0, dropout=0.0),
           "mobilenet": dict(dropout=0.0)}


def build(name, deterministic=False, num_classes=NUM_CLASSES):
    if name == "resnet18-cifar":
        m = torchvision.models.resnet18(num_classes=num_classes)
        m.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        m.maxpool = torch.nn.Identity()
        return m, 32
    kw = next((v for k, v in NO_DROP.items() if name.startswith(k)), {}) if deterministic else {}
    if name.startswith("vit"):
        return getattr(torchvision.models, name)(num_classes=num_classes, image_size=32, **kw), 32
    size = 96 if name == "alexnet" else 64
    return getattr(torchvision.models, name)(num_classes=num_classes, **kw), size


def randomise(m):
    """Random norm statistics and affine parameters, so eval-mode BatchNorm is not an identity;
    random values where torchvision starts at a constant that hides a path (ConvNeXt's 1e-6 layer
    scales, ViT's zero head and class token)."""
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
        if isinstance(mod, (torch.nn.BatchNorm2d, torch.nn.LayerNorm)):
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.2, 0.2)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("layer_scale"):
                p.uniform_(0.1, 0.5)
            elif name == "class_token" or name.startswith("heads.head"):
                p.normal_(0, 0.5)


def models(out, *names):
    pth = names and names[0] == "--pth"
    names = names[1:] if pth else names
    for name in names:
        torch.manual_seed(0)
        m, size = build(name, deterministic=True)
        randomise(m)
        x = torch.randn(3, 3, size, size)
        m.eval()
        with torch.no_grad():
            eval_logits = m(x)
        tensors = {"x": x, "eval_logits": eval_logits}
        # Saved before the train-mode pass, which updates the BN running statistics.
        state = {k: v.clone().contiguous() for k, v in m.state_dict().items()}
        if name != "alexnet":  # dropout makes alexnet's train mode random
            m.train()
            with torch.no_grad():
                tensors["train_logits"] = m(x)
            m.eval()
        save_file(state, f"{out}/{name}.safetensors")
        save_file(tensors, f"{out}/{name}.io.safetensors")
        if pth:
            torch.save(state, f"{out}/{name}.pth")
            torch.save(state, f"{out}/{name}.legacy.pth", _use_new_zipfile_serialization=False)
        json.dump({"size": size, "parameters": sum(p.numel() for p in m.parameters())},
                  open(f"{out}/{name}.json", "w"))


def load_strict(d, *names):
    from safetensors.torch import load_file

    result = {}
    for name in names:
        m, _ = build(name)
        m.load_state_dict(load_file(f"{d}/{name}.ours.safetensors"), strict=True)
        m.eval()
        io = load_file(f"{d}/{name}.ours_io.safetensors")
        with torch.no_grad():
            theirs = m(io["x"])
        result[name] = {"max_abs_diff": (theirs - io["logits"]).abs().max().item(),
                        "logit_scale": theirs.abs().max().item()}
    print(json.dumps(result))


def param_counts(*names):
    """Parameters at 1000 classes and, for torchvision's own architectures, the crop size of the
    default weights' transforms."""
    counts = {}
    for name in names:
        m = build(name, num_classes=1000)[0] if name == "resnet18-cifar" else \
            getattr(torchvision.models, name)(num_classes=1000)
        counts[name] = {"parameters": sum(p.numel() for p in m.parameters())}
        if name in torchvision.models.list_models():
            crop = torchvision.models.get_model_weights(name).DEFAULT.transforms().crop_size
            counts[name]["input"] = crop[0]
    print(json.dumps(counts))


def interpolate_pos(src, size, out):
    from safetensors.torch import load_file
    from torchvision.models.vision_transformer import interpolate_embeddings

    state = interpolate_embeddings(int(size), 16, load_file(src))
    save_file({"encoder.pos_embedding": state["encoder.pos_embedding"].contiguous()}, out)


def evaluate(name, num_classes, ckpt, root, size, resize):
    """Top-1 of a ringtrain checkpoint loaded strictly into torchvision, with torchvision's
    own evaluation transforms."""
    from safetensors.torch import load_file
    from torchvision import transforms as T

    m = getattr(torchvision.models, name)(num_classes=int(num_classes))
    m.load_state_dict(load_file(ckpt), strict=True)
    m.eval()
    tf = T.Compose([T.Resize(int(resize)), T.CenterCrop(int(size)), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    ds = torchvision.datasets.ImageFolder(root, transform=tf)
    correct = 0
    with torch.no_grad():
        for x, y in torch.utils.data.DataLoader(ds, batch_size=64):
            correct += (m(x).argmax(1) == y).sum().item()
    print(correct / len(ds))


def predict_logits(ckpt_dir, csv_path):
    """Loads a ringtrain checkpoint into torchvision by name (strict), runs the images listed in
    ringtrain's predict CSV through torchvision's own eval transforms and compares the logits."""
    import csv
    from PIL import Image
    from safetensors.torch import load_file
    from torchvision import transforms as T

    st = json.load(open(f"{ckpt_dir}/state.json"))
    m = getattr(torchvision.models, st["model"])(num_classes=len(st["classes"]))
    m.load_state_dict(load_file(f"{ckpt_dir}/model.safetensors"), strict=True)
    m.eval()
    mode = T.InterpolationMode(st.get("interpolation", "bilinear"))
    tf = T.Compose([T.Resize(st["eval_resize"], mode), T.CenterCrop(st["img_size"]), T.ToTensor(),
                    T.Normalize(st["mean"], st["std"])])
    rows = list(csv.DictReader(open(csv_path)))
    x = torch.stack([tf(Image.open(r["path"]).convert("RGB")) for r in rows])
    ours = torch.tensor([[float(r[f"logit_{c}"]) for c in st["classes"]] for r in rows])
    with torch.no_grad():
        theirs = m(x)
    print(json.dumps({"images": len(rows), "max_abs_diff": (ours - theirs).abs().max().item(),
                      "logit_scale": theirs.abs().max().item()}))


def pil_pixels(out, size, resize, *files):
    import numpy as np
    from PIL import Image
    from torchvision import transforms as T

    tf = T.Compose([T.Resize(int(resize)), T.CenterCrop(int(size))])
    tensors = {}
    for i, f in enumerate(files):
        img = Image.open(f).convert("RGB")
        tensors[f"decode/{i}"] = torch.from_numpy(np.asarray(img).copy())
        tensors[f"eval/{i}"] = torch.from_numpy(np.asarray(tf(img)).copy())
    save_file(tensors, out)


def init_state(out, *names):
    """torchvision's own initialisation, untouched (models() randomises BatchNorm)."""
    for name in names:
        torch.manual_seed(0)
        if name.endswith("+zero_init_residual"):
            m = getattr(torchvision.models, name.split("+")[0])(num_classes=NUM_CLASSES, zero_init_residual=True)
        else:
            m, _ = build(name)
        save_file({k: v.contiguous() for k, v in m.state_dict().items()}, f"{out}/{name}.init.safetensors")


def crop_boxes(out, n, *specs):
    from torchvision import transforms as T

    torch.manual_seed(0)
    tensors = {}
    for spec in specs:
        w, h, s0, s1 = spec.split(":")
        img = torch.empty(3, int(h), int(w), dtype=torch.uint8)
        boxes = [T.RandomResizedCrop.get_params(img, (float(s0), float(s1)), (3 / 4, 4 / 3)) for _ in range(int(n))]
        tensors[spec] = torch.tensor(boxes, dtype=torch.int64)
    save_file(tensors, out)


def transforms(images, jobs, out):
    import numpy as np
    from PIL import Image
    from safetensors.torch import load_file
    from torchvision import transforms as T
    from torchvision.transforms import functional as F

    images = load_file(images)
    tensors = {}
    for i, job in enumerate(json.load(open(jobs))):
        img = Image.fromarray(images[job["image"]].numpy())
        size = job["size"]
        mode = T.InterpolationMode(job.get("interpolation", "bilinear"))
        if "box" in job:
            top, left, h, w = job["box"]
            result = F.resized_crop(img, top, left, h, w, [size, size], mode, antialias=True)
        else:
            result = T.CenterCrop(size)(T.Resize(job["resize"], mode, antialias=True)(img))
        tensors[str(i)] = torch.from_numpy(np.asarray(result).copy())
    save_file(tensors, out)


def jpeg_variants(src, out):
    from PIL import Image

    img = Image.open(src).convert("RGB").resize((96, 96), Image.BILINEAR)
    img.convert("L").save(f"{out}/gray.jpg", quality=90)
    img.convert("CMYK").save(f"{out}/cmyk.jpg", quality=90)


def sklearn_report(path):
    """sklearn's classification_report(output_dict=True) for {"targets","preds","classes"}."""
    import warnings
    from sklearn.metrics import classification_report

    d = json.load(open(path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zero-division warnings: the default still gives 0
        r = classification_report(d["targets"], d["preds"], labels=list(range(len(d["classes"]))),
                                  target_names=d["classes"], output_dict=True)
    print(json.dumps(r))


def tensorboard_scalars(run_dir):
    """Every scalar and text tag TensorBoard's own reader finds in a run directory."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(run_dir, size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    out = {"scalars": {t: [[e.step, e.value] for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]},
           "tensors": {t: [e.tensor_proto.string_val[0].decode() for e in acc.Tensors(t)] for t in acc.Tags()["tensors"]}}
    print(json.dumps(out))


def grad_scaler(steps, bad):
    """PyTorch's GradScaler (defaults, CPU) on a scripted gradient sequence: gradient 1.0 each
    step except inf/NaN at the steps listed in `bad` ("3,17"). Prints, per step, the scale
    after update() and whether the optimizer stepped."""
    bad = {int(b) for b in bad.split(",") if b}
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    out = []
    for k in range(int(steps)):
        opt.zero_grad()
        scaler.scale(torch.ones(()))  # the scaler starts lazily on its first scale()
        g = float("inf") if k in bad and k % 2 == 0 else float("nan") if k in bad else 1.0
        p.grad = torch.full_like(p, g) * scaler.get_scale()
        before = p.detach().clone()
        scaler.step(opt)
        scaler.update()
        out.append([scaler.get_scale(), not torch.equal(before, p.detach())])
    print(json.dumps(out))


# The scripted optimizer problem shared with tests/optim.rs.
OPT_LRS = [0.1, 0.08, 0.05, 0.05, 0.02, 0.01]
OPT_SKIPPED_STEP = 3  # a gradient holds inf: GradScaler skips the step and backs off
OPT_HEAD_MULT = 10.0


def opt_grad(p, k):
    return torch.sin(p * (k + 1)) + 0.1 * k


def optimizer(inp, out, kind, impl):
    """Runs torch.optim.{SGD, Adam, AdamW} (kind: sgd, sgd_nesterov, sgd_plain, adam, adamw) with
    impl "fused" or "forloop", torch.optim.RMSprop (kind: rmsprop with momentum 0.9, rmsprop_plain
    without; torchvision's alpha 0.9 and eps 0.0316) with impl "foreach" or "forloop", or
    timm.optim.{Lars, Lamb} (kind: lars, lars_nesterov, lamb; trust
    coefficient 0.001, Lamb's defaults) with impl "foreach" or "forloop", under
    torch.amp.GradScaler("cpu") (its defaults: scale 65536,
    dynamic) on the parameters in IN: groups body (decay), bn.* (no decay), fc.* (head, 10x lr);
    gradient (sin(p * (k + 1)) + 0.1 k) * scale at step k, from backward of a scaled loss;
    at step OPT_SKIPPED_STEP body.weight's first gradient is inf. scaler.step / scaler.update as
    a training loop calls them: a fused optimizer gets found_inf and grad_scale, a for-loop one is
    unscaled and skipped. Writes final parameters, optimizer state and the scaler's scale and
    growth tracker to OUT."""
    from safetensors.torch import load_file
    init = load_file(inp)
    ps = {k: torch.nn.Parameter(v.clone()) for k, v in init.items()}
    wd = {"sgd": 1e-4, "sgd_nesterov": 1e-3, "sgd_plain": 1e-2, "adam": 1e-2, "adamw": 0.05, "lars": 5e-5,
          "lars_nesterov": 1e-3, "lamb": 0.02, "rmsprop": 1e-4, "rmsprop_plain": 1e-3}[kind]
    groups = [
        {"params": [ps["body.weight"]], "weight_decay": wd, "mult": 1.0},
        {"params": [ps["bn.bias"], ps["bn.weight"]], "weight_decay": 0.0, "mult": 1.0},
        {"params": [ps["fc.bias"], ps["fc.weight"]], "weight_decay": wd, "mult": OPT_HEAD_MULT},
    ]
    flags = {"fused": True} if impl == "fused" else {"foreach": impl == "foreach"}
    if kind.startswith("lars"):
        import timm.optim
        opt = timm.optim.Lars(groups, lr=0.1, momentum=0.9, nesterov=kind == "lars_nesterov", **flags)
    elif kind == "lamb":
        import timm.optim
        opt = timm.optim.Lamb(groups, lr=0.1, **flags)
    elif kind.startswith("rmsprop"):
        momentum = 0.0 if kind == "rmsprop_plain" else 0.9
        opt = torch.optim.RMSprop(groups, lr=0.1, momentum=momentum, alpha=0.9, eps=0.0316, **flags)
    elif kind.startswith("sgd"):
        momentum = 0.0 if kind == "sgd_plain" else 0.9
        opt = torch.optim.SGD(groups, lr=0.1, momentum=momentum, nesterov=kind == "sgd_nesterov", **flags)
    elif kind == "adam":
        opt = torch.optim.Adam(groups, lr=0.1, **flags)
    else:
        opt = torch.optim.AdamW(groups, lr=0.1, **flags)
    scaler = torch.amp.GradScaler("cpu")
    for k, lr in enumerate(OPT_LRS):
        for g in opt.param_groups:
            g["lr"] = lr * g["mult"]
        # A loss whose gradient is opt_grad, scaled and backpropagated as in a training loop.
        loss = sum((p * opt_grad(p.detach(), k)).sum() for p in ps.values())
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if k == OPT_SKIPPED_STEP:
            ps["body.weight"].grad[0, 0] = float("inf")
        scaler.step(opt)
        scaler.update()
    result = {k: v.detach().contiguous() for k, v in ps.items()}
    for name, p in ps.items():
        for key, v in opt.state[p].items():
            if torch.is_tensor(v):
                result[f"{name}.{key}"] = v.detach().float().contiguous().reshape(v.shape)
    # timm's Lamb counts steps per group; ringtrain keeps the count under each parameter.
    for g in opt.param_groups:
        if "step" in g:
            for p in g["params"]:
                name = next(n for n, q in ps.items() if q is p)
                result[f"{name}.step"] = g["step"].detach().float().reshape(()).clone()
    result["scaler.scale"] = scaler._scale.detach().float().reshape(())
    result["scaler.growth_tracker"] = scaler._growth_tracker.detach().float().reshape(())
    save_file(result, out)


def plateau(metrics, mode, factor, patience, threshold, cooldown, min_lr):
    """torch's ReduceLROnPlateau (lr 1.0) on a metric sequence: the LR after each step(metric)."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    s = torch.optim.lr_scheduler.ReduceLROnPlateau(
        opt, mode=mode, factor=float(factor), patience=int(patience), threshold=float(threshold),
        cooldown=int(cooldown), min_lr=float(min_lr))
    out = []
    for m in metrics.split(","):
        s.step(float(m))
        out.append(opt.param_groups[0]["lr"])
    print(json.dumps(out))


def ema(states, k, decay, out):
    """torch.optim.swa_utils.AveragedModel with get_ema_multi_avg_fn(DECAY) and use_buffers=True
    (torchvision's reference ExponentialMovingAverage) over resnet18(num_classes=7) states
    "0.<name>" ... "K.<name>" from STATES; writes the averaged state_dict to OUT."""
    from safetensors.torch import load_file
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
    st = load_file(states)
    m = torchvision.models.resnet18(num_classes=NUM_CLASSES)
    avg = AveragedModel(m, multi_avg_fn=get_ema_multi_avg_fn(float(decay)), use_buffers=True)
    for i in range(int(k) + 1):
        m.load_state_dict({n[len(f"{i}."):]: v for n, v in st.items() if n.startswith(f"{i}.")})
        avg.update_parameters(m)
    save_file({n: v.contiguous() for n, v in avg.module.state_dict().items()}, out)


def pixel_stats(root):
    """Per-channel mean and population std over all pixels of an ImageFolder tree, with NumPy."""
    import numpy as np
    from PIL import Image

    ds = torchvision.datasets.ImageFolder(root)
    s, sq, n = np.zeros(3), np.zeros(3), 0
    for path, _ in ds.samples:
        a = np.asarray(Image.open(path).convert("RGB"), dtype=np.float64).reshape(-1, 3) / 255.0
        s += a.sum(0)
        sq += (a * a).sum(0)
        n += a.shape[0]
    mean = s / n
    print(json.dumps({"mean": mean.tolist(), "std": np.sqrt(sq / n - mean ** 2).tolist(), "pixels": n}))


def imagefolder(root):
    ds = torchvision.datasets.ImageFolder(root)
    print(json.dumps({"classes": ds.classes, "class_to_idx": ds.class_to_idx, "samples": ds.samples}))


def sgd_step(root, size, weights, optim, out, wd="5e-4"):
    """One torch.optim.SGD step (lr 0.01, momentum 0.9, weight decay WD, label smoothing 0.1) of
    torchvision's resnet18 on every image of ROOT as one batch. WEIGHTS: a state_dict file, or
    init:PATH for torchvision's own initialisation (seed 0), saved to PATH first. OPTIM: the
    momentum buffers (`<name>.momentum_buffer`, as ringtrain saves them) or - for none."""
    from safetensors.torch import load_file
    from torchvision import transforms as T
    size = int(size)
    tf = T.Compose([T.Resize((size, size)), T.ToTensor(), T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    ds = torchvision.datasets.ImageFolder(root, tf)
    x = torch.stack([ds[i][0] for i in range(len(ds))])
    y = torch.tensor([ds[i][1] for i in range(len(ds))])
    torch.manual_seed(0)
    m = torchvision.models.resnet18(num_classes=len(ds.classes))
    if weights.startswith("init:"):
        save_file({k: v.clone().contiguous() for k, v in m.state_dict().items()}, weights[5:])
    else:
        m.load_state_dict(load_file(weights))
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, weight_decay=float(wd))
    if optim != "-":
        bufs = load_file(optim)
        for name, p in m.named_parameters():
            opt.state[p]["momentum_buffer"] = bufs[f"{name}.momentum_buffer"]
    m.train()
    loss = torch.nn.CrossEntropyLoss(label_smoothing=0.1)(m(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    save_file({k: v.clone().contiguous() for k, v in m.state_dict().items()}, out)


class _Fixed:
    """Stands in for MixUp's/CutMix's Beta distribution: its one sample is the Rust draw."""

    def __init__(self, value):
        self.value = value

    def sample(self, shape=()):
        assert shape == (), shape
        return torch.tensor(self.value, dtype=torch.float64)


def mixup(d):
    from pathlib import Path

    from safetensors.torch import load_file
    from torchvision.transforms import v2

    d = Path(d)
    inp = load_file(d / "in.safetensors")
    out = {}
    randint = torch.randint
    try:
        for case in json.loads((d / "cases.json").read_text()):
            name, cfg, draws = case["name"], case["cfg"], case["draws"]
            x, y = inp[f"{name}.x"], inp[f"{name}.y"]
            h, w = x.shape[-2:]
            cutmix = draws["centre"] is not None
            t = (v2.CutMix if cutmix else v2.MixUp)(
                alpha=cfg["cutmix_alpha" if cutmix else "mixup_alpha"], num_classes=cfg["num_classes"])
            t._dist = _Fixed(draws["beta"])
            # CutMix asks torch.randint for the column, then the row.
            asked = [(w, draws["centre"][1]), (h, draws["centre"][0])] if cutmix else []

            def replay(high, size):
                (want, value) = asked.pop(0)
                assert (high, size) == (want, (1,)), (high, size, want)
                return torch.tensor([value])

            params = {}
            make_params = t.make_params
            t.make_params = lambda flat: params.update(make_params(flat)) or params
            torch.randint = replay
            mixed, target = t(x.clone(), y)
            torch.randint = randint
            assert not asked, "CutMix did not use every draw"
            eps, k = cfg["label_smoothing"], cfg["num_classes"]
            out[f"{name}.x"] = mixed.contiguous()
            # As cross_entropy smooths probability targets (LossNLL.cpp).
            out[f"{name}.target"] = target * (1 - eps) + eps / k if eps > 0 else target
            out[f"{name}.loss"] = torch.nn.functional.cross_entropy(
                inp[f"{name}.logits"], target, label_smoothing=eps).reshape(1).double()
            out[f"{name}.lam"] = torch.tensor([params.get("lam_adjusted", params.get("lam"))], dtype=torch.float64)
            if cutmix:
                x1, y1, x2, y2 = params["box"]
                out[f"{name}.box"] = torch.tensor([y1, y2, x1, x2], dtype=torch.int64)
    finally:
        torch.randint = randint
    save_file(out, d / "out.safetensors")


COMMANDS = [models, evaluate, predict_logits, pil_pixels, init_state, crop_boxes, transforms, jpeg_variants,
            sklearn_report, tensorboard_scalars, grad_scaler, pixel_stats, optimizer, ema, plateau, sgd_step,
            imagefolder, load_strict, param_counts, interpolate_pos, mixup]

if __name__ == "__main__":
    commands = {f.__name__: f for f in COMMANDS}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        sys.exit(f"unknown command {sys.argv[1:2]}: one of {', '.join(commands)}")
    commands[sys.argv[1]](*sys.argv[2:])
