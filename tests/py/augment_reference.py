"""torchvision.transforms.v2's augmentation policies as the reference for tests/augment_policies.rs.

  ops OUT IMAGE...   every operation of every policy's space, at every magnitude bin and both
                     signs, on uint8 tensors (the images resized to 45x38 and 40x40), through the
                     policy's own `_apply_image_or_video_transform`: OUT/cases.json, OUT/data.bin
  draws N W H        N draws of each policy on a WxH image, as counts of what it applied
                     (the operations are replaced by a recorder): JSON on stdout
"""
import json
import sys

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import v2
from torchvision.transforms.v2 import AutoAugmentPolicy, InterpolationMode

SIZES = [(45, 38), (40, 40)]
GEOMETRIC = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"}


def policies():
    return {
        "ta_wide": (v2.TrivialAugmentWide(), 31),
        "ra": (v2.RandAugment(), 31),
        "imagenet": (v2.AutoAugment(AutoAugmentPolicy.IMAGENET), 10),
        "augmix": (v2.AugMix(), 10),
    }


def ops(out, paths):
    images, blobs, cases = [], [], []
    offset = 0

    def put(arr):
        nonlocal offset
        b = np.ascontiguousarray(arr, dtype=np.uint8).tobytes()
        blobs.append(b)
        offset += len(b)
        return offset - len(b)

    tensors = []
    for p in paths:
        for w, h in SIZES:
            hwc = np.asarray(Image.open(p).convert("RGB").resize((w, h), Image.BILINEAR))
            images.append({"w": w, "h": h, "offset": put(hwc)})
            tensors.append(torch.from_numpy(hwc.copy()).permute(2, 0, 1).contiguous())
    for name, (policy, bins) in policies().items():
        space = policy._AUGMENTATION_SPACE
        for op, (fn, signed) in space.items():
            for k, img in enumerate(tensors):
                h, w = img.shape[-2:]
                mags = fn(bins, h, w)
                steps = [(None, 0.0)] if mags is None else [(b, float(mags[b])) for b in range(bins)]
                for b, m in steps:
                    for negative in ([False, True] if signed and b is not None else [False]):
                        mag = -m if negative else m
                        modes = [InterpolationMode.NEAREST, InterpolationMode.BILINEAR] if op in GEOMETRIC else [InterpolationMode.NEAREST]
                        for mode in modes:
                            got = policy._apply_image_or_video_transform(img, op, mag, interpolation=mode, fill=policy._fill)
                            cases.append({
                                "policy": name, "op": op, "bin": b, "negative": negative, "magnitude": mag,
                                "interpolation": mode.value, "image": k,
                                "offset": put(got.permute(1, 2, 0).numpy()),
                            })
    # ColorJitter's hue, the one adjustment no policy has.
    for k, img in enumerate(tensors):
        for factor in np.linspace(-0.5, 0.5, 41).tolist():
            got = v2.functional.adjust_hue(img, factor)
            cases.append({
                "policy": "color_jitter", "op": "Hue", "bin": None, "negative": False, "magnitude": factor,
                "interpolation": "nearest", "image": k, "offset": put(got.permute(1, 2, 0).numpy()),
            })
    with open(f"{out}/data.bin", "wb") as f:
        for b in blobs:
            f.write(b)
    with open(f"{out}/cases.json", "w") as f:
        json.dump({"images": images, "cases": cases}, f)


def key(op, mag):
    return f"{op}:{mag:.4f}"


def draws(n, w, h):
    torch.manual_seed(0)
    out = {}
    for name, policy in [
        ("ta_wide", v2.TrivialAugmentWide()),
        ("ra", v2.RandAugment()),
        ("imagenet", v2.AutoAugment(AutoAugmentPolicy.IMAGENET)),
        ("cifar10", v2.AutoAugment(AutoAugmentPolicy.CIFAR10)),
        ("svhn", v2.AutoAugment(AutoAugmentPolicy.SVHN)),
        ("augmix", v2.AugMix()),
    ]:
        img = torch.zeros(3, h, w, dtype=torch.uint8)
        applied = []

        def record(image, transform_id, magnitude, interpolation, fill):
            # A chain's first operation gets the input itself; the recorder returns copies.
            applied.append((image.data_ptr() == img.data_ptr(), key(transform_id, magnitude)))
            return image.clone()

        policy._apply_image_or_video_transform = record
        weights = []
        if name == "augmix":
            sample = policy._sample_dirichlet

            def dirichlet(params):
                d = sample(params)
                weights.append(d[0].tolist())
                return d

            policy._sample_dirichlet = dirichlet
        counts, steps, depths = {}, {}, {}
        for _ in range(n):
            applied.clear()
            policy(img)
            if name == "augmix":
                depth = 0
                for i, (first, k) in enumerate(applied):
                    steps[k] = steps.get(k, 0) + 1
                    depth = 1 if first else depth + 1
                    if i + 1 == len(applied) or applied[i + 1][0]:
                        depths[str(depth)] = depths.get(str(depth), 0) + 1
            else:
                k = "|".join(k for _, k in applied)
                counts[k] = counts.get(k, 0) + 1
        if name == "augmix":
            beta = np.array(weights[0::2])
            mixture = np.array(weights[1::2])
            # The original's weight, and the first chain's (its Dirichlet share of the rest).
            out[name] = {
                "steps": steps, "depths": depths,
                "original": beta[:, 0].tolist(), "chain": (mixture[:, 0] * beta[:, 1]).tolist(),
            }
        else:
            out[name] = counts
    # ColorJitter(0.4, 0.4, 0.4, 0.1)'s draws: the order of its four adjustments, their factors.
    cj = v2.ColorJitter(0.4, 0.4, 0.4, 0.1)
    img = torch.zeros(3, h, w, dtype=torch.uint8)
    orders, factors = {}, []
    for _ in range(n):
        p = cj.make_params([img])
        o = "".join(str(int(i)) for i in p["fn_idx"])
        orders[o] = orders.get(o, 0) + 1
        factors.append([p["brightness_factor"], p["contrast_factor"], p["saturation_factor"], p["hue_factor"]])
    out["color_jitter"] = {"orders": orders, "factors": factors}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    if sys.argv[1] == "ops":
        ops(sys.argv[2], sys.argv[3:])
    else:
        draws(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
