"""timm's own models, standing in for the weights its users fine-tune, for the Rust tests.

    timm_zoo.py hub HF_HOME NAME:SIZE...   for each, timm.create_model(NAME) with random weights
                                           (every tensor drawn, not left at its initial constant)
                                           saved by timm's save_for_hf as the hub's cache holds
                                           timm/NAME.test; HF_HOME/io-NAME.safetensors: x and
                                           timm's eval logits, and at 1.5x SIZE for a ViT, whose
                                           position embeddings timm then resamples (x_big,
                                           logits_big)
    timm_zoo.py check NAME:FILE:IO:OUT...  FILE (a state_dict ringtrain wrote) loaded with
                                           strict=True into timm.create_model(NAME,
                                           num_classes=K); OUT: its eval logits on IO's x
    timm_zoo.py params NAME...             JSON: each architecture's parameters at 1000 classes and
                                           the input size of its default pretrained weights
"""
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

import timm
from timm.layers import resample_abs_pos_embed
from timm.models._hub import save_for_hf

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def is_vit(m):
    return hasattr(m, "pos_embed")


def create(name, size, **kw):
    args = dict(img_size=size) if name.startswith(("vit_", "deit_")) else {}
    return timm.create_model(name, pretrained=False, **args, **kw)


def draw(m):
    """Every tensor random: norms' weights near 1, biases, running statistics and layer scales
    drawn (a layer scale left at 1e-6 would hide its block, a zero head every logit)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, t in list(m.state_dict().items()):
            if not t.is_floating_point():
                continue
            r = torch.randn(t.shape, generator=g)
            if name.endswith("running_var"):
                t.copy_(0.5 + r.abs())
            elif name.endswith("running_mean"):
                t.copy_(0.2 * r)
            elif t.dim() <= 1 and name.endswith("gamma"):  # layer scale
                t.copy_(0.5 + 0.2 * r)
            elif t.dim() <= 1 and name.endswith("weight"):  # a norm's
                t.copy_(1.0 + 0.2 * r)
            elif t.dim() <= 1:  # biases
                t.copy_(0.1 * r)
            elif t.abs().max() < 1e-3:  # ViT's zero head, its class token (std 1e-6)
                t.copy_(0.02 * r)


def hub(hf_home, *cases):
    for case in cases:
        name, size = case.split(":")
        hub_one(name, int(size), hf_home)


def hub_one(repo_name, size, hf_home):
    """repo_name: NAME (the repository timm/NAME.test) or NAME.TAG (timm/NAME.TAG, as published)."""
    name, _, tag = repo_name.partition(".")
    tag = tag or "test"
    torch.manual_seed(0)
    # A published tag's pretrained_cfg (its evaluation transform) is timm's registry's.
    m = create(repo_name if tag != "test" else name, size)
    draw(m)
    m.eval()
    tmp = Path(tempfile.mkdtemp())
    save_for_hf(m, tmp, safe_serialization=True)
    cfg = json.loads((tmp / "config.json").read_text())
    cfg["pretrained_cfg"]["input_size"] = [3, size, size]
    (tmp / "config.json").write_text(json.dumps(cfg))
    repo = Path(hf_home) / "hub" / f"models--timm--{name}.{tag}"
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True, exist_ok=True)
    for f in ("config.json", "model.safetensors"):
        shutil.copy(tmp / f, snap / f)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    shutil.rmtree(tmp)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, size, size, generator=g)
    out = {"x": x}
    with torch.no_grad():
        out["logits"] = m(x)
        if is_vit(m):
            big = size * 3 // 2
            sd = m.state_dict()
            p = m.patch_embed.patch_size[0]
            sd["pos_embed"] = resample_abs_pos_embed(
                sd["pos_embed"], [big // p, big // p], num_prefix_tokens=m.num_prefix_tokens)
            m_big = create(name, big)
            m_big.load_state_dict(sd, strict=True)
            m_big.eval()
            x_big = torch.randn(2, 3, big, big, generator=g)
            out["x_big"], out["logits_big"] = x_big, m_big(x_big)
    save_file({k: v.contiguous() for k, v in out.items()}, f"{hf_home}/io-{name}.safetensors")


def check(*cases):
    for case in cases:
        check_one(*case.split(":"))


def check_one(name, file, io, out):
    sd = load_file(file)
    head = next(k for k in ("head.weight", "head.fc.weight", "classifier.weight", "fc.weight") if k in sd)
    k = sd[head].shape[0]
    x = load_file(io)["x"]
    m = create(name, x.shape[-1], num_classes=k)
    m.load_state_dict(sd, strict=True)
    m.eval()
    with torch.no_grad():
        save_file({"logits": m(x).contiguous()}, out)


def params(*names):
    counts = {}
    for name in names:
        with torch.device("meta"):
            m = timm.create_model(name, pretrained=False)
        counts[name] = {"parameters": sum(p.numel() for p in m.parameters()),
                        "input": m.pretrained_cfg["input_size"][-1]}
    print(json.dumps(counts))


if __name__ == "__main__":
    {"hub": hub, "check": check, "params": params}[sys.argv[1]](*sys.argv[2:])
