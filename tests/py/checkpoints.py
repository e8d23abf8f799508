"""PyTorch checkpoints as users have them, made by the PyTorch of the set-up, for ringtrain's
`--pretrained` and `convert` tests.

  checkpoints.py files OUT    resnet18 (7 classes, random BN statistics) saved by torch.save as
      OUT/plain.pth (zip), OUT/legacy.pth (the format before torch 1.6), OUT/ddp.pth (a DDP
      model's state_dict: every key under module.), OUT/compiled.pth (torch.compile's
      _orig_mod.), OUT/imagenet.pth.tar (the ImageNet example's dict: epoch, arch, the DDP
      state_dict, best_acc1, the optimizer's state, argparse's Namespace), OUT/timm_train.pth
      (timm's train script: state_dict and state_dict_ema), OUT/lightning.ckpt (Lightning's:
      every name under model.), OUT/whole_module.pth (torch.save of the module itself); OUT/reference.safetensors holds the
      state_dict itself, OUT/ema.safetensors the EMA one
  checkpoints.py hostile OUT MARKER   pickles that would create MARKER when unpickled: at the
      root (OUT/root_system.pth, root_eval.pth, root_popen.pth), beside the weights
      (OUT/side.pth) and in a weight's place (OUT/weight.pth); OUT/truncated.pth (a zip cut in
      half) and OUT/short_storage.pth (a storage shorter than its tensor)
  checkpoints.py same A B      exit 1 unless safetensors files A and B hold the same names and
      bit-identical tensors of the same dtypes
  checkpoints.py timm_hub OUT  timm's resnet18 (random, 5 classes) as the hub holds it:
      OUT/model.safetensors and OUT/config.json (pretrained_cfg: 64 px, crop_pct 0.8, mean and
      std 0.5), OUT/io.safetensors: an input and timm's eval logits
"""
import argparse
import builtins
import json
import os
import subprocess
import sys
import zipfile

import torch
import torchvision
from safetensors.torch import load_file, save_file


def resnet18():
    torch.manual_seed(0)
    m = torchvision.models.resnet18(num_classes=7)
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
            mod.num_batches_tracked.fill_(17)
    return m


def snapshot(m):
    return {k: v.detach().clone().contiguous() for k, v in m.state_dict().items()}


def files(out):
    m = resnet18()
    state = snapshot(m)
    save_file(state, f"{out}/reference.safetensors")
    torch.save(m.state_dict(), f"{out}/plain.pth")
    torch.save(m.state_dict(), f"{out}/legacy.pth", _use_new_zipfile_serialization=False)
    torch.save(m, f"{out}/whole_module.pth")  # torch.save(model), not its state_dict
    ddp = {"module." + k: v for k, v in state.items()}
    torch.save(ddp, f"{out}/ddp.pth")
    torch.save({"_orig_mod." + k: v for k, v in state.items()}, f"{out}/compiled.pth")
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    m(torch.randn(2, 3, 32, 32)).sum().backward()
    opt.step()  # the optimizer's state holds tensors too: they are not the weights
    torch.save({"epoch": 3, "arch": "resnet18", "state_dict": ddp, "best_acc1": torch.tensor(55.0),
                "optimizer": opt.state_dict(), "args": argparse.Namespace(lr=0.1, arch="resnet18")},
               f"{out}/imagenet.pth.tar")
    ema = {k: (v * 0.5 if v.is_floating_point() else v) for k, v in state.items()}
    save_file(ema, f"{out}/ema.safetensors")
    torch.save({"epoch": 3, "arch": "resnet18", "state_dict": state, "state_dict_ema": ema},
               f"{out}/timm_train.pth")
    # Lightning: the LightningModule's attribute before every name, the trainer's state beside.
    torch.save({"epoch": 3, "global_step": 300, "pytorch-lightning_version": "2.5.0",
                "state_dict": {"model." + k: v for k, v in state.items()},
                "optimizer_states": [opt.state_dict()], "hyper_parameters": {"lr": 0.1}},
               f"{out}/lightning.ckpt")



class Call:
    """Unpickling this calls `fn(*args)`: what a hostile checkpoint does."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


def hostile(out, marker):
    calls = {
        "system": Call(os.system, f"touch {marker}"),
        "eval": Call(builtins.eval, f"open({marker!r}, 'w').close()"),
        "popen": Call(subprocess.Popen, ["touch", marker]),
    }
    for name, call in calls.items():
        torch.save(call, f"{out}/root_{name}.pth")
    state = snapshot(resnet18())
    torch.save({"state_dict": state, "hook": calls["system"]}, f"{out}/side.pth")
    bad = dict(state)
    bad["conv1.weight"] = calls["system"]
    torch.save(bad, f"{out}/weight.pth")
    torch.save({"conv1.weight": calls["system"]}, f"{out}/only_call.pth")
    torch.save({"epoch": 3, "lr": 0.1}, f"{out}/no_tensors.pth")

    torch.save(state, f"{out}/whole.pth")
    data = open(f"{out}/whole.pth", "rb").read()
    open(f"{out}/truncated.pth", "wb").write(data[: len(data) // 2])
    # The same archive with the storage of fc.weight cut to 16 bytes: the pickle still says
    # 7x512 floats live there.
    # torch.save numbers storages in the order the pickle meets them: fc.weight's is its index
    # in the state_dict.
    fc_key = str(list(state).index("fc.weight"))
    with zipfile.ZipFile(f"{out}/whole.pth") as src, zipfile.ZipFile(f"{out}/short_storage.pth", "w") as dst:
        for info in src.infolist():
            body = src.read(info.filename)
            if info.filename.endswith(f"/data/{fc_key}"):
                body = body[:16]
            dst.writestr(info, body)


def same(a, b):
    x, y = load_file(a), load_file(b)
    if set(x) != set(y):
        sys.exit(f"names differ: {sorted(set(x) ^ set(y))[:10]}")
    for k in x:
        if x[k].dtype != y[k].dtype or x[k].shape != y[k].shape or not torch.equal(x[k], y[k]):
            sys.exit(f"{k} differs")


def timm_hub(out):
    import timm

    torch.manual_seed(0)
    m = timm.create_model("resnet18", num_classes=5)
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
    m.eval()
    save_file(snapshot(m), f"{out}/model.safetensors")
    cfg = {"architecture": "resnet18", "num_classes": 5, "num_features": 512,
           "pretrained_cfg": {"tag": "test", "input_size": [3, 64, 64], "crop_pct": 0.8,
                              "interpolation": "bicubic", "mean": [0.5, 0.5, 0.5],
                              "std": [0.5, 0.5, 0.5], "num_classes": 5, "classifier": "fc"}}
    json.dump(cfg, open(f"{out}/config.json", "w"))
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        save_file({"x": x, "logits": m(x)}, f"{out}/io.safetensors")


if __name__ == "__main__":
    commands = {"files": files, "hostile": hostile, "same": same, "timm_hub": timm_hub}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        sys.exit(f"unknown command {sys.argv[1:2]}: one of {', '.join(commands)}")
    commands[sys.argv[1]](*sys.argv[2:])
