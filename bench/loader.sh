#!/usr/bin/env bash
# Input pipeline: ringtrain's loader against torchvision's ImageFolder + DataLoader, same data,
# same transforms, same machine, in one run (`ringtrain bench-data --vs-pytorch`); prints both
# and the ratio.
#   bench/loader.sh [DIR] [SIZE] [WORKERS] [more bench-data flags, e.g. --model resnet50]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir="${1:-$here/../../shared/data/plant-seedlings/train}"
size="${2:-128}"
workers="${3:-$(nproc)}"
shift $(( $# < 3 ? $# : 3 ))
exec "$here/../scripts/ringtrain" bench-data --data "$dir" --img-size "$size" --workers "$workers" \
    --batch-size 64 --epochs 2 --vs-pytorch "$@"
