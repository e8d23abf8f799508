"""timm's LARS and LAMB training a torchvision ResNet-18, for tests/large_batch_optim.rs.

  large_batch_reference.py resnet18 DIR KIND LR WD STEPS WARMUP POWER END
      KIND lars or lamb, as `timm.optim.create_optimizer_v2(model, KIND, ...)` builds it (norms
      and biases in a group without weight decay, hence without trust ratio; LARS with momentum
      0.9 and trust coefficient 0.001, LAMB with its defaults), on resnet18(num_classes=10) from
      torch.manual_seed(0), STEPS steps on one fixed random batch (16 images of 64x64) at MLPerf's
      polynomial schedule: LR * (k + 1) / WARMUP during the warm-up, then
      (LR - END) * (1 - (k - WARMUP) / (STEPS - WARMUP)) ** POWER + END.
      The foreach implementation trains the model; the for-loop implementation and a wrong
      variant (trust ratio 1: no layer-wise adaptation) step copies of its parameters with the
      same gradients. Writes DIR/init.safetensors (the state_dict), DIR/grads-K.safetensors (the
      gradients of step K, by parameter name), and the final parameters and state of each
      optimizer: DIR/foreach.safetensors, DIR/forloop.safetensors, DIR/wrong.safetensors; and
      DIR/no_decay.json, the names timm leaves without weight decay.
"""
import contextlib
import copy
import json
import sys

import torch
import torchvision
from safetensors.torch import save_file

import timm.optim
import timm.optim.lamb
import timm.optim.lars


def mlperf_poly(k, lr, steps, warmup, power, end):
    if k < warmup:
        return lr * (k + 1) / warmup
    return (lr - end) * (1 - (k - warmup) / (steps - warmup)) ** power + end


@contextlib.contextmanager
def trust_ratio_one():
    """The deliberate mistake: every trust ratio 1 (the excluded groups keep theirs, 1 anyway)."""
    saved = timm.optim.lars._lars_trust_ratio, timm.optim.lamb._lamb_trust_ratio
    timm.optim.lars._lars_trust_ratio = lambda w, *a: torch.ones_like(w)
    timm.optim.lamb._lamb_trust_ratio = lambda w, *a: torch.ones_like(w)
    try:
        yield
    finally:
        timm.optim.lars._lars_trust_ratio, timm.optim.lamb._lamb_trust_ratio = saved


def state(model, opt):
    out = {n: p.detach().clone().contiguous() for n, p in model.named_parameters()}
    names = {p: n for n, p in model.named_parameters()}
    for p, st in opt.state.items():
        for key, v in st.items():
            out[f"{names[p]}.{key}"] = v.detach().float().contiguous()
    for g in opt.param_groups:
        if "step" in g:  # LAMB's count, per group
            for p in g["params"]:
                out[f"{names[p]}.step"] = g["step"].detach().float().reshape(()).clone()
    return out


def resnet18(d, kind, lr, wd, steps, warmup, power, end, momentum):
    lr, wd, steps, warmup, power, end = float(lr), float(wd), int(steps), int(warmup), float(power), float(end)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    save_file({k: v.clone().contiguous() for k, v in model.state_dict().items()}, f"{d}/init.safetensors")
    x = torch.randn(16, 3, 64, 64)
    y = torch.randint(0, 10, (16,))
    copies = {"forloop": copy.deepcopy(model), "wrong": copy.deepcopy(model)}
    extra = {"momentum": float(momentum)} if kind == "lars" else {}
    opts = {name: timm.optim.create_optimizer_v2(m, kind, lr=lr, weight_decay=wd, foreach=name == "foreach", **extra)
            for name, m in [("foreach", model), *copies.items()]}
    names = {p: n for n, p in model.named_parameters()}
    no_decay = [names[p] for g in opts["foreach"].param_groups if g["weight_decay"] == 0 for p in g["params"]]
    with open(f"{d}/no_decay.json", "w") as f:
        json.dump(no_decay, f)
    for k in range(steps):
        for opt in opts.values():
            for g in opt.param_groups:
                g["lr"] = mlperf_poly(k, lr, steps, warmup, power, end)
        model.train()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opts["foreach"].zero_grad(set_to_none=True)
        loss.backward()
        grads = {n: p.grad.detach().clone().contiguous() for n, p in model.named_parameters()}
        save_file(grads, f"{d}/grads-{k}.safetensors")
        opts["foreach"].step()
        for name, m in copies.items():
            for n, p in m.named_parameters():
                p.grad = grads[n].clone()
        opts["forloop"].step()
        with trust_ratio_one():
            opts["wrong"].step()
    for name, m in [("foreach", model), *copies.items()]:
        save_file(state(m, opts[name]), f"{d}/{name}.safetensors")


if __name__ == "__main__":
    commands = {"resnet18": resnet18}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        sys.exit(f"unknown command {sys.argv[1:2]}: one of {', '.join(commands)}")
    commands[sys.argv[1]](*sys.argv[2:])
