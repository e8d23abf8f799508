"""Tar shards and parquet files against a folder of the same images, and against PyTorch
reading the same shards with the webdataset package and the same parquet files with the datasets
package: one epoch, the whole command timed (opening the set included), warm and, with --cold,
after dropping the page cache (needs root).

  python bench/shards.py FOLDER OUT_DIR [--size 32] [--batch 256] [--workers 2] [--cold]

Writes OUT_DIR/train-NNNNNN.tar with webdataset's ShardWriter (1,000 samples each, in a
shuffled order) and OUT_DIR/parquet/train-NNNNN-of-NNNNN.parquet with datasets' to_parquet (the
same order, row groups of 100 as the library writes images) unless they are there. ringtrain
runs `bench-data` (RandomResizedCrop + flip, uint8 batches) on each; PyTorch runs
WebDataset(...).shuffle(1000).decode("pil"), and a datasets Dataset with set_transform and a
shuffling DataLoader, with the same transform, workers and batch.
"""
import argparse
import glob
import os
import random
import subprocess
import sys
import time

RINGTRAIN = os.environ.get("RINGTRAIN_BIN", "ringtrain")

PYTORCH = r"""
import sys, time, torch, webdataset as wds
from torchvision import transforms as T
pattern, size, batch, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
tf = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(),
                T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
ds = (wds.WebDataset(pattern, shardshuffle=100, nodesplitter=wds.split_by_node)
      .shuffle(1000).decode("pil").to_tuple("jpg;png", "cls").map_tuple(tf, lambda c: c)
      .batched(batch, partial=False))
dl = wds.WebLoader(ds, batch_size=None, num_workers=workers)
n = 0
for x, y in dl:
    n += len(y)
print(n)
"""

HF = r"""
import glob, sys, torch
from datasets import Dataset
from torchvision import transforms as T
files, size, batch, workers = sorted(glob.glob(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
tf = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(),
                T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
ds = Dataset.from_parquet(files)
ds.set_transform(lambda b: {"x": [tf(im.convert("RGB")) for im in b["image"]], "y": b["label"]})
dl = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, drop_last=True)
n = 0
for b in dl:
    n += len(b["y"])
print(n)
"""


def make_shards(folder, out):
    import webdataset as wds
    classes = sorted(os.listdir(folder))
    items = [(os.path.join(folder, c, f), i) for i, c in enumerate(classes)
             for f in sorted(os.listdir(os.path.join(folder, c)))]
    random.Random(0).shuffle(items)
    os.makedirs(out, exist_ok=True)
    with wds.ShardWriter(os.path.join(out, "train-%06d.tar"), maxcount=1000, verbose=0) as w:
        for i, (p, c) in enumerate(items):
            ext = os.path.splitext(p)[1].lower().lstrip(".").replace("jpeg", "jpg")
            w.write({"__key__": f"{i:08d}", ext: open(p, "rb").read(), "cls": c})


def make_parquet(shards, out):
    """The shards' samples, in their order, as a datasets Image + ClassLabel table."""
    import io
    import tarfile
    from datasets import ClassLabel, Dataset, Features, Image
    rows = {"image": [], "label": []}
    for tar in sorted(glob.glob(os.path.join(shards, "train-*.tar"))):
        members = {}
        with tarfile.open(tar) as t:
            for m in t.getmembers():
                key, ext = m.name.split(".", 1)
                members.setdefault(key, {})[ext] = t.extractfile(m).read()
        for key, m in members.items():
            ext = next(e for e in m if e != "cls")
            rows["image"].append({"bytes": m[ext], "path": f"{key}.{ext}"})
            rows["label"].append(int(m["cls"]))
    n = max(rows["label"]) + 1
    ds = Dataset.from_dict(rows, features=Features({"image": Image(), "label": ClassLabel(num_classes=n)}))
    os.makedirs(out, exist_ok=True)
    k = 4
    for i in range(k):
        ds.shard(k, i, contiguous=True).to_parquet(os.path.join(out, f"train-{i:05d}-of-{k:05d}.parquet"), batch_size=100)


def timed(cmd, cold):
    if cold:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def arguments():
    """The arguments this benchmark and bench/remote_data.py share."""
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("shards")
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    return ap


def main():
    ap = arguments()
    ap.add_argument("--cold", action="store_true")
    a = ap.parse_args()
    if not glob.glob(os.path.join(a.shards, "train-*.tar")):
        make_shards(a.folder, a.shards)
    parquet = os.path.join(a.shards, "parquet")
    if not glob.glob(os.path.join(parquet, "*.parquet")):
        make_parquet(a.shards, parquet)
    files = os.path.join(parquet, "train-*.parquet")
    n = len(glob.glob(os.path.join(a.shards, "train-*.tar")))
    pattern = os.path.join(a.shards, "train-{%06d..%06d}.tar" % (0, n - 1))
    common = ["bench-data", "--img-size", str(a.size), "--batch-size", str(a.batch), "--workers",
              str(a.workers), "--epochs", "1", "--device", "cpu", "--cache", "off"]
    runs = {
        "ringtrain, folder": [RINGTRAIN] + common + ["--data", a.folder],
        "ringtrain, shards": [RINGTRAIN] + common + ["--data", pattern],
        "pytorch webdataset, shards": [sys.executable, "-c", PYTORCH, pattern, str(a.size), str(a.batch),
                                       str(a.workers)],
        "ringtrain, parquet": [RINGTRAIN] + common + ["--data", files],
        "pytorch datasets, parquet": [sys.executable, "-c", HF, files, str(a.size), str(a.batch), str(a.workers)],
    }
    for name, cmd in runs.items():
        if not a.cold:
            timed(cmd, False)  # warms the page cache; not counted
        times = [timed(cmd, a.cold) for _ in range(a.repeat)]
        print(f"{name:28s} {'cold' if a.cold else 'warm'}: " + ", ".join(f"{t:.2f} s" for t in times))


if __name__ == "__main__":
    main()
