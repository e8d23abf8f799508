#!/usr/bin/env bash
# A tree of N images in 1,000 classes made of hard links to CIFAR-10's training JPEGs (no
# copies: the tree costs directory entries, not data), for start-up benchmarks at ImageNet's
# scale of files:
#   bench/many_files.sh CIFAR10_TRAIN_DIR OUT_DIR [N=1000000]
set -euo pipefail
src="$1"; out="$2"; n="${3:-1000000}"
[ -e "$out" ] && { echo "$out exists; remove it first" >&2; exit 2; }
python3 - "$src" "$out" "$n" <<'PY'
import os, sys
src, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
files = sorted(os.path.join(r, f) for r, _, fs in os.walk(src) for f in fs if f.endswith(".jpg"))
classes, per = 1000, n // 1000
tmp = out + ".partial"
for c in range(classes):
    d = os.path.join(tmp, f"n{c:08d}")
    os.makedirs(d)
    for k in range(per):
        i = c * per + k
        os.link(files[i % len(files)], os.path.join(d, f"n{c:08d}_{i}.JPEG"))
os.rename(tmp, out)
print(f"{out}: {classes * per} files in {classes} classes")
PY
