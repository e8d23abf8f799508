"""PyTorch reference for `ringtrain bench-data --vs-pytorch`: ImageFolder + DataLoader throughput,
alone or feeding the training step, measured the way ringtrain measures its own pipeline.

The loader-only measurement is that of the shared reference bench_loader_cpu.py (RandomResizedCrop
+ horizontal flip + ToTensor + Normalize, shuffled, drop_last, persistent workers, the first batch
untimed), with the batch size and number of epochs as parameters; with a model it is that of
bench_loader.py (pinned memory, channels_last, autocast, SGD momentum 0.9).

With POLICY (ta_wide, ra, imagenet, cifar10, svhn, augmix) torchvision's policy follows the flip,
on the PIL image, as torchvision's reference recipe (presets.py) puts it; with timm's RandAugment
string (rand-m9-mstd0.5-inc1) timm's, with the hyper-parameters timm's training transform gives
it (ImageNet's mean as the fill, bilinear).

Usage: torch_loader.py DIR SIZE BATCH WORKERS EPOCHS MODEL|none AMP(off|bf16|fp16) CHANNELS_LAST(0|1) DEVICE [POLICY|none]
Prints one JSON object: {"images_per_s": ...}.
"""
import json
import sys
import time

import torch
import torchvision
from torchvision import transforms as T


def policy_transform(name):
    bilinear = T.InterpolationMode.BILINEAR
    if name == "ta_wide":
        return [T.TrivialAugmentWide(interpolation=bilinear)]
    if name == "ra":
        return [T.RandAugment(interpolation=bilinear)]
    if name == "augmix":
        return [T.AugMix(interpolation=bilinear)]
    if name in ("imagenet", "cifar10", "svhn"):
        return [T.AutoAugment(T.AutoAugmentPolicy(name), interpolation=bilinear)]
    if name.startswith("rand"):
        from PIL import Image
        from timm.data import auto_augment
        from timm.data.auto_augment import rand_augment_transform
        # timm asks posterize for 0 bits at the top of inc1's range; Pillow 11 and later raise
        # there, inside timm. Earlier Pillows (and torchvision) give a black image, as ringtrain.
        def posterize(img, bits_to_keep, **_):
            if bits_to_keep >= 8:
                return img
            if bits_to_keep <= 0:
                return Image.new(img.mode, img.size)
            return auto_augment.ImageOps.posterize(img, bits_to_keep)
        for op in [k for k in auto_augment.NAME_TO_OP if k.startswith("Posterize")]:
            auto_augment.NAME_TO_OP[op] = posterize
        mean = (0.485, 0.456, 0.406)
        hparams = dict(img_mean=tuple(min(255, round(255 * x)) for x in mean), interpolation=Image.BILINEAR)
        return [rand_augment_transform(name, hparams)]
    return []


def main(root, size, batch, workers, epochs, model, amp, channels_last, device, policy="none"):
    size, batch, workers, epochs = map(int, (size, batch, workers, epochs))
    channels_last = channels_last == "1"
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    tf = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), *policy_transform(policy), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    ds = torchvision.datasets.ImageFolder(root, tf)
    dl = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                                     drop_last=True, pin_memory=cuda, persistent_workers=workers > 0)
    step = None
    if model != "none":
        torch.backends.cudnn.benchmark = True
        m = getattr(torchvision.models, model)(num_classes=len(ds.classes)).to(dev)
        if channels_last:
            m = m.to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)
        scaler = torch.amp.GradScaler(dev.type) if amp == "fp16" else None

        def step(x, y):
            with torch.autocast(dev.type, dtype=dtype, enabled=dtype is not None):
                loss = torch.nn.functional.cross_entropy(m(x), y)
            opt.zero_grad(set_to_none=True)
            if scaler:
                scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
            else:
                loss.backward(); opt.step()

    n, t0 = 0, None
    for _ in range(epochs):
        for x, y in dl:
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            if step:
                step(x, y)
            if t0 is None:
                if cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                continue
            n += x.shape[0]
    if cuda:
        torch.cuda.synchronize()
    print(json.dumps({"images_per_s": n / (time.perf_counter() - t0)}))


if __name__ == "__main__":
    main(*sys.argv[1:])
