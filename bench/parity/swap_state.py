"""Move a run's state between torchvision's train.py and ringtrain at an epoch's end, so that one
program can go on from where the other stopped: weights, BatchNorm statistics and SGD's momentum
buffers (both keep torch's buffer, so it carries over as it is). The schedule, the epoch and,
for ringtrain, the data position come from a template: a checkpoint of the receiving program at
the same epoch's end, from a run of the same command.

    swap_state.py to-torchvision RINGTRAIN_DIR TEMPLATE.pth OUT.pth
        (RINGTRAIN_DIR: a run's last/ or best/; TEMPLATE.pth: train.py's model_E.pth, with
         --output-dir; then train.py ... --resume OUT.pth)
    swap_state.py to-ringtrain TRAIN_PY.pth TEMPLATE_DIR OUT_DIR
        (TEMPLATE_DIR: a ringtrain run's last/ after the same epoch; then ringtrain train ...
         --resume OUT_DIR with the template run's --seed)

train.py's optimizer numbers its parameters in the order of its parameter groups
(utils.set_weight_decay: with --norm-weight-decay, the other parameters, then the norm layers'),
so it needs its references/classification folder: set TORCHVISION_REFERENCES to it.
"""
import argparse
import json
import os
import shutil
import sys

import torch
import torchvision
from safetensors.torch import load_file, save_file


def parameter_order(model_name, num_classes, param_groups):
    """train.py's optimizer indices → parameter names."""
    sys.path.insert(0, os.environ["TORCHVISION_REFERENCES"])
    import utils

    model = torchvision.models.get_model(model_name, num_classes=num_classes)
    norm = 0.0 if len(param_groups) > 1 else None
    groups = utils.set_weight_decay(model, 0.0, norm_weight_decay=norm)
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for g in groups for p in g["params"]]
    if [len(g["params"]) for g in groups] != [len(g["params"]) for g in param_groups]:
        sys.exit("the template's parameter groups are not train.py's for this model")
    return order


def load_both(train_py, ringtrain_dir):
    """train.py's checkpoint; ringtrain's state.json, weights and optimizer state."""
    # torch's restricted unpickler, with the one class train.py adds (its args) allowed.
    with torch.serialization.safe_globals([argparse.Namespace]):
        ckpt = torch.load(train_py, map_location="cpu", weights_only=True)
    state = json.load(open(f"{ringtrain_dir}/state.json"))
    weights = load_file(f"{ringtrain_dir}/model.safetensors")
    buffers = load_file(f"{ringtrain_dir}/optimizer.safetensors")
    if set(weights) != set(ckpt["model"]):
        sys.exit(f"{train_py} and {ringtrain_dir} hold different tensors")
    return ckpt, state, weights, buffers


def momentum_order(ckpt, state, buffers, ringtrain_dir):
    """ringtrain's momentum-buffer names in train.py's optimizer order."""
    order = parameter_order(state["model"], len(state["classes"]), ckpt["optimizer"]["param_groups"])
    keys = [f"{name}.momentum_buffer" for name in order]
    if set(keys) != set(buffers):
        sys.exit(f"{ringtrain_dir}'s optimizer state is not SGD's momentum buffers of these parameters")
    return keys


def synced(path):
    """fsync a file, or every file under a directory, before it is renamed into place."""
    files = [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs] if os.path.isdir(path) else [path]
    for f in files:
        with open(f, "rb") as h:
            os.fsync(h.fileno())
    return path


def to_torchvision(ringtrain_dir, template, out):
    ckpt, state, weights, buffers = load_both(template, ringtrain_dir)
    keys = momentum_order(ckpt, state, buffers, ringtrain_dir)
    ckpt["model"] = {k: weights[k].to(v.dtype) for k, v in ckpt["model"].items()}
    for i, key in enumerate(keys):
        ckpt["optimizer"]["state"][i]["momentum_buffer"] = buffers[key].clone()
    ckpt.pop("args", None)  # train.py loads with weights_only=True, which refuses argparse's Namespace
    torch.save(ckpt, f"{out}.tmp")
    os.replace(synced(f"{out}.tmp"), out)


def to_ringtrain(train_py, template_dir, out):
    ckpt, state, weights, buffers = load_both(train_py, template_dir)
    keys = momentum_order(ckpt, state, buffers, template_dir)
    if os.path.exists(out):
        sys.exit(f"{out} exists")
    tmp = f"{out}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(template_dir, tmp)
    save_file({k: ckpt["model"][k].to(v.dtype).contiguous() for k, v in weights.items()}, f"{tmp}/model.safetensors")
    moved = {key: ckpt["optimizer"]["state"][i]["momentum_buffer"].contiguous() for i, key in enumerate(keys)}
    save_file(moved, f"{tmp}/optimizer.safetensors")
    os.replace(synced(tmp), out)


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] not in ("to-torchvision", "to-ringtrain"):
        sys.exit(__doc__)
    (to_torchvision if sys.argv[1] == "to-torchvision" else to_ringtrain)(*sys.argv[2:])
