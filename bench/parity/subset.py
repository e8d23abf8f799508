"""A class-balanced subset of an ImageFolder tree, as symbolic links (nothing is copied): the
first N files of every class, in sorted order, so the subset is the same on every machine.

Usage: subset.py SRC DEST SPLIT=N [SPLIT=N ...]
    e.g. subset.py ../shared/data/cifar10 runs/cifar10-sub train=500 test=300
"""
import os
import shutil
import sys


def main(src, dest, *splits):
    tmp = f"{dest}.tmp-{os.getpid()}"
    for spec in splits:
        split, n = spec.split("=")
        for cls in sorted(os.listdir(os.path.join(src, split))):
            files = sorted(os.listdir(os.path.join(src, split, cls)))[: int(n)]
            assert len(files) == int(n), f"{split}/{cls} has {len(files)} files, fewer than {n}"
            os.makedirs(os.path.join(tmp, split, cls))
            for f in files:
                os.symlink(os.path.abspath(os.path.join(src, split, cls, f)), os.path.join(tmp, split, cls, f))
    if os.path.isdir(dest):
        shutil.rmtree(dest)
    os.rename(tmp, dest)


if __name__ == "__main__":
    main(*sys.argv[1:])
