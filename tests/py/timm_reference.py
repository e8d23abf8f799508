"""timm's own Mixup/CutMix and SoftTargetCrossEntropy, run on tensors from the Rust tests.

    timm_reference.py mixup DIR    DIR/cases.json + DIR/in.safetensors -> DIR/out.safetensors
    timm_reference.py soft-ce DIR  DIR/in.safetensors (logits, target) -> DIR/out.safetensors (loss)
    timm_reference.py eval-transform DIR  timm's evaluation transform for the pretrained_cfg in
        DIR/cfg.json, as `timm.data.create_transform(**timm.data.resolve_data_config({},
        pretrained_cfg=cfg))` makes it, of each image file listed in DIR/files.json (opened by
        PIL, convert("RGB")) -> DIR/out.safetensors (float CHW tensors keyed by index); prints
        the transform

For mixup, timm draws its random numbers through numpy's global functions; those are replaced by
the Rust side's draws (checking the arguments timm asks with), so timm's code decides lambda,
CutMix or Mixup, and the box from the same numbers.
"""
import json
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import timm.data.mixup as tm
from timm.loss import SoftTargetCrossEntropy


class Replay:
    """Stands in for np.random.rand/beta/randint, answering with the Rust draws in order."""

    def __init__(self, case, h, w):
        cfg, d = case["cfg"], case["draws"]
        both = cfg["mixup_alpha"] > 0 and cfg["cutmix_alpha"] > 0
        cutmix = (d["u_switch"] < cfg["switch_prob"]) if both and d["u_switch"] is not None else \
            cfg["mixup_alpha"] <= 0
        self.rand = [d["u_mix"]] + ([d["u_switch"]] if d["u_switch"] is not None else [])
        self.beta = [d["beta"]] if d["beta"] is not None else []
        self.alpha = cfg["cutmix_alpha"] if cutmix else cfg["mixup_alpha"]
        self.randint = [((0, h), d["centre"][0]), ((0, w), d["centre"][1])] if d["centre"] else []

    def np_rand(self, *size):
        assert not size, f"timm asked for an array of uniforms {size}"
        return self.rand.pop(0)

    def np_beta(self, a, b, size=None):
        assert size is None and a == b == self.alpha, (a, b, self.alpha)
        return self.beta.pop(0)

    def np_randint(self, low, high=None, size=None):
        (want, value) = self.randint.pop(0)
        assert size is None and (low, high) == want, ((low, high), want)
        return value

    def check_used(self):
        assert not (self.rand or self.beta or self.randint), "timm did not use every draw"


def mixup(d):
    cases = json.loads((d / "cases.json").read_text())
    inp = load_file(d / "in.safetensors")
    out = {}
    saved = (np.random.rand, np.random.beta, np.random.randint, tm.cutmix_bbox_and_lam)
    try:
        for case in cases:
            name, cfg = case["name"], case["cfg"]
            x, y = inp[f"{name}.x"].clone(), inp[f"{name}.y"]
            replay = Replay(case, x.shape[-2], x.shape[-1])
            np.random.rand, np.random.beta, np.random.randint = replay.np_rand, replay.np_beta, replay.np_randint
            boxes = []

            def observed(*args, **kwargs):
                (box, lam) = saved[3](*args, **kwargs)
                boxes.append([int(v) for v in box])
                return box, lam

            tm.cutmix_bbox_and_lam = observed
            m = tm.Mixup(mixup_alpha=cfg["mixup_alpha"], cutmix_alpha=cfg["cutmix_alpha"], prob=cfg["prob"],
                         switch_prob=cfg["switch_prob"], mode="batch", correct_lam=cfg["correct_lam"],
                         label_smoothing=cfg["label_smoothing"], num_classes=cfg["num_classes"])
            # Mixup.__call__ in batch mode, without its even-batch assertion (batch mode needs none).
            lam = m._mix_batch(x)
            target = tm.mixup_target(y, m.num_classes, lam, m.label_smoothing)
            replay.check_used()
            out[f"{name}.x"] = x.contiguous()
            out[f"{name}.target"] = target
            out[f"{name}.lam"] = torch.tensor([float(lam)], dtype=torch.float64)
            if boxes:
                out[f"{name}.box"] = torch.tensor(boxes[0], dtype=torch.int64)
    finally:
        np.random.rand, np.random.beta, np.random.randint, tm.cutmix_bbox_and_lam = saved
    save_file(out, d / "out.safetensors")


def soft_ce(d):
    inp = load_file(d / "in.safetensors")
    loss = SoftTargetCrossEntropy()(inp["logits"], inp["target"])
    save_file({"loss": loss.reshape(1).contiguous()}, d / "out.safetensors")


def eval_transform(d):
    import timm.data
    from PIL import Image

    cfg = json.loads((d / "cfg.json").read_text())
    tf = timm.data.create_transform(**timm.data.resolve_data_config({}, pretrained_cfg=cfg))
    files = json.loads((d / "files.json").read_text())
    out = {str(i): tf(Image.open(f).convert("RGB")).contiguous() for i, f in enumerate(files)}
    save_file(out, str(d / "out.safetensors"))
    print(tf)


if __name__ == "__main__":
    {"mixup": mixup, "soft-ce": soft_ce, "eval-transform": eval_transform}[sys.argv[1]](Path(sys.argv[2]))
