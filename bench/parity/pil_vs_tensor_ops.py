"""TrivialAugmentWide's operations on PIL images (train.py's default --backend pil) against the same
operations on uint8 tensors (--backend tensor, and ringtrain, whose operations equal torchvision's
tensor kernels): for each operation and magnitude bin, the mean absolute difference in levels
(0-255) between the two outputs of the same input, and each side's mean pixel and pixel spread.
The inputs are what train.py's PIL pipeline gives TrivialAugmentWide: RandomResizedCrop (bilinear,
antialiased) of the first images of a shuffled ImageFolder tree, at SIZE pixels. Signed operations
are applied with the positive magnitude; operations without a magnitude get one row.

Usage: pil_vs_tensor_ops.py IMAGE_FOLDER SIZE [IMAGES]
    e.g. pil_vs_tensor_ops.py ../shared/data/plant-seedlings/train 40
"""
import glob
import random
import sys

import torch
import torchvision.transforms as T
import torchvision.transforms.functional as F
from PIL import Image
from torchvision.transforms import InterpolationMode
from torchvision.transforms.autoaugment import TrivialAugmentWide, _apply_op


def main(folder, size, count=200):
    random.seed(0)
    torch.manual_seed(0)
    files = sorted(glob.glob(f"{folder}/*/*"))
    random.shuffle(files)
    bilinear = InterpolationMode.BILINEAR
    crop = T.RandomResizedCrop(int(size), interpolation=bilinear, antialias=True)
    images = [crop(Image.open(f).convert("RGB")) for f in files[: int(count)]]
    print(f"{len(images)} crops of {size} px from {folder}")
    print("operation      bin  magnitude  |pil - tensor|  mean pil/tensor  std pil/tensor")
    for name, (magnitudes, _) in TrivialAugmentWide()._augmentation_space(31).items():
        for b in (10, 20, 30) if magnitudes.ndim > 0 else (0,):
            m = float(magnitudes[b]) if magnitudes.ndim > 0 else 0.0
            diff = mean_p = mean_t = std_p = std_t = 0.0
            for img in images:
                p = F.pil_to_tensor(_apply_op(img, name, m, bilinear, None)).float()
                t = _apply_op(F.pil_to_tensor(img), name, m, bilinear, None).float()
                diff += (p - t).abs().mean().item()
                mean_p, mean_t = mean_p + p.mean().item(), mean_t + t.mean().item()
                std_p, std_t = std_p + p.std().item(), std_t + t.std().item()
            n = len(images)
            print(f"{name:14s} {b:3d} {m:10.3f} {diff / n:14.2f} {mean_p / n:8.1f} {mean_t / n:6.1f}"
                  f" {std_p / n:8.1f} {std_t / n:6.1f}")


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    main(*sys.argv[1:])
