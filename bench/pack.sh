#!/usr/bin/env bash
# Decode once: ringtrain's input pipeline from a folder, a raw pack, an encoded pack and the RAM
# cache, each beside torchvision's ImageFolder + DataLoader on the same folder in the same
# invocation (`ringtrain bench-data --vs-pytorch`: the loader alone, RandomResizedCrop + flip +
# normalise, batch 64, WORKERS threads / worker processes). Packs are written to a temporary
# directory and removed.
#     bench/pack.sh [SHARED_DATA] [WORKERS]
#     e.g. bench/pack.sh ../shared/data 2
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
data="${1:-$here/../../shared/data}"
workers="${2:-$(nproc)}"
bin="$here/../scripts/ringtrain"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
bench() {  # LABEL DATA SIZE EPOCHS [FLAGS]
  local label="$1" d="$2" size="$3" epochs="$4"; shift 4
  echo "== $label"
  "$bin" bench-data --data "$d" --img-size "$size" --workers "$workers" --batch-size 64 \
      --epochs "$epochs" --device cpu --vs-pytorch "$@" | grep -E "^(ringtrain|pytorch|ratio|RAM)"
}
seedlings="$data/plant-seedlings/train"
"$bin" pack --data "$seedlings" --out "$tmp/seedlings-raw.pack" --workers "$workers"
bench "plant seedlings, folder (PNG)" "$seedlings" 128 2
bench "plant seedlings, raw pack" "$tmp/seedlings-raw.pack" 128 2
bench "plant seedlings, folder, RAM cache (epochs 2-3 timed)" "$seedlings" 128 3 --cache ram
cifar="$data/cifar10/train"
"$bin" pack --data "$cifar" --out "$tmp/cifar-encoded.pack" --store encoded --workers "$workers"
"$bin" pack --data "$cifar" --out "$tmp/cifar-raw.pack" --workers "$workers"
bench "CIFAR-10, folder (50,000 JPEG files)" "$cifar" 32 1
bench "CIFAR-10, encoded pack" "$tmp/cifar-encoded.pack" 32 1
bench "CIFAR-10, raw pack" "$tmp/cifar-raw.pack" 32 1
