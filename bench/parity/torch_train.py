"""PyTorch + torchvision reference for the parity benchmark: trains the recipe in a ringtrain TOML
file the way `ringtrain train --config` does (torchvision model and init, ImageFolder,
RandomResizedCrop + flip, Resize + CenterCrop for evaluation, SGD, label smoothing, a cosine
learning rate updated every step, last partial batch kept) and evaluates on VAL after every
epoch.

Usage: torch_train.py RECIPE.toml TRAIN_DIR VAL_DIR SEED WORKERS
Prints one JSON line per epoch: {"epoch", "train_loss", "val_top1", "val_macro_f1", "seconds"}.
"""
import json
import math
import sys
import time
import tomllib

import torch
import torchvision
from sklearn.metrics import f1_score
from torchvision import transforms as T

SUPPORTED = {"model", "img_size", "crop_scale", "epochs", "batch_size", "optimizer", "lr", "momentum",
             "weight_decay", "label_smoothing", "sched", "warmup_epochs", "device", "amp", "log_every",
             "torchvision_compat"}
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def main(recipe, train_dir, val_dir, seed, workers):
    with open(recipe, "rb") as f:
        r = tomllib.load(f)
    unknown = set(r) - SUPPORTED
    assert not unknown, f"torch_train.py does not implement {sorted(unknown)}"
    assert r["optimizer"] == "sgd" and r["sched"] == "cosine" and r["amp"] == "off"
    torch.manual_seed(int(seed))
    size = r["img_size"]
    train_tf = T.Compose([T.RandomResizedCrop(size, scale=tuple(r.get("crop_scale", (0.08, 1.0)))),
                          T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    eval_tf = T.Compose([T.Resize(round(size / 0.875)), T.CenterCrop(size), T.ToTensor(), T.Normalize(MEAN, STD)])
    train = torchvision.datasets.ImageFolder(train_dir, train_tf)
    val = torchvision.datasets.ImageFolder(val_dir, eval_tf)
    assert train.classes == val.classes
    bs = r["batch_size"]
    train_dl = torch.utils.data.DataLoader(train, bs, shuffle=True, num_workers=int(workers),
                                           persistent_workers=int(workers) > 0)
    val_dl = torch.utils.data.DataLoader(val, bs, num_workers=int(workers))
    model = getattr(torchvision.models, r["model"])(num_classes=len(train.classes))
    opt = torch.optim.SGD(model.parameters(), lr=r["lr"], momentum=r.get("momentum", 0.9),
                          weight_decay=r.get("weight_decay", 1e-4))
    # ringtrain's schedule (train/schedule.rs): linear warm-up, then cosine to 0, per step.
    total = r["epochs"] * len(train_dl)
    warm = round(r.get("warmup_epochs", 0.0) * len(train_dl))

    def factor(s):
        if s < warm:
            return (s + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (s - warm) / max(1, total - warm))))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=r.get("label_smoothing", 0.0))
    for epoch in range(1, r["epochs"] + 1):
        t0 = time.perf_counter()
        model.train()
        loss_sum, n = 0.0, 0
        for x, y in train_dl:
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            loss_sum += loss.item() * len(y)
            n += len(y)
        model.eval()
        preds, targets = [], []
        with torch.no_grad():
            for x, y in val_dl:
                preds.append(model(x).argmax(1))
                targets.append(y)
        p, t = torch.cat(preds).numpy(), torch.cat(targets).numpy()
        print(json.dumps({"epoch": epoch, "train_loss": loss_sum / n, "val_top1": 100.0 * (p == t).mean(),
                          "val_macro_f1": 100.0 * f1_score(t, p, average="macro"),
                          "seconds": time.perf_counter() - t0}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
