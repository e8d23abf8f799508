"""torchvision.transforms.v2's augmentation policies as the reference for tests/augment_policies.rs.

  ops OUT IMAGE...   every operation of every policy's space, at every magnitude bin and both
                     signs, on uint8 tensors (the images resized to 45x38 and 40x40), through the
                     policy's own `_apply_image_or_video_transform`: OUT/cases.json, OUT/data.bin
  draws N W H        N draws of each policy on a WxH image, as counts of what it applied
                     (the operations are replaced by a recorder): JSON on stdout
  timm_ops OUT IMAGE every operation of timm's RandAugment (plain and increasing) at magnitudes
                     0..10 (and 15 with mmax 20) and both signs, through timm's own level and op
                     functions on the PIL image resized to 45x38 and 40x40, bilinear and
                     bicubic, filled with ImageNet's mean colour: OUT/cases.json, OUT/data.bin
  timm_draws N W H CONFIG...  N draws of each timm RandAugment string: the operations each
                     image got (counts) and each operation's arguments, JSON on stdout
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


class Blobs:
    """Images as one byte string (OUT/data.bin), each at the offset `put` returns, and the index
    of images and cases (OUT/cases.json)."""

    def __init__(self):
        self.blobs, self.offset = [], 0

    def put(self, arr):
        b = np.ascontiguousarray(np.asarray(arr), dtype=np.uint8).tobytes()
        self.blobs.append(b)
        self.offset += len(b)
        return self.offset - len(b)

    def save(self, out, images, cases):
        with open(f"{out}/data.bin", "wb") as f:
            for b in self.blobs:
                f.write(b)
        with open(f"{out}/cases.json", "w") as f:
            json.dump({"images": images, "cases": cases}, f)


def ops(out, paths):
    images, cases = [], []
    put = (blobs := Blobs()).put

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
    blobs.save(out, images, cases)


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


# timm's training transform's hyper-parameters for its policies: ImageNet's mean as the fill.
TIMM_FILL = tuple(min(255, round(255 * x)) for x in (0.485, 0.456, 0.406))
TIMM_MAGNITUDES = [0, 1, 2.5, 4, 5, 6.3, 7.5, 9, 9.99, 10, 12]


def timm_ops(out, path):
    import random
    from timm.data import auto_augment as aa
    images, cases = [], []
    put = (blobs := Blobs()).put
    pils = []
    for w, h in SIZES:
        im = Image.open(path).convert("RGB").resize((w, h), Image.BILINEAR)
        images.append({"w": w, "h": h, "offset": put(im)})
        pils.append(im)
    filters = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}
    hparams = dict(translate_const=250, img_mean=TIMM_FILL)
    for increasing, mmax in [(False, None), (True, None), (True, 20)]:
        names = aa._RAND_INCREASING_TRANSFORMS if increasing else aa._RAND_TRANSFORMS
        hp = dict(hparams) if mmax is None else dict(hparams, magnitude_max=mmax)
        for name in names:
            level_fn, op_fn = aa.LEVEL_TO_ARG[name], aa.NAME_TO_OP[name]
            for m in TIMM_MAGNITUDES + ([15, 20] if mmax else []):
                # AugmentOp.__call__'s clipping, then the level function with its sign fixed
                # (_randomly_negate negates when random.random() > 0.5).
                clipped = max(0.0, min(m, mmax or aa._LEVEL_DENOM))
                for negative in (False, True):
                    saved = random.random
                    random.random = (lambda: 0.9) if negative else (lambda: 0.1)
                    try:
                        args = level_fn(clipped, hp) if level_fn else ()
                    finally:
                        random.random = saved
                    geometric = name in ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
                    for fname in (filters if geometric else ["bilinear"]):
                        for k, im in enumerate(pils):
                            case = {
                                "op": name, "increasing": increasing, "mmax": mmax, "magnitude": m,
                                "negative": negative, "filter": fname, "image": k, "args": list(args),
                            }
                            try:
                                got = op_fn(im, *args, fillcolor=TIMM_FILL, resample=filters[fname])
                                case["offset"] = put(got.convert("RGB"))
                            except ValueError as e:
                                # Pillow 11+ refuses to keep 0 bits, which timm asks for at the
                                # ends of its posterize ranges; earlier Pillows made the image black.
                                case["refused"] = str(e)
                            cases.append(case)
    blobs.save(out, images, cases)


def timm_draws(n, w, h, configs):
    import random
    from timm.data.auto_augment import rand_augment_transform
    random.seed(0)
    np.random.seed(0)
    img = Image.new("RGB", (w, h))
    out = {}
    for config in configs:
        ra = rand_augment_transform(config, dict(translate_const=250, img_mean=TIMM_FILL))
        applied = []
        args = {}

        def recorder(name):
            def record(image, *a, **_):
                applied.append(name)
                args.setdefault(name, []).append(a[0] if a else 0.0)
                return image
            return record

        for op in ra.ops:
            op.aug_fn = recorder(op.name)
        counts = {}
        for _ in range(n):
            applied.clear()
            ra(img)
            k = "|".join(applied)
            counts[k] = counts.get(k, 0) + 1
        out[config] = {"counts": counts, "args": args}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    if sys.argv[1] == "ops":
        ops(sys.argv[2], sys.argv[3:])
    elif sys.argv[1] == "timm_ops":
        timm_ops(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "timm_draws":
        timm_draws(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:])
    else:
        draws(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
